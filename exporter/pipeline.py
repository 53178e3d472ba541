"""The export pipeline and the parity ladder as a Python API; `vitedge export` / `vitedge parity` are thin
layers over `export()` and `parity()`, and both return the same `Report` the CLI writes.

export: validate everything -> build the train-form (checkpoint, or seeded trained-like demo weights)
-> re-parameterize -> fp64 equivalence gate -> ONNX (raw) -> onnxsim -> each requested target, with a
parity hop after each step, every hop against train-form on the documented input set. The output folder
is built in a temporary sibling and renamed into place in one step; a failed hop moves the artifacts to
DIR/quarantine/. Bad input raises VitedgeError before anything is written.
"""
from __future__ import annotations

import copy
import difflib
import inspect
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn as nn

from ..errors import VitedgeError
from ..models.registry import IMAGENET_MEAN, IMAGENET_STD, create_model
from ..targets import ALIASES, TARGETS, Artifact, LowerSpec, Runner, Target, UnavailableError, get_target
from ..targets.ort import OnnxRuntimeRunner
from ..targets.pytorch import deploy_form_runner, train_form_runner
from . import inputs as parity_set, stale
from .localize import localize_onnx, localize_torch
from .onnx_export import (DEFAULT_OPSET, OnnxExportError, check_onnx, check_opset, export_onnx, node_counts,
                          read_metadata, save_onnx, set_metadata, simplify_onnx)
from .parity import check_hop, failed, run_batched, tolerances as make_tolerances, unverified
from .progress import QUIET, Progress
from .report import ArtifactEntry, Hop, ReparamInfo, Report, sha256_file, size_bytes, versions

PRECISIONS = ("fp32", "fp16")
PARITY_SEED = 0          # the parity input set's seed (README "Parity inputs")
DEMO_SEED = 0            # trained-like demo weights when no checkpoint is given
LOCALIZE_SAMPLES = 4     # inputs used to localize a failed hop
FP16_CALIBRATION = 32    # parity inputs used for the fp16 range analysis
QUARANTINE = "quarantine"
SKIPPED = "not run: an earlier step failed"


# ---- resolving what to build (no side effects) ---------------------------------------------------

@dataclass
class TargetPlan:
    name: str
    target: Target | None
    precision: str | None
    options: dict = field(default_factory=dict)
    missing: str | None = None  # why the target's module could not be imported

    def hop(self) -> str:
        names = getattr(self.target, "hop_names", {}) if self.target else {}
        return names.get(self.precision, self.name)


def _flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def _load_target(name: str) -> tuple[Target | None, str | None]:
    try:
        return get_target(name), None
    except ImportError as e:  # its backend package or module is missing: the hop becomes "unverified"
        return None, f"target module for {name} is not available ({type(e).__name__}: {e})"


def resolve_targets(targets, precision: str | None = None, dynamic_batch: bool = False,
                    options: dict | None = None) -> list[TargetPlan]:
    """Validate the target list and every target-specific flag against the TARGETS table."""
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    names = [ALIASES.get(n.strip().lower(), n.strip().lower()) for n in names if n.strip()]
    if not names:
        raise VitedgeError(f"--target needs at least one of {', '.join(TARGETS)}")
    for n in names:
        if n not in TARGETS:
            close = difflib.get_close_matches(n, list(TARGETS) + list(ALIASES), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise VitedgeError(f"unknown target {n!r}{hint}; choose from {', '.join(TARGETS)}")
    names = list(dict.fromkeys(names))
    if precision is not None and precision not in PRECISIONS:
        raise VitedgeError(f"--precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")

    plans = []
    for n in names:
        t, missing = _load_target(n)
        plans.append(TargetPlan(n, t, None, {}, missing))
    loaded = [p for p in plans if p.target is not None]
    all_loaded = len(loaded) == len(plans)

    if precision is not None and all_loaded and not any(precision in p.target.precisions for p in loaded):
        raise VitedgeError(f"--precision {precision} is not supported by {', '.join(names)}")
    for p in plans:
        if p.target is None:
            p.precision = precision
        else:
            p.precision = precision if precision in p.target.precisions else p.target.default_precision

    if dynamic_batch:
        static = [p.name for p in loaded if not p.target.dynamic_batch]
        if static:
            raise VitedgeError(f"--dynamic-batch is not supported by {', '.join(static)} (static shapes only, e.g. to "
                               "keep the Neural Engine usable); export that target in a separate run without it")

    for key, value in (options or {}).items():
        if value is None:
            continue
        owners = [p for p in loaded if key in p.target.options]
        if not owners:
            if not all_loaded:
                continue  # the owner may be a target whose module is missing; its hop will say so
            accepting = [n for n in TARGETS if key in getattr(_load_target(n)[0], "options", ())]
            unknown = [n for n in TARGETS if _load_target(n)[0] is None]
            where = (f"it applies to {', '.join(accepting)} only" if accepting else
                     f"no available target accepts it (not importable here: {', '.join(unknown)})" if unknown else
                     "no target accepts it")
            raise VitedgeError(f"{_flag(key)} does not apply to --target {','.join(names)}: {where}")
        for p in owners:
            p.options[key] = value
    for p in loaded:  # target-specific values (e.g. a --labels file that must exist) before any work
        validate = getattr(p.target, "validate_options", None)
        if validate is not None:
            validate(p.options)
    return plans


def _model_name(model: nn.Module) -> str:
    return getattr(model, "vitedge_name", None) or type(model).__name__.lower()


def _spec(model: nn.Module):
    return getattr(model, "vitedge_spec", None)


def resolve_imgsz(model: nn.Module, imgsz: int | None) -> int:
    spec = _spec(model)
    overrides = getattr(model, "vitedge_overrides", {})
    if spec is None:
        return int(imgsz or 224)
    imgsz = int(imgsz or spec.fixed_size(overrides) or spec.default_imgsz)
    spec.check_imgsz(imgsz, overrides)
    return imgsz


def _check_out(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise VitedgeError(f"--out {out} is a file; give a folder path")
    if out.exists() and any(out.iterdir()) and not force:
        raise VitedgeError(f"{out} already holds artifacts; pass --force to replace them or choose another --out")


# ---- building the train-form and deploy-form ------------------------------------------------------

@dataclass
class Loaded:
    model: nn.Module
    name: str
    weights: str
    checkpoint_sha256: str | None
    overrides: dict


def build_train_form(model_or_name, checkpoint: str | Path | None = None, overrides: dict | None = None,
                     seed: int = DEMO_SEED) -> Loaded:
    """The train-form in eval mode: from a checkpoint, or seeded trained-like demo weights (untrained)."""
    overrides = dict(overrides or {})
    if isinstance(model_or_name, str):
        model = create_model(model_or_name, **overrides)
        weights = "untrained"
    elif isinstance(model_or_name, nn.Module):
        if overrides:
            raise VitedgeError("overrides apply to model names only; build the module with them instead")
        model, weights = model_or_name, "module"
        overrides = dict(getattr(model, "vitedge_overrides", {}))
    else:
        raise VitedgeError(f"expected a model name or an nn.Module; got {type(model_or_name).__name__}")
    sha = None
    if checkpoint is not None:
        from ..models.checkpoint import load_checkpoint

        path = Path(checkpoint)
        if not path.exists():
            raise VitedgeError(f"checkpoint {path} not found; check the --checkpoint path")
        load_checkpoint(model, path)
        weights, sha = "checkpoint", sha256_file(path)
    elif weights == "untrained":
        from ..models.trained_like import make_trained_like

        make_trained_like(model, seed)  # realistic statistics make the demo's parity meaningful
    if any(p.dtype != torch.float32 for p in model.parameters() if p.is_floating_point()):
        model = copy.deepcopy(model).float()  # the ladder's reference is the float32 train-form
    return Loaded(model.eval(), _model_name(model), weights, sha, overrides)


def build_deploy_form(model: nn.Module, imgsz: int, reparam: bool = True, attn_order: str = "auto",
                      strict_schedule: bool = False, rewrites=True) -> tuple[nn.Module, nn.Module]:
    """(deploy-form in float32, the same in float64). The engine folds in float64 and rounds once, so the
    float64 gate checks the fold itself and the float32 weights carry a single rounding."""
    if not reparam:
        deploy = copy.deepcopy(model).eval()
        deploy.reparam_imgsz = imgsz
        return deploy, copy.deepcopy(deploy).double()
    from .reparam import reparameterize

    deploy = reparameterize(model, imgsz=imgsz, attn_order=attn_order, strict_schedule=strict_schedule,
                            rewrites=rewrites)
    return deploy, deploy.__dict__.get("reparam_fp64", deploy)


def reparam_info(deploy: nn.Module, reparam: bool = True) -> ReparamInfo:
    summary = getattr(deploy, "reparam_summary", None)
    if not reparam or summary is None:
        return ReparamInfo(unfolded=[{"module": "(model)", "why": "--no-reparam: exported in train-form"}])
    d = summary.to_dict()
    return ReparamInfo(folded=d["folded"], unfolded=d["unfolded"], attention_order=d["attention_order"],
                       attention_reason=d.get("attention_reason", {}), schedule=d.get("schedule", []),
                       rewrites=d.get("rewrites", []))


def _inputs(model: nn.Module, n: int, imgsz: int) -> np.ndarray:
    spec = _spec(model)
    mean, std = (spec.mean, spec.std) if spec else (IMAGENET_MEAN, IMAGENET_STD)
    return parity_set.parity_inputs(n, imgsz, seed=PARITY_SEED, mean=mean, std=std).numpy()


def _inputs_note(n: int) -> str:
    return (f"vitedge.exporter.inputs.parity_inputs(n={n}, seed={PARITY_SEED}): "
            f"{', '.join(parity_set.CATEGORIES)} (cycled)")


def _metadata(loaded: Loaded, imgsz: int, batch: int | None, attn_order: str, info: ReparamInfo,
              vers: dict) -> dict:
    spec = _spec(loaded.model)
    mean, std = (spec.mean, spec.std) if spec else (IMAGENET_MEAN, IMAGENET_STD)
    return {"model": loaded.name, "imgsz": imgsz, "batch": batch if batch else "dynamic", "mean": list(mean),
            "std": list(std), "input": "image: float32 NCHW, RGB, normalized with mean/std", "output": "logits",
            "weights": loaded.weights, "checkpoint_sha256": loaded.checkpoint_sha256, "overrides": loaded.overrides,
            "attn_order": attn_order, "precision": "fp32",
            "reparam": {"folded": info.folded, "unfolded": info.unfolded, "attention_order": info.attention_order},
            "versions": vers}


def _localize_onnx_hop(hop: Hop, model: onnx.ModelProto, deploy: nn.Module, x: np.ndarray,
                       progress: Progress) -> None:
    with progress.step(f"localizing the {hop.hop} divergence"):
        try:
            div = localize_onnx(model, deploy, x[:LOCALIZE_SAMPLES], hop.tolerance)
        except Exception as e:  # localization is a diagnosis aid: never mask the hop's own failure
            hop.reason = f"{hop.reason}; localization failed ({type(e).__name__}: {e})"
            return
    if div is not None:
        hop.diverging_module = div.module
        hop.reason = f"{hop.reason}; {div.describe()}"
    else:
        hop.reason = (f"{hop.reason}; no module's output diverges beyond the tolerance and its own float32 noise: "
                      "accumulated rounding rather than one broken op")


def _artifact_hop(hop_name: str, target: Target, artifact: Artifact, deploy: nn.Module, x: np.ndarray,
                  reference: np.ndarray, tol, progress: Progress, mode: str | None = None,
                  on_runner=None, require_ane: bool = False) -> Hop:
    """Run a built artifact through its target's runner on the parity set (unverified where it cannot run)."""
    ok, why = target.runnable()
    if not ok:
        return unverified(hop_name, target.name, f"cannot run here: {why}", tol)
    takes_mode = "mode" in inspect.signature(target.runner).parameters
    try:
        runner = target.runner(artifact, **({"mode": mode} if mode and takes_mode else {}))
    except UnavailableError as e:
        return unverified(hop_name, target.name, f"cannot run here{f' in {mode} mode' if mode else ''}: {e}", tol)
    except Exception as e:
        return failed(hop_name, target.name, f"could not load the artifact: {type(e).__name__}: {e}", tolerance=tol)
    if mode and runner.mode != mode:
        return unverified(hop_name, runner.backend, f"--mode {mode} requested, but {target.name} runs here in "
                                                    f"{runner.mode} mode only", tol)
    if on_runner is not None:
        on_runner(runner)
    with progress.step(f"{hop_name} hop ({runner.backend})"):
        hop = check_hop(hop_name, runner, x, reference, tol)
    if require_ane and target.name == "coreml":
        _ane_check(hop, runner)
    if hop.status == "failed" and Path(artifact.path).suffix == ".onnx":
        _localize_onnx_hop(hop, onnx.load(str(artifact.path)), deploy, x, progress)
    return hop


def _ane_check(hop: Hop, runner: Runner) -> None:
    """--require-ane: a CoreML device hop fails when the model mostly runs off the Neural Engine; where that
    cannot be told (no Neural Engine, no compute plan, not run on CoreML) the check is inconclusive."""
    check = getattr(runner, "ane_residency", None)
    if runner.mode == "device" and callable(check):
        res = check()
    else:
        res = {"status": "inconclusive", "reason": f"the hop ran {runner.mode or 'nowhere'}, not on CoreML itself: "
                                                   "where ops run is known only on macOS (--mode device)"}
    hop.ane_residency = res
    if res["status"] == "failed" and hop.status == "passed":
        hop.status, hop.reason = "failed", f"--require-ane: {res['reason']}"


# ---- export ---------------------------------------------------------------------------------------

def export(model_or_name, targets="onnx", *, checkpoint: str | Path | None = None, imgsz: int | None = None,
           batch: int | None = None, dynamic_batch: bool = False, opset: int = DEFAULT_OPSET,
           precision: str | None = None, out: str | Path | None = None, reparam: bool = True, force: bool = False,
           attn_order: str = "auto", strict_schedule: bool = False, samples: int = parity_set.DEFAULT_SAMPLES,
           tolerances: dict | list | None = None, require_verified: bool = False, overrides: dict | None = None,
           options: dict | None = None, seed: int = DEMO_SEED, progress: Progress | None = None,
           rewrites=True, require_ane: bool = False) -> Report:
    """Export `model_or_name` to `targets` in folder `out` (default runs/NAME) and run the parity ladder.

    `rewrites`: the deploy-form's speed rewrites (True all, False none, or names; see `available_rewrites`).
    `require_ane`: a CoreML device hop fails when the model mostly runs off the Neural Engine (macOS).

    Returns the Report also written to OUT/report.json; `report.exit_code` is 0 (all executed hops
    passed), 1 (a hop failed: artifacts in OUT/quarantine/). Raises VitedgeError (exit 2) on bad input,
    before anything is written.
    """
    progress = progress or QUIET
    # -- validate everything that can be validated without work
    plans = resolve_targets(targets, precision, dynamic_batch, options)
    if dynamic_batch and batch is not None:
        raise VitedgeError("--batch and --dynamic-batch exclude each other; drop one")
    if batch is not None and batch <= 0:
        raise VitedgeError(f"--batch must be positive; got {batch}")
    batch = None if dynamic_batch else (batch or 1)
    check_opset(opset)
    tols = make_tolerances(tolerances)
    if samples <= 0:
        raise VitedgeError(f"--samples must be positive; got {samples}")
    if not reparam and rewrites is not True:
        raise VitedgeError("--rewrites shapes the re-parameterized deploy-form; drop it or drop --no-reparam")
    name = model_or_name if isinstance(model_or_name, str) else _model_name(model_or_name)
    out = Path(out) if out is not None else Path("runs") / name
    for line in stale.recover(out):  # before the check: a killed --force run may have left DIR aside
        progress.note(line)
    _check_out(out, force)

    with progress.step("building the train-form model"):
        loaded = build_train_form(model_or_name, checkpoint, overrides, seed)
    imgsz = resolve_imgsz(loaded.model, imgsz)
    with progress.step("re-parameterizing"):
        deploy, deploy64 = build_deploy_form(loaded.model, imgsz, reparam, attn_order, strict_schedule, rewrites)

    vers = versions()
    info = reparam_info(deploy, reparam)
    report = Report(model=loaded.name, imgsz=imgsz, batch=batch, weights=loaded.weights,
                    checkpoint_sha256=loaded.checkpoint_sha256, reparam=info, versions=vers, command="export",
                    targets=[p.name for p in plans], overrides=loaded.overrides, samples=samples,
                    inputs=_inputs_note(samples), require_verified=require_verified, require_ane=require_ane)

    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]  # removed again if we fail
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = stale.sibling(out, "tmp")
    try:
        tmp.mkdir()  # not mkdtemp: its 0700 mode would become the output folder's; mkdir follows the umask
        build = _Build(report, plans, loaded, deploy, deploy64, tmp, batch, opset, attn_order, reparam, tols,
                       progress)
        build.run()
        report.finalize()
        report.out_dir = str(out)
        if report.failed_hops():
            _quarantine(report, tmp, build.raw)
        report.write(tmp / "report.json")
        _commit(tmp, out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in made:  # innermost first; a folder someone else filled meanwhile stays
            try:
                p.rmdir()
            except OSError:
                break
        raise
    return report


@dataclass
class _Build:
    """One export run building into `tmp`: fills `report` hop by hop."""
    report: Report
    plans: list
    loaded: Loaded
    deploy: nn.Module
    deploy64: nn.Module
    tmp: Path
    batch: int | None
    opset: int
    attn_order: str
    reparam: bool
    tols: dict
    progress: Progress
    raw: onnx.ModelProto | None = None  # the unsimplified graph, kept for the quarantine
    fp16_analysis: object = None        # exporter.precision.Fp16Analysis, computed once if any target is fp16
    fp16_problem: str | None = None
    fp16_module: str | None = None

    def run(self) -> None:
        r, fp32, imgsz = self.report, self.tols["fp32"], self.report.imgsz
        if self.reparam and not self._gate():
            return self._skip_rest()
        x = _inputs(self.loaded.model, r.samples, imgsz)
        with self.progress.step(f"train-form reference on {r.samples} parity inputs"):
            reference = run_batched(train_form_runner(self.loaded.model), x)
        with self.progress.step("deploy-form hop"):
            hop = check_hop("deploy-form", deploy_form_runner(self.deploy), x, reference, fp32)
        if hop.status == "failed" and self.reparam:  # the fp64 gate passed: float32 arithmetic, not a wrong fold
            hop.reason += "; the float64 equivalence gate passed: float32 rounding in the deploy-form exceeds tolerance"
        r.parity.append(hop)

        # ONNX: the raw export, then the simplified hub graph every target builds from
        try:
            with self.progress.step("exporting ONNX"):
                self.raw = check_onnx(export_onnx(self.deploy, imgsz, self.batch, self.opset))
            del self.raw.graph.value_info[:]  # inferred shapes were for checking; saved graphs stay lean
        except OnnxExportError as e:
            r.parity.append(failed("onnx", "torch.onnx (TorchScript)", str(e)))
            return self._skip_rest()
        self._onnx_hop("onnx", self.raw, x, reference)
        try:
            with self.progress.step("simplifying ONNX (onnxsim)"):
                simp = simplify_onnx(self.raw)
        except OnnxExportError as e:
            r.parity.append(failed("onnx-simplified", "onnxsim", str(e)))
            return self._skip_rest()
        meta = _metadata(self.loaded, imgsz, self.batch, self.attn_order, r.reparam, r.versions)
        hub = save_onnx(set_metadata(simp, meta), self.tmp / f"{r.model}.onnx")
        self._onnx_hop("onnx-simplified", simp, x, reference)
        _record_artifact(r, "onnx", self.tmp, Artifact("onnx", hub, "fp32"))

        for plan in self.plans:  # every requested target, generically through the TARGETS table
            if r.hop(plan.hop()) is None:  # (the onnx fp32 artifact is the hub graph, already checked)
                r.parity.append(self._target_hop(plan, hub, meta, x, reference))

    def _gate(self) -> bool:
        from .equivalence import verify_equivalence

        with self.progress.step("equivalence gate (float64)"):
            eq = verify_equivalence(self.loaded.model, self.deploy64, self.report.imgsz, raise_on_fail=False)
        self.report.reparam.equivalence = eq.to_dict()
        if not eq.passed:
            self.report.parity.append(failed(
                "deploy-form", "pytorch (float64 equivalence gate)",
                f"re-parameterization changed the function: first diverging block {eq.diverging_module}; logits "
                f"max|diff| {eq.max_abs:.3e} vs tolerance {eq.rtol:.0e}*max|y| ({eq.scale:.3e})", mode="reference",
                tolerance=self.tols["fp32"], diverging_module=eq.diverging_module))
        return eq.passed

    def _fp16_safe(self, plan: TargetPlan, x: np.ndarray) -> bool:
        """fp16 range analysis of the deploy-form (once per run): a model that would overflow in fp16 outside
        the precision policy's fp32 islands fails its fp16 hops with the module named, before lowering."""
        if self.fp16_analysis is None:
            from .precision import analyze_fp16_ranges, default_policy

            with self.progress.step("fp16 range analysis"):
                policy = default_policy()
                self.fp16_analysis = analyze_fp16_ranges(self.deploy, torch.from_numpy(x[:FP16_CALIBRATION]),
                                                         policy)
            self.report.reparam.fp16 = self.fp16_analysis.to_dict()
            bad = [h for h in self.fp16_analysis.hazards if policy.covers(h.op) is None]
            if bad:
                more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
                self.fp16_module = bad[0].module
                self.fp16_problem = (f"fp16 is unsafe: {bad[0].describe()} outside the precision policy's fp32 "
                                     f"islands{more}; export this target with --precision fp32")
        return self.fp16_problem is None

    def _skip_rest(self) -> None:
        done = {h.hop for h in self.report.parity}
        for h in dict.fromkeys(["onnx", "onnx-simplified"] + [p.hop() for p in self.plans]):
            if h not in done:
                self.report.parity.append(unverified(h, "-", SKIPPED))

    def _onnx_hop(self, hop_name: str, model: onnx.ModelProto, x: np.ndarray, reference: np.ndarray) -> None:
        with self.progress.step(f"{hop_name} hop (ONNX Runtime)"):
            hop = check_hop(hop_name, OnnxRuntimeRunner(model), x, reference, self.tols["fp32"])
        if hop.status == "failed":
            _localize_onnx_hop(hop, model, self.deploy, x, self.progress)
        self.report.parity.append(hop)

    def _target_hop(self, plan: TargetPlan, hub: Path, meta: dict, x: np.ndarray, reference: np.ndarray) -> Hop:
        hop_name, t = plan.hop(), plan.target
        tol = self.tols.get(plan.precision) if plan.precision else None
        if t is None:
            return unverified(hop_name, plan.name, plan.missing, tol)
        ok, why = t.available()
        if not ok:
            return unverified(hop_name, t.name, f"{t.name} cannot lower here: {why}", tol)
        if plan.precision == "fp16" and not self._fp16_safe(plan, x):
            return failed(hop_name, t.name, self.fp16_problem, tolerance=tol, diverging_module=self.fp16_module)
        spec = LowerSpec(name=self.report.model, imgsz=self.report.imgsz, batch=self.batch, precision=plan.precision,
                         out_dir=self.tmp, onnx_path=hub, metadata=dict(meta, precision=plan.precision),
                         options=dict(plan.options))
        try:
            with self.progress.step(f"lowering to {t.name} ({plan.precision})"):
                artifact = t.lower(self.deploy, spec)
        except VitedgeError:
            raise  # bad target-specific input (e.g. a missing --labels file): exit 2, nothing written
        except UnavailableError as e:
            return unverified(hop_name, t.name, f"{t.name} cannot lower here: {e}", tol)
        except Exception as e:
            return failed(hop_name, t.name, f"lowering to {t.name} failed: {type(e).__name__}: {e}", tolerance=tol)
        _record_artifact(self.report, hop_name, self.tmp, artifact)
        return _artifact_hop(hop_name, t, artifact, self.deploy, x, reference, tol, self.progress,
                             require_ane=self.report.require_ane)


def _artifact_key(hop_name: str) -> str:
    # report.artifacts is keyed by target, with the fp32 ONNX (hops onnx / onnx-simplified) as "onnx"
    return "onnx" if hop_name in ("onnx", "onnx-simplified") else hop_name


def _record_artifact(report: Report, hop_name: str, root: Path, artifact: Artifact) -> None:
    path = Path(artifact.path)
    nodes = node_counts(onnx.load(str(path), load_external_data=False)) if path.suffix == ".onnx" else None
    report.artifacts[_artifact_key(hop_name)] = ArtifactEntry(path=str(path.relative_to(root)), sha256=sha256_file(path),
                                          bytes=size_bytes(path), precision=artifact.precision, nodes=nodes,
                                          info=dict(artifact.info))


def _quarantine(report: Report, tmp: Path, raw: onnx.ModelProto | None) -> None:
    """Move every artifact of a failed run under tmp/quarantine/ so no app build picks it up."""
    q = tmp / QUARANTINE
    q.mkdir()
    for entry in tmp.iterdir():
        if entry.name not in (QUARANTINE, "report.json"):
            entry.rename(q / entry.name)
    for a in report.artifacts.values():
        a.path = f"{QUARANTINE}/{a.path}"
    if raw is not None:
        save_onnx(raw, q / f"{report.model}.raw.onnx")
    report.quarantine = QUARANTINE if any(q.iterdir()) else None
    if report.quarantine is None:
        q.rmdir()


def _commit(tmp: Path, out: Path, force: bool) -> None:
    """Rename the finished build folder into place (an empty existing folder is replaced by the rename)."""
    if out.exists() and any(out.iterdir()):
        if not force:  # appeared while we were building
            raise VitedgeError(f"{out} already holds artifacts; pass --force to replace them")
        old = stale.sibling(out, "old")
        os.rename(out, old)
        try:
            os.rename(tmp, out)
        except BaseException:
            os.rename(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, out)


# ---- parity on an existing artifact ---------------------------------------------------------------

_SUFFIX_TARGET = {".onnx": "onnx", ".mlpackage": "coreml", ".mlmodel": "coreml", ".engine": "tensorrt",
                  ".plan": "tensorrt"}


def _artifact_target(path: Path, target: str | None) -> str:
    if target:
        return resolve_targets(target)[0].name
    for name in TARGETS:  # the table's own suffixes first, then the common aliases
        t, _ = _load_target(name)
        if t is not None and t.suffix and path.name.endswith(t.suffix):
            return name
    if path.suffix in _SUFFIX_TARGET:
        return _SUFFIX_TARGET[path.suffix]
    raise VitedgeError(f"cannot tell the target of {path} from its suffix; pass --target")


def _read_artifact(path: Path, target: str | None) -> tuple[str, onnx.ModelProto | None, dict]:
    """(target name, the ONNX model for .onnx artifacts, the metadata the artifact carries)."""
    if not path.exists():
        raise VitedgeError(f"artifact {path} not found; check the --artifact path")
    tname = _artifact_target(path, target)
    if tname != "onnx":
        return tname, None, _artifact_metadata(tname, path)
    try:
        model = onnx.load(str(path))
    except Exception as e:
        raise VitedgeError(f"{path} is not a readable ONNX file ({type(e).__name__}); re-export it") from None
    return tname, model, read_metadata(model)


def _artifact_metadata(target: str, path: Path) -> dict:
    """What a target's `read_metadata(path)` (optional hook) says about an artifact it wrote, decoded:
    JSON strings become values and "none" becomes None (CoreML user metadata is all strings)."""
    t, _ = _load_target(target)
    reader = getattr(t, "read_metadata", None)
    if reader is None:
        return {}
    try:
        raw = reader(path)
    except Exception as e:
        raise VitedgeError(f"cannot read {path} as a {target} artifact ({type(e).__name__}: {e})") from None
    out = {}
    for k, v in raw.items():
        if isinstance(v, str):
            if v.lower() == "none":
                v = None
            else:
                try:
                    v = json.loads(v)
                except json.JSONDecodeError:
                    pass
        out[k] = v
    return out


def _onnx_precision(model: onnx.ModelProto) -> str:
    half = any(i.data_type == onnx.TensorProto.FLOAT16 for i in model.graph.initializer)
    return "fp16" if half else "fp32"


def parity(model_or_name, artifact: str | Path | None = None, *, checkpoint: str | Path | None = None,
           deploy_checkpoint: str | Path | None = None, target: str | None = None, imgsz: int | None = None,
           precision: str | None = None, attn_order: str | None = None, samples: int = parity_set.DEFAULT_SAMPLES,
           tolerances: dict | list | None = None, require_verified: bool = False, overrides: dict | None = None,
           seed: int = DEMO_SEED, report_path: str | Path | None = None, mode: str | None = None,
           progress: Progress | None = None, require_ane: bool = False) -> Report:
    """The parity ladder for an existing artifact and/or a deploy-form checkpoint (`vitedge reparam`).

    Hops: deploy-form (the deploy checkpoint if given, else a fresh re-parameterization) and the artifact,
    each against the train-form on the parity set. Artifact metadata (ONNX metadata_props) supplies the
    size, overrides and attention order it was exported with; flags given explicitly win. `mode`
    ("device" | "emulated") insists on how the artifact runs: otherwise the hop is unverified.
    """
    progress = progress or QUIET
    if mode not in (None, "device", "emulated"):
        raise VitedgeError(f"--mode must be device or emulated; got {mode!r}")
    if artifact is None and deploy_checkpoint is None:
        raise VitedgeError("vitedge parity needs --artifact PATH (and/or --deploy-checkpoint PATH)")
    if precision is not None and precision not in PRECISIONS:
        raise VitedgeError(f"--precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if samples <= 0:
        raise VitedgeError(f"--samples must be positive; got {samples}")
    tols = make_tolerances(tolerances)
    tname, art_model, meta = None, None, {}
    if artifact is not None:
        artifact = Path(artifact)
        tname, art_model, meta = _read_artifact(artifact, target)
        if precision is None:
            precision = meta.get("precision") or (_onnx_precision(art_model) if art_model is not None else None)
    deploy = None
    if deploy_checkpoint is not None:
        from .deploy_checkpoint import load_deploy_checkpoint

        deploy = load_deploy_checkpoint(deploy_checkpoint)
        dmeta = deploy.deploy_checkpoint_meta
        meta = {"model": dmeta["model"], "imgsz": dmeta["imgsz"], "attn_order": dmeta["attn_order"],
                "overrides": dmeta["overrides"], "checkpoint_sha256": dmeta["checkpoint_sha256"],
                "weights": "checkpoint" if dmeta["checkpoint_sha256"] else "untrained",
                **meta}  # an artifact's own metadata wins
    name = model_or_name if isinstance(model_or_name, str) else _model_name(model_or_name)
    source = artifact if artifact is not None else deploy_checkpoint
    if meta.get("model") and meta["model"] != name:
        raise VitedgeError(f"{source} holds {meta['model']}, not {name}; pass --model {meta['model']}")
    if meta.get("weights") == "checkpoint" and checkpoint is None:
        raise VitedgeError(f"{source} was exported from a checkpoint (sha256 {str(meta.get('checkpoint_sha256'))[:12]}"
                           "...); pass the same --checkpoint")
    if overrides is None and isinstance(model_or_name, str):
        overrides = meta.get("overrides") or {}
    plan = resolve_targets(tname, precision)[0] if tname else None

    with progress.step("building the train-form model"):
        loaded = build_train_form(model_or_name, checkpoint, overrides, seed)
    exported_from = meta.get("checkpoint_sha256")
    if exported_from and loaded.checkpoint_sha256 and exported_from != loaded.checkpoint_sha256:
        raise VitedgeError(f"--checkpoint (sha256 {loaded.checkpoint_sha256[:12]}...) is not the one {source} was "
                           f"made from ({exported_from[:12]}...)")
    imgsz = resolve_imgsz(loaded.model, imgsz or meta.get("imgsz"))
    if deploy is not None and deploy.reparam_imgsz != imgsz:
        raise VitedgeError(f"{deploy_checkpoint} was folded for imgsz {deploy.reparam_imgsz}, the check runs at "
                           f"{imgsz}; pass --imgsz {deploy.reparam_imgsz}")
    with progress.step("re-parameterizing"):
        # the same rewrites as the deploy checkpoint, so that localization compares like module trees
        same = deploy.deploy_checkpoint_meta.get("rewrites", True) if deploy is not None else True
        fresh, fresh64 = build_deploy_form(loaded.model, imgsz, True, attn_order or meta.get("attn_order") or "auto",
                                           rewrites=same)
    deploy = deploy or fresh

    batch = meta.get("batch")
    report = Report(model=loaded.name, imgsz=imgsz, batch=batch if isinstance(batch, int) else None,
                    weights=loaded.weights, checkpoint_sha256=loaded.checkpoint_sha256, reparam=reparam_info(deploy),
                    versions=versions(), command="parity", targets=[tname] if tname else [],
                    overrides=loaded.overrides, samples=samples, inputs=_inputs_note(samples),
                    require_verified=require_verified, require_ane=require_ane)

    x = _inputs(loaded.model, samples, imgsz)
    with progress.step(f"train-form reference on {samples} parity inputs"):
        reference = run_batched(train_form_runner(loaded.model), x)
    with progress.step("deploy-form hop"):
        hop = check_hop("deploy-form", deploy_form_runner(deploy), x, reference, tols["fp32"])
    if hop.status == "failed":
        _localize_deploy_hop(hop, loaded.model, fresh, fresh64, deploy, x, imgsz, progress)
    report.parity.append(hop)

    if artifact is not None:
        report.parity.append(_existing_artifact_hop(report, plan, artifact, art_model, deploy, x, reference, tols,
                                                    progress, mode))
    report.finalize()
    if report_path is not None:
        report.write(report_path)
    return report


def _localize_deploy_hop(hop: Hop, train: nn.Module, fresh: nn.Module, fresh64: nn.Module, deploy: nn.Module,
                         x: np.ndarray, imgsz: int, progress: Progress) -> None:
    with progress.step("localizing the deploy-form divergence"):
        if deploy is not fresh:  # a loaded deploy checkpoint has the fresh fold's module tree: compare module by module
            div = localize_torch(fresh, deploy, x[:LOCALIZE_SAMPLES], hop.tolerance)
            where = div and (div.module, div.describe())
        else:  # the fold itself is suspect: the equivalence gate compares train and deploy block by block
            from .equivalence import verify_equivalence

            eq = verify_equivalence(train, fresh64, imgsz, raise_on_fail=False)
            where = eq.diverging_module and (eq.diverging_module,
                                             f"first diverging block {eq.diverging_module} (float64 equivalence gate)")
    if where:
        hop.diverging_module, detail = where
        hop.reason = f"{hop.reason}; {detail}"


def _existing_artifact_hop(report: Report, plan: TargetPlan, path: Path, art_model: onnx.ModelProto | None,
                           deploy: nn.Module, x: np.ndarray, reference: np.ndarray, tols: dict,
                           progress: Progress, mode: str | None = None) -> Hop:
    hop_name = "onnx" if plan.name == "onnx" and plan.precision == "fp32" else plan.hop()
    tol = tols.get(plan.precision) if plan.precision else None
    art = Artifact(plan.name, path, plan.precision or "fp32")
    report.artifacts[_artifact_key(hop_name)] = ArtifactEntry(
        path=str(path), sha256=sha256_file(path), bytes=size_bytes(path), precision=art.precision,
        nodes=node_counts(art_model) if art_model is not None else None)
    if plan.target is None:
        return unverified(hop_name, plan.name, plan.missing, tol)

    def note_batch(runner: Runner) -> None:
        if report.batch is None and runner.max_batch():
            report.batch = runner.max_batch()  # the artifact's static batch, when its metadata did not say

    return _artifact_hop(hop_name, plan.target, art, deploy, x, reference, tol, progress, mode, note_batch,
                         require_ane=report.require_ane)
