"""scripts/gpu_check.sh and scripts/mac_check.sh cannot run here (no GPU, no Mac): their syntax, the flags their
`vitedge` steps pass (each must be a real flag of that subcommand), the Python snippets they run, the one
PASS/FAIL/INCONCLUSIVE/SKIP line per step that the shared step helper prints, and gpu_check.sh's setup steps,
run here with a fake `tensorrt` (tests/trt_fake.py) and its whole log written to one file; and
scripts/suite_cpu.py, the suite's CPU seconds per test file, on a suite of two small files."""
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
    script = (f"LOGS={tmp_path}\nRECORD={tmp_path}/record.log\nsource {SCRIPTS / '_steps.sh'}\n"
              "step good true\nstep bad sh -c 'echo boom; exit 3'\nstep undecided sh -c 'echo hidden; exit 10'\n"
              "skip phone 'no iPhone'\nfinish demo\n")
    r = subprocess.run([bash, "-c", script], capture_output=True, text=True)
    assert r.returncode == 1
    lines = ["PASS good", f"FAIL bad: boom (log: {tmp_path}/bad.log)",
             f"INCONCLUSIVE undecided: hidden (log: {tmp_path}/undecided.log)", "SKIP phone: no iPhone",
             "demo: 1 passed, 1 failed, 1 inconclusive"]
    assert r.stdout.splitlines() == lines
    record = (tmp_path / "record.log").read_text()  # every line printed and every step's output, in order
    assert record.splitlines() == ["---- good: true (exit 0)", "PASS good",
                                   "---- bad: sh -c echo boom; exit 3 (exit 3)", "boom", lines[1], "---- undecided: sh -c echo hidden; exit 10 (exit 10)", "hidden",
                                   *lines[2:]]


FAKE_TENSORRT = """import sys
from vitedge.tests.trt_fake import FakeTRT
sys.modules[__name__] = FakeTRT("10.16.1").module  # the spec_set fake built from the API table
"""


def _run_gpu_check(tmp_path, *plants: tuple[str, str]):
    """scripts/gpu_check.sh --setup-only with a fake `tensorrt` (and `plants`: (module, source) put first on the
    path) importable, its log written under tmp_path."""
    import os
    fake = tmp_path / "fake"
    (fake / "tensorrt").mkdir(parents=True)
    (fake / "tensorrt" / "__init__.py").write_text(FAKE_TENSORRT)
    for module, source in plants:
        (fake / module).mkdir()
        (fake / module / "__init__.py").write_text(source)
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(fake), os.environ.get("PYTHONPATH")) if p),
               GPU_CHECK_LOG=str(tmp_path / "record" / "gpu_check.log"),
               PATH=os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))  # this python
    r = subprocess.run([bash, str(SCRIPTS / "gpu_check.sh"), "--setup-only", str(tmp_path / "out")],
                       capture_output=True, text=True, env=env, timeout=300)
    return r, tmp_path / "record" / "gpu_check.log"


def test_gpu_check_gets_past_setup_with_the_install_it_names(tmp_path):
    """The setup steps run here as on the GPU machine (TensorRT faked): the install the script names (this editable
    checkout with its test extra) is enough, and the whole log, versions first, lands in GPU_CHECK_LOG. The old
    script named `vitedge[tensorrt10]` alone, which installs no pytest, while its tests need pytest-xdist (addopts
    -n) and the checkout's vitedge.tests helpers."""
    r, record = _run_gpu_check(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[1:] == ["PASS versions", "PASS setup", "PASS tensorrt-import",
                                         "gpu_check-setup: 3 passed, 0 failed"]
    log = record.read_text()
    assert log.startswith("gpu_check ") and f"log: {record}" in log.splitlines()[0]
    for needed in ("---- versions", "tensorrt: 10.16.1", "python: ", "checkout: ", "gpu: ", "---- setup",
                   "ready", "tensorrt 10.16.1", "gpu_check-setup: 3 passed, 0 failed"):
        assert needed in log, needed
    text = (SCRIPTS / "gpu_check.sh").read_text()
    assert "pip install -e '.[tensorrt10,test]'" in text and "benchmarks/results/gpu_check/" in text


def test_gpu_check_setup_names_what_is_missing_and_the_fix(tmp_path):
    r, record = _run_gpu_check(tmp_path, ("xdist", "raise ImportError(\"No module named 'xdist' (planted)\")"))
    assert r.returncode == 2, r.stdout + r.stderr
    last = r.stdout.splitlines()[-1]
    assert "missing: pytest-xdist." in last and "Fix: pip install -e '" in last and "[tensorrt10,test]'" in last
    assert "tensorrt-import" not in r.stdout  # nothing past setup ran
    assert "missing: pytest-xdist" in record.read_text()


@pytest.mark.parametrize("requested, status, rc", [("fp16", "confirmed", 0), ("fp16", "refuted", 1),
                                                   ("int8", "inconclusive", 10), ("int8", "confirmed", 0)])
def test_gpu_check_precision_steps_follow_the_targets_rule(tmp_path, requested, status, rc):
    """One rule for a precision check (targets/tensorrt/precision.py check_outcome), in the target's lowering, the
    GPU check and the GPU tests: refuted fails, inconclusive is neither a pass nor a failure. The old script
    demanded "confirmed" of int8, which the target and the GPU int8 test accept as inconclusive."""
    import json
    import sys
    side = tmp_path / "m.engine.json"
    side.write_text(json.dumps({"precision_requested": requested, "precision_built": "unknown",
                                "precision_check": {"status": status, "evidence": "inspector", "reason": "r"},
                                "fp32_policy": {"pinned_layers": None}, "source_onnx": {"file": "m.onnx"}}))
    r = subprocess.run([sys.executable, str(SCRIPTS / "gpu_check_steps.py"), "precision", str(side)],
                       capture_output=True, text=True)
    assert r.returncode == rc, r.stdout + r.stderr
    assert f"{requested} -> unknown: {status}" in r.stdout
    text = (SCRIPTS / "gpu_check.sh").read_text()
    assert '"confirmed"' not in text and text.count('gpu_check_steps.py" precision') == 2


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


def test_suite_cpu_counts_each_files_cpu_with_its_subprocesses(tmp_path):
    """scripts/suite_cpu.py (the suite's time in docs/contributing.md): a file's CPU includes the subprocesses its
    tests waited for, tests are counted per file, and pytest's exit code comes back."""
    import json
    import sys

    (tmp_path / "test_busy.py").write_text(
        "import subprocess, sys\n"
        "def test_child():\n"
        "    subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
        "while time.process_time() - t < 0.5: pass'], check=True)\n"
        "def test_fails():\n"
        "    assert False\n")
    (tmp_path / "test_idle.py").write_text("def test_nothing():\n    pass\n")
    out = tmp_path / "cpu.json"
    r = subprocess.run([sys.executable, str(SCRIPTS / "suite_cpu.py"), "--out", str(out), "--", "-p", "no:cacheprovider",
                        "-p", "no:xdist", "test_busy.py", "test_idle.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # the planted failure
    data = json.loads(out.read_text())
    assert data["pytest_exit_code"] == 1 and data["processes"] == 1
    rows = {row["file"]: row for row in data["files"]}
    assert {f: row["tests"] for f, row in rows.items()} == {"test_busy.py": 2, "test_idle.py": 1}
    assert rows["test_busy.py"]["cpu_s"] >= 0.5 > rows["test_idle.py"]["cpu_s"]  # the child's 0.5 s included
    assert [row["file"] for row in data["files"]] == ["test_busy.py", "test_idle.py"]
    assert "test_busy.py" in r.stdout and r.stdout.rstrip().endswith(f"written to {out}")
