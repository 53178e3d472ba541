"""The parity ladder's hops, shared by `export`, `parity` and `package`: the parity set and its float64 ground
truth, one hop per runner, localization of a failed hop, and the report entry of an artifact.

Every hop is judged against the train-form on the same inputs: the train-form in float64 is the truth, the same
train-form in float32 gives each sample's intrinsic float32 noise, and the per-sample noise rule
(exporter/verdict/criteria.py) decides, per input set (natural / stress / user). The ground truth is computed once per
run and reused by every hop. A runner whose artifact changes its inputs on the way in (an image input takes 8-bit
pixels) says so through `reference_inputs`; its hop is judged against the ground truth on those inputs instead
(computed once per run for them). Runners are used as context managers: their sessions and engines are released
as soon as the hop is judged. A failed hop is localized by the same rule, on its worst samples.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch.nn as nn

from ...models.features import output_specs
from ...models.outputs import output_columns
from ...precisions import HALF, names
from ...models.registry import recipe_of
from ...targets import target_for_file
from ...targets.base import Artifact, Runner, Target, UnavailableError, sha256_file, size_bytes
from ...targets.graph.runtime import OnnxRuntimeRunner
from ...targets.pytorch import deploy_form_runner
from ...targets.rows import ANE
from . import images as image_files, inputs as parity_inputs
from .criteria import GroundTruth, reference_block
from .inputs import ParitySet
from .localize import localize_onnx
from ..onnx.onnx_export import node_counts
from .probe import PROBE_SAMPLES, deploy_reference, judge_probe, onnx_tensor, probe_point
from .parity import REFERENCE_THREADS, check_hop, failed, fp16_reference, noise_rule, unverified
from ..core.progress import Progress
from ..core.report import ArtifactEntry, Hop, Report, Tolerance
from ..core.target_plans import BASE_HOPS, artifact_key

RAW_HOP = BASE_HOPS[0]  # the base graph as exported, before onnxsim
from .truth_cache import cached_ground_truth
from .weight_check import judge_weights
from ...models.input_size import as_hw

PARITY_SEED = 0          # the parity input set's seed (README "Parity inputs")
LOCALIZE_SAMPLES = 4     # inputs used to localize a failed hop (its worst samples first)
# `vitedge export` runs its deploy-form and raw onnx hops on this many parity inputs (every input set in
# proportion): the onnx-simplified hop runs the same deploy-form graph on all of them, and the float64 gate has
# proved the folds. The raw hop runs on all of them again when the simplified one fails (did onnxsim do it?).
PRE_BASE_SAMPLES = 64
DEPLOY_SUBSET = "the onnx-simplified hop runs the exported deploy-form on every input"
RAW_SUBSET = ("the onnx-simplified hop runs this graph, simplified, on every input (this one runs all of them when "
              "that one fails)")


def parity_inputs_for(model: nn.Module, imgsz: int, samples: int, images: str | Path | None = None,
                      labels: str | Path | None = None) -> ParitySet:
    """The run's parity set, preprocessed by `model`'s recipe (models.registry.recipe_of): the default set (`samples` natural and stress
    inputs interleaved 3:1), or with `images` every image of that folder followed by a small stress set (labels
    from an ImageFolder layout, class index by `labels`' lines, else sorted folder order). Bad images or folders
    raise VitedgeError naming the file."""
    recipe = recipe_of(model)
    if images is not None:
        return parity_inputs.user_set(images, imgsz, labels_file=labels, seed=PARITY_SEED, recipe=recipe)
    return parity_inputs.parity_set(samples, imgsz, PARITY_SEED, recipe=recipe)


def check_images(images: str | Path | None, labels: str | Path | None = None) -> None:
    """--images checked before any work: the folder's layout and, in ImageFolder layout, every class folder against
    --labels (the images themselves are decoded when the parity set is built, and name the file if they fail)."""
    if images is not None:
        image_files.scan_folder(images, labels)


def parity_set_for(model: nn.Module, n: int, imgsz: int) -> np.ndarray:
    """The default parity set's inputs for `model` (normalized with its mean/std)."""
    return parity_inputs_for(model, imgsz, n).numpy()


@dataclass
class Ladder:
    """The parity set, the train-form's ground truth on it, and the deploy-form every localization compares with.
    `train` may be None with `build_train` given (an export reusing a verified base: exporter/flow/verified_base.py):
    the train-form is then built only if a runner changes its inputs."""
    train: nn.Module | None
    deploy: nn.Module
    inputs: ParitySet
    truth: GroundTruth
    progress: Progress
    build_train: Callable[[], nn.Module] | None = None
    use_cache: bool = True              # the disk cache of ground truths (truth_cache.py)
    cache: dict | None = None           # what the cache did for `truth` (report.json reference.cache)
    _truths: dict = field(default_factory=dict)  # ground truth on the inputs a runner really sees, by content
    _probe_refs: dict = field(default_factory=dict)  # (module, samples) -> (float64, float32) probe outputs
    _fp16_refs: dict = field(default_factory=dict)   # the fp16 rule's reference outputs, by input content
    outputs: tuple = ()                 # the deploy-form's outputs (models/features.py OutputSpec), in order

    def __post_init__(self):
        self.outputs = output_specs(self.deploy, tuple(self.inputs.x.shape[2:]))
        self.truth = self.with_outputs(self.truth)

    def with_outputs(self, truth: GroundTruth) -> GroundTruth:
        """`truth` knowing which of its columns belong to which output (several outputs: each judged alone)."""
        return replace(truth, outputs=output_columns(self.outputs)) if len(self.outputs) > 1 else truth

    @classmethod
    def build(cls, train: nn.Module, deploy: nn.Module, inputs: ParitySet, progress: Progress,
              use_cache: bool = True) -> "Ladder":
        with progress.step(f"train-form ground truth on {len(inputs)} parity inputs (float64; float32 on "
                           f"{REFERENCE_THREADS} threads)"):
            truth, cache = cached_ground_truth(train, inputs.numpy(), inputs.sets, inputs.labels_array(),
                                               use_cache=use_cache)
        if cache["status"] == "hit":
            progress.note(f"ground truth read from the cache ({cache['path']})")
        return cls(train, deploy, inputs, truth, progress, use_cache=use_cache, cache=cache)

    @property
    def x(self) -> np.ndarray:
        return self.inputs.numpy()

    def reference(self) -> dict:
        """report.json's `reference` block: the train-form's own float32 noise and accuracy."""
        return {**reference_block(self.truth, self.inputs.classes), "cache": self.cache}

    def truth_for(self, runner: Runner) -> GroundTruth:
        """The ground truth on the inputs `runner` really feeds its artifact (Runner.reference_inputs)."""
        x = self.x[:runner.max_samples] if runner.max_samples else self.x
        seen = runner.reference_inputs(x)
        if seen is x:
            return self.truth
        seen = np.ascontiguousarray(seen, dtype=np.float32)
        key = hashlib.sha256(seen.tobytes()).hexdigest()
        if key not in self._truths:
            if self.train is None:
                with self.progress.step("building the train-form model"):
                    self.train = self.build_train()
            n, labels = len(seen), self.inputs.labels_array()
            with self.progress.step(f"train-form ground truth on the inputs {runner.backend} sees"):
                self._truths[key] = self.with_outputs(cached_ground_truth(
                    self.train, seen, self.inputs.sets[:n], None if labels is None else labels[:n],
                    use_cache=self.use_cache)[0])
        return self._truths[key]

    def judge(self, hop_name: str, runner: Runner, tol: Tolerance | None, step: str | None = None,
              also: Callable[[Hop, Runner], None] | None = None, subset: tuple[int, str] | None = None) -> Hop:
        """Run the hop on `runner`, record what the runner says about the run (and `also` check what needs the
        runner still open), release the runner. `subset` (n, why): run only n samples, each input set's first
        ones in proportion to its share (subset_indices), saying why in `Hop.subset`."""
        idx = subset_indices(self.inputs.sets, subset[0]) if subset else None
        x, names = self.x, self.inputs.names
        with runner, self.progress.step(step or f"{hop_name} hop ({runner.backend})"):
            truth = self.truth_for(runner)
            if tol is not None and tol.fp16_rule():  # on the samples the runner runs (an emulator: a subset)
                truth = self.with_fp16_reference(truth.head(runner.max_samples or len(truth.y64)), runner)
            if idx is not None:
                x, truth = x[idx], truth.take(idx)
                names = None if names is None else tuple(names[i] for i in idx)
            hop = check_hop(hop_name, runner, x, None, tol, truth=truth, names=names)
            hop.runner = runner.info() or None
            if also is not None:
                also(hop, runner)
        if idx is not None:
            for d in (hop.sets or {}).values():  # worst samples name positions in the whole parity set
                if d.get("worst_sample"):
                    d["worst_sample"]["index"] = int(idx[d["worst_sample"]["index"]])
            counts = ", ".join(f"{int(np.sum(np.asarray(truth.sets) == s))} {s}" for s in truth.present())
            hop.subset = f"the first {counts} of the {len(self.x)} parity inputs: {subset[1]}"
        return hop

    def with_fp16_reference(self, truth: GroundTruth, runner: Runner) -> GroundTruth:
        """`truth` with the fp16 rule's reference: the deploy-form rounded to fp16 (parity.fp16_reference) on the
        inputs `runner` really feeds its artifact, computed once per run for them."""
        seen = np.ascontiguousarray(runner.reference_inputs(self.x[:len(truth.y64)]), dtype=np.float32)
        key = hashlib.sha256(seen.tobytes()).hexdigest()
        if key not in self._fp16_refs:
            with self.progress.step(f"deploy-form rounded to fp16 on {len(seen)} inputs (the fp16 rule)"):
                self._fp16_refs[key] = fp16_reference(self.deploy, seen)
        return replace(truth, y16=self._fp16_refs[key])

    def deploy_hop(self, deploy: nn.Module, tol: Tolerance, subset: tuple[int, str] | None = None) -> Hop:
        return self.judge("deploy-form", deploy_form_runner(deploy), tol, "deploy-form hop", subset=subset)

    def onnx_hop(self, hop_name: str, model: onnx.ModelProto, tol: Tolerance,
                 subset: tuple[int, str] | None = None) -> Hop:
        """ONNX Runtime on an in-memory graph; a failure is localized to the first diverging module."""
        hop = self.judge(hop_name, OnnxRuntimeRunner(model), tol, f"{hop_name} hop (ONNX Runtime)", subset=subset)
        self.check_onnx(hop, model)
        return hop

    def widen_raw_hop(self, parity: list[Hop], raw: onnx.ModelProto, tol: Tolerance) -> None:
        """After a failed onnx-simplified hop: the raw onnx hop, run on a subset and passed, runs again on every
        input (in place in `parity`), so that the report tells whether onnxsim broke the graph."""
        at = next(i for i, h in enumerate(parity) if h.hop == RAW_HOP)
        if parity[-1].status == "failed" and parity[at].status == "passed" and parity[at].subset:
            parity[at] = self.onnx_hop(RAW_HOP, raw, tol)

    def check_onnx(self, hop: Hop, model: onnx.ModelProto) -> None:
        """After an ONNX graph's hop: a passing one is probed (exporter/verdict/probe.py), a failed one localized."""
        if hop.status == "passed":
            self.probe_onnx(hop, model)
        if hop.status == "failed":
            self.localize_onnx(hop, model)

    def probe_onnx(self, hop: Hop, model: onnx.ModelProto) -> None:
        """The feature probe of an ONNX hop under the noise rule; a broken probe fails the hop."""
        rule = noise_rule(hop.tolerance)
        if rule is None:
            return
        if len(self.outputs) > 1 or any(len(o.shape) > 1 for o in self.outputs):
            # the probe looks at a map before a classifier pools it; here every output is judged itself
            hop.probe = {"status": "not applicable",
                         "why": "the outputs are maps or several, each judged by the noise rule"}
            return
        x = self.x[:min(PROBE_SAMPLES, hop.samples or len(self.x))]
        with self.progress.step(f"{hop.hop} feature probe"):
            try:
                point = probe_point(model, self.deploy, x)
                if point is None:
                    hop.probe = {"status": "not run", "why": "no deploy-form module output maps to a feature map "
                                                             "in this graph"}
                    return
                module, tensor = point
                key = (module, len(x))  # hops that run fewer samples probe fewer
                if key not in self._probe_refs:
                    self._probe_refs[key] = deploy_reference(self.deploy, module, x)
                y64, y32 = self._probe_refs[key]
                cand = onnx_tensor(model, tensor, x)
            except Exception as e:  # a check that raised is never a pass: the hop is unverified, saying why
                why = f"{type(e).__name__}: {e}"
                hop.probe = {"status": "error", "why": why}
                hop.status = "unverified"
                hop.reason = f"the feature probe raised ({why}): the logits passed, the feature map is unchecked"
                return
        if cand.size != y64.size:
            hop.probe = {"status": "not run", "module": module, "tensor": tensor,
                         "why": f"ONNX tensor shape {cand.shape} differs from the module output {y64.shape}"}
            return
        probe = judge_probe(module, tensor, cand, y64, y32, self.inputs.sets[:len(x)], rule)
        hop.probe = {"status": "passed" if probe.passed else "failed", **probe.as_dict()}
        if not probe.passed:
            hop.status, hop.reason = "failed", probe.describe()

    def artifact_hop(self, hop_name: str, target: Target, artifact: Artifact, tol: Tolerance | None,
                     mode: str | None = None, on_runner: Callable[[Runner], None] | None = None,
                     require_ane: bool = False, also: Callable[[Hop, Runner], None] | None = None) -> Hop:
        """Run a built artifact through its target's runner on the parity set (unverified where it cannot run).
        `require_ane`: a CoreML hop also checks where CoreML runs the model (`ane_check`). `also(hop, runner)`:
        what else to record while the runner is open."""
        runner = open_runner(hop_name, target, artifact, tol, mode)
        if isinstance(runner, Hop):
            return runner
        # A device runner knows its mode only once it has predicted (None until then): judged after the hop too.
        if mode and runner.mode not in (mode, None):
            runner.close()
            return unverified(hop_name, runner.backend, _mode_mismatch(mode, target, runner.mode), tol)
        if on_runner is not None:
            on_runner(runner)
        hop = self.judge(hop_name, runner, tol,
                         also=_all_of(hop_checks(target, require_ane), also))
        if mode and hop.mode != mode:
            return unverified(hop_name, hop.backend, _mode_mismatch(mode, target, hop.mode), tol)
        if artifact.precision in names(HALF):   # the table now: a registered fp16-kind precision too
            with self.progress.step(f"{hop_name} weights check"):
                judge_weights(hop, self.deploy, artifact.path, artifact.precision, target, artifact.entry)
        graph = target.graph(artifact.path) if hop.status in ("passed", "failed") else None
        if graph is not None:
            self.check_onnx(hop, graph)
        elif hop.status == "failed" and target.localization:
            hop.reason = f"{hop.reason}; {target.localization}"
        return hop

    def localize_samples(self, hop: Hop) -> np.ndarray:
        """Indices of the inputs a failed hop is localized on: each set's worst sample (failing sets first), then
        the first inputs, LOCALIZE_SAMPLES in all."""
        sets = sorted((hop.sets or {}).values(), key=lambda d: -(d.get("noise_ratio") or 0.0))
        picked = [d["worst_sample"]["index"] for d in sets if d.get("worst_sample")]
        picked += range(hop.samples or len(self.x))
        return np.array(list(dict.fromkeys(picked))[:LOCALIZE_SAMPLES], dtype=np.int64)

    def localize_onnx(self, hop: Hop, model: onnx.ModelProto) -> None:
        """Name the first module whose output breaks the hop's rule (the noise rule where its tolerance sets one)."""
        with self.progress.step(f"localizing the {hop.hop} divergence"):
            try:
                div = localize_onnx(model, self.deploy, self.x[self.localize_samples(hop)], hop.tolerance,
                                    rule=noise_rule(hop.tolerance))
            except Exception as e:  # localization is a diagnosis aid: never mask the hop's own failure
                hop.reason = f"{hop.reason}; localization failed ({type(e).__name__}: {e})"
                return
        if div is not None:
            hop.diverging_module = div.module
            hop.reason = f"{hop.reason}; {div.describe()}"
        else:
            hop.reason = (f"{hop.reason}; no module's output diverges beyond the tolerance and its own float32 noise: "
                          "accumulated rounding rather than one broken op")


def subset_indices(sets: tuple[str, ...], n: int) -> np.ndarray | None:
    """Indices of n samples: each input set's first ones, in proportion to the set's share (at least one of each),
    in parity-set order; None when n covers the whole set."""
    total = len(sets)
    if n >= total:
        return None
    by_set: dict[str, list[int]] = {}
    for i, s in enumerate(sets):
        by_set.setdefault(s, []).append(i)
    picked = [i for members in by_set.values()
              for i in members[:max(1, round(n * len(members) / total))]]
    return np.array(sorted(picked), dtype=np.int64)


def open_runner(hop_name: str, target: Target, artifact: Artifact, tol: Tolerance | None,
                mode: str | None = None) -> Runner | Hop:
    """The target's runner for `artifact`, or the hop that says why there is none (unverified where it cannot run
    here, failed where the artifact does not load)."""
    ok, why = target.runnable()
    if not ok:
        return unverified(hop_name, target.name, f"cannot run here: {why}", tol)
    try:
        return target.runner(artifact, mode=mode)
    except UnavailableError as e:
        return unverified(hop_name, target.name, f"cannot run here{f' in {mode} mode' if mode else ''}: {e}", tol)
    except Exception as e:
        return failed(hop_name, target.name, f"could not load the artifact: {type(e).__name__}: {e}", tolerance=tol)


def hop_checks(target: Target, require_ane: bool = False) -> Callable | None:
    """The checks a target's row adds to its hops (`TargetRow.checks`), those the run asked for, as one
    `also(hop, runner)`; None when there are none."""
    asked = {ANE: require_ane}
    row = getattr(target, "row", None)
    return _all_of(*(CHECKS[c] for c in (row.checks if row else ()) if asked.get(c)))


def ane_check(hop: Hop, runner: Runner) -> None:
    """--require-ane: a CoreML device hop fails when the model mostly runs off the Neural Engine; where that
    cannot be told (no Neural Engine, no compute plan, not run on CoreML) the check is inconclusive."""
    check = getattr(runner, "ane_residency", None)  # CoreML's device runner only
    if runner.mode == "device" and callable(check):
        res = check()
    else:
        res = {"status": "inconclusive", "reason": f"the hop ran {runner.mode or 'nowhere'}, not on CoreML itself: "
                                                   "where ops run is known only on macOS (--mode device)"}
    hop.ane_residency = res
    if res["status"] == "failed" and hop.status == "passed":
        hop.status, hop.reason = "failed", f"--require-ane: {res['reason']}"


def _all_of(*checks: Callable[[Hop, Runner], None] | None) -> Callable[[Hop, Runner], None] | None:
    """One `also` callback running each given check in turn (None when none is given)."""
    given = [c for c in checks if c is not None]
    if not given:
        return None

    def run(hop: Hop, runner: Runner) -> None:
        for check in given:
            check(hop, runner)
    return run


CHECKS = {ANE: ane_check}  # a row's hop checks by name


def _mode_mismatch(mode: str, target: Target, actual: str | None) -> str:
    return f"--mode {mode} requested, but {target.name} runs here in {actual} mode only"


def record_artifact(report: Report, hop_name: str, path: Path, precision: str, info: dict | None = None,
                    root: Path | None = None, model: onnx.ModelProto | None = None) -> None:
    """The report entry of an artifact: its path (relative to `root`, the build folder), sha256, size, precision,
    ONNX node counts and the target's facts."""
    path = Path(path)
    if model is None:  # an ONNX graph's node counts (its target says whether it is one)
        target = target_for_file(path)
        model = target.graph(path, weights=False) if target is not None else None
    report.artifacts[artifact_key(hop_name)] = ArtifactEntry(
        path=str(path.relative_to(root) if root is not None else path), sha256=sha256_file(path),
        bytes=size_bytes(path), precision=precision, nodes=node_counts(model) if model is not None else None,
        info=dict(info or {}))
