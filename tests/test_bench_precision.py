"""`vitedge bench` judges a device backend by its artifact's recorded precision, never by its backend string.

TensorRT engines are built in fp16 by default and CoreML packages too; their backend strings ("tensorrt 10.13.0
(NVIDIA H200)", "CoreML ALL (macOS 15.1)") say nothing about it. Fake targets (lower + runner, as bench's
_target_runner calls them) stand in for both: their runners compute the deploy-form with fp16-level error (fp16
inputs and outputs), so the fp32 noise rule must fail them and the fp16 profile must pass them, then they are
timed (TensorRT's GPU compute time too, through its prepare/execute). The same outputs from an artifact recorded
as fp32 fail: the recorded precision decides, not leniency.
"""
import numpy as np
import pytest
import torch

import vitedge.targets
from vitedge.exporter.timing import bench
from vitedge.exporter.timing.bench import run_bench
from vitedge.models.reduced import reduced
from vitedge.targets.base import Artifact, Runner, Target

TINY = reduced("swiftformer")
QUICK = dict(warmup_s=0.0, max_s=0.0, min_iters=3)


def _fp16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


class Fp16LikeRunner(Runner):
    """The deploy-form with fp16-level error: fp16-rounded inputs and outputs (relative error ~5e-4)."""
    mode = "device"

    def __init__(self, model, backend: str):
        self.model, self.backend = model, backend

    def run(self, x):
        with torch.no_grad():
            return _fp16(self.model(torch.from_numpy(_fp16(x))).numpy())


class FakeTensorRTRunner(Fp16LikeRunner):
    """Also has the CUDA-event interface bench times GPU compute with (prepare + execute -> ms)."""

    def prepare(self, x):
        self.staged = x

    def execute(self) -> float:
        self.run(self.staged)
        return 0.25


class FakeTarget(Target):
    def __init__(self, name: str, precision: str, runner_cls, backend: str):
        self.name, self.default_precision = name, precision
        self.runner_cls, self.backend, self.model = runner_cls, backend, None

    def lower(self, deploy_model, spec):
        self.model = deploy_model
        return Artifact(self.name, spec.out_dir / f"bench.{self.name}", spec.precision)

    def runner(self, artifact, mode=None):
        return self.runner_cls(self.model, self.backend)


def _bench(monkeypatch, targets: dict[str, FakeTarget]):
    monkeypatch.setattr(vitedge.targets, "get_target", lambda name: targets[name])  # what bench lowers with
    report = run_bench("swiftformer_xs", overrides=TINY, imgsz="32", backends=",".join(targets), **QUICK)
    return {r.backend: r for r in report.results}


def test_fp16_tensorrt_and_coreml_are_judged_by_the_fp16_profile_and_timed(monkeypatch):
    res = _bench(monkeypatch, {
        "tensorrt": FakeTarget("tensorrt", "fp16", FakeTensorRTRunner, "tensorrt 10.13.0 (NVIDIA H200)"),
        "coreml": FakeTarget("coreml", "fp16", Fp16LikeRunner, "CoreML ALL (macOS 15.1)")})
    for name in ("tensorrt", "coreml"):
        r = res[name]
        assert r.status == "ok" and r.valid, r.reason
        assert r.precision == "fp16"
        assert r.parity["max_rel"] > 1e-5  # really fp16-level error: the fp32 rule would have failed it
        assert r.latency is not None and r.latency["iters"] >= 3
    assert res["tensorrt"].gpu_compute is not None and res["tensorrt"].gpu_compute["iters"] >= 3
    assert res["coreml"].gpu_compute is None


def test_the_same_outputs_recorded_as_fp32_fail_and_are_not_timed(monkeypatch):
    res = _bench(monkeypatch, {
        "tensorrt": FakeTarget("tensorrt", "fp32", FakeTensorRTRunner, "tensorrt 10.13.0 (NVIDIA H200)")})
    r = res["tensorrt"]
    assert r.precision == "fp32"
    assert r.status == "failed" and not r.valid and r.latency is None and r.gpu_compute is None
    assert "parity failed" in r.reason


@pytest.mark.parametrize("given, on_runner, want", [(None, None, "fp32"), (None, "fp16", "fp16"),
                                                    ("int8", "fp16", "int8")])
def test_runner_precision_comes_from_the_artifact_never_the_backend_string(given, on_runner, want):
    r = Fp16LikeRunner(None, "fp16 in the backend's name says nothing")
    if on_runner:
        r.precision = on_runner
    assert bench.runner_precision(r, given) == want
    assert bench._tolerance_for(r, given).profile == want
