"""`vitedge export` as a Python API: `export()` returns the same `Report` the CLI writes.

validate everything -> build the train-form (checkpoint, or seeded trained-like demo weights) -> re-parameterize
-> fp64 equivalence gate -> ONNX (raw) -> onnxsim -> each requested target, with a parity hop after each step,
every hop against the train-form's float64 ground truth on the parity set (default, or --images) by the
per-sample noise rule (hops.py). The output folder is one transaction (outdir.py): built in a temporary sibling,
renamed into place in one step; a failed hop moves the artifacts to DIR/quarantine/. Bad input raises VitedgeError
before anything is written. `parity()` is verify.py. `base_store=`: the verified base (deploy-form, base ONNX,
ground truth) reused from, or left in, a store (verified_base.py). What the run is asked to do is one
ExportSettings (exporter/core/settings.py); the targets' own hops are target_hops.py's."""
from __future__ import annotations

import copy
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import onnx
import torch.nn as nn

from ...errors import VitedgeError
from ...models.features import output_specs
from ...models.input_size import as_hw, size_json
from ...models.registry import input_stats, recipe_of
from ...targets.graph.metadata import read_metadata, set_metadata
from ..core import outdir
from ..core.settings import ExportSettings
from ..quantize.calibrate import check_flags
from ..verdict.criteria import reference_block
from ..verdict.equivalence import verify_equivalence
from ..reparam.build_forms import (Loaded, build_deploy_form, build_train_form, identify_checkpoint, model_name,
                                   reparam_info)
from ...targets.labels import class_names
from ..verdict.hops import (DEPLOY_SUBSET, PRE_BASE_SAMPLES, RAW_SUBSET, Ladder, check_images, parity_inputs_for,
                            record_artifact)
from .verified_base import BaseStore, VerifiedBase
from .target_hops import ExportRun, TargetHops
from ..onnx.onnx_export import (DEFAULT_EXPORTER, OnnxExportError, check_onnx, check_opset, default_opset,
                                export_onnx_info, exporter_label, save_onnx, simplify_keeping_fusions)
from ..verdict.parity_cost import check_samples, choose_samples
from ..verdict.parity import FLOAT64_TOLERANCES, failed, tolerances as make_tolerances, unverified
from ..core.progress import QUIET, Progress
from ..core.report import ReparamInfo, Report, versions
from ..core.target_plans import resolve_targets

SKIPPED = "not run: an earlier step failed"


def export(model=None, targets=None, *, progress: Progress | None = None, base_store: BaseStore | None = None,
           **settings) -> Report:
    """Export a model to `targets` in folder `out` (default runs/NAME) and run the parity ladder.

    `model` is an ExportSettings (exporter/core/settings.py), or the model (a registered name, an nn.Module, or
    None: the one a transformers checkpoint names) with the settings as keywords, which build the ExportSettings:
    checkpoint, imgsz, batch, dynamic_batch, opset, precision, out, reparam, force, clean, attn_order,
    strict_schedule, samples, tolerances, require_verified, overrides, options, seed, rewrites, require_ane,
    images, labels, calib, calib_images, exporter, truth_cache, preprocess, features (`model_or_name` and `target`
    are accepted spellings of `model` and `targets`). Given an ExportSettings, keywords change fields of it.
    `features`: True (or "default") exports the backbone's official detection feature maps instead of the logits,
    a list of positions the maps at those positions (docs/dense.md); a module embedding a vitedge backbone (a
    user's own head) is folded where the backbone is, each of its outputs judged.

    `rewrites`: the deploy-form's speed rewrites (True all, False none, or names; see `available_rewrites`).
    `require_ane`: a CoreML device hop fails when the model mostly runs off the Neural Engine (macOS).
    `exporter`: the ONNX exporter, "torchscript" or "dynamo" (where dynamo cannot export the model, TorchScript is
    used and `report.exporter_fallback` says why); `opset` None: the exporter's default (17 / 18).
    `base_store`: a BaseStore (verified_base.py); a VerifiedBase it holds replaces the train-form, deploy-form and
    ONNX steps with their verified results (the caller keys it by everything they depend on: `vitedge matrix`),
    else the one this run builds is put there once it passed. `hub` is its former name (deprecated).
    `images`: a folder of images (flat, or ImageFolder layout with labels) used as the parity set instead of the
    default one, beside a small stress set. `labels`: class names in index order, one per line (every target: ONNX
    metadata `vitedge.labels`, a CoreML classifier; the class index of an ImageFolder `images`); also accepted
    as `options["labels"]`.
    `calib` / `calib_images`: --precision int8 | w8a8: how many calibration images (default 64) and, optionally,
    the folder they come from (else views of the shipped photos the compressed hops are not judged on; see
    exporter/quantize/calibrate.py). `truth_cache`: use the disk cache of float64 ground truths (exporter/verdict/truth_cache.py).
    `preprocess`: crop_pct, interpolation, mean, std.

    Returns the Report also written to OUT/report.json; `report.exit_code` is 0 (all executed hops
    passed), 1 (a hop failed: artifacts in OUT/quarantine/). Raises VitedgeError (exit 2) on bad input or --out,
    before anything is written; `force` replaces only files vitedge wrote there (`clean`: any file).
    """
    base_store = _base_store_keyword(base_store, settings)
    s = ExportSettings.build(model, settings, "export", targets=targets)
    progress = progress or QUIET
    if s.several_sizes():  # one export of every size (sizes.py), each through the pipeline below
        from .sizes import export_sizes

        return export_sizes(s, progress, sys.modules[__name__], base_store)
    req = prepare(s, progress, base_store)
    # Ctrl-C anywhere from here on ends the run (exit 130, DIR as it was), even where a library swallowed it
    with outdir.InterruptWatch() as interrupts:
        one = start(req, s, progress, base_store)
        with outdir.OutputFolder(req.out, s.force, interrupts) as folder:
            build = one.build(folder.tmp, folder.checkpoint, req.plans)
            build.run()
            finish(one.report, folder, build.save_raw, req.out)
    return one.report


def _base_store_keyword(base_store: BaseStore | None, settings: dict) -> BaseStore | None:
    """`base_store`, or the store given under its former name `hub=` (popped from `settings`, with a
    DeprecationWarning)."""
    if "hub" not in settings:
        return base_store
    hub = settings.pop("hub")
    warnings.warn("export(hub=...) is deprecated; pass the store as export(base_store=...)", DeprecationWarning,
                  stacklevel=3)
    if base_store is not None and hub is not None:
        raise VitedgeError("export() got base_store= and hub= (its former name); drop hub=")
    return base_store if hub is None else hub


@dataclass
class Request:
    """An export's request, validated before any work: what every size of it shares."""
    run: ExportSettings     # the settings as the run resolved them (what the targets' loop and the report read)
    plans: list             # the requested targets' plans
    labels: object
    train_form_args: dict   # build_train_form's own keywords: identified (the checkpoint), preprocess, features
    n_calib: int | None
    tols: dict
    name: str
    out: Path


def prepare(s: ExportSettings, progress: Progress, base_store: BaseStore | None = None) -> Request:
    """Validate everything that can be validated without work (VitedgeError, nothing written)."""
    options = dict(s.options or {})
    identified, labels = identify_checkpoint(s.model, s.checkpoint, s.overrides, s.labels, options.pop("labels", None),
                                             dense=s.features is not None)
    train_form_args = {"identified": identified, "preprocess": s.preprocess, "features": s.features}
    if s.features is not None and labels is not None:
        raise VitedgeError("--labels names the classes of logits; --features exports feature maps: drop one")
    plans = resolve_targets(s.targets or "onnx", s.precision, s.dynamic_batch, options, labels=labels, batch=s.batch)
    n_calib = check_flags(s.precision, s.calib, s.calib_images, s.images, labels)
    for plan in plans:  # what each precision needs on its target (palette's scikit-learn): before any work
        if plan.precision and plan.target is not None:
            plan.target.require(plan.precision)
    if s.dynamic_batch and s.batch is not None:
        raise VitedgeError("--batch and --dynamic-batch exclude each other; drop one")
    if s.batch is not None and s.batch <= 0:
        raise VitedgeError(f"--batch must be positive; got {s.batch}")
    exporter = s.exporter or DEFAULT_EXPORTER
    opset = default_opset(exporter) if s.opset is None else s.opset  # (default_opset checks the exporter's name)
    check_opset(opset, exporter)
    tols = make_tolerances(s.tolerances, FLOAT64_TOLERANCES)
    check_samples(s.samples)
    check_images(s.images, labels)
    if not s.reparam and s.rewrites is not True:
        raise VitedgeError("--rewrites shapes the re-parameterized deploy-form; drop it or drop --no-reparam")
    if base_store is not None and not s.reparam:
        raise VitedgeError("a shared verified base holds the re-parameterized deploy-form; drop --no-reparam")
    name = identified.name if identified else s.model if isinstance(s.model, str) else model_name(s.model)
    out = Path(s.out) if s.out is not None else Path("runs") / name
    for line in outdir.recover(out):  # before the check: a killed --force run may have left DIR aside
        progress.note(line)
    outdir.check_out(out, s.force, s.clean)
    run = s.replace(batch=None if s.dynamic_batch else (s.batch or 1), opset=opset, exporter=exporter,
                    attn_order=s.attn_order or "auto", out=out, labels=labels, options=options)
    return Request(run, plans, labels, train_form_args, n_calib, tols, name, out)


@dataclass
class Started:
    """One size of an export up to its deploy-form: the train-form, the parity set, the report to fill."""
    req: Request
    loaded: Loaded
    deploy: nn.Module
    deploy64: nn.Module | None
    pset: object
    report: Report
    classes: list | None
    progress: Progress
    base_store: BaseStore | None
    reused_base: VerifiedBase | None  # the verified base the store held (None: this run builds one)

    def build(self, tmp: Path, checkpoint, plans: list) -> "_Build":
        """The run of `plans` building into `tmp` (call `run()`)."""
        req, s = self.req, self.req.run
        return _Build(s, self.report, self.deploy, tmp, req.tols, self.progress, checkpoint, self.pset,
                      lambda: build_train_form(s.model, s.checkpoint, s.overrides, s.seed, **req.train_form_args).sized(
                          self.report.imgsz),
                      req.n_calib, plans=plans, loaded=self.loaded, deploy64=self.deploy64, classes=self.classes,
                      store=self.base_store, reused_base=self.reused_base)


def start(req: Request, one: ExportSettings, progress: Progress, base_store: BaseStore | None = None,
          loaded: Loaded | None = None) -> Started:
    """The train-form (or a reused verified base's), the parity set and the deploy-form at `one`'s size (its one imgsz);
    `loaded`: a train-form built for another size of the same export (the size is an argument, never set on it)."""
    s, run = one, req.run
    asked = s.one_size()  # the one size of this run (settings.py says what the pipeline runs)
    reused_base = base_store.get() if base_store is not None else None
    if reused_base is not None:  # verified earlier for these inputs: no train-form, fold, gate or ONNX export here
        loaded, deploy, deploy64 = reused_base.loaded(req.name), reused_base.deploy, None
        imgsz = loaded.at_size(asked)
        info = copy.deepcopy(reused_base.reparam)  # the report adds to it (fp16 analysis)
    else:
        if loaded is None:
            with progress.step("building the train-form model"):
                loaded = build_train_form(s.model, s.checkpoint, s.overrides, s.seed, **req.train_form_args)
        imgsz = loaded.at_size(asked)
    classes = class_names(req.labels, loaded.model, imgsz)
    samples, rule = choose_samples(s.samples, s.model, imgsz, loaded.overrides, loaded.model, s.images)
    with progress.step("reading the parity inputs"):
        pset = parity_inputs_for(loaded.model, imgsz, samples, s.images, req.labels)
    if reused_base is not None:
        reused_base.check_fits(imgsz, pset, run.exporter)
    else:
        with progress.step("re-parameterizing"):
            deploy, deploy64 = build_deploy_form(loaded.model, imgsz, s.reparam, run.attn_order,
                                                 s.strict_schedule, s.rewrites)
        info = reparam_info(deploy, s.reparam)
    outputs = [o.as_dict() for o in output_specs(deploy, as_hw(imgsz))]
    report = Report(model=loaded.name, imgsz=imgsz, batch=run.batch, reparam=info, **loaded.facts(),
                    outputs=outputs, features=s.features,
                    versions=versions(), command="export", targets=[p.name for p in req.plans],
                    samples=len(pset), samples_rule=rule, inputs=pset.note,
                    images=None if s.images is None else str(s.images),
                    labels=None if req.labels is None else str(req.labels),
                    require_verified=s.require_verified, require_ane=s.require_ane, exporter=run.exporter,
                    opset=run.opset)
    return Started(req, loaded, deploy, deploy64, pset, report, classes, progress, base_store, reused_base)


def finish(report: Report, folder: outdir.OutputFolder, save_raw, out: Path) -> None:
    """The outcome: a failed run's artifacts quarantined, report.json written, the folder committed."""
    report.finalize()
    report.out_dir = str(out)
    if report.failed_hops():
        report.quarantine = outdir.quarantine(folder.tmp, add=save_raw)
        for a in report.artifacts.values():
            a.path = f"{outdir.QUARANTINE}/{a.path}"
    report.write(folder.tmp / "report.json")
    folder.commit()


def _metadata(loaded: Loaded, imgsz: int, run: ExportSettings, info: ReparamInfo, vers: dict,
              labels: list[str] | None = None, report: Report | None = None) -> dict:
    batch, attn_order = run.batch, run.attn_order
    mean, std = input_stats(loaded.model)
    extra = {"labels": labels} if labels is not None else {}  # vitedge.labels: class names travel with the graph
    extra["preprocess"] = recipe_of(loaded.model).to_dict()  # vitedge.preprocess: the eval recipe
    if report is not None:  # vitedge.exporter / _fallback: which exporter wrote the graph (why not dynamo)
        extra.update(exporter=report.exporter, exporter_fallback=report.exporter_fallback)
    outputs = report.outputs if report is not None and report.outputs else None
    if outputs is not None and len(outputs) > 1:  # vitedge.outputs: every output's name, shape and stride
        extra["outputs"] = outputs
    if run.features is not None:  # vitedge.features: what `vitedge parity` rebuilds the train-form with
        extra["features"] = run.features if isinstance(run.features, str) else list(run.features)
    output = "logits" if not outputs or len(outputs) == 1 else "feature maps" if all(
        o.get("stride") for o in outputs) else "outputs"
    if output == "logits" and isinstance(getattr(loaded.model, "num_classes", None), int):
        extra["num_classes"] = loaded.model.num_classes  # checked against --checkpoint's before any work
    return {**extra, "model": loaded.name, "imgsz": size_json(imgsz), "input_size": list(as_hw(imgsz)),
            "batch": batch if batch else "dynamic", "mean": list(mean),
            "std": list(std), "input": "image: float32 NCHW, RGB, normalized with mean/std", "output": output,
            "weights": loaded.weights, "checkpoint_sha256": loaded.checkpoint_sha256, "overrides": loaded.overrides,
            "attn_order": attn_order, "precision": "fp32",
            "reparam": {"folded": info.folded, "unfolded": info.unfolded, "attention_order": info.attention_order},
            "versions": vers}


@dataclass
class _Build(ExportRun):
    """One export run building into `tmp`: fills `report` hop by hop up to the base graph, then hands the targets
    to target_hops.py."""
    plans: list
    loaded: Loaded
    deploy64: nn.Module | None          # the float64 deploy-form of the gate (None: a reused base's)
    classes: list | None = None         # --labels: class names in index order
    store: BaseStore | None = None      # where the base this run verifies is put (export(base_store=...))
    reused_base: VerifiedBase | None = None  # a verified base: the steps up to its graph are not run again
    raw: onnx.ModelProto | None = None  # the unsimplified graph, kept for the quarantine
    ready: tuple | None = None          # (base graph path, metadata, ladder) once it passed its steps
    targets: TargetHops | None = None   # the targets' loop (its shared analyses: a multi-size export reuses them)

    def run(self) -> None:
        self.ready = self._reuse_base() if self.reused_base is not None else self._build_base()
        if self.ready is None:
            return self._skip_rest()
        self.targets = TargetHops(**self.shared())
        self.targets.run(self.plans, *self.ready)

    def _reuse_base(self) -> tuple[Path, dict, Ladder]:
        """The reused base's hop records, its graph copied into the build folder, and its reference."""
        r, h = self.report, self.reused_base
        r.parity += h.hop_records()
        r.exporter, r.exporter_fallback = h.export["exporter"], h.export["exporter_fallback"]
        self.raw = h.raw
        graph = self.tmp / f"{r.model}.onnx"
        meta = _metadata(self.loaded, r.imgsz, self.settings, r.reparam, r.versions, self.classes, r)
        if read_metadata(h.onnx_path).get("labels") != self.classes:  # class names belong to this export
            save_onnx(set_metadata(onnx.load(str(h.onnx_path)), meta), graph)
        else:
            shutil.copyfile(h.onnx_path, graph)
        self.checkpoint("base-graph")
        record_artifact(r, "onnx", graph, "fp32", {"simplify": h.export.get("simplify")}, root=self.tmp)
        r.reference = {**reference_block(h.truth, self.inputs.classes), "cache": None}  # the base's own truth
        return graph, meta, Ladder(None, self.deploy, self.inputs, h.truth, self.progress, self.build_train)

    def _build_base(self) -> tuple[Path, dict, Ladder] | None:
        """Gate, reference, deploy-form hop, ONNX export + hop, onnxsim + hop: (base graph path, metadata, ladder),
        or None when a step failed. A base whose every hop passed is put in the store."""
        r, fp32, imgsz, run = self.report, self.tols["fp32"], self.report.imgsz, self.settings
        if run.reparam and not self._gate():
            return None
        ladder = Ladder.build(self.loaded.model, self.deploy, self.inputs, self.progress, run.truth_cache)
        r.reference = ladder.reference()
        hop = ladder.deploy_hop(self.deploy, fp32, (PRE_BASE_SAMPLES, DEPLOY_SUBSET))
        if hop.status == "failed" and run.reparam:  # the fp64 gate passed: float32 arithmetic, not a wrong fold
            hop.reason += ("; the float64 equivalence gate passed: float32 rounding in the deploy-form exceeds its "
                           "allowance")
        r.parity.append(hop)

        # ONNX: the raw export, then the simplified base graph every target builds from
        try:
            with self.progress.step("exporting ONNX"):  # (benchmarks/export_time.py reads the step names)
                exported = export_onnx_info(self.deploy, imgsz, run.batch, run.opset, run.exporter)
                self.raw = check_onnx(exported.model)
            del self.raw.graph.value_info[:]  # inferred shapes were for checking; saved graphs stay lean
        except OnnxExportError as e:
            r.parity.append(failed("onnx", exporter_label(run.exporter), str(e)))
            return None
        r.exporter, r.exporter_fallback = exported.exporter, exported.fallback_reason
        if exported.fallback_reason:
            self.progress.note(f"dynamo could not export {r.model}; TorchScript did ({exported.fallback_reason})")
        r.parity.append(ladder.onnx_hop("onnx", self.raw, fp32, (PRE_BASE_SAMPLES, RAW_SUBSET)))
        try:
            with self.progress.step("simplifying ONNX (onnxsim)"):
                simp, simp_info = simplify_keeping_fusions(self.raw)  # fused-op counts: artifact info
        except OnnxExportError as e:
            r.parity.append(failed("onnx-simplified", "onnxsim", str(e)))
            return None
        meta = _metadata(self.loaded, imgsz, self.settings, r.reparam, r.versions, self.classes, r)
        graph = save_onnx(set_metadata(simp, meta), self.tmp / f"{r.model}.onnx")
        self.checkpoint("base-graph")
        r.parity.append(ladder.onnx_hop("onnx-simplified", simp, fp32))
        ladder.widen_raw_hop(r.parity, self.raw, fp32)
        record_artifact(r, "onnx", graph, "fp32", {"simplify": simp_info}, root=self.tmp)
        if self.store is not None and all(h.status == "passed" for h in r.parity):  # never share a failed base
            self.store.put(VerifiedBase(self.deploy, imgsz, graph, self.raw, ladder.truth, self.inputs.note,
                                        copy.deepcopy(r.parity), copy.deepcopy(r.reparam), run.attn_order,
                                        self.loaded.weights, self.loaded.checkpoint_sha256,
                                        dict(self.loaded.overrides), {**exported.info(), "simplify": simp_info},
                                        list(r.resized)))
        return graph, meta, ladder

    def save_raw(self, folder: Path) -> None:
        """The unsimplified graph, for the quarantine of a failed run."""
        if self.raw is not None:
            save_onnx(self.raw, folder / f"{self.report.model}.raw.onnx")

    def _gate(self) -> bool:
        with self.progress.step("equivalence gate (float64)"):
            eq = verify_equivalence(self.loaded.model, self.deploy64, self.report.imgsz, raise_on_fail=False)
        self.report.reparam.equivalence = eq.to_dict()
        if not eq.passed:
            self.report.parity.append(failed(
                "deploy-form", "pytorch (float64 equivalence gate)",
                f"re-parameterization changed the function: first diverging block {eq.diverging_module}; "
                f"{eq.describe()}", mode="reference",
                tolerance=self.tols["fp32"], diverging_module=eq.diverging_module))
        return eq.passed

    def _skip_rest(self) -> None:
        done = {h.hop for h in self.report.parity}
        for h in dict.fromkeys(["onnx", "onnx-simplified"] + [p.hop() for p in self.plans]):
            if h not in done:
                self.report.parity.append(unverified(h, "-", SKIPPED))
