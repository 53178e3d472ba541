"""Compressed artifacts in the parity ladder (--precision int8 | w8 | palette4 | palette6 | w8a8): the QDQ graphs a
run writes, the samples compressed hops are judged on, the hops, and the localization of a failed one.

- The int8 QDQ graphs are built from the verified base graph, once per encoding the requested targets need
  (targets/graph/qdq.py): `NAME.int8.onnx` (onnx: uint8 activations, ONNX Runtime's fast path) and
  `NAME.int8.tensorrt.onnx` (tensorrt: int8 symmetric activations, what TensorRT's parser takes), with the same
  calibration and the same islands. The tensorrt graph is checked on ONNX Runtime CPU as hop `tensorrt-qdq` (the
  very graph the engine is built from), since the engine itself is unverified without a GPU.
- Judged samples (`JudgedSamples`): the parity set's natural and user samples, without any that calibrated
  (exporter/quantize/calibrate.py), against the train-form in float64, by the kind's profile (exporter/verdict/parity.py
  COMPRESSED_TOLERANCES). Stress samples are not judged: quantization ranges come from natural images. Samples
  are put in a seeded order, so the prefix an emulator runs mixes photos and classes. One disagreeing sample and
  one misclassified labelled sample are always tolerated (the resolution of n samples): the hop's tolerance
  records the bounds it was judged by. Each sample is also judged against an independent emulation of the kind
  (exporter/verdict/emulate.compressed_reference, the deploy-form compressed the kind's way in torch): an artifact far
  beyond what a correct one of its kind does on that sample fails (the compressed rule, parity.judge).
- Localization of a failed hop, by what the artifact's target gives (targets/base.py): an ONNX graph (`graph`) by
  exporter/verdict/localize.localize_onnx with the profile's bounds (int8 quantization error per module stays within
  them on correct artifacts); otherwise, where its reader gives weights to localize with (`read_weights`: a CoreML
  package's compressed weights, decompressed by the MIL interpreter's own kernels from the saved package), on the
  torch side: they are loaded into a copy of the deploy-form, which is compared module by module with the
  deploy-form (localize_torch). That finds a weight's error (a corrupted lookup table or scale, too coarse a
  palette); quantized activations (w8a8) are not modelled on the torch side, and the reason says so when the
  weights alone diverge nowhere.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.input_size import canonical
from ...precisions import TABLE
from ...targets.base import Artifact, Runner, StoredWeights, Target
from ...targets.calibration import Calibration
from ...targets.graph.metadata import read_metadata, set_metadata
from ...targets.graph.qdq import quantize_qdq
from .calibrate import evaluation_indices
from ..verdict.criteria import GroundTruth
from ..verdict.emulate import compressed_reference
from ..reparam.build_forms import build_deploy_form
from ..verdict.hops import open_runner
from ..verdict.inputs import ParitySet
from ..verdict.localize import localize_onnx, localize_torch
from ..verdict.parity import check_hop, ground_truth, unverified
from ..core.progress import Progress
from ..verdict.weight_check import judge_weights
from ..core.report import Hop, Tolerance

QDQ_FILES = {"onnxruntime": "{name}.int8.onnx", "tensorrt": "{name}.int8.tensorrt.onnx"}
QDQ_HOP = "tensorrt-qdq"      # the tensorrt encoding's graph, run by ONNX Runtime CPU
ORDER_SEED = 0
LOCALIZE_SAMPLES = 4


def write_qdq(graph: Path, calibration: Calibration, encoding: str, out_dir: Path, name: str) -> tuple[Path, dict]:
    """The QDQ int8 graph of the base graph in `encoding`, saved with its metadata (precision int8, the
    calibration record): (path, info)."""
    fp32 = onnx.load(str(graph))
    q = quantize_qdq(fp32, calibration.x, calibration_ids=calibration.ids, encoding=encoding)
    info = dict(q.info, calibration={**q.info["calibration"], **calibration.record()})
    meta = {**read_metadata(fp32), **read_metadata(q.model), "precision": "int8", "qdq_encoding": encoding}
    path = Path(out_dir) / QDQ_FILES[encoding].format(name=name)
    onnx.save(set_metadata(q.model, meta), str(path))
    return path, info


@dataclass
class JudgedSamples:
    """The samples compressed hops are judged on, their float64 ground truth, the train-form it came from and the
    deploy-form the kind's emulation compresses (built from the train-form when not given)."""
    train: nn.Module
    x: np.ndarray
    truth: GroundTruth
    names: tuple[str, ...]
    deploy: nn.Module | None = None

    @classmethod
    def build(cls, train: nn.Module, pset: ParitySet, calibration_ids=(), truth: GroundTruth | None = None,
              deploy: nn.Module | None = None) -> "JudgedSamples":
        """From the run's parity set without the samples that calibrated (`calibration_ids`: Calibration.ids or
        what an artifact recorded), and its ground truth where the ladder has one (subset, not rerun)."""
        idx = evaluation_indices(pset.names, pset.sets, calibration_ids)
        if len(idx) == 0:
            raise VitedgeError("no natural or user image is left to judge the compressed artifact on once the "
                               "calibration images are set aside; give more --images or --calib-images DIR")
        idx = idx[np.random.default_rng(ORDER_SEED).permutation(len(idx))]
        x = pset.numpy()[idx]
        sets = tuple(pset.sets[i] for i in idx)
        labels = pset.labels_array()
        labels = None if labels is None else labels[idx]
        if truth is None:
            truth = ground_truth(train, x, sets, labels)
        else:
            truth = GroundTruth(truth.y64[idx], truth.y32[idx], sets, labels, outputs=truth.outputs)
        return cls(train, x, truth, tuple(pset.names[i] for i in idx), deploy)

    def describe(self, parity_inputs: str, left_out: str) -> str:
        """report.json's `compressed_inputs`: which samples were judged (`left_out`: what calibration removed)."""
        kinds = " and ".join(sorted(set(self.truth.sets)))  # natural, and user with --images
        return (f"{len(self.x)} {kinds} samples of the parity set ({parity_inputs}){left_out}, in a seeded order "
                "(stress samples are not judged), against the train-form in float64")

    def truth_on(self, seen: np.ndarray, n: int) -> GroundTruth:
        """The truth for the first `n` samples as a runner really feeds them (an image input's 8-bit pixels)."""
        t = self.truth.head(n)
        return ground_truth(self.train, np.asarray(seen, np.float32), t.sets, t.labels)

    def with_emulation(self, truth: GroundTruth, seen: np.ndarray, kind: str) -> GroundTruth:
        """`truth` with the compressed rule's reference: the deploy-form compressed as `kind`, on `seen`."""
        if self.deploy is None:
            self.deploy = build_deploy_form(copy.deepcopy(self.train), canonical(np.shape(seen)[-2:]))[0]
        return replace(truth, yq=compressed_reference(self.deploy, np.asarray(seen, np.float32), kind))


def resolution_bounds(tol: Tolerance, n: int, labelled: int) -> Tolerance:
    """`tol` with one disagreeing sample (of `n`) and one misclassified labelled sample always tolerated."""
    out = tol
    if tol.top1_agreement is not None and n > 0:
        out = replace(out, top1_agreement=min(tol.top1_agreement, (n - 1) / n))  # judged as a count
    if tol.accuracy_drop is not None and labelled > 0:
        out = replace(out, accuracy_drop=max(tol.accuracy_drop, 1.0 / labelled))
    return out


def judge_compressed(hop_name: str, runner: Runner, judged: JudgedSamples, tol: Tolerance, kind: str) -> Hop:
    """An open runner's compressed hop (an artifact of compressed `kind`) on the judged samples (as many as the
    runner runs), by the kind's profile with the resolution bounds and, where the profile sets it, the compressed
    rule; `vitedge bench --artifact` judges a compressed artifact with this too."""
    n = min(len(judged.x), runner.max_samples or len(judged.x))
    x = judged.x[:n]
    seen = runner.reference_inputs(x)
    truth = judged.truth.head(n) if seen is x else judged.truth_on(seen, n)
    if tol.compressed_rule():
        truth = judged.with_emulation(truth, seen, kind)
    labelled = 0 if truth.labels is None else int((truth.labels >= 0).sum())
    return check_hop(hop_name, runner, x, None, resolution_bounds(tol, n, labelled), truth=truth,
                     names=judged.names[:n])


def compressed_hop(hop_name: str, target: Target, artifact: Artifact, tol: Tolerance, judged: JudgedSamples,
                   deploy: nn.Module, progress: Progress, mode: str | None = None,
                   also: Callable[[Hop, Runner], None] | None = None) -> Hop:
    """Run a compressed artifact through its target's runner on the judged samples (and `also` check what needs
    the runner still open: --require-ane); a failure is localized."""
    runner = open_runner(hop_name, target, artifact, tol, mode)
    if isinstance(runner, Hop):
        return runner
    with runner, progress.step(f"{hop_name} hop ({runner.backend})"):
        hop = judge_compressed(hop_name, runner, judged, tol, artifact.precision)
        hop.runner = runner.info() or None
        if also is not None:
            also(hop, runner)
    if mode and hop.mode not in (mode, None):
        return unverified(hop_name, hop.backend, f"--mode {mode} requested, but {target.name} runs here in "
                                                 f"{hop.mode} mode only", tol)
    with progress.step(f"{hop_name} weights check"):
        judge_weights(hop, deploy, artifact.path, artifact.precision, target, artifact.entry)
    if hop.status == "failed":
        with progress.step(f"localizing the {hop_name} divergence"):
            localize(hop, artifact, deploy, judged.x[:LOCALIZE_SAMPLES], target)
    return hop


OUTPUTS_ONLY = "not localized: only the artifact's outputs are read here"


def localize(hop: Hop, artifact: Artifact, deploy: nn.Module, x: np.ndarray, target: Target) -> None:
    """Name the first diverging module of a failed compressed hop in `hop` (see the module doc): an ONNX graph per
    module, an artifact whose reader gives weights to localize with on the torch side; for an artifact read only by
    its outputs, say so (the target's own words, Target.localization)."""
    try:
        graph = target.graph(artifact.path)
        # a target that says why it is not localized is not read for weights to localize with
        stored = (None if graph is not None or target.localization else
                  target.read_weights(artifact.path, **({"entry": artifact.entry} if artifact.entry else {})))
        if graph is not None:
            div = localize_onnx(graph, deploy, x, hop.tolerance)
            how = "ONNX Runtime per module"
        elif stored is not None and stored.localize:
            div = localize_weights(deploy, stored, x, hop.tolerance)
            how = "the artifact's decompressed weights in the deploy-form, per module"
        else:
            hop.reason = f"{hop.reason}; {target.localization or OUTPUTS_ONLY}"
            return
    except Exception as e:  # a diagnosis aid: never mask the hop's own failure
        hop.reason = f"{hop.reason}; localization failed ({type(e).__name__}: {e})"
        return
    if div is not None:
        hop.diverging_module = div.module
        hop.reason = f"{hop.reason}; {div.describe()} ({how})"
    elif graph is None and TABLE[artifact.precision].calibrates:
        hop.reason = (f"{hop.reason}; with the artifact's decompressed weights no module diverges: the activation "
                      "quantization (not modelled on the torch side) is where it goes wrong")
    else:
        hop.reason = f"{hop.reason}; no module's output diverges beyond the profile ({how}): accumulated error"


def _torch_key(name: str) -> str:
    return name.replace(".", "_")


def localize_weights(deploy: nn.Module, stored: StoredWeights, x: np.ndarray, tol: Tolerance):
    """First module whose output differs between the deploy-form and a copy of it holding the artifact's
    decompressed weights (`stored.localize`, matched by name: the converter names a weight after its parameter,
    `network.2.0.fc1.weight` -> `network_2_0_fc1_weight`). An artifact built from a changed deploy-form (an
    image-input package's 1/std folded into its first conv: `stored.reference`) is compared with the same change,
    both seeing x scaled as it scales its inputs (`stored.input_scale`)."""
    ref = copy.deepcopy(deploy).float().eval()
    if stored.reference is not None:
        ref = stored.reference(ref)
        if stored.input_scale is not None:
            x = (x * np.asarray(stored.input_scale, np.float32).reshape(1, -1, 1, 1)).astype(np.float32)
    cand = copy.deepcopy(ref)
    params = {_torch_key(n): p for n, p in cand.named_parameters()}
    matched = 0
    with torch.no_grad():
        for key, value in stored.localize.items():
            p = params.get(key)
            if p is not None and p.numel() == value.size:
                p.copy_(torch.from_numpy(value.reshape(p.shape)))
                matched += 1
    if matched == 0:
        raise RuntimeError("no compressed weight of the artifact matches a deploy-form parameter by name")
    return localize_torch(ref, cand, x, tol)
