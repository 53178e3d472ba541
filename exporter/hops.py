"""The parity ladder's hops, shared by `export` and `parity`: the parity set and its train-form reference, one hop
per runner, localization of a failed hop, and the report entry of an artifact.

Every hop is judged against the train-form on the same inputs. A runner whose artifact changes its inputs on the
way in (an image input takes 8-bit pixels) says so through `reference_inputs`, and its hop is judged against the
train-form on those inputs instead. Runners are used as context managers: their sessions and engines are released
as soon as the hop is judged.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch.nn as nn

from ..models.registry import input_stats
from ..targets.base import Artifact, Runner, Target, UnavailableError, sha256_file, size_bytes
from ..targets.ort import OnnxRuntimeRunner
from ..targets.pytorch import deploy_form_runner, train_form_runner
from . import inputs as parity_set
from .localize import localize_onnx
from .onnx_export import node_counts
from .parity import check_hop, failed, run_batched, unverified
from .progress import Progress
from .report import ArtifactEntry, Hop, Report, Tolerance
from .target_plans import artifact_key

PARITY_SEED = 0          # the parity input set's seed (README "Parity inputs")
LOCALIZE_SAMPLES = 4     # inputs used to localize a failed hop


def parity_set_for(model: nn.Module, n: int, imgsz: int) -> np.ndarray:
    """The documented parity set for `model` (normalized with its mean/std)."""
    mean, std = input_stats(model)
    return parity_set.parity_inputs(n, imgsz, seed=PARITY_SEED, mean=mean, std=std).numpy()


def inputs_note(n: int) -> str:
    return (f"vitedge.exporter.inputs.parity_inputs(n={n}, seed={PARITY_SEED}): "
            f"{', '.join(parity_set.CATEGORIES)} (cycled)")


@dataclass
class Ladder:
    """The parity inputs, the train-form reference on them, and the deploy-form every localization compares with.
    `train` may be None with `build_train` given (an export reusing a verified hub: exporter/hub.py): the train-
    form is then built only if a runner changes its inputs."""
    train: nn.Module | None
    deploy: nn.Module
    x: np.ndarray
    reference: np.ndarray
    progress: Progress
    build_train: Callable[[], nn.Module] | None = None

    @classmethod
    def build(cls, train: nn.Module, deploy: nn.Module, samples: int, imgsz: int, progress: Progress) -> "Ladder":
        x = parity_set_for(train, samples, imgsz)
        with progress.step(f"train-form reference on {samples} parity inputs"):
            reference = run_batched(train_form_runner(train), x)
        return cls(train, deploy, x, reference, progress)

    def reference_for(self, runner: Runner) -> np.ndarray:
        """The train-form on the inputs `runner` really feeds its artifact (Runner.reference_inputs)."""
        x = self.x[:runner.max_samples] if runner.max_samples else self.x
        seen = runner.reference_inputs(x)
        if seen is x:
            return self.reference
        if self.train is None:
            with self.progress.step("building the train-form model"):
                self.train = self.build_train()
        with self.progress.step(f"train-form reference on the inputs {runner.backend} sees"):
            return run_batched(train_form_runner(self.train), np.asarray(seen, np.float32))

    def judge(self, hop_name: str, runner: Runner, tol: Tolerance | None, step: str | None = None,
              also: Callable[[Hop, Runner], None] | None = None) -> Hop:
        """Run the hop on `runner`, record what the runner says about the run (and `also` check what needs the
        runner still open), release the runner."""
        with runner, self.progress.step(step or f"{hop_name} hop ({runner.backend})"):
            hop = check_hop(hop_name, runner, self.x, self.reference_for(runner), tol)
            hop.runner = runner.info() or None
            if also is not None:
                also(hop, runner)
        return hop

    def deploy_hop(self, deploy: nn.Module, tol: Tolerance) -> Hop:
        return self.judge("deploy-form", deploy_form_runner(deploy), tol, "deploy-form hop")

    def onnx_hop(self, hop_name: str, model: onnx.ModelProto, tol: Tolerance) -> Hop:
        """ONNX Runtime on an in-memory graph; a failure is localized to the first diverging module."""
        hop = self.judge(hop_name, OnnxRuntimeRunner(model), tol, f"{hop_name} hop (ONNX Runtime)")
        if hop.status == "failed":
            self.localize_onnx(hop, model)
        return hop

    def artifact_hop(self, hop_name: str, target: Target, artifact: Artifact, tol: Tolerance | None,
                     mode: str | None = None, on_runner: Callable[[Runner], None] | None = None,
                     require_ane: bool = False, also: Callable[[Hop, Runner], None] | None = None) -> Hop:
        """Run a built artifact through its target's runner on the parity set (unverified where it cannot run).
        `require_ane`: a CoreML hop also checks where CoreML runs the model (`ane_check`). `also(hop, runner)`:
        what else to record while the runner is open."""
        ok, why = target.runnable()
        if not ok:
            return unverified(hop_name, target.name, f"cannot run here: {why}", tol)
        try:
            runner = target.runner(artifact, mode=mode)
        except UnavailableError as e:
            return unverified(hop_name, target.name, f"cannot run here{f' in {mode} mode' if mode else ''}: {e}", tol)
        except Exception as e:
            return failed(hop_name, target.name, f"could not load the artifact: {type(e).__name__}: {e}", tolerance=tol)
        # A device runner knows its mode only once it has predicted (None until then): judged after the hop too.
        if mode and runner.mode not in (mode, None):
            runner.close()
            return unverified(hop_name, runner.backend, _mode_mismatch(mode, target, runner.mode), tol)
        if on_runner is not None:
            on_runner(runner)
        hop = self.judge(hop_name, runner, tol,
                         also=_all_of(ane_check if require_ane and target.name == "coreml" else None, also))
        if mode and hop.mode != mode:
            return unverified(hop_name, hop.backend, _mode_mismatch(mode, target, hop.mode), tol)
        if hop.status == "failed" and Path(artifact.path).suffix == ".onnx":
            self.localize_onnx(hop, onnx.load(str(artifact.path)))
        return hop

    def localize_onnx(self, hop: Hop, model: onnx.ModelProto) -> None:
        with self.progress.step(f"localizing the {hop.hop} divergence"):
            try:
                div = localize_onnx(model, self.deploy, self.x[:LOCALIZE_SAMPLES], hop.tolerance)
            except Exception as e:  # localization is a diagnosis aid: never mask the hop's own failure
                hop.reason = f"{hop.reason}; localization failed ({type(e).__name__}: {e})"
                return
        if div is not None:
            hop.diverging_module = div.module
            hop.reason = f"{hop.reason}; {div.describe()}"
        else:
            hop.reason = (f"{hop.reason}; no module's output diverges beyond the tolerance and its own float32 noise: "
                          "accumulated rounding rather than one broken op")


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


def _mode_mismatch(mode: str, target: Target, actual: str | None) -> str:
    return f"--mode {mode} requested, but {target.name} runs here in {actual} mode only"


def record_artifact(report: Report, hop_name: str, path: Path, precision: str, info: dict | None = None,
                    root: Path | None = None, model: onnx.ModelProto | None = None) -> None:
    """The report entry of an artifact: its path (relative to `root`, the build folder), sha256, size, precision,
    ONNX node counts and the target's facts."""
    path = Path(path)
    if model is None and path.suffix == ".onnx":
        model = onnx.load(str(path), load_external_data=False)
    report.artifacts[artifact_key(hop_name)] = ArtifactEntry(
        path=str(path.relative_to(root) if root is not None else path), sha256=sha256_file(path),
        bytes=size_bytes(path), precision=precision, nodes=node_counts(model) if model is not None else None,
        info=dict(info or {}))
