"""The export pipeline's contract: targets driven generically through the TARGETS table, flag validation
before any work, the atomic output folder (refuse to overwrite, --force, quarantine), unverified hops."""
from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

import vitedge
from vitedge.exporter.flow import pipeline, verify
from vitedge.exporter.core.outdir import MANIFEST
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.flow.verify import parity
from vitedge.models import VitedgeError
from vitedge.models.reduced import reduced
from vitedge.targets import TARGETS
from vitedge.targets.base import Artifact, Runner, Target, UnavailableError
from vitedge.targets.onnx.target import OnnxRuntimeRunner

SWIFT = reduced("swiftformer")
IMGSZ = 32
FAST = dict(imgsz=IMGSZ, samples=4, overrides=SWIFT)


class _GainRunner(Runner):
    mode, backend = "emulated", "fake runtime"

    def __init__(self, path, gain):
        self.inner, self.gain = OnnxRuntimeRunner(path), gain

    def run(self, x):
        return self.inner.run(x) * self.gain

    def max_batch(self):
        return self.inner.max_batch()


class FakeTarget(Target):
    """Lowers to a copy of the base ONNX; its runner scales the logits by the `gain` option."""
    name, suffix = "fake", ".fake"
    default_precision, precisions, options, dynamic_batch = "fp16", ("fp32", "fp16"), ("gain",), False
    specs: list = []

    def lower(self, deploy_model, spec):
        FakeTarget.specs.append(spec)
        if spec.options.get("gain") == "explode":
            raise VitedgeError("--gain must be a number")
        path = Path(spec.out_dir) / f"{spec.name}{self.suffix}"
        path.write_bytes(Path(spec.onnx_path).read_bytes())
        return Artifact(self.name, path, spec.precision, info={"note": "fake"})

    def runner(self, artifact, **kw):
        return _GainRunner(artifact.path, float(FakeTarget.specs[-1].options.get("gain", 1.0)))


class OfflineTarget(FakeTarget):
    name = "offline"

    def available(self):
        return False, "needs a GPU"


class NoRunTarget(FakeTarget):
    name = "norun"

    def runnable(self):
        return False, "needs macOS"


class RaisingRunnerTarget(FakeTarget):
    name = "norunner"

    def runner(self, artifact, **kw):
        raise UnavailableError("framework missing")


@pytest.fixture(autouse=True)
def fake_targets(monkeypatch):
    mod = types.ModuleType("vitedge_test_fake_targets")
    for cls in (FakeTarget, OfflineTarget, NoRunTarget, RaisingRunnerTarget):
        setattr(mod, cls.__name__, cls)
        monkeypatch.setitem(TARGETS, cls.name, f"vitedge_test_fake_targets:{cls.__name__}")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    FakeTarget.specs = []


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_public_api_is_the_pipeline():
    assert vitedge.export is pipeline.export and vitedge.parity is verify.parity


def test_generic_target_is_lowered_checked_and_recorded(tmp_path):
    out = tmp_path / "run"
    report = export("swiftformer_xs", "onnx,fake", out=out, options={"gain": 1.0}, **FAST)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    assert [h.hop for h in report.parity] == ["deploy-form", "onnx", "onnx-simplified", "fake"]
    hop = report.hop("fake")
    assert (hop.status, hop.mode, hop.backend, hop.tolerance.profile) == ("passed", "emulated", "fake runtime", "fp16")
    spec = FakeTarget.specs[0]
    assert spec.precision == "fp16" and spec.options == {"gain": 1.0} and spec.batch == 1
    assert spec.onnx_path.name == "swiftformer_xs.onnx" and spec.metadata["model"] == "swiftformer_xs"
    assert report.artifacts["fake"].path == "swiftformer_xs.fake" and report.artifacts["fake"].info == {"note": "fake"}
    assert _tree(out) == [MANIFEST, "report.json", "swiftformer_xs.fake", "swiftformer_xs.onnx"]
    assert report.targets == ["onnx", "fake"]


def test_failed_hop_quarantines_every_artifact(tmp_path):
    out = tmp_path / "run"
    report = export("swiftformer_xs", "fake", out=out, options={"gain": 1.5}, **FAST)
    assert report.exit_code == 1 and report.status == "failed"
    assert report.hop("fake").status == "failed" and "cosine" not in report.hop("fake").reason  # scale, not shape
    assert _tree(out) == [MANIFEST, "quarantine", "quarantine/swiftformer_xs.fake", "quarantine/swiftformer_xs.onnx",
                          "quarantine/swiftformer_xs.raw.onnx", "report.json"]
    assert report.quarantine == "quarantine"
    assert {a.path for a in report.artifacts.values()} == {"quarantine/swiftformer_xs.onnx",
                                                           "quarantine/swiftformer_xs.fake"}


def test_explicit_precision_applies_to_targets_that_support_it(tmp_path):
    export("swiftformer_xs", "fake", out=tmp_path / "a", precision="fp32", **FAST)
    assert FakeTarget.specs[-1].precision == "fp32"


def test_unverified_hops_are_never_passed(tmp_path):
    reasons = {"offline": "needs a GPU", "norun": "needs macOS", "norunner": "framework missing"}
    report = export("swiftformer_xs", "offline,norun,norunner", out=tmp_path / "run", **FAST)
    for target, reason in reasons.items():
        hop = report.hop(target)
        assert hop.status == "unverified" and reason in hop.reason and hop.metrics is None
        assert (target in report.artifacts) == (target != "offline")  # built wherever it could be lowered
    assert report.exit_code == 0  # nothing failed; the summary lists them as unverified
    strict = export("swiftformer_xs", "onnx,norun", out=tmp_path / "strict", require_verified=True, **FAST)
    assert strict.exit_code == 1 and strict.quarantine is None  # nothing failed: artifacts stay where they are
    assert (tmp_path / "strict" / "swiftformer_xs.fake").exists()  # the norun target writes a .fake file


def test_missing_target_module_is_unverified(tmp_path, monkeypatch):
    monkeypatch.setitem(TARGETS, "fake", "vitedge_no_such_module:FakeTarget")
    report = export("swiftformer_xs", "onnx,fake", out=tmp_path / "run", **FAST)
    assert report.hop("fake").status == "unverified" and "not available" in report.hop("fake").reason
    assert report.exit_code == 0 and report.hop("onnx-simplified").status == "passed"


@pytest.mark.parametrize("kwargs,message", [
    (dict(targets="onnx", options={"gain": 2.0}), "--gain does not apply"),
    (dict(targets="fake", dynamic_batch=True), "--dynamic-batch is not supported by fake"),
    (dict(targets="onnx", dynamic_batch=True, batch=2), "exclude each other"),
    (dict(targets="onnx", precision="w8"), "--precision w8 is not supported by onnx"),
    (dict(targets="onnx", precision="int8", calib=0), "--calib"),
    (dict(targets="onnx,nope"), "unknown target"),
    (dict(targets="onnx", imgsz=40), "divisible by 32"),
    (dict(targets="onnx", checkpoint="/no/such.pth"), "not found"),
    (dict(targets="onnx", opset=3), "--opset"),
    (dict(targets="onnx", samples=0), "--samples"),
    (dict(targets="onnx", tolerances=["fp32.nope=1"]), "--tol"),
    (dict(targets="fake", options={"gain": "explode"}), "--gain must be a number"),  # raised by the target itself
])
def test_bad_input_raises_before_anything_is_written(tmp_path, kwargs, message):
    args = dict(FAST, **kwargs)
    with pytest.raises(VitedgeError, match=message):
        export("swiftformer_xs", out=tmp_path / "run", **args)
    assert list(tmp_path.iterdir()) == []  # no output folder, no temporary sibling


def test_refuses_to_overwrite_then_force_replaces_atomically(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "old.onnx").write_text("previous run")
    with pytest.raises(VitedgeError, match="--force"):
        export("swiftformer_xs", "onnx", out=out, **FAST)
    assert _tree(out) == ["old.onnx"] and (out / "old.onnx").read_text() == "previous run"
    with pytest.raises(VitedgeError, match="did not write in .*old.onnx"):  # not vitedge's file: --force keeps it
        export("swiftformer_xs", "onnx", out=out, force=True, **FAST)
    report = export("swiftformer_xs", "onnx", out=out, force=True, clean=True, **FAST)
    assert report.exit_code == 0
    assert _tree(out) == [MANIFEST, "report.json", "swiftformer_xs.onnx"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary or old sibling left


def test_an_empty_existing_folder_is_used_without_force(tmp_path):
    (tmp_path / "run").mkdir()
    assert export("swiftformer_xs", "onnx", out=tmp_path / "run", **FAST).exit_code == 0


def test_no_reparam_exports_the_train_form(tmp_path):
    report = export("swiftformer_xs", "onnx", out=tmp_path / "run", reparam=False, **FAST)
    assert report.exit_code == 0 and report.reparam.folded == {} and report.reparam.equivalence is None
    assert "--no-reparam" in report.reparam.unfolded[0]["why"]
    assert report.artifacts["onnx"].nodes.get("BatchNormalization", 0) > 0  # nothing was folded


def test_tolerance_override_can_fail_a_hop(tmp_path):
    # A bound tighter than float32 rounding fails every fp32 hop: the gate is real, not a formality.
    report = export("swiftformer_xs", "onnx", out=tmp_path / "run", tolerances=["fp32.max_rel=1e-12"], **FAST)
    assert report.exit_code == 1
    assert {h.hop for h in report.failed_hops()} == {"deploy-form", "onnx", "onnx-simplified"}
    assert all(h.tolerance.max_rel == 1e-12 for h in report.parity)
    assert np.isfinite(report.hop("onnx").metrics.max_rel)


def test_noise_rule_overrides_apply_to_every_fp32_hop(tmp_path):
    # K far below 1 allows less than float32's own noise: every fp32 hop fails, by the noise rule, per set
    report = export("swiftformer_xs", "onnx", out=tmp_path / "tight", tolerances=["fp32.noise_k=0.01",
                                                                                 "fp32.noise_floor=1e-12"], **FAST)
    assert report.exit_code == 1 and {h.hop for h in report.failed_hops()} == {"deploy-form", "onnx",
                                                                                "onnx-simplified"}
    assert all(h.tolerance.noise_k == 0.01 and "noise_ratio" in h.reason for h in report.parity)
    assert all(s["noise_ratio"] > 1 for h in report.parity for s in h.sets.values() if s["problems"])
    # both keys disabled and nothing else set: no fp32 check is left, the (same) artifacts pass
    off = export("swiftformer_xs", "onnx", out=tmp_path / "off", tolerances=["fp32.noise_k=none",
                                                                            "fp32.noise_floor=none"], **FAST)
    assert off.exit_code == 0 and all(s["noise_ratio"] is None for h in off.parity for s in h.sets.values())


def test_parity_on_a_target_artifact_reads_its_metadata_and_honours_mode(tmp_path, monkeypatch):
    export("swiftformer_xs", "fake", out=tmp_path / "run", **FAST)
    seen = []

    def read_metadata(self, path):  # the optional hook; CoreML-style all-string values are decoded
        seen.append(Path(path).name)
        return {"model": "swiftformer_xs", "imgsz": str(IMGSZ), "precision": "fp32", "overrides": '{"layers": '
                '[1, 1, 2, 1], "embed_dims": [16, 24, 32, 48], "num_classes": 10}', "checkpoint_sha256": "none"}

    monkeypatch.setattr(FakeTarget, "read_metadata", read_metadata, raising=False)
    art = tmp_path / "run" / "swiftformer_xs.fake"
    report = parity("swiftformer_xs", art, samples=4)
    assert seen == ["swiftformer_xs.fake"] and report.imgsz == IMGSZ and report.overrides["num_classes"] == 10
    hop = report.hop("fake")
    assert (hop.status, hop.mode, hop.tolerance.profile) == ("passed", "emulated", "fp32")
    strict = parity("swiftformer_xs", art, samples=4, mode="device", require_verified=True)
    assert strict.hop("fake").status == "unverified" and "emulated" in strict.hop("fake").reason
    assert strict.exit_code == 1
