"""`vitedge parity` as a Python API: the parity ladder on artifacts that already exist.

Hops: deploy-form (a deploy checkpoint from `vitedge reparam`, else a fresh re-parameterization) and the artifact,
each against the train-form's float64 ground truth on the parity set, by the per-sample noise rule (hops.py). What
the artifact says about itself (ONNX metadata_props, a target's `read_metadata`) supplies the model, size,
overrides, attention order and checkpoint hash it was exported with, and which ONNX exporter wrote it; flags given
explicitly win (a different model or exporter is an error). A compressed artifact (int8 QDQ graph, compressed CoreML
package) is judged by its kind's profile on the natural samples that did not calibrate it (the calibration ids it
recorded), as `export` does (exporter/quantize/compressed.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch.nn as nn

from ...errors import VitedgeError
from ...models.features import output_specs
from ...models.input_size import as_hw, canonical, size_text
from ...precisions import compressed_names
from ...models.preprocess import Recipe
from ...targets import row_of
from ...targets.base import Artifact, Runner
from ...targets.rows import ONNX
from .artifact_files import ArtifactFile, artifact_paths, check_same_export, sizes_to_check
from .deploy_checkpoint import load_deploy_checkpoint
from ..verdict.equivalence import verify_equivalence
from ..quantize.compressed import JudgedSamples, compressed_hop
from ..reparam.build_forms import build_deploy_form, build_train_form, model_name, reparam_info
from ...targets.labels import class_names, labels_of
from ..verdict.predictions import predictions
from ..verdict.hops import Ladder, check_images, hop_checks, parity_inputs_for, record_artifact
from ..onnx.onnx_choice import check_exporter
from ..onnx.onnx_dynamo import graph_opset
from ..verdict.localize import localize_torch
from ..verdict.parity_cost import check_samples, choose_samples
from ..verdict.parity import FLOAT64_TOLERANCES, noise_rule, profile_for, tolerances as make_tolerances, unverified
from ..core.progress import QUIET, Progress
from ..core.settings import ExportSettings, size_label
from ..core.report import Hop, Report, versions
from ..core.target_plans import TargetPlan, artifact_key, check_precision
from ..core.writable import check_file_path
from .sizes import size_row


# the settings parity reads (the rest shape an export, and are refused rather than ignored)
PARITY_SETTINGS = ("model", "targets", "checkpoint", "imgsz", "precision", "attn_order", "samples", "tolerances",
                   "require_verified", "overrides", "seed", "require_ane", "images", "labels", "exporter",
                   "truth_cache")


def parity(model=None, artifact: str | Path | list | None = None, *, deploy_checkpoint: str | Path | None = None,
           report_path: str | Path | None = None, mode: str | None = None, progress: Progress | None = None,
           **settings) -> Report:
    """The parity ladder for an existing artifact and/or a deploy-form checkpoint (`vitedge reparam`).

    `model` is an ExportSettings (exporter/core/settings.py) or the model, with the settings parity reads as
    keywords (PARITY_SETTINGS: checkpoint, target, imgsz, precision, attn_order, samples, tolerances,
    require_verified, overrides, seed, require_ane, images, labels, exporter, truth_cache), as for `export`.

    Hops: deploy-form (the deploy checkpoint if given, else a fresh re-parameterization) and the artifact,
    each against the train-form's float64 ground truth on the parity set. Artifact metadata (ONNX metadata_props)
    supplies the size, overrides and attention order it was exported with; settings given explicitly win. `mode`
    ("device" | "emulated") insists on how the artifact runs: otherwise the hop is unverified. `images` /
    `labels`: the user's image folder as the parity set, class names in index order (as for `export`); labels
    that differ from those the artifact carries are an error.

    Several sizes: a multi-size artifact (a multifunction CoreML package, an ExecuTorch program of several
    methods) has every function / method judged at its own size, each its own hop with its own deploy-form hop and
    ground truth; `artifact` may also be a list of files (the per-size ONNX files of a multi-size export), each
    judged at the size it records. Hops then carry `size` (and `entry`, the function / method) and the report
    `sizes`, as a multi-size export's do; `imgsz` picks some of the sizes.

    `model` None: the model the artifact's (or deploy checkpoint's) metadata names. `exporter`: the ONNX
    exporter the artifact was written with, recorded in the report where its metadata does not say; one that
    contradicts the metadata is an error. An artifact carrying class names (`vitedge.labels`) gets its top-1
    class names on the first parity inputs in the report (`parity[].predictions`). `truth_cache`: read and keep the
    float64 ground truth in the disk cache (exporter/verdict/truth_cache.py).
    """
    s = ExportSettings.build(model, settings, "parity")
    s.only(PARITY_SETTINGS, "parity")
    model_or_name, checkpoint, target, precision = s.model, s.checkpoint, s.targets, s.precision
    samples, overrides, images, labels = s.samples, s.overrides, s.images, s.labels
    progress = progress or QUIET
    if mode not in (None, "device", "emulated"):
        raise VitedgeError(f"--mode must be device or emulated; got {mode!r}")
    paths = artifact_paths(artifact)
    if not paths and deploy_checkpoint is None:
        raise VitedgeError("vitedge parity needs --artifact PATH (and/or --deploy-checkpoint PATH)")
    check_precision(precision)
    check_samples(samples)
    check_file_path(report_path, "--report")  # written last: a folder or an unwritable place is known now
    check_images(images, labels)
    tols = make_tolerances(s.tolerances, FLOAT64_TOLERANCES)
    files = [ArtifactFile.read(path, target, precision) for path in paths]
    meta = files[0].meta if files else {}
    for f in files[1:]:
        check_same_export(files[0], f)
    deploy = None
    if deploy_checkpoint is not None:
        deploy = load_deploy_checkpoint(deploy_checkpoint)
        dmeta = deploy.deploy_checkpoint_meta
        meta = {"model": dmeta["model"], "imgsz": dmeta["imgsz"], "attn_order": dmeta["attn_order"],
                "overrides": dmeta["overrides"], "checkpoint_sha256": dmeta["checkpoint_sha256"],
                "weights": "checkpoint" if dmeta["checkpoint_sha256"] else "untrained",
                **meta}  # an artifact's own metadata wins
    source = files[0].path if files else deploy_checkpoint
    if model_or_name is None:
        if not meta.get("model"):
            raise VitedgeError(f"{source} carries no vitedge metadata naming its model; pass --model NAME")
        model_or_name = meta["model"]
    name = model_or_name if isinstance(model_or_name, str) else model_name(model_or_name)
    made_with = _exporter_of(source, files[0].tname if files else None, meta, s.exporter)
    for where, held in [(f.path, f.meta.get("model")) for f in files] or [(source, meta.get("model"))]:
        if held and held != name:
            raise VitedgeError(f"{where} holds {held}, not {name}; pass --model {held}")
    check_checkpoint(source, meta, checkpoint)
    jobs = sizes_to_check(files, s, meta.get("imgsz"))
    _check_folded_for(deploy, deploy_checkpoint, [z for z in jobs if z is not None])  # (None: the model's default)
    if overrides is None and isinstance(model_or_name, str):
        overrides = meta.get("overrides") or {}

    with progress.step("building the train-form model"):
        # an artifact of feature maps (its vitedge.features) is judged against the same maps of the train-form
        loaded = build_train_form(model_or_name, checkpoint, overrides, s.seed, features=meta.get("features"))
    if isinstance(meta.get("preprocess"), dict):  # the artifact's own eval preprocessing (models/preprocess.py)
        loaded.model.vitedge_recipe = Recipe.from_dict(meta["preprocess"])
    check_checkpoint(source, meta, checkpoint, loaded.checkpoint_sha256)
    for f in files:
        check_class_count(f.path, f.graph, f.meta, loaded.model, s.checkpoint)
    several = len(jobs) > 1 or any(entry for judged in jobs.values() for _, entry in judged)
    run = _Run(s, model_or_name, loaded, meta, deploy, deploy_checkpoint, made_with, mode, tols, progress)
    reports = []
    for size, judged in jobs.items():
        if several:
            progress.note(f"input size {size_text(size)} ({len(reports) + 1} of {len(jobs)})")
        reports.append(run.at_size(size, judged))
    report = reports[0]
    if several:
        _merge_sizes(report, reports, jobs)
    report.finalize()
    if report_path is not None:
        report.write(report_path)
    return report


@dataclass
class _Run:
    """What every size of a `parity` run shares: its settings, train-form, the artifacts' metadata, the deploy
    checkpoint (if given) and how hops are judged."""
    s: ExportSettings
    model_or_name: object
    loaded: object                  # reparam.build_forms' loaded train-form
    meta: dict
    deploy: nn.Module | None        # the deploy checkpoint, if given
    deploy_checkpoint: Path | None
    made_with: str | None           # the ONNX exporter that wrote the artifact
    mode: str | None
    tols: dict
    progress: Progress

    def at_size(self, imgsz, judged: list) -> Report:
        """The single-size parity run at `imgsz` (None: the model's default): the deploy-form hop and each (file,
        entry) of `judged`, in a report of its own."""
        s, loaded, meta, progress = self.s, self.loaded, self.meta, self.progress
        images, labels = s.images, s.labels
        imgsz = loaded.at_size(imgsz)
        classes = class_names(labels, loaded.model, imgsz)
        _check_carried_labels(classes, meta.get("labels"), labels,
                              judged[0][0].path if judged else self.deploy_checkpoint)
        samples, rule = choose_samples(s.samples, self.model_or_name, imgsz, loaded.overrides, loaded.model, images)
        with progress.step("reading the parity inputs"):
            pset = parity_inputs_for(loaded.model, imgsz, samples, images, labels)
        deploy = self.deploy
        _check_folded_for(deploy, self.deploy_checkpoint, [imgsz])
        with progress.step("re-parameterizing"):
            # the same rewrites as the deploy checkpoint, so that localization compares like module trees
            same = deploy.deploy_checkpoint_meta.get("rewrites", True) if deploy is not None else True
            fresh, fresh64 = build_deploy_form(loaded.model, imgsz, True,
                                               s.attn_order or meta.get("attn_order") or "auto", rewrites=same)
        deploy = deploy or fresh

        first = judged[0][0] if judged else None
        batch = meta.get("batch")
        report = Report(model=loaded.name, imgsz=imgsz, batch=batch if isinstance(batch, int) else None,
                        weights=loaded.weights, checkpoint_sha256=loaded.checkpoint_sha256,
                        reparam=reparam_info(deploy), versions=versions(), command="parity",
                        targets=list(dict.fromkeys(f.tname for f, _ in judged)), overrides=loaded.overrides,
                        samples=len(pset), samples_rule=rule, inputs=pset.note,
                        images=None if images is None else str(images), labels=None if labels is None else str(labels),
                        require_verified=s.require_verified, require_ane=s.require_ane, exporter=self.made_with,
                        exporter_fallback=meta.get("exporter_fallback") if self.made_with else None,
                        opset=graph_opset(first.graph) if first is not None and first.graph is not None else None,
                        outputs=[o.as_dict() for o in output_specs(deploy, as_hw(imgsz))],
                        features=meta.get("features"))

        ladder = Ladder.build(loaded.model, deploy, pset, progress, s.truth_cache)
        report.reference = ladder.reference()
        hop = ladder.deploy_hop(deploy, self.tols["fp32"])
        if hop.status == "failed":
            _localize_deploy_hop(hop, loaded.model, fresh, fresh64, deploy, ladder, imgsz, progress)
        report.parity.append(hop)
        for f, entry in judged:
            if f.plan.precision in compressed_names():
                hop = _compressed_artifact_hop(report, f.plan, f.path, f.graph, f.meta, ladder, self.tols, self.mode,
                                               progress, entry)
            else:
                hop = _existing_artifact_hop(report, f.plan, f.path, f.graph, ladder, self.tols, self.mode,
                                             labels_of(f.meta), entry)
            hop.entry = entry
            report.parity.append(hop)
        return report


def _check_folded_for(deploy, deploy_checkpoint, sizes: list) -> None:
    """A deploy checkpoint is checked at the size it was folded for (its file's metadata): every size the run
    checks must be that one."""
    if deploy is None:
        return
    folded_for = deploy.deploy_checkpoint_meta["imgsz"]
    other = next((z for z in sizes if z != canonical(folded_for)), None)
    if other is not None:
        raise VitedgeError(f"{deploy_checkpoint} was folded for imgsz {size_text(folded_for)}, the check runs at "
                           f"{size_text(other)}; pass --imgsz {size_text(folded_for)}")


def _merge_sizes(report: Report, reports: list[Report], jobs: dict) -> None:
    """`report` (the first size's) with every size's hops (`size` set) and artifacts, and `sizes`, as a multi-size
    export's report has them: an artifact of every size keeps its key, a file of one size is keyed KEY@HxW."""
    own = [(r, r.parity, r.artifacts) for r in reports]  # (the first is `report` itself)
    report.parity, report.artifacts, report.sizes = [], {}, []
    for (r, parity, artifacts), judged in zip(own, jobs.values()):
        label = size_label(as_hw(r.imgsz))
        for h in parity:
            h.size = label
        report.parity += parity
        files = {}
        for (_, entry), h in zip(judged, parity[1:]):  # (after the deploy-form hop: one hop per file)
            key = artifact_key(h.hop)
            files[key] = artifacts[key].path
            report.artifacts[key if entry else f"{key}@{label}"] = artifacts[key]
        report.sizes.append(size_row(label, next((e for _, e in judged if e), None), r, files))
    report.targets = list(dict.fromkeys(t for r in reports for t in r.targets))


def _check_carried_labels(classes: list[str] | None, carried, labels, source) -> None:
    """--labels against what the artifact says it was exported with: the names (ONNX `vitedge.labels`) or their
    count (CoreML's user metadata `labels`)."""
    if classes is None or carried is None:
        return
    same = carried == classes if isinstance(carried, list) else carried == len(classes)
    if not same:
        raise VitedgeError(f"--labels {labels} differs from the class names {source} carries (vitedge.labels); "
                           "pass the labels file it was exported with")


def check_checkpoint(source: Path, meta: dict, checkpoint, loaded_sha256: str | None = None) -> None:
    """An artifact made from a checkpoint is checked against that checkpoint: none given is an error, and so is
    one whose sha256 (`loaded_sha256`, once loaded) differs from the one its metadata records."""
    if meta.get("weights") == "checkpoint" and checkpoint is None:
        raise VitedgeError(f"{source} was exported from a checkpoint (sha256 {str(meta.get('checkpoint_sha256'))[:12]}"
                           "...); pass the same --checkpoint")
    exported_from = meta.get("checkpoint_sha256")
    if exported_from and loaded_sha256 and exported_from != loaded_sha256:
        raise VitedgeError(f"--checkpoint (sha256 {loaded_sha256[:12]}...) is not the one {source} was "
                           f"made from ({exported_from[:12]}...)")


def check_class_count(source: Path, graph: onnx.ModelProto | None, meta: dict, model: nn.Module,
                      checkpoint) -> None:
    """An artifact whose output has another class count than the model it is checked against (an untrained
    1000-class export checked with a 5-class --checkpoint) is the user's mismatch: said before any work (`parity`,
    `bench --artifact`). An ONNX graph says its count in its output's shape; a program or package in the metadata
    its export wrote."""
    want = getattr(model, "num_classes", None)
    dims = graph.graph.output[0].type.tensor_type.shape.dim if graph is not None and graph.graph.output else []
    got = dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else meta.get("num_classes")
    if isinstance(want, int) and want > 0 and isinstance(got, int) and got and got != want:
        given = f"--checkpoint {checkpoint}" if checkpoint is not None else "the model's default (no --checkpoint)"
        raise VitedgeError(f"{source} outputs {got} classes, the model built from {given} has {want}: they are "
                           "not the same model; check the artifact against the checkpoint it was exported from")


def _localize_deploy_hop(hop: Hop, train: nn.Module, fresh: nn.Module, fresh64: nn.Module, deploy: nn.Module,
                         ladder: Ladder, imgsz: int, progress: Progress) -> None:
    with progress.step("localizing the deploy-form divergence"):
        if deploy is not fresh:  # a loaded deploy checkpoint has the fresh fold's module tree: compare module by module
            div = localize_torch(fresh, deploy, ladder.x[ladder.localize_samples(hop)], hop.tolerance,
                                 rule=noise_rule(hop.tolerance))
            where = div and (div.module, div.describe())
        else:  # the fold itself is suspect: the equivalence gate compares train and deploy block by block
            eq = verify_equivalence(train, fresh64, imgsz, raise_on_fail=False)
            where = eq.diverging_module and (eq.diverging_module,
                                             f"first diverging block {eq.diverging_module} (float64 equivalence gate)")
    if where:
        hop.diverging_module, detail = where
        hop.reason = f"{hop.reason}; {detail}"


def _exporter_of(source: Path, target: str | None, meta: dict, exporter: str | None) -> str | None:
    """The ONNX exporter that wrote the artifact: its metadata's, else `exporter` as given (checked against the
    metadata: the one that wrote it, or dynamo when the metadata records a fallback from it)."""
    from_onnx = target is not None and row_of(target).source == ONNX  # an ONNX graph, or built from one
    said = meta.get("exporter") if from_onnx else None
    if exporter is None:
        return said
    check_exporter(exporter)
    if not from_onnx:
        raise VitedgeError(f"--exporter says which ONNX exporter wrote an ONNX graph (or the graph a TensorRT engine "
                           f"was built from); {source} is not one: drop --exporter")
    asked = "dynamo" if meta.get("exporter_fallback") else said
    if said is not None and exporter not in (said, asked):
        raise VitedgeError(f"{source} was exported with the {said} exporter (its vitedge.exporter metadata), not "
                           f"{exporter}; drop --exporter or pass --exporter {said}")
    return said or exporter


def _existing_artifact_hop(report: Report, plan: TargetPlan, path: Path, art_model: onnx.ModelProto | None,
                           ladder: Ladder, tols: dict, mode: str | None = None,
                           labels: list[str] | None = None, entry: str | None = None) -> Hop:
    """`path`'s hop (of its function / method `entry`, in an artifact of several sizes)."""
    hop_name = plan.existing_hop()
    tol = tols.get(plan.precision) if plan.precision else None
    art = Artifact(plan.name, path, plan.precision or "fp32", entry=entry)
    record_artifact(report, hop_name, path, art.precision, model=art_model)
    if plan.target is None:
        return unverified(hop_name, plan.name, plan.missing, tol)

    def note_batch(runner: Runner) -> None:
        if report.batch is None and runner.max_batch():
            report.batch = runner.max_batch()  # the artifact's static batch, when its metadata did not say

    def name_classes(hop: Hop, runner: Runner) -> None:  # the artifact's class names, printed by the summary
        if labels and hop.status != "unverified":
            hop.predictions = predictions(runner, ladder.x, ladder.truth_for(runner).y64.astype(np.float32), labels)

    return ladder.artifact_hop(hop_name, plan.target, art, tol, mode, note_batch, require_ane=report.require_ane,
                               also=name_classes)


def recorded_calibration_ids(meta: dict) -> list:
    """The calibration ids an artifact recorded: an int8 graph's `vitedge.int8` entry, a CoreML package's
    `compression` entry; [] for weight-only kinds."""
    for key, sub in (("int8", "calibration"), ("compression", None)):
        entry = meta.get(key)
        if isinstance(entry, dict):
            rec = entry.get(sub) if sub else entry
            ids = (rec or {}).get("ids" if sub else "calibration_ids")
            if ids:
                return list(ids)
    return []


def _compressed_artifact_hop(report: Report, plan: TargetPlan, path: Path, art_model, meta: dict, ladder: Ladder,
                             tols: dict, mode: str | None, progress: Progress, entry: str | None = None) -> Hop:
    hop_name = plan.hop()
    tol = tols[profile_for(plan.precision)]
    art = Artifact(plan.name, path, plan.precision, entry=entry)
    record_artifact(report, hop_name, path, art.precision, model=art_model)
    if plan.target is None:
        return unverified(hop_name, plan.name, plan.missing, tol)
    ids = recorded_calibration_ids(meta)
    with progress.step("choosing the samples the compressed hop is judged on"):
        judged = JudgedSamples.build(ladder.train, ladder.inputs, ids, truth=ladder.truth, deploy=ladder.deploy)
    report.compressed_inputs = judged.describe(report.inputs, f", without the {len(ids)} calibration ids the "
                                               "artifact records and their photos")
    return compressed_hop(hop_name, plan.target, art, tol, judged, ladder.deploy, progress, mode,
                          also=hop_checks(plan.target, report.require_ane))
