#!/usr/bin/env python
"""The Python steps of scripts/gpu_check.sh that need more than a line (run as `python gpu_check_steps.py STEP ...`).

- `setup CHECKOUT`: what the script needs before any GPU step, checked first: `vitedge` imported from CHECKOUT
  (an editable install of the checkout the script is in: the GPU tests import its `vitedge.tests` helpers, which a
  wheel does not ship), pytest and pytest-xdist (pyproject's addopts pass `-n`), scikit-learn (the trained
  fixtures), the `vitedge` console script. Exit 2 with one line naming what is missing and the one command that installs it.
- `versions`: the software and hardware this run used, for the head of the run's log.
- `precision SIDECAR`: an engine sidecar's precision check, judged by the target's own rule
  (targets/tensorrt/precision.py `check_outcome`): exit 0 confirmed, 1 refuted, INCONCLUSIVE (the step helper's
  code for "neither a pass nor a failure") otherwise.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

INCONCLUSIVE = 10  # scripts/_steps.sh prints INCONCLUSIVE for this exit code; it fails nothing
# (import name, what pip installs it as): what the GPU check imports besides vitedge and TensorRT
NEEDED = (("pytest", "pytest"), ("xdist", "pytest-xdist"), ("sklearn", "scikit-learn"))


def fix_line(checkout: Path) -> str:
    return (f"pip install -e '{checkout}[tensorrt10,test]' (CUDA 12 driver; '[tensorrt11,test]' on CUDA 13, r580+; "
            "Python 3.14: tensorrt11 only)")


def setup(checkout: str) -> int:
    root = Path(checkout).resolve()
    missing = []
    try:
        import vitedge
        where = Path(vitedge.__file__).resolve().parent
        if where != root:
            missing.append(f"vitedge is imported from {where}, not from this checkout {root}")
        elif importlib.util.find_spec("vitedge.tests._ci") is None:
            missing.append("vitedge.tests (the GPU tests' helpers)")
    except ImportError as e:
        missing.append(f"vitedge ({e})")
    for module, package in NEEDED:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(package)
    if shutil.which("vitedge") is None:  # the export and bench steps call the console script
        missing.append("the `vitedge` command on PATH")
    if missing:
        print(f"missing: {'; '.join(missing)}. Fix: {fix_line(root)}")
        return 2
    import pytest
    print(f"vitedge from {root}; pytest {pytest.__version__}; ready")
    return 0


def _version(module: str) -> str:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "installed"))
    except Exception as e:  # noqa: BLE001 - a broken install is reported, not raised: this is a record
        return f"not importable ({type(e).__name__}: {e})"


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    return (r.stdout.strip() or r.stderr.strip() or f"exit {r.returncode}").replace("\n", " | ")


def versions() -> int:
    repo = Path(__file__).resolve().parents[1]
    lines = {
        "checkout": f"{repo} at {_run(['git', 'rev-parse', 'HEAD'], repo)}"
                    f"{' (uncommitted changes)' if _run(['git', 'status', '--porcelain'], repo) else ''}",
        "python": sys.version.split()[0], "platform": platform.platform(),
        "gpu": _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
    }
    for module in ("vitedge", "tensorrt", "torch", "cuda.bindings", "onnx", "onnxruntime", "numpy", "pytest"):
        lines[module] = _version(module)
    try:
        import torch
        lines["torch cuda"] = f"{torch.version.cuda} (available: {torch.cuda.is_available()})"
    except ImportError:
        pass
    for k, v in lines.items():
        print(f"{k}: {v}")
    return 0


def precision(sidecar: str) -> int:
    from vitedge.targets.tensorrt.precision import check_outcome
    side = json.loads(Path(sidecar).read_text())
    check = side["precision_check"]
    pinned = side.get("fp32_policy", {}).get("pinned_layers")
    print(f"{side['precision_requested']} -> {side['precision_built']}: {check['status']} ({check['evidence']}): "
          f"{check['reason']}; fp32 island nodes verified: {pinned}; built from {side['source_onnx']['file']}")
    return {"pass": 0, "fail": 1}.get(check_outcome(check), INCONCLUSIVE)


def main(argv: list[str]) -> int:
    steps = {"setup": setup, "versions": versions, "precision": precision}
    if not argv or argv[0] not in steps:
        print(__doc__)
        return 2
    return steps[argv[0]](*argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
