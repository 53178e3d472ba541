"""`vitedge bench --artifact PATH`: time an artifact that already exists, made by vitedge or anywhere else.

- `.onnx`: ONNX Runtime, once per execution provider asked for (`providers`: ONNX Runtime's own names, or short
  ones such as cpu, cuda, tensorrt, coreml, openvino, dml; default cpu). A provider this onnxruntime build does not
  have, or one that fails to load (ONNX Runtime then falls back to the CPU), is listed `unavailable` with the
  reason: never dropped, never timed as another.
- `.engine` / `.plan`: TensorRT through the tensorrt target (needs an NVIDIA GPU; unavailable elsewhere, with why).
- `.mlpackage`: CoreML on macOS (the target's device runner); with `device="iphone[:NAME]"`, the tethered iPhone
  (exporter/timing/device_bench.py). An emulator's speed is not a latency, so off macOS the package is `unavailable`.

Parity runs first when the artifact's vitedge metadata names its model (vitedge wrote it): the train-form is
rebuilt from the metadata (model, overrides, size; an artifact made from a checkpoint needs that `checkpoint`,
checked by sha256) and every backend is checked as `vitedge bench` checks its own, a failed one not timed. An
artifact of several sizes (Target.held_sizes: CoreML functions, ExecuTorch methods) is checked and timed entry by
entry, each at its own size; `imgsz` picks one of them.
Otherwise parity is not run and the report says why (`artifact.parity`). A compressed artifact (int8 QDQ graph,
w8 / palette / w8a8 package: `vitedge.precision`) is judged as `export` and `parity` judge it: by its kind's
profile, on the natural samples of the parity set that did not calibrate it (the ids it records), against float64
(exporter/quantize/compressed.py); never by the float32 noise rule, and never on stress samples (`artifact.compressed_inputs`
says which were judged).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import onnx

from ...errors import VitedgeError
from ...precisions import HALF, TABLE as PRECISION_TABLE, compressed_names
from ...targets import Artifact, row_of, usable_target
from ...targets.base import Runner, UnavailableError, sha256_file
from ...targets.graph.runtime import OnnxRuntimeRunner
from .bench import PARITY_SAMPLES, check_parity, check_settings, gate, machine_info, time_backends
from .bench_report import BackendResult, BenchReport
from ...targets.labels import labels_of
from ..verdict.predictions import predictions
from ..quantize.compressed import JudgedSamples, judge_compressed
from ..reparam.build_forms import build_train_form
from ..verdict.hops import parity_inputs_for
from ..verdict.inputs import parity_inputs
from ..verdict.parity import FLOAT64_TOLERANCES, ground_truth, profile_for, tolerances, with_fp16_reference
from ..core.settings import ExportSettings
from ..flow.artifact_files import ArtifactFile, read_artifact, sizes_to_check
from ...models.input_size import as_hw
from ..flow.verify import check_checkpoint, check_class_count, recorded_calibration_ids

DEFAULT_PROVIDERS = ("cpu",)
_ALIASES = {"directml": "DmlExecutionProvider", "trt": "TensorrtExecutionProvider"}
_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.DOUBLE: np.float64,
       onnx.TensorProto.INT64: np.int64, onnx.TensorProto.INT32: np.int32, onnx.TensorProto.UINT8: np.uint8,
       onnx.TensorProto.INT8: np.int8, onnx.TensorProto.BOOL: np.bool_}


# ---- ONNX Runtime execution providers ------------------------------------------------------------------

def provider_names() -> dict[str, str]:
    """Short name -> ONNX Runtime execution provider, for every provider ONNX Runtime knows (installed or not):
    `cuda` -> CUDAExecutionProvider, `tensorrt` -> TensorrtExecutionProvider, `coreml`, `openvino`, `dml`, ..."""
    import onnxruntime as ort

    names = {p[:-len("ExecutionProvider")].lower(): p for p in ort.get_all_providers()}
    return {**names, **{k: v for k, v in _ALIASES.items() if v in names.values()}}


def parse_providers(spec: str | list | None) -> list[str]:
    """`cpu,cuda` (or ONNX Runtime's own names) -> execution provider names; unknown ones are a usage error."""
    items = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec or DEFAULT_PROVIDERS)
             if p.strip()]
    known = provider_names()
    out = []
    for p in items:
        ep = known.get(p.lower()) or (p if p in known.values() else None)
        if ep is None:
            raise VitedgeError(f"--providers: unknown ONNX Runtime execution provider {p!r}; use {', '.join(known)} "
                               "(or a full name such as CUDAExecutionProvider)")
        out.append(ep)
    if not out:
        raise VitedgeError("--providers takes a comma list such as cpu,cuda")
    return list(dict.fromkeys(out))


def short_name(ep: str) -> str:
    return ep[:-len("ExecutionProvider")].lower() if ep.endswith("ExecutionProvider") else ep


def provider_runner(path: Path, ep: str, threads: int, spinning: bool | None) -> Runner:
    """An ONNX Runtime session on `ep` alone; UnavailableError (with why) when this build lacks the provider or
    the session would run on another one."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    if ep not in available:
        raise UnavailableError(f"{ep} is not in this ONNX Runtime build (onnxruntime {ort.__version__} has "
                               f"{', '.join(available)}); install the onnxruntime package built with it (e.g. "
                               "onnxruntime-gpu for CUDA and TensorRT)")
    try:
        runner = OnnxRuntimeRunner(path, providers=[ep], threads=threads, spinning=spinning)
    except Exception as e:  # noqa: BLE001  (a provider that cannot start is a fact about this machine)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise UnavailableError(f"{ep} could not create a session here: {type(e).__name__}: {first}") from None
    used = runner.session.get_providers()
    if used[0] != ep:
        runner.close()
        raise UnavailableError(f"{ep} did not load here: ONNX Runtime fell back to {used[0]}")
    return runner


def onnx_input(model: onnx.ModelProto, batch: int | None, imgsz: int | None) -> tuple[tuple, type]:
    """The shape and dtype of the graph's one input: a symbolic first axis takes `batch` (default 1), other
    symbolic axes of an NCHW input take `imgsz`."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise VitedgeError(f"bench --artifact times single-input graphs; this one has inputs "
                           f"{', '.join(i.name for i in inputs) or 'none'}")
    t = inputs[0].type.tensor_type
    shape = []
    for axis, d in enumerate(t.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(d.dim_value)
        elif axis == 0:
            shape.append(batch or 1)
        elif imgsz is not None and len(t.shape.dim) == 4 and axis >= 2:
            shape.append(imgsz)
        else:
            raise VitedgeError(f"input {inputs[0].name!r} has a symbolic axis {axis} ({d.dim_param or '?'}); pass "
                               "--imgsz to size it")
    if t.elem_type not in _NP:
        raise VitedgeError(f"input {inputs[0].name!r} has an element type bench --artifact cannot feed "
                           f"({onnx.TensorProto.DataType.Name(t.elem_type)})")
    return tuple(shape), _NP[t.elem_type]


# ---- the bench -----------------------------------------------------------------------------------------

class _Plan:
    """What one artifact bench does: the backends (name -> runner factory), the train-form for parity (or why
    none), the input batch to time."""

    def __init__(self, path: Path, kind: str, meta: dict, model: onnx.ModelProto | None):
        self.path, self.kind, self.meta, self.graph = path, kind, meta, model
        self.backends: dict[str, Callable[[], Runner]] = {}
        self.train = None
        self.no_parity: str | None = None
        self.imgsz = 0
        self.inputs = None                  # the parity set (inputs.ParitySet) when parity runs
        self.x: np.ndarray | None = None    # its inputs (normalized NCHW)
        self.xb: np.ndarray | None = None   # the batch that is timed
        precision = meta.get("precision")
        # the parity tolerance profile: fp32 / fp16, or a compressed kind's (judged on `judged`)
        self.precision = precision if precision in PRECISION_TABLE else None
        self.judged: JudgedSamples | None = None   # a compressed artifact's judged samples (natural, not calibration)
        self.entry: str | None = None       # the function / method timed, of an artifact holding several sizes


def bench_artifact(path: str | Path, *, providers=None, checkpoint: str | Path | None = None,
                   model: str | None = None, batch: int | None = None, imgsz: int | None = None, threads: int = 1,
                   warmup_s: float = 0.5, min_iters: int = 50, max_s: float = 5.0, baseline: str | None = None,
                   max_regression: float | None = None, ort_spinning: bool | None = None, device: str | None = None,
                   team_id: str | None = None, device_runner: Callable | None = None,
                   log: Callable[[str], None] = lambda s: None, bundle_id: str | None = None) -> BenchReport:
    """Time the artifact at `path` (see the module docstring); returns the BenchReport (`artifact` says what was
    timed and whether parity ran). `model`, given, must be the one the artifact's metadata names."""
    path = Path(path)
    if not path.exists():
        raise VitedgeError(f"--artifact {path} not found; check the path")
    tname, graph, meta = read_artifact(path, None)
    base_p50 = check_settings(batch or 1, threads, warmup_s, min_iters, max_s, baseline, max_regression)
    row = row_of(tname)
    if providers is not None and not row.onnx_graph:
        raise VitedgeError(f"--providers chooses ONNX Runtime execution providers for an .onnx artifact; {path} is "
                           f"a {tname} artifact: drop --providers")
    eps = parse_providers(providers) if row.onnx_graph else []
    phone = None
    if device is not None:
        from .device_bench import connect
        phone = connect(device, team_id, bundle_id, row)  # the artifact's target must time on that device kind
    if model is not None and meta.get("model") not in (None, model):
        raise VitedgeError(f"{path} holds {meta['model']}, not {model}; drop --model or pass --model {meta['model']}")
    if model is not None and not meta.get("model"):
        raise VitedgeError(f"{path} carries no vitedge metadata, so its parity cannot be checked against {model}; "
                           "drop --model to time it without parity")

    held = _held_entries(path, tname, graph, meta, imgsz)  # [(function / method, size)] of a multi-size artifact
    plans = []
    for entry, size in held or [(None, None)]:
        plan = _Plan(path, tname, meta, graph)
        plan.entry = entry
        _parity_source(plan, checkpoint, imgsz, at=size)
        _backends(plan, eps, batch, None if entry else imgsz, threads, ort_spinning)
        plans.append(plan)
    plan = plans[0]
    labels = labels_of(meta)
    report = BenchReport(model=meta.get("model") or path.name, weights=meta.get("weights") or "unknown",
                         batch=batch or 1, threads=threads, sizes=[p.imgsz for p in plans], baseline=baseline,
                         machine=machine_info(),
                         settings={"warmup_s": warmup_s, "min_iters": min_iters, "max_s": max_s,
                                   "parity_samples": PARITY_SAMPLES if plan.train is not None else 0,
                                   "ort_spinning": {None: "default", True: "on", False: "off"}[ort_spinning],
                                   "providers": eps},
                         artifact={"path": str(path), "format": row.format,
                                   "sha256": sha256_file(path) if path.is_file() else None,
                                   "model": meta.get("model"), "metadata": bool(meta),
                                   "exporter": meta.get("exporter"), "labels": len(labels) if labels else None,
                                   "parity": "run" if plan.train is not None else "not run",
                                   "parity_reason": plan.no_parity})
    if held:  # each function / method is timed at its own size, one result per entry
        report.artifact["entries"] = {p.entry: list(as_hw(p.imgsz)) for p in plans}
    log(f"{path.name}: {', '.join(plan.backends) or 'no host backend'}; parity "
        + ("first, against the train-form" if plan.train is not None else f"not run: {plan.no_parity}")
        + (f"; {len(plans)} sizes, one entry each" if held else ""))
    results = []
    for plan in plans:
        results += _bench_plan(plan, report, labels, batch, warmup_s, min_iters, max_s)
    report.results = results
    if phone is not None:
        report.device = _on_phone(plans[0], phone, min_iters, log, device_runner, bundle_id)
    return gate(report, base_p50, max_regression)


def _held_entries(path: Path, tname: str, graph: onnx.ModelProto | None, meta: dict, imgsz) -> list:
    """[(entry, size)] for an artifact holding several sizes (Target.held_sizes), the sizes `imgsz` picks (all when
    None, as `vitedge parity` picks them: artifact_files.sizes_to_check); [] for a one-size artifact."""
    f = ArtifactFile.of(path, tname, graph, meta)  # as the caller read it: no second read
    if not f.entries:
        return []
    jobs = sizes_to_check([f], ExportSettings(imgsz=None if imgsz is None else (as_hw(imgsz),)), meta.get("imgsz"))
    return [(entry, size) for size, files in jobs.items() for _, entry in files]


def _bench_plan(plan: _Plan, report: BenchReport, labels, batch: int | None, warmup_s: float, min_iters: int,
                max_s: float) -> list[BackendResult]:
    """Parity, then timing, of every backend of one plan (one size of the artifact)."""
    results, runners = [], {}
    with contextlib.ExitStack() as stack:
        truth = _ground_truth(plan)
        if truth is not None and plan.precision in compressed_names():
            plan.judged = JudgedSamples.build(plan.train, plan.inputs, recorded_calibration_ids(plan.meta), truth=truth)
            report.artifact["compressed_inputs"] = plan.judged.describe(
                f"{PARITY_SAMPLES} samples", ", without the calibration ids the artifact records")
        for name, make in plan.backends.items():
            t0 = time.perf_counter()
            try:
                runner = stack.enter_context(make())
            except UnavailableError as e:
                results.append(BackendResult(name, plan.imgsz, "unavailable", reason=str(e)))
                continue
            res = BackendResult(name, plan.imgsz, "ok", mode=runner.mode, load_s=round(time.perf_counter() - t0, 4))
            if plan.train is None:
                res.reason = f"parity not run: {plan.no_parity}"
            else:
                _check(plan, res, runner, truth)
                if labels and res.status == "ok":
                    res.predictions = predictions(runner, plan.x, truth.y64.astype(np.float32), labels)
            results.append(res)
            runners[name] = (runner, res)
        time_backends(runners, plan.xb, batch or 1, warmup_s, min_iters, max_s)
    return results


def _check(plan: _Plan, res: BackendResult, runner: Runner, truth) -> None:
    """Parity of one backend before it is timed: a compressed artifact by its kind's profile on the judged samples,
    any other as `vitedge bench` checks its own backends."""
    if plan.judged is None:
        check_parity(res, runner, plan.inputs, truth, plan.precision)
        return
    res.precision = plan.precision
    try:
        hop = judge_compressed(res.backend, runner, plan.judged,
                               tolerances(None, FLOAT64_TOLERANCES)[profile_for(plan.precision)], plan.precision)
    except Exception as e:  # a backend that crashes on the parity inputs has failed parity
        res.status, res.reason = "failed", f"parity failed: {type(e).__name__}: {e}"
        return
    res.parity = asdict(hop.metrics) if hop.metrics is not None else None
    res.parity_sets = hop.sets
    if hop.status != "passed":
        res.status, res.reason = "failed", f"parity failed: {hop.reason}"


def _parity_source(plan: _Plan, checkpoint, imgsz: int | None, at=None) -> None:
    """The train-form to check against, from the artifact's metadata (or why there is none); `at`: the size of the
    entry timed (a multi-size artifact), else the size the artifact records."""
    meta = plan.meta
    if not meta.get("model"):
        plan.no_parity = (f"{plan.path.name} carries no vitedge metadata naming its model (vitedge.model), so there "
                          "is no train-form to compare it with")
        return
    check_checkpoint(plan.path, meta, checkpoint)
    loaded = build_train_form(meta["model"], checkpoint, meta.get("overrides") or {})
    check_checkpoint(plan.path, meta, checkpoint, loaded.checkpoint_sha256)
    check_class_count(plan.path, plan.graph, meta, loaded.model, checkpoint)
    if at is None and imgsz is not None and meta.get("imgsz") not in (None, imgsz):
        raise VitedgeError(f"{plan.path} was exported for imgsz {meta['imgsz']}; drop --imgsz")
    plan.train = loaded.model.eval()
    plan.imgsz = loaded.at_size(at if at is not None else meta.get("imgsz"))


def _backends(plan: _Plan, eps: list[str], batch: int | None, imgsz: int | None, threads: int,
              spinning: bool | None) -> None:
    """The runner factories and the timed batch of the artifact's kind."""
    if plan.graph is not None:  # a plain ONNX graph: ONNX Runtime, per execution provider
        shape, dtype = onnx_input(plan.graph, batch, imgsz or plan.imgsz or None)
        plan.imgsz = plan.imgsz or (shape[-1] if len(shape) == 4 else 0)
        plan.xb = (np.random.default_rng(99).standard_normal(shape) if np.issubdtype(dtype, np.floating)
                   else np.zeros(shape)).astype(dtype)
        for ep in eps:
            plan.backends[f"onnxruntime-{short_name(ep)}"] = (
                lambda ep=ep: provider_runner(plan.path, ep, threads, spinning))
    else:
        if not plan.imgsz:
            plan.imgsz = imgsz or plan.meta.get("imgsz") or 0
            if not plan.imgsz:
                raise VitedgeError(f"{plan.path} does not say its input size; pass --imgsz")
        plan.xb = parity_inputs(batch or 1, plan.imgsz, seed=99).numpy()
        plan.backends[plan.kind] = lambda: _target_runner(plan, threads)
    if plan.train is not None:
        plan.inputs = parity_inputs_for(plan.train, plan.imgsz, PARITY_SAMPLES)
        plan.x = plan.inputs.numpy()
        if plan.xb.shape[1:] != plan.x.shape[1:]:
            raise VitedgeError(f"{plan.path}'s input {tuple(plan.xb.shape)} does not take {plan.imgsz}px images")


def _target_runner(plan: _Plan, threads: int | None = None) -> Runner:
    """TensorRT, CoreML or ExecuTorch on the target's own runtime ("device"); UnavailableError where it cannot run
    here. `threads`: ExecuTorch's XNNPACK pool (--threads, as for ONNX Runtime)."""
    target = usable_target(plan.kind, lowers=False)
    precision = plan.meta.get("precision") or target.default_precision
    runner = target.runner(Artifact(plan.kind, plan.path, precision, entry=plan.entry), mode="device",
                           **({"threads": threads} if target.threaded else {}))
    runner.precision = precision  # its parity's tolerance profile (bench.runner_precision)
    return runner


def _ground_truth(plan: _Plan):
    """The train-form's float64 ground truth on the parity set (criteria.GroundTruth), None without a train-form."""
    if plan.train is None:
        return None
    truth = ground_truth(plan.train, plan.x, plan.inputs.sets, plan.inputs.labels_array())
    # the fp16 rule's reference: the train-form rounded to fp16 (no deploy-form is built for an artifact's bench)
    half = plan.precision in PRECISION_TABLE and PRECISION_TABLE[plan.precision].kind == HALF
    return with_fp16_reference(truth, plan.train, plan.x) if half else truth


def _on_phone(plan: _Plan, phone, iterations: int, log: Callable[[str], None],
              device_runner: Callable | None, bundle_id: str | None = None) -> dict:
    from .device_bench import phone_section, time_package

    section = phone_section(phone)
    log(f"{phone.bench.kind} {section['name']}: timing load and predict of {plan.path.name} on the device")
    time_package(section, phone, plan.path, plan.imgsz, plan.train, iterations, device_runner,
                 plan.no_parity, bundle_id=bundle_id)
    return section
