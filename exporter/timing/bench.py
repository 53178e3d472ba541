"""The latency harness behind `vitedge bench`: measured, paired, parity-checked, with a regression gate.

Per size, every available backend is built (its load/compile time measured), checked against the
train-form's float64 ground truth on parity inputs (the per-sample noise rule, as the export ladder judges its
hops; `--images` replaces the default inputs with the user's), then all passing backends are timed *interleaved* in rounds, so the
train-form / deploy-form ratio (the re-parameterization speedup) is a paired measurement with a
bootstrap confidence interval. A backend that fails parity is reported as failed and its latency is
marked invalid; a backend that cannot run here is listed as unavailable with the reason.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...targets import LowerSpec, row_of, rows, usable_target
from ...targets.rows import ONNX
from ...targets.base import Runner, UnavailableError
from ...targets.graph.runtime import OnnxRuntimeRunner
from ...targets.pytorch import TorchRunner
from . import latency
from ..core.settings import ExportSettings
from ..reparam.build_forms import build_deploy_form, build_train_form
from .bench_report import BackendResult, BenchReport
from ..verdict.criteria import GroundTruth, reference_block
from ...targets.labels import class_names
from ..verdict.hops import check_images, parity_inputs_for
from ..verdict.inputs import ParitySet, parity_inputs
from ..onnx.onnx_export import DEFAULT_EXPORTER, check_exporter, check_onnx, export_onnx_info, save_onnx, simplify_onnx
from ..verdict.parity import (FLOAT64_TOLERANCES, check_hop, ground_truth, profile_for, tolerances as make_tolerances,
                              with_fp16_reference)

TORCH_BACKENDS, ORT = ("torch", "torch-deploy"), "onnxruntime"  # torch's train/deploy-form; the bench's own ORT


def backend_table() -> dict[str, str]:
    """Bench backend -> the target it times (the rows' `bench` names; "" for torch)."""
    return {**{b: "" for b in TORCH_BACKENDS}, **{r.bench: r.name for r in rows() if r.bench}}


BACKENDS = tuple(backend_table())  # as registered at import; parse_backends reads the table again
DEFAULT_BACKENDS = ("torch", "torch-deploy", "onnxruntime")
PARITY_SAMPLES = 8
ORDER_BACKENDS = ("torch-deploy", "onnxruntime")  # where `--order measured` can time both orders
RUNTIME = {"torch": "torch", "torch-deploy": "torch"}  # backends timed in the same interleaved rounds


def machine_info() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__}


# ---- backends ---------------------------------------------------------------------------------------

def _onnx(deploy: nn.Module, imgsz: int, batch: int, exporter: str):
    """(the simplified graph, how it was exported: OnnxExport.info())."""
    exported = export_onnx_info(deploy, imgsz, batch=batch, exporter=exporter)
    return simplify_onnx(check_onnx(exported.model)), exported.info()


def _ort_runner(deploy: nn.Module, imgsz: int, batch: int, threads: int, spinning: bool | None = None,
                exporter: str = DEFAULT_EXPORTER) -> Runner:
    model, exported = _onnx(deploy, imgsz, batch, exporter)
    runner = OnnxRuntimeRunner(model, threads=threads, spinning=spinning)
    runner.onnx_export = exported  # BackendResult.export
    return runner


def _target_runner(name: str, deploy: nn.Module, imgsz: int, batch: int, tmp: Path,
                   exporter: str = DEFAULT_EXPORTER, threads: int | None = None) -> Runner:
    """A target's artifact on its own runtime (UnavailableError, with why, where it cannot run); `threads`: a
    threaded runner's pool (the bench's --threads, as for ONNX Runtime). One from ONNX is built from the graph."""
    target = usable_target(name)
    onnx_path, exported = None, None
    if row_of(name).source == ONNX:
        model, exported = _onnx(deploy, imgsz, batch, exporter)
        onnx_path = save_onnx(model, tmp / "bench.onnx")
    spec = LowerSpec(name="bench", imgsz=imgsz, batch=batch, precision=target.default_precision, out_dir=tmp,
                     onnx_path=onnx_path)
    artifact = target.lower(deploy, spec)
    runner = target.runner(artifact, **({"threads": threads} if target.threaded else {}))
    runner.precision = artifact.precision  # the precision truth its parity is judged by (runner_precision)
    if runner.mode not in ("device", None):  # an emulator's speed says nothing of the device: never timed as one
        runner.close()  # (a device runner says "device" once it has predicted)
        raise UnavailableError(f"{name} runs only {runner.mode} here ({runner.backend}); no device to time")
    runner.onnx_export = exported
    return runner


def build_runner(backend: str, train: nn.Module, deploy: nn.Module, imgsz: int, batch: int, threads: int,
                 tmp: Path, spinning: bool | None = None, exporter: str = DEFAULT_EXPORTER) -> Runner:
    if backend == "torch":
        return TorchRunner(train, "train-form")
    if backend == "torch-deploy":
        return TorchRunner(deploy, "deploy-form")
    if backend == ORT:
        return _ort_runner(deploy, imgsz, batch, threads, spinning, exporter)
    table = backend_table()
    if table.get(backend):
        return _target_runner(table[backend], deploy, imgsz, batch, tmp, exporter, threads)
    raise VitedgeError(f"unknown backend {backend!r}; use one of {', '.join(table)}")


def parse_backends(spec: str | list) -> list[str]:
    names = [b.strip() for b in (spec.split(",") if isinstance(spec, str) else spec) if b.strip()]
    table = backend_table()
    bad = [b for b in names if b not in table]
    if bad or not names:
        raise VitedgeError(f"--backends takes a comma list of {', '.join(table)}; got {spec!r}")
    return list(dict.fromkeys(names))


# ---- the harness --------------------------------------------------------------------------------------

def runner_precision(runner: Runner, precision: str | None = None) -> str:
    """The precision whose tolerance profile judges `runner`: the artifact's recorded precision (`precision`, or
    the `precision` its target lowered it in, set on the runner when it was built); fp32 for a runner without
    one (torch, ONNX Runtime on the fp32 graph). Never guessed from the backend's name: "tensorrt 10.13 (GPU)"
    says nothing about an engine built in fp16."""
    return precision or getattr(runner, "precision", None) or "fp32"


def _tolerance_for(runner: Runner, precision: str | None = None):
    return make_tolerances(None, FLOAT64_TOLERANCES)[profile_for(runner_precision(runner, precision))]


def _parity(runner: Runner, inputs: ParitySet, truth: GroundTruth,
            precision: str | None = None) -> tuple[dict, dict, list[str]]:
    """(metrics vs float64, per-set details, problems) of one backend: the export ladder's hop check."""
    hop = check_hop(runner.backend or "bench", runner, inputs.numpy(), None, _tolerance_for(runner, precision),
                    truth=truth, names=inputs.names)
    return asdict(hop.metrics) if hop.metrics is not None else None, hop.sets, [hop.reason] if hop.reason else []


def _fresh_input(imgsz: int, batch: int) -> np.ndarray:
    return parity_inputs(batch, imgsz, seed=99).numpy()


def check_parity(res: BackendResult, runner: Runner, inputs: ParitySet, truth: GroundTruth,
                 precision: str | None = None) -> None:
    """Parity of one backend before it is timed (`precision`: the artifact's, default `runner_precision`): one
    that fails (or crashes on the inputs) is `failed`, and its latency is never measured as if it were right."""
    res.precision = runner_precision(runner, precision)
    try:
        res.parity, res.parity_sets, problems = _parity(runner, inputs, truth, precision)
    except Exception as e:  # a backend that crashes on the parity inputs has failed parity
        res.parity, problems = None, [f"{type(e).__name__}: {e}"]
    if problems:
        res.status, res.reason = "failed", "parity failed: " + "; ".join(problems)


def time_backends(runners: dict[str, tuple[Runner, BackendResult]], xb: np.ndarray, batch: int, warmup_s: float,
                  min_iters: int, max_s: float) -> dict[str, list[float]]:
    """Time every backend whose result is still "ok" on the batch `xb`, interleaved within each runtime; fill each
    result's latency (and GPU compute time, where the runner has CUDA events). Returns the seconds per round."""
    timed = {b: rr for b, rr in runners.items() if rr[1].status == "ok"}
    times: dict[str, list[float]] = {}
    # Interleave only backends of the same runtime: a torch call right before an ONNX Runtime call slows
    # that call (measured: docs/benchmarks/index.md, method notes), so mixing runtimes in one round would bias
    # exactly the paired ratios this harness reports.
    for group in dict.fromkeys(RUNTIME.get(b, b) for b in timed):
        members = {b: rr for b, rr in timed.items() if RUNTIME.get(b, b) == group}
        fns = {b: (lambda r=r: r.run(xb)) for b, (r, _) in members.items()}
        times.update(latency.time_interleaved(fns, warmup_s=warmup_s, min_iters=min_iters, max_s=max_s))
    for b, (r, res) in timed.items():
        res.latency = latency.summarize(times[b], batch=batch).to_dict()
        res.valid = True
        if callable(getattr(r, "execute", None)) and callable(getattr(r, "prepare", None)):
            res.gpu_compute = latency.summarize(gpu_compute_times(r, xb, warmup_s, min_iters, max_s),
                                                batch=batch).to_dict()
    return times


def measure_size(name: str, train: nn.Module, make_deploy: Callable[[int], nn.Module], imgsz: int,
                 backends: list[str], batch: int, threads: int, warmup_s: float, min_iters: int, max_s: float,
                 tmp: Path, inject: dict | None = None, spinning: bool | None = None,
                 inputs: ParitySet | None = None,
                 exporter: str = DEFAULT_EXPORTER) -> tuple[list[BackendResult], list[dict], dict]:
    """Build, parity-check and time every backend at one size; also returns the train-form's reference block
    (report.json's `reference`, per size here). `inject` maps backend -> Runner (tests). `inputs`: the parity set
    at this size (default: the first PARITY_SAMPLES of the default set)."""
    inputs = inputs if inputs is not None else parity_inputs_for(train, imgsz, PARITY_SAMPLES)
    truth = ground_truth(train, inputs.numpy(), inputs.sets, inputs.labels_array(), threads64=os.cpu_count())
    deploy = make_deploy(imgsz)
    truth = with_fp16_reference(truth, deploy, inputs.numpy())  # an fp16 backend's per-sample allowance
    results, runners = [], {}
    with contextlib.ExitStack() as stack:  # every runner is closed once the size is measured
        for b in backends:
            t0 = time.perf_counter()
            try:
                runner = (inject or {}).get(b) or build_runner(b, train, deploy, imgsz, batch, threads, tmp, spinning,
                                                               exporter)
            except UnavailableError as e:
                results.append(BackendResult(b, imgsz, "unavailable", reason=str(e)))
                continue
            stack.enter_context(runner)
            load_s = time.perf_counter() - t0
            res = BackendResult(b, imgsz, "ok", mode=runner.mode, load_s=round(load_s, 4),
                                export=getattr(runner, "onnx_export", None))
            check_parity(res, runner, inputs, truth)
            results.append(res)
            runners[b] = (runner, res)
        times = time_backends(runners, _fresh_input(imgsz, batch), batch, warmup_s, min_iters, max_s)
        ratios: list[dict] = []
        if "torch" in times and "torch-deploy" in times:  # the re-parameterization speedup, paired round by round
            ratios.append({"imgsz": imgsz, "numerator": "torch", "denominator": "torch-deploy",
                           **latency.paired_ratio(times["torch"], times["torch-deploy"])})
        return results, ratios, {"imgsz": imgsz, **reference_block(truth, inputs.classes)}


def gpu_compute_times(runner, x: np.ndarray, warmup_s: float, min_iters: int, max_s: float) -> list[float]:
    """Seconds per execution of a staged batch, from the runner's CUDA events (no copies, no allocation)."""
    runner.prepare(x)
    t_end = time.perf_counter() + warmup_s
    while time.perf_counter() < t_end:
        runner.execute()
    out: list[float] = []
    t_end = time.perf_counter() + max_s
    while len(out) < min_iters or time.perf_counter() < t_end:
        out.append(runner.execute() / 1e3)
    return out


def _attention_modules(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if hasattr(m, "attn_order") and hasattr(m, "order_for")]


def measure_orders(train: nn.Module, make_deploy: Callable[[int, str], nn.Module], imgsz: int, backend: str,
                   batch: int, threads: int, warmup_s: float, min_iters: int, max_s: float, tmp: Path,
                   spinning: bool | None = None, exporter: str = DEFAULT_EXPORTER) -> dict:
    """Time the deploy-form with each attention order forced, interleaved; return the faster one."""
    if backend not in ORDER_BACKENDS:
        raise VitedgeError(f"--order measured times orders on {' or '.join(ORDER_BACKENDS)}; add one to --backends")
    xb = _fresh_input(imgsz, batch)
    with contextlib.ExitStack() as stack:
        runners = {o: stack.enter_context(build_runner(backend, train, make_deploy(imgsz, o), imgsz, batch, threads,
                                                       tmp, spinning, exporter)) for o in ("qk_first", "kv_first")}
        times = latency.time_interleaved({o: (lambda r=r: r.run(xb)) for o, r in runners.items()},
                                         warmup_s=warmup_s, min_iters=min_iters, max_s=max_s)
    stats = {o: latency.summarize(t, batch).to_dict() for o, t in times.items()}
    best = min(stats, key=lambda o: stats[o]["p50_ms"])
    rule = make_deploy(imgsz, "auto").reparam_summary.attention_order
    return {"imgsz": imgsz, "backend": backend, "latency": stats, "measured_best": best,
            "rule_choice": sorted(set(rule.values())), "qk_over_kv": latency.paired_ratio(times["qk_first"],
                                                                                          times["kv_first"])}


def run_bench(model: str, *, checkpoint: str | None = None, backends="torch,torch-deploy,onnxruntime",
              imgsz=None, batch: int = 1, threads: int = 1, warmup_s: float = 0.5, min_iters: int = 50,
              max_s: float = 5.0, baseline: str | None = None, max_regression: float | None = None,
              order: str = "auto", attn_order: str = "auto", overrides: dict | None = None,
              device: str | None = None, inject: dict | None = None, tmp_dir: str | Path | None = None,
              ort_spinning: bool | None = None, rewrites=True, team_id: str | None = None,
              bundle_id: str | None = None, coreml_options: dict | None = None, device_runner: Callable | None = None,
              log: Callable[[str], None] = lambda s: None, images: str | Path | None = None,
              labels: str | Path | None = None, exporter: str = DEFAULT_EXPORTER) -> BenchReport:
    """Run the harness; the report's exit_code is 1 when --baseline shows a p50 regression beyond the limit,
    or when the phone's golden-vector parity failed (`device`, with --device iphone[:NAME]).

    `imgsz`: a size or a comma list (None: the model's default size). `ort_spinning`: ONNX Runtime's intra-op
    spinning (None = its default; False helps multi-thread runs on small shared or virtual machines, see
    `OnnxRuntimeRunner`). `images` / `labels`: the parity check runs on the user's image folder (plus a small
    stress set) instead of the default inputs; class names in index order (the ImageFolder class index; with
    `device`, the phone's package is a classifier). `exporter`: the ONNX exporter of the onnxruntime and tensorrt
    backends' graphs (each result's `export` says which one wrote it)."""
    backends_l = parse_backends(backends)
    check_exporter(exporter)
    asked = ExportSettings(imgsz=imgsz)
    sizes = asked.sizes()  # S, or (H, W): as the pipeline takes it
    base_p50 = check_settings(batch, threads, warmup_s, min_iters, max_s, baseline, max_regression)
    if order not in ("auto", "measured"):
        raise VitedgeError(f"--order must be auto or measured; got {order!r}")
    phone = None
    coreml_options = {k: v for k, v in (coreml_options or {}).items() if k != "labels"} | (
        {"labels": str(labels)} if labels is not None else {})
    if device is None and coreml_options.get("input") is not None:
        raise VitedgeError("--input chooses the phone's package: it goes with --device iphone[:NAME]")
    check_images(images, labels)
    if device is not None:
        from .device_bench import connect
        phone = connect(device, team_id, bundle_id)  # VitedgeError saying what is missing (platform, tools, device)

    loaded = build_train_form(model, checkpoint=checkpoint, overrides=overrides)
    sizes = [loaded.resolve_imgsz(s) for s in (sizes or [None])]
    # --labels against the model's class count, before any work (the train-form at that size)
    class_names(labels, loaded.sized(sizes[0]), sizes[0])
    torch.set_num_threads(threads or os.cpu_count() or 1)
    train = loaded.model.eval()

    def make_deploy(size: int, forced: str | None = None) -> nn.Module:
        return build_deploy_form(train, size, attn_order=forced or attn_order, rewrites=rewrites)[0]

    report = BenchReport(model=loaded.name, weights=loaded.weights, batch=batch, threads=threads, sizes=sizes,
                         baseline=baseline, machine=machine_info(),
                         settings={"backends": backends_l, "warmup_s": warmup_s, "min_iters": min_iters,
                                   "max_s": max_s, "order": order, "attn_order": attn_order,
                                   "parity_samples": PARITY_SAMPLES, "images": None if images is None
                                   else str(images), "labels": None if labels is None else str(labels),
                                   "exporter": exporter,
                                   "ort_spinning": {None: "default", True: "on", False: "off"}[ort_spinning],
                                   "rewrites": rewrites if isinstance(rewrites, bool) else sorted(rewrites)})
    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        for s in sizes:
            log(f"imgsz {s}: building and checking {', '.join(backends_l)}")
            loaded.at_size(s)  # the reference at this size: its tables resampled, its maps padded (docs/models.md)
            pset = parity_inputs_for(train, s, PARITY_SAMPLES, images, labels)
            report.settings["parity_inputs"] = pset.note
            results, ratios, ref = measure_size(loaded.name, train, make_deploy, s, backends_l, batch, threads,
                                                warmup_s, min_iters, max_s, Path(tmp), inject, ort_spinning, pset,
                                                exporter)
            report.results += results
            report.ratios += ratios
            report.reference.append(ref)
            if order == "measured":
                if not _attention_modules(train):
                    raise VitedgeError(f"--order measured needs SLA or SimA attention; {loaded.name} has none")
                ob = next((b for b in backends_l if b in ORDER_BACKENDS), None)
                if ob is None:
                    raise VitedgeError(f"--order measured needs one of {', '.join(ORDER_BACKENDS)} in --backends")
                if (ob == "onnxruntime" and threads != 1 and ort_spinning is not False
                        and "order_note" not in report.settings):
                    note = ("the two orders' ONNX Runtime sessions alternate call by call with multi-thread pools "
                            "whose idle workers spin and compete; add --ort-spinning off (or --threads 1) for a "
                            "steadier qk/kv ratio")
                    report.settings["order_note"] = note
                    log(f"note: {note}")
                report.order.append(measure_orders(train, make_deploy, s, ob, batch, threads, warmup_s,
                                                   min_iters, max_s, Path(tmp), ort_spinning, exporter))
        if phone is not None:
            from .device_bench import run_on_phone
            report.device = run_on_phone(phone, train, make_deploy, sizes, Path(tmp), min_iters,
                                         coreml_options or {}, log, device_runner, bundle_id=bundle_id,
                                         onnx_graph=lambda deploy, s: _onnx(deploy, s, 1, exporter)[0])
    return gate(report, base_p50, max_regression)


def gate(report: BenchReport, base_p50: dict[str, float] | None, max_regression: float | None) -> BenchReport:
    """The exit code: 1 for a p50 regression beyond `max_regression` against the baseline, or a failed parity on
    the phone; else 0."""
    if base_p50 is not None:
        report.regressions = latency.regression_check(report.p50_by_key(), base_p50, max_regression)
        report.exit_code = 1 if report.regressions else 0
    if report.device and any(r["parity"]["status"] == "failed" for r in report.device["results"]):
        report.exit_code = 1
    return report


def check_settings(batch: int, threads: int, warmup_s: float, min_iters: int, max_s: float, baseline: str | None,
                   max_regression: float | None) -> dict[str, float] | None:
    """The timing settings every bench shares, checked before any work; returns the baseline's p50 per key."""
    if batch <= 0:
        raise VitedgeError(f"--batch must be >= 1; got {batch}")
    if threads < 0:
        raise VitedgeError(f"--threads must be >= 0 (0 = all cores); got {threads}")
    if min_iters <= 0 or warmup_s < 0 or max_s < 0:
        raise VitedgeError("--min-iters must be >= 1 and --warmup-s / --max-s >= 0")
    if (baseline is None) != (max_regression is None):
        raise VitedgeError("--baseline and --max-regression go together: give both or neither")
    return _read_baseline(baseline) if baseline else None


def _read_baseline(path: str) -> dict[str, float]:
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise VitedgeError(f"--baseline {p} not found; pass a report written by `vitedge bench --report`") from None
    except (OSError, json.JSONDecodeError) as e:
        raise VitedgeError(f"--baseline {p} is not a bench report JSON ({e})") from None
    try:
        return {r["key"]: r["latency"]["p50_ms"] for r in d["results"] if r.get("valid") and r.get("latency")}
    except (KeyError, TypeError):
        raise VitedgeError(f"--baseline {p} is not a bench report JSON (no results[].latency)") from None
