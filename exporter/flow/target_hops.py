"""The per-target loop of one export: every requested target lowered from the verified base graph (or, for
CoreML and ExecuTorch, from the deploy-form) and judged by its own parity hop against the train-form's float64
ground truth. pipeline.py builds the base graph and hands each target plan here; what the targets share across one
run (the fp16 range analysis, the calibration set, the samples compressed hops are judged on) is computed once,
on first need.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...precisions import HALF, row as precision_row
from ...models.registry import input_stats, recipe_of
from ...targets import Artifact, LowerSpec, UnavailableError, row_of
from ..core.progress import Progress
from ..core.report import Hop, Report
from ..core.settings import ExportSettings
from ..core.target_plans import TargetPlan
from ..quantize.calibrate import calibration_set
from ..quantize.compressed import QDQ_HOP, JudgedSamples, compressed_hop, write_qdq
from ..verdict.hops import Ladder, hop_checks, record_artifact
from ..verdict.inputs import ParitySet
from ..verdict.parity import failed, profile_for, unverified

FP16_CALIBRATION = 32    # parity inputs used for the fp16 range analysis


@dataclass
class ExportRun:
    """What the steps of one export run building into `tmp` share (pipeline.py's up to the base graph, then this
    module's)."""
    settings: ExportSettings            # as the run resolved them (batch, opset, exporter, attn_order, labels)
    report: Report                      # filled hop by hop
    deploy: nn.Module
    tmp: Path
    tols: dict
    progress: Progress
    checkpoint: Callable[[str], None]   # the output folder's named points (Ctrl-C, test pauses)
    inputs: ParitySet                   # the parity set (default or --images)
    build_train: Callable[[], nn.Module] | None  # the train-form, when a reused base's hop needs it
    n_calib: int | None                 # --precision int8 | w8a8: calibration images to take

    def shared(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(ExportRun)}


@dataclass
class TargetHops(ExportRun):
    """The target hops of one export run, appended to `report.parity` by `run`."""
    fp16_analysis: object = None        # exporter.verdict.fp16_ranges.Fp16Analysis, computed once if any target is fp16
    fp16_problem: str | None = None
    fp16_module: str | None = None
    calibration: object = None          # targets.calibration.Calibration, chosen once per run
    judged: JudgedSamples | None = None        # what compressed hops are judged on, built once per run

    def run(self, plans: list, graph: Path, meta: dict, ladder: Ladder) -> None:
        for plan in plans:  # every requested target, generically through the TARGETS table
            if self.report.hop(plan.hop()) is None:  # (the onnx fp32 artifact is the base graph, already checked)
                self.report.parity.append(self.hop(plan, graph, meta, ladder))

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
    def _calibration(self):
        """The run's calibration set (--precision int8 | w8a8), chosen once; None for other precisions."""
        if self.n_calib is not None and self.calibration is None:
            with self.progress.step(f"choosing {self.n_calib} calibration images"):
                self.calibration = calibration_set(self.n_calib, self.report.imgsz, *input_stats(self.deploy),
                                                   images_dir=self.settings.images,
                                                   calib_images=self.settings.calib_images,
                                                   labels_file=self.settings.labels, recipe=recipe_of(self.deploy))
            self.report.calibration = self.calibration.record()
        return self.calibration

    def _judged(self, ladder: Ladder) -> JudgedSamples:
        """The parity set's natural and user samples (none that calibrated) and the ladder's truth on them, once."""
        if self.judged is None:
            r = self.report
            train = ladder.train if ladder.train is not None else self.build_train()
            with self.progress.step("choosing the samples the compressed hops are judged on"):
                calib = self._calibration()
                self.judged = JudgedSamples.build(train, self.inputs, calib.ids if calib is not None else (),
                                           truth=ladder.truth, deploy=self.deploy)
            r.compressed_inputs = self.judged.describe(r.inputs, ", none that calibrated" if calib is not None else "")
        return self.judged

    def _int8_graph(self, plan: TargetPlan, graph: Path, ladder: Ladder, tol) -> Path:
        """The QDQ graph of the base graph in the target's encoding, written and recorded; the tensorrt encoding gets
        its own hop on ONNX Runtime CPU (the engine itself needs a GPU)."""
        from ...targets import get_target

        encoding = plan.target.qdq_encoding
        with self.progress.step(f"int8 QDQ graph for {plan.name} ({encoding} encoding)"):
            path, info = write_qdq(graph, self._calibration(), encoding, self.tmp, self.report.model)
        key = plan.hop() if row_of(plan.name).onnx_graph else QDQ_HOP  # (an ONNX target's int8 artifact IS the graph)
        record_artifact(self.report, key, path, "int8", info, root=self.tmp)
        if key == QDQ_HOP:
            onnx_t = get_target("onnx")
            art = onnx_t.lower(self.deploy, LowerSpec(self.report.model, self.report.imgsz, self.settings.batch, "int8",
                                                      self.tmp, graph, qdq_path=path))
            self.report.parity.append(compressed_hop(QDQ_HOP, onnx_t, art, tol, self._judged(ladder), self.deploy,
                                                     self.progress))
        return path

    def hop(self, plan: TargetPlan, graph: Path, meta: dict, ladder: Ladder) -> Hop:
        spec = self.spec(plan, graph, meta, ladder)
        if isinstance(spec, Hop):
            return spec
        t, tol = plan.target, self.tolerance(plan)
        try:
            with self.progress.step(f"lowering to {t.name} ({plan.precision})"):
                artifact = t.lower(self.deploy, spec)
        except VitedgeError:
            raise  # bad target-specific input (e.g. a missing --labels file): exit 2, nothing written
        except UnavailableError as e:
            return unverified(plan.hop(), t.name, f"{t.name} cannot lower here: {e}", tol)
        except Exception as e:
            return failed(plan.hop(), t.name, f"lowering to {t.name} failed: {type(e).__name__}: {e}", tolerance=tol)
        return self.judge(plan, artifact, ladder)

    def tolerance(self, plan: TargetPlan):
        return self.tols.get(profile_for(plan.precision)) if plan.precision else None

    def spec(self, plan: TargetPlan, graph: Path, meta: dict, ladder: Ladder) -> LowerSpec | Hop:
        """What `plan`'s target lowers from at this run's size, or the hop that says why it cannot lower."""
        hop_name, t = plan.hop(), plan.target
        tol = self.tolerance(plan)
        if t is None:
            return unverified(hop_name, plan.name, plan.missing, tol)
        p = precision_row(plan.precision)   # looked up now: a registered precision too
        try:
            qdq_path = (self._int8_graph(plan, graph, ladder, tol) if plan.precision == "int8" and t.qdq_encoding
                        else None)
        except VitedgeError:
            raise  # bad input (e.g. unreadable --calib-images): exit 2, nothing written
        except Exception as e:
            return failed(hop_name, t.name, f"int8 quantization failed: {type(e).__name__}: {e}", tolerance=tol)
        ok, why = t.available()
        if not ok:
            return unverified(hop_name, t.name, f"{t.name} cannot lower here: {why}", tol)
        if p is not None and p.kind == HALF and not self._fp16_safe(ladder.x):
            return failed(hop_name, t.name, self.fp16_problem, tolerance=tol, diverging_module=self.fp16_module)
        return LowerSpec(name=self.report.model, imgsz=self.report.imgsz, batch=self.settings.batch,
                         precision=plan.precision, out_dir=self.tmp, onnx_path=graph,
                         metadata=dict(meta, precision=plan.precision), options=dict(plan.options), qdq_path=qdq_path,
                         calibration=self._calibration() if p is not None and p.calibrates else None)

    def judge(self, plan: TargetPlan, artifact: Artifact, ladder: Ladder, record: bool = True) -> Hop:
        """The hop of a lowered artifact (for a one-file multi-size artifact: of its entry at this run's size);
        `record`: put the artifact in the report (a one-file artifact is recorded once, by its caller)."""
        hop_name, t, tol = plan.hop(), plan.target, self.tolerance(plan)
        p = precision_row(plan.precision)   # looked up now: a registered precision too
        compressed = p is not None and p.compressed
        if record and not (row_of(plan.name).onnx_graph and compressed):  # (ONNX int8: the QDQ graph, recorded)
            record_artifact(self.report, hop_name, artifact.path, artifact.precision, artifact.info, root=self.tmp)
        self.checkpoint(f"lowered-{t.name}")
        if compressed:
            return compressed_hop(hop_name, t, artifact, tol, self._judged(ladder), self.deploy, self.progress,
                                  also=hop_checks(t, self.report.require_ane))
        return ladder.artifact_hop(hop_name, t, artifact, tol, require_ane=self.report.require_ane)
