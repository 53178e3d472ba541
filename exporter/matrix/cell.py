"""One matrix cell, run by a worker (a local pool process or a Ray task): `vitedge export` of one model at one
size to one target and precision, parity ladder included, plus its latency with `--bench`.

Nothing raised by a cell escapes: bad input and crashes come back as status "error" with the message and
the traceback (Ctrl-C excepted), so one cell never stops the others.
"""
from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

from ..core.settings import ExportSettings
from .folders import BASE_META
from .plan import Cell
from .status import cell_status

BENCH_WARMUP_S, BENCH_MIN_ITERS, BENCH_MAX_S = 0.3, 20, 2.0


def configure_threads(threads: int) -> None:
    """Intra-op threads of this worker (torch and ONNX Runtime sessions), so workers x threads <= cores."""
    from ...targets.graph.runtime import THREADS_ENV

    os.environ[THREADS_ENV] = str(threads)
    import torch

    torch.set_num_threads(threads)


def run_cell(cell: dict, out: str, base: str | None = None, bench: bool = False) -> dict:
    """Export `cell` into the folder `out` (atomic, replaced if present). `base`: a folder holding (or to hold)
    the verified base (deploy-form, base ONNX, ground truth) shared by the cells of this model and size.

    Returns {"status", "reason", "report" (dict or None), "traceback", "seconds", "latency", "base_stored"}.
    """
    t0 = time.perf_counter()
    c = Cell.from_dict(cell)
    result = {"status": "error", "reason": None, "report": None, "traceback": None, "latency": None,
              "base_stored": False}
    try:
        report = _export(c, Path(out), Path(base) if base else None)
        result["report"] = report.to_dict()
        result["status"], result["reason"] = cell_status(result["report"], c)
        result["base_stored"] = bool(base) and (Path(base) / BASE_META).is_file()
        if bench and result["status"] == "passed":
            result["latency"] = _latency(c, report, Path(out))
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001  (SystemExit from a library, too: the other cells go on)
        from ...errors import VitedgeError

        first = (str(e).strip().splitlines() or [""])[0]
        result["reason"] = first if isinstance(e, VitedgeError) else f"{type(e).__name__}: {first}"
        result["traceback"] = traceback.format_exc()
    result["seconds"] = round(time.perf_counter() - t0, 3)
    return result


def _export(c: Cell, out: Path, base: Path | None):
    from ..flow.pipeline import export
    from ..core.progress import QUIET

    return export(cell_settings(c, out), progress=QUIET, base_store=_base_store(base))


def cell_settings(c: Cell, out: str | Path) -> ExportSettings:
    """The export a cell runs, into the folder `out` (replaced if present): its settings, built once here."""
    return ExportSettings(model=c.model, targets=c.target, checkpoint=c.checkpoint, imgsz=c.imgsz, batch=c.batch,
                          opset=c.opset, precision=c.precision, out=out, force=True, attn_order=c.attn_order,
                          samples=c.samples, tolerances=c.tolerances or None, overrides=c.overrides,
                          options=c.options, rewrites=c.rewrites, exporter=c.exporter)


def _base_store(folder: Path | None):
    if folder is None:
        return None
    from .base_folder import FolderBaseStore

    return FolderBaseStore(folder)


def _latency(c: Cell, report, out: Path) -> dict:
    """p50 etc. of the cell's artifact on its own runtime; an emulated runtime is not a latency measurement."""
    from ...models.registry import get_spec
    from ...targets import Artifact, get_target
    from ...targets.graph.runtime import THREADS_ENV
    from ..verdict.inputs import parity_inputs
    from ..timing.latency import summarize, time_loop
    from ..core.target_plans import artifact_key

    key = artifact_key(c.hop)
    entry = report.artifacts.get(key)
    if entry is None:
        return {"p50_ms": None, "reason": f"no {key} artifact"}
    spec = get_spec(c.model)
    x = parity_inputs(c.batch, c.size, seed=1, mean=spec.mean, std=spec.std).numpy()
    with get_target(c.target).runner(Artifact(c.target, out / entry.path, c.precision)) as runner:
        runner.run(x)  # a device runner knows its mode once it has predicted
        if runner.mode != "device":
            return {"p50_ms": None, "reason": f"{runner.backend} runs {runner.mode}: not a latency measurement"}
        stats = summarize(time_loop(lambda: runner.run(x), BENCH_WARMUP_S, BENCH_MIN_ITERS, BENCH_MAX_S), c.batch)
        backend = runner.backend
    return {**stats.to_dict(), "backend": backend, "threads": int(os.environ.get(THREADS_ENV) or 0),
            "host": os.uname().nodename}
