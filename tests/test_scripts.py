"""scripts/gpu_check.sh and scripts/mac_check.sh cannot run here (no GPU, no Mac): their syntax, the flags their
`vitedge` steps pass (each must be a real flag of that subcommand), the Python snippets they run, and the one
PASS/FAIL/SKIP line per step that the shared step helper prints."""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from vitedge.cli import build_parser

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
CHECKS = ("gpu_check.sh", "mac_check.sh")
bash = shutil.which("bash")
pytestmark = pytest.mark.skipif(bash is None, reason="bash is not installed")


def _commands(text: str) -> list[list[str]]:
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        m = re.search(r"\bvitedge (\w+)(.*)", line)
        if m and not line.lstrip().startswith("#") and "import" not in line:
            out.append([m.group(1)] + re.findall(r"(--[a-z][a-z-]*)", m.group(2)))
    return out


def _subparser_flags(name: str) -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices[name]
    return {s for a in sub._actions for s in a.option_strings}


@pytest.mark.parametrize("script", CHECKS)
def test_script_syntax_and_real_flags(script):
    path = SCRIPTS / script
    subprocess.run([bash, "-n", str(path)], check=True)
    cmds = _commands(path.read_text())
    assert cmds, "no vitedge step found"
    for sub, *flags in cmds:
        unknown = set(flags) - _subparser_flags(sub)
        assert not unknown, f"{script}: vitedge {sub} has no {sorted(unknown)}"
    want = {"gpu_check.sh": {("export", "--require-verified"), ("bench", "--backends"), ("bench", "--artifact")},
            "mac_check.sh": {("parity", "--mode"), ("parity", "--require-verified"), ("parity", "--require-ane"),
                             ("bench", "--device"), ("bench", "--backends")}}[script]
    assert want <= {(c[0], f) for c in cmds for f in c[1:]}


@pytest.mark.parametrize("script", CHECKS)
def test_python_snippets_compile(script):
    for snippet in re.findall(r"<<'PY'\n(.*?)\nPY\n", (SCRIPTS / script).read_text(), re.S):
        ast.parse(snippet)


def test_step_helper_prints_one_line_per_step(tmp_path):
    script = (f"LOGS={tmp_path}\nsource {SCRIPTS / '_steps.sh'}\n"
              "step good true\nstep bad sh -c 'echo boom; exit 3'\nskip phone 'no iPhone'\nfinish demo\n")
    r = subprocess.run([bash, "-c", script], capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stdout.splitlines() == ["PASS good", f"FAIL bad: boom (log: {tmp_path}/bad.log)", "SKIP phone: no iPhone",
                                     "demo: 1 passed, 1 failed"]


def test_gpu_check_cross_checks_with_nvidias_tools():
    """trtexec loads vitedge's plain engine and its GPU compute median is compared with vitedge's; layer info is
    saved; polygraphy cross-checks fp32; each is skipped with why when the tool is missing."""
    text = (SCRIPTS / "gpu_check.sh").read_text()
    for needed in ("trtexec --loadEngine=\"$ENGINE\"", "--exportLayerInfo=", "polygraphy run", "--trt --onnxrt",
                   "skip trtexec-load", "skip polygraphy-fp32", "GPU Compute Time", "layer_info/"):
        assert needed in text, needed
    snippet = next(s for s in re.findall(r"<<'PY'\n(.*?)\nPY\n", text, re.S) if "GPU Compute Time" in s)
    assert re.search(r"GPU Compute Time: .*?median = ([0-9.]+) ms",
                     "[I] GPU Compute Time: min = 0.5 ms, max = 0.9 ms, mean = 0.6 ms, median = 0.58 ms, ") \
        and "0.67 <= ours / theirs <= 1.5" in snippet


@pytest.mark.parametrize("script, backend", [("gpu_check.sh", "tensorrt"), ("mac_check.sh", "coreml")])
def test_bench_checks_say_why_an_untimed_backend_failed(tmp_path, script, backend):
    """The bench snippets read a report whose backend failed parity (latency None) and fail with the reason,
    instead of crashing on it."""
    import json
    import sys
    text = (SCRIPTS / script).read_text()
    snippet = next(s for s in re.findall(r"<<'PY'\n(.*?)\nPY\n", text, re.S)
                   if f'x["backend"] == "{backend}"' in s)
    report = tmp_path / "bench.json"
    report.write_text(json.dumps({"results": [{"backend": backend, "status": "failed", "valid": False,
                                               "latency": None, "gpu_compute": None, "precision": "fp16",
                                               "reason": "parity failed: natural: psnr 20 < 35"}]}))
    r = subprocess.run([sys.executable, "-c", snippet, str(report)], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "not timed: parity failed" in r.stdout
