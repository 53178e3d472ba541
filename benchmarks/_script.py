"""A benchmark script's run: its command line, the machine it ran on (and how loaded), and the JSON results file.

The scripts run as `python benchmarks/NAME.py`; these helpers sit beside them (imported as siblings), one job per
module: `_script` (this), `_timing` (interleaved timing), `_stats` (ratios and counts), `_graphs` (ONNX builds and
parity), `_corpus` (which models, and the trained weights cached outside the repository).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from vitedge.targets.coreml.coremltools_import import lean_coremltools_import

# A benchmark script is vitedge's own process, as the CLI's is: coremltools' first import skips the converters
# vitedge never calls (targets/coreml/coremltools_import.py). export_time's plain baseline imports coremltools
# itself, as a user's script does.
lean_coremltools_import()

RESULTS = Path(__file__).resolve().parent / "results"
STEP_RE = re.compile(r"^\s+(.+): ([0-9.]+) s$")  # a finished progress step, as the CLI prints it on stderr


def cli_steps(stderr: str) -> list[tuple[str, float]]:
    """(step, seconds) of every finished progress step a `vitedge` command printed on stderr."""
    return [(m.group(1), float(m.group(2))) for m in map(STEP_RE.match, stderr.splitlines()) if m]


def set_flags(overrides: dict) -> list[str]:
    """`--set KEY=VALUE` arguments for a `vitedge` command line (values as JSON, no spaces)."""
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={json.dumps(v).replace(' ', '')}")]


def parser(script: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"benchmarks/{script}.py", description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="reduced configs and a few rounds (seconds; the smoke test)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"JSON results file (default benchmarks/results/{script}.json; --quick: {script}.quick.json)")
    return p


def out_path(script: str, args: argparse.Namespace) -> Path:
    return args.out or RESULTS / (f"{script}.quick.json" if args.quick else f"{script}.json")


def cpu_model() -> str:
    """`lscpu`'s model name (platform.processor() is empty on most Linux hosts)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict:
    import onnxruntime

    cores = os.cpu_count() or 1
    return {"cpu": cpu_model(), "cores": cores, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "load_start": load_average()}


def load_note(info: dict) -> str:
    """Whether other processes were competing for the cores (1-minute load average vs core count)."""
    loads = [info.get("load_start"), info.get("load_end")]
    worst = max((lv[0] for lv in loads if lv), default=0.0)
    if worst > 0.5 * info["cores"]:
        return (f"machine busy (1-min load average up to {worst:.1f} on {info['cores']} cores): absolute timings are "
                "inflated and noisy; the interleaved ratios and their CIs are the figures to read")
    return f"machine quiet (1-min load average up to {worst:.1f} on {info['cores']} cores)"


def describe_machine(info: dict) -> str:
    return f"{info['cpu']}, {info['cores']} cores, {info['platform']}, torch {info['torch']}, ORT {info['onnxruntime']}"


def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, np.generic):
        return _finite(o.item())
    return o


def write_results(path: Path, script: str, info: dict, args: argparse.Namespace, body: dict,
                  started: float) -> Path:
    info["load_end"] = load_average()
    info["load_note"] = load_note(info)
    data = {"script": script, "quick": bool(args.quick), "machine": info, "wall_s": round(time.time() - started, 1),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), **body}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=1, allow_nan=False) + "\n")
    return path


def begin(script: str, quick: bool, threads: int | None = 1) -> tuple[float, dict]:
    """Every script's opening: its start time, torch's intra-op threads (`threads`; None leaves them), the machine
    and its load (`machine`), printed as the first line (`banner`). Returns (started, machine info)."""
    started = time.time()
    if threads is not None:
        torch.set_num_threads(threads)
    info = machine()
    banner(script, info, quick)
    return started, info


def banner(script: str, info: dict, quick: bool) -> None:
    print(f"{script}{' (--quick)' if quick else ''} on {describe_machine(info)}; "
          f"load average {info['load_start']}", flush=True)
