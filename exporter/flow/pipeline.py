"""`vitedge export` as a Python API: `export()` returns the same `Report` the CLI writes.

validate everything -> build the train-form (checkpoint, or seeded trained-like demo weights) -> re-parameterize
-> fp64 equivalence gate -> ONNX (raw) -> onnxsim -> each requested target, with a parity hop after each step,
every hop against the train-form's float64 ground truth on the parity set (default, or --images) by the
per-sample noise rule (hops.py). The output folder is one transaction (outdir.py): built in a temporary sibling,
renamed into place in one step; a failed hop moves the artifacts to DIR/quarantine/. Bad input raises VitedgeError
before anything is written. `parity()` is verify.py. `hub=`: a verified deploy-form and hub ONNX reused from, or
left in, a store (hub.py).

Length: one run, the export; its imports took a line more when exporter/ was grouped by job (the flow's next change
should move the target loop out)."""
from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...precisions import CALIBRATED
from ...models.registry import input_stats, recipe_of, resolve_imgsz
from ...targets import LowerSpec, UnavailableError, row_of
from ...targets.graph.metadata import read_metadata, set_metadata
from ..core import outdir
from ..quantize.calibrate import COMPRESSED, calibration_set, check_flags
from ..quantize.compressed import QDQ_HOP, Judged, compressed_hop, write_qdq
from ..verdict.criteria import reference_block
from ..verdict.equivalence import verify_equivalence
from ..reparam.forms import (DEMO_SEED, Loaded, build_deploy_form, build_train_form, hold_checkpoint, model_name,
                             reparam_info)
from ..verdict.hops import (DEPLOY_SUBSET, PRE_HUB_SAMPLES, RAW_SUBSET, Ladder, check_images, class_names, hop_checks,
                            parity_inputs_for, record_artifact)
from .hub import Hub, HubStore
from ..verdict.inputs import ParitySet
from ..onnx.onnx_export import (DEFAULT_EXPORTER, OnnxExportError, check_onnx, check_opset, default_opset,
                                export_onnx_info, exporter_label, save_onnx, simplify_keeping_fusions)
from ..verdict.parity_cost import check_samples, choose_samples
from ..verdict.parity import FLOAT64_TOLERANCES, failed, profile_for, tolerances as make_tolerances, unverified
from ..core.progress import QUIET, Progress
from ..core.report import Hop, ReparamInfo, Report, versions
from ..core.target_plans import TargetPlan, resolve_targets

FP16_CALIBRATION = 32    # parity inputs used for the fp16 range analysis
SKIPPED = "not run: an earlier step failed"


def export(model_or_name, targets="onnx", *, checkpoint: str | Path | None = None, imgsz: int | None = None,
           batch: int | None = None, dynamic_batch: bool = False, opset: int | None = None,
           precision: str | None = None, out: str | Path | None = None, reparam: bool = True, force: bool = False,
           attn_order: str = "auto", strict_schedule: bool = False, samples: int | None = None,
           tolerances: dict | list | None = None, require_verified: bool = False, overrides: dict | None = None,
           options: dict | None = None, seed: int = DEMO_SEED, progress: Progress | None = None,
           rewrites=True, require_ane: bool = False, hub: HubStore | None = None, images: str | Path | None = None,
           labels: str | Path | None = None, calib: int | None = None,
           calib_images: str | Path | None = None, exporter: str = DEFAULT_EXPORTER,
           truth_cache: bool = True, clean: bool = False, preprocess: dict | None = None) -> Report:
    """Export `model_or_name` to `targets` in folder `out` (default runs/NAME) and run the parity ladder.

    `rewrites`: the deploy-form's speed rewrites (True all, False none, or names; see `available_rewrites`).
    `require_ane`: a CoreML device hop fails when the model mostly runs off the Neural Engine (macOS).
    `exporter`: the ONNX exporter, "torchscript" or "dynamo" (where dynamo cannot export the model, TorchScript is
    used and `report.exporter_fallback` says why); `opset` None: the exporter's default (17 / 18).
    `hub`: a HubStore (hub.py); a Hub it holds replaces the train-form, deploy-form and ONNX steps with their
    verified results (the caller keys it by everything they depend on: `vitedge matrix`), else the one this run
    builds is put there once it passed.
    `images`: a folder of images (flat, or ImageFolder layout with labels) used as the parity set instead of the
    default one, beside a small stress set. `labels`: class names in index order, one per line (every target: ONNX
    metadata `vitedge.labels`, a CoreML classifier; the class index of an ImageFolder `images`); also accepted
    as `options["labels"]`.
    `calib` / `calib_images`: --precision int8 | w8a8: how many calibration images (default 64) and, optionally,
    the folder they come from (else views of the shipped photos the compressed hops are not judged on; see
    exporter/quantize/calibrate.py). `truth_cache`: use the disk cache of float64 ground truths (exporter/verdict/truth_cache.py).
    `model_or_name` None: the one a transformers checkpoint names; `preprocess`: crop_pct, interpolation, mean, std.

    Returns the Report also written to OUT/report.json; `report.exit_code` is 0 (all executed hops
    passed), 1 (a hop failed: artifacts in OUT/quarantine/). Raises VitedgeError (exit 2) on bad input or --out,
    before anything is written; `force` replaces only files vitedge wrote there (`clean`: any file).
    """
    progress = progress or QUIET
    # -- validate everything that can be validated without work
    options = dict(options or {})
    held, labels = hold_checkpoint(model_or_name, checkpoint, overrides, labels, options.pop("labels", None))
    made = {"held": held, "preprocess": preprocess}  # how build_train_form makes the train-form
    plans = resolve_targets(targets, precision, dynamic_batch, options, labels=labels, batch=batch)
    n_calib = check_flags(precision, calib, calib_images, images, labels)
    for plan in plans:  # what each precision needs on its target (palette's scikit-learn): before any work
        if plan.precision and plan.target is not None:
            plan.target.require(plan.precision)
    if dynamic_batch and batch is not None:
        raise VitedgeError("--batch and --dynamic-batch exclude each other; drop one")
    if batch is not None and batch <= 0:
        raise VitedgeError(f"--batch must be positive; got {batch}")
    batch = None if dynamic_batch else (batch or 1)
    opset = default_opset(exporter) if opset is None else opset  # (default_opset checks the exporter's name)
    check_opset(opset, exporter)
    tols = make_tolerances(tolerances, FLOAT64_TOLERANCES)
    check_samples(samples)
    check_images(images, labels)
    if not reparam and rewrites is not True:
        raise VitedgeError("--rewrites shapes the re-parameterized deploy-form; drop it or drop --no-reparam")
    if hub is not None and not reparam:
        raise VitedgeError("a shared hub holds the re-parameterized deploy-form; drop --no-reparam")
    name = held.name if held else model_or_name if isinstance(model_or_name, str) else model_name(model_or_name)
    out = Path(out) if out is not None else Path("runs") / name
    for line in outdir.recover(out):  # before the check: a killed --force run may have left DIR aside
        progress.note(line)
    outdir.check_out(out, force, clean)

    # Ctrl-C anywhere from here on ends the run (exit 130, DIR as it was), even where a library swallowed it
    with outdir.InterruptWatch() as interrupts:
        reused = hub.get() if hub is not None else None
        if reused is not None:  # verified earlier for these inputs: no train-form, fold, gate or ONNX export here
            loaded, deploy, deploy64 = reused.loaded(name), reused.deploy, None
            imgsz = resolve_imgsz(deploy, imgsz)
            info = copy.deepcopy(reused.reparam)  # the report adds to it (fp16 analysis)
        else:
            with progress.step("building the train-form model"):
                loaded = build_train_form(model_or_name, checkpoint, overrides, seed, **made)
            imgsz = resolve_imgsz(loaded.model, imgsz)
        classes = class_names(labels, loaded.model, imgsz)
        samples, rule = choose_samples(samples, model_or_name, imgsz, loaded.overrides, loaded.model, images)
        with progress.step("reading the parity inputs"):
            pset = parity_inputs_for(loaded.model, imgsz, samples, images, labels)
        if reused is not None:
            reused.check_fits(imgsz, pset, exporter)
        else:
            with progress.step("re-parameterizing"):
                deploy, deploy64 = build_deploy_form(loaded.model, imgsz, reparam, attn_order, strict_schedule,
                                                     rewrites)
            info = reparam_info(deploy, reparam)

        report = Report(model=loaded.name, imgsz=imgsz, batch=batch, reparam=info, **loaded.facts(),
                        versions=versions(), command="export", targets=[p.name for p in plans],
                        samples=len(pset), samples_rule=rule, inputs=pset.note,
                        images=None if images is None else str(images), labels=None if labels is None else str(labels),
                        require_verified=require_verified, require_ane=require_ane, exporter=exporter,
                        opset=opset)
        with outdir.OutputFolder(out, force, interrupts) as folder:
            build = _Build(report, plans, loaded, deploy, deploy64, folder.tmp, batch, opset, attn_order, reparam,
                           tols, progress, folder.checkpoint, pset, classes, hub, reused,
                           lambda: build_train_form(model_or_name, checkpoint, overrides, seed, **made).model,
                           n_calib=n_calib, calib_images=calib_images, images=images, labels_file=labels,
                           exporter=exporter, truth_cache=truth_cache)
            build.run()
            report.finalize()
            report.out_dir = str(out)
            if report.failed_hops():
                report.quarantine = outdir.quarantine(folder.tmp, add=build.save_raw)
                for a in report.artifacts.values():
                    a.path = f"{outdir.QUARANTINE}/{a.path}"
            report.write(folder.tmp / "report.json")
            folder.commit()
    return report


def _metadata(loaded: Loaded, imgsz: int, batch: int | None, attn_order: str, info: ReparamInfo,
              vers: dict, labels: list[str] | None = None, report: Report | None = None) -> dict:
    mean, std = input_stats(loaded.model)
    extra = {"labels": labels} if labels is not None else {}  # vitedge.labels: class names travel with the graph
    extra["preprocess"] = recipe_of(loaded.model).to_dict()  # vitedge.preprocess: the eval recipe
    if report is not None:  # vitedge.exporter / _fallback: which exporter wrote the graph (why not dynamo)
        extra.update(exporter=report.exporter, exporter_fallback=report.exporter_fallback)
    return {**extra, "model": loaded.name, "imgsz": imgsz, "batch": batch if batch else "dynamic", "mean": list(mean),
            "std": list(std), "input": "image: float32 NCHW, RGB, normalized with mean/std", "output": "logits",
            "weights": loaded.weights, "checkpoint_sha256": loaded.checkpoint_sha256, "overrides": loaded.overrides,
            "attn_order": attn_order, "precision": "fp32",
            "reparam": {"folded": info.folded, "unfolded": info.unfolded, "attention_order": info.attention_order},
            "versions": vers}


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
    checkpoint: Callable[[str], None]   # the output folder's named points (Ctrl-C, test pauses)
    inputs: ParitySet                   # the parity set (default or --images)
    classes: list | None = None         # --labels: class names in index order
    store: HubStore | None = None       # where a hub this run verifies is put (export(hub=...))
    reused: Hub | None = None           # a verified hub: the steps up to the hub graph are not run again
    build_train: Callable[[], nn.Module] | None = None  # the train-form, when a reused hub's hop needs it
    exporter: str = DEFAULT_EXPORTER    # the ONNX exporter asked for (report.exporter: the one that wrote it)
    raw: onnx.ModelProto | None = None  # the unsimplified graph, kept for the quarantine
    fp16_analysis: object = None        # exporter.verdict.fp16_ranges.Fp16Analysis, computed once if any target is fp16
    fp16_problem: str | None = None
    fp16_module: str | None = None
    n_calib: int | None = None          # --precision int8 | w8a8: calibration images to take
    calib_images: str | Path | None = None
    images: str | Path | None = None    # --images (split between calibration and judging) and --labels
    labels_file: str | Path | None = None
    calibration: object = None          # targets.calibration.Calibration, chosen once per run
    judged: Judged | None = None        # what compressed hops are judged on, built once per run
    truth_cache: bool = True            # the disk cache of ground truths (truth_cache.py)

    def run(self) -> None:
        ready = self._reuse_hub() if self.reused is not None else self._build_hub()
        if ready is None:
            return self._skip_rest()
        hub, meta, ladder = ready
        for plan in self.plans:  # every requested target, generically through the TARGETS table
            if self.report.hop(plan.hop()) is None:  # (the onnx fp32 artifact is the hub graph, already checked)
                self.report.parity.append(self._target_hop(plan, hub, meta, ladder))

    def _reuse_hub(self) -> tuple[Path, dict, Ladder]:
        """The reused hub's hop records, its graph copied into the build folder, and its reference."""
        r, h = self.report, self.reused
        r.parity += h.hop_records()
        r.exporter, r.exporter_fallback = h.export["exporter"], h.export["exporter_fallback"]
        self.raw = h.raw
        hub = self.tmp / f"{r.model}.onnx"
        meta = _metadata(self.loaded, r.imgsz, self.batch, self.attn_order, r.reparam, r.versions, self.classes, r)
        if read_metadata(h.onnx_path).get("labels") != self.classes:  # class names belong to this export
            save_onnx(set_metadata(onnx.load(str(h.onnx_path)), meta), hub)
        else:
            shutil.copyfile(h.onnx_path, hub)
        self.checkpoint("hub-graph")
        record_artifact(r, "onnx", hub, "fp32", {"simplify": h.export.get("simplify")}, root=self.tmp)
        r.reference = {**reference_block(h.truth, self.inputs.classes), "cache": None}  # the hub's own truth
        return hub, meta, Ladder(None, self.deploy, self.inputs, h.truth, self.progress, self.build_train)

    def _build_hub(self) -> tuple[Path, dict, Ladder] | None:
        """Gate, reference, deploy-form hop, ONNX export + hop, onnxsim + hop: (hub path, metadata, ladder), or
        None when a step failed. A hub whose every hop passed is put in the store."""
        r, fp32, imgsz = self.report, self.tols["fp32"], self.report.imgsz
        if self.reparam and not self._gate():
            return None
        ladder = Ladder.build(self.loaded.model, self.deploy, self.inputs, self.progress, self.truth_cache)
        r.reference = ladder.reference()
        hop = ladder.deploy_hop(self.deploy, fp32, (PRE_HUB_SAMPLES, DEPLOY_SUBSET))
        if hop.status == "failed" and self.reparam:  # the fp64 gate passed: float32 arithmetic, not a wrong fold
            hop.reason += ("; the float64 equivalence gate passed: float32 rounding in the deploy-form exceeds its "
                           "allowance")
        r.parity.append(hop)

        # ONNX: the raw export, then the simplified hub graph every target builds from
        try:
            with self.progress.step("exporting ONNX"):  # (benchmarks/export_time.py reads the step names)
                made = export_onnx_info(self.deploy, imgsz, self.batch, self.opset, self.exporter)
                self.raw = check_onnx(made.model)
            del self.raw.graph.value_info[:]  # inferred shapes were for checking; saved graphs stay lean
        except OnnxExportError as e:
            r.parity.append(failed("onnx", exporter_label(self.exporter), str(e)))
            return None
        r.exporter, r.exporter_fallback = made.exporter, made.fallback_reason
        if made.fallback_reason:
            self.progress.note(f"dynamo could not export {r.model}; TorchScript did ({made.fallback_reason})")
        r.parity.append(ladder.onnx_hop("onnx", self.raw, fp32, (PRE_HUB_SAMPLES, RAW_SUBSET)))
        try:
            with self.progress.step("simplifying ONNX (onnxsim)"):
                simp, simp_info = simplify_keeping_fusions(self.raw)  # fused-op counts: artifact info
        except OnnxExportError as e:
            r.parity.append(failed("onnx-simplified", "onnxsim", str(e)))
            return None
        meta = _metadata(self.loaded, imgsz, self.batch, self.attn_order, r.reparam, r.versions, self.classes, r)
        hub = save_onnx(set_metadata(simp, meta), self.tmp / f"{r.model}.onnx")
        self.checkpoint("hub-graph")
        r.parity.append(ladder.onnx_hop("onnx-simplified", simp, fp32))
        ladder.widen_raw_hop(r.parity, self.raw, fp32)
        record_artifact(r, "onnx", hub, "fp32", {"simplify": simp_info}, root=self.tmp)
        if self.store is not None and all(h.status == "passed" for h in r.parity):  # never share a failed hub
            self.store.put(Hub(self.deploy, hub, self.raw, ladder.truth, self.inputs.note, copy.deepcopy(r.parity),
                               copy.deepcopy(r.reparam), self.attn_order, self.loaded.weights,
                               self.loaded.checkpoint_sha256, dict(self.loaded.overrides),
                               {**made.info(), "simplify": simp_info}))
        return hub, meta, ladder

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

    def _fp16_safe(self, x: np.ndarray) -> bool:
        """fp16 range analysis of the deploy-form (once per run): a model that would overflow in fp16 outside
        the precision policy's fp32 islands fails its fp16 hops with the module named, before lowering."""
        if self.fp16_analysis is None:
            from ...targets.graph.precision import default_policy
            from ..verdict.fp16_ranges import analyze_fp16_ranges

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

    def _calibration(self):
        """The run's calibration set (--precision int8 | w8a8), chosen once; None for other precisions."""
        if self.n_calib is not None and self.calibration is None:
            with self.progress.step(f"choosing {self.n_calib} calibration images"):
                self.calibration = calibration_set(self.n_calib, self.report.imgsz, *input_stats(self.deploy),
                                                   images_dir=self.images, calib_images=self.calib_images,
                                                   labels_file=self.labels_file, recipe=recipe_of(self.deploy))
            self.report.calibration = self.calibration.record()
        return self.calibration

    def _judged(self, ladder: Ladder) -> Judged:
        """The parity set's natural and user samples (none that calibrated) and the ladder's truth on them, once."""
        if self.judged is None:
            r = self.report
            train = ladder.train if ladder.train is not None else self.build_train()
            with self.progress.step("choosing the samples the compressed hops are judged on"):
                calib = self._calibration()
                self.judged = Judged.build(train, self.inputs, calib.ids if calib is not None else (),
                                           truth=ladder.truth, deploy=self.deploy)
            r.compressed_inputs = self.judged.describe(r.inputs, ", none that calibrated" if calib is not None else "")
        return self.judged

    def _int8_graph(self, plan: TargetPlan, hub: Path, ladder: Ladder, tol) -> Path:
        """The QDQ graph of the hub in the target's encoding, written and recorded; the tensorrt encoding gets
        its own hop on ONNX Runtime CPU (the engine itself needs a GPU)."""
        from ...targets import get_target

        encoding = plan.target.qdq_encoding
        with self.progress.step(f"int8 QDQ graph for {plan.name} ({encoding} encoding)"):
            path, info = write_qdq(hub, self._calibration(), encoding, self.tmp, self.report.model)
        key = plan.hop() if row_of(plan.name).onnx_graph else QDQ_HOP  # (an ONNX target's int8 artifact IS the graph)
        record_artifact(self.report, key, path, "int8", info, root=self.tmp)
        if key == QDQ_HOP:
            onnx_t = get_target("onnx")
            art = onnx_t.lower(self.deploy, LowerSpec(self.report.model, self.report.imgsz, self.batch, "int8",
                                                      self.tmp, hub, qdq_path=path))
            self.report.parity.append(compressed_hop(QDQ_HOP, onnx_t, art, tol, self._judged(ladder), self.deploy,
                                                     self.progress))
        return path

    def _target_hop(self, plan: TargetPlan, hub: Path, meta: dict, ladder: Ladder) -> Hop:
        hop_name, t = plan.hop(), plan.target
        tol = self.tols.get(profile_for(plan.precision)) if plan.precision else None
        if t is None:
            return unverified(hop_name, plan.name, plan.missing, tol)
        compressed = plan.precision in COMPRESSED
        try:
            qdq_path = self._int8_graph(plan, hub, ladder, tol) if plan.precision == "int8" and t.qdq_encoding else None
        except VitedgeError:
            raise  # bad input (e.g. unreadable --calib-images): exit 2, nothing written
        except Exception as e:
            return failed(hop_name, t.name, f"int8 quantization failed: {type(e).__name__}: {e}", tolerance=tol)
        ok, why = t.available()
        if not ok:
            return unverified(hop_name, t.name, f"{t.name} cannot lower here: {why}", tol)
        if plan.precision == "fp16" and not self._fp16_safe(ladder.x):
            return failed(hop_name, t.name, self.fp16_problem, tolerance=tol, diverging_module=self.fp16_module)
        spec = LowerSpec(name=self.report.model, imgsz=self.report.imgsz, batch=self.batch, precision=plan.precision,
                         out_dir=self.tmp, onnx_path=hub, metadata=dict(meta, precision=plan.precision),
                         options=dict(plan.options), qdq_path=qdq_path,
                         calibration=self._calibration() if plan.precision in CALIBRATED else None)
        try:
            with self.progress.step(f"lowering to {t.name} ({plan.precision})"):
                artifact = t.lower(self.deploy, spec)
        except VitedgeError:
            raise  # bad target-specific input (e.g. a missing --labels file): exit 2, nothing written
        except UnavailableError as e:
            return unverified(hop_name, t.name, f"{t.name} cannot lower here: {e}", tol)
        except Exception as e:
            return failed(hop_name, t.name, f"lowering to {t.name} failed: {type(e).__name__}: {e}", tolerance=tol)
        if not (row_of(plan.name).onnx_graph and compressed):  # (an ONNX target's int8 artifact: the QDQ graph)
            record_artifact(self.report, hop_name, artifact.path, artifact.precision, artifact.info, root=self.tmp)
        self.checkpoint(f"lowered-{t.name}")
        if compressed:
            return compressed_hop(hop_name, t, artifact, tol, self._judged(ladder), self.deploy, self.progress,
                                  also=hop_checks(t, self.report.require_ane))
        return ladder.artifact_hop(hop_name, t, artifact, tol, require_ane=self.report.require_ane)
