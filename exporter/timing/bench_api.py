"""`vitedge.bench()`: the `vitedge bench` command as one call, for a model (bench.py) or an existing artifact
(bench_artifact.py), writing the same report JSON and plot the command writes."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from ...errors import VitedgeError
from .bench import DEFAULT_BACKENDS, run_bench
from .bench_artifact import bench_artifact
from .bench_report import BenchReport, require_matplotlib, write_plot
from ..core.settings import ExportSettings
from ..core.writable import check_file_path


# the settings a bench reads (the rest shape an export, and are refused rather than ignored)
BENCH_SETTINGS = ("model", "checkpoint", "imgsz", "batch", "attn_order", "overrides", "rewrites", "exporter", "labels",
                  "images")


def bench(model=None, *, artifact: str | Path | None = None, providers=None, backends=None, threads: int = 1,
          warmup_s: float = 0.5, min_iters: int = 50, max_s: float = 5.0, baseline: str | None = None,
          max_regression: float | None = None, order: str = "auto", ort_spinning: bool | None = None,
          device: str | None = None, team_id: str | None = None, bundle_id: str | None = None,
          input: str | None = None, report_path: str | Path | None = None, plot: str | Path | None = None,
          log: Callable[[str], None] | None = None, **settings) -> BenchReport:
    """`vitedge bench`: latency per backend and size, each backend parity-checked before it is timed.

    `model` is an ExportSettings (exporter/core/settings.py) or the model name, with the settings a bench reads as
    keywords (BENCH_SETTINGS: checkpoint, imgsz, batch, attn_order, overrides, rewrites, exporter, labels, images),
    as for `export`; the other keywords are the bench's own.

    With `model`: the train-form, deploy-form and their exports on `backends` (default torch, torch-deploy,
    onnxruntime) at each size of `imgsz` (sizes, or a comma list). With `artifact`: an existing `.onnx` (on each
    ONNX Runtime execution provider of `providers`, default cpu), `.engine` or `.mlpackage`; parity runs first when
    its vitedge metadata names the model (`model`, given too, must match it). `device="iphone[:NAME]"` also times on
    a tethered iPhone (`input`, `labels`: its package; `team_id` / `bundle_id`: the model-runner app's signing).
    `images` / `labels`: the parity check of a model bench runs on the user's image folder (plus a small stress
    set); class names in index order. `report_path` / `plot`: where to write the report JSON and the latency plot
    (the plot needs `vitedge[plot]`, checked before any work). Returns the BenchReport; its `exit_code` is 1 for a
    p50 regression beyond `max_regression` against `baseline` or a failed parity on the phone, else 0. Bad input
    raises VitedgeError (the CLI's exit 2).
    """
    check_file_path(report_path, "--report")  # written after the timing: a bad path is known now
    check_file_path(plot, "--plot")
    s = ExportSettings.build(model, settings, "bench")
    s.only(BENCH_SETTINGS, "bench")
    model, sizes, attn_order = s.model, s.sizes(), s.attn_order or "auto"
    if plot is not None:
        require_matplotlib()
    if bundle_id is not None and device is None:
        raise VitedgeError("--bundle-id names the phone's model-runner app: it goes with --device iphone[:NAME]")
    log = log or (lambda _: None)
    common = dict(threads=threads, warmup_s=warmup_s, min_iters=min_iters, max_s=max_s, baseline=baseline,
                  max_regression=max_regression, ort_spinning=ort_spinning, device=device, team_id=team_id,
                  bundle_id=bundle_id, log=log)
    if artifact is not None:
        model_only = {"--backends": backends is not None, "--order": order != "auto",
                      "--attn-order": attn_order != "auto", "--set": bool(s.overrides),
                      "--rewrites": s.rewrites is not True, "--exporter": s.exporter is not None,
                      "--input": input is not None, "--labels": s.labels is not None, "--images": s.images is not None}
        given = [flag for flag, on in model_only.items() if on]
        if given:
            raise VitedgeError(f"{', '.join(given)} shape{'s' if len(given) == 1 else ''} the artifacts a model bench "
                               f"builds; with --artifact the artifact is timed as it is: drop {given[0]}")
        if sizes is not None and len(sizes) > 1:
            raise VitedgeError(f"--imgsz with --artifact is one size (the artifact's input); got "
                               f"{','.join(map(str, sizes))}")
        report = bench_artifact(artifact, providers=providers, checkpoint=s.checkpoint, model=model, batch=s.batch,
                                imgsz=sizes[0] if sizes else None, **common)
    else:
        if model is None:
            raise VitedgeError("vitedge bench needs --model NAME (a model to export and time) or --artifact PATH "
                               "(an existing .onnx, .engine or .mlpackage)")
        if providers is not None:
            raise VitedgeError("--providers chooses ONNX Runtime execution providers for an --artifact .onnx; a model "
                               "bench runs ONNX Runtime on the CPU (backend onnxruntime): drop --providers")
        extra = {"exporter": s.exporter} if s.exporter is not None else {}
        report = run_bench(model, checkpoint=s.checkpoint, backends=backends or ",".join(DEFAULT_BACKENDS),
                           imgsz=sizes, batch=s.batch or 1, order=order, attn_order=attn_order, overrides=s.overrides,
                           rewrites=s.rewrites, coreml_options={"input": input}, images=s.images, labels=s.labels,
                           **common, **extra)
    if report_path is not None:
        os.makedirs(os.path.dirname(os.path.abspath(report_path)), exist_ok=True)
        with open(report_path, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if plot is not None:
        write_plot(report, plot)
    return report
