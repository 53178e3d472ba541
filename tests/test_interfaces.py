"""The declared Target / Runner interface (targets/base.py): its defaults, runners as context managers that the
ladder closes, and `reference_inputs` wired into the hops (an artifact that quantizes its inputs, as an image
input does, is judged against the train-form on the quantized inputs)."""
from __future__ import annotations

import dataclasses
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from vitedge.errors import VitedgeError
from vitedge.exporter.flow import pipeline
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.flow.verify import parity
from vitedge.models.reduced import reduced
from vitedge.targets import TARGETS
from vitedge.targets.base import Artifact, LowerSpec, Runner, Target, pad_batch
from vitedge.targets.onnx.target import OnnxRuntimeRunner

SWIFT = reduced("swiftformer")
FAST = dict(imgsz=32, samples=6, overrides=SWIFT)
STEP = 0.5  # the fake artifact's input grid (normalized units): coarse enough to change the logits well past fp32
CLOSED: list = []


class _Minimal(Target):
    name = "minimal"

    def lower(self, deploy_model, spec):
        return Artifact(self.name, spec.out_dir, spec.precision)

    def runner(self, artifact, mode=None):
        raise NotImplementedError


class _Echo(Runner):
    def run(self, x):
        return x


def test_target_defaults():
    t = _Minimal()
    assert t.hop_name("fp32") == "minimal" and t.hop_name(None) == "minimal"
    assert t.available() == (True, None) and t.runnable() == (True, None)
    assert t.validate_options({"anything": 1}) is None
    assert t.read_metadata(Path("x.minimal")) == {}


def test_target_hop_names_override_per_precision():
    from vitedge.targets import get_target

    onnx = get_target("onnx")
    assert onnx.hop_name("fp32") == "onnx-simplified" and onnx.hop_name("fp16") == "onnx-fp16"
    assert get_target("coreml").hop_name("fp16") == "coreml"


def test_runner_defaults_and_lifecycle():
    x = np.zeros((2, 3, 4, 4), np.float32)
    r = _Echo()
    assert r.reference_inputs(x) is x and r.info() == {} and r.max_samples is None and r.max_batch() is None
    closed = []
    r.close = lambda: closed.append(True)
    with pytest.raises(ValueError), r as same:
        assert same is r
        raise ValueError("the hop crashed")
    assert closed == [True]  # released even when the hop raised


def test_pad_batch_repeats_the_last_row():
    x = np.arange(2 * 3, dtype=np.float32).reshape(2, 3)
    padded = pad_batch(x, 4)
    assert padded.shape == (4, 3) and (padded[2:] == x[-1]).all() and (padded[:2] == x).all()
    assert pad_batch(x, 2) is x


def test_onnx_runtime_runner_releases_its_session(tmp_path):
    report = export("swiftformer_xs", "onnx", out=tmp_path / "run", **FAST)
    with OnnxRuntimeRunner(tmp_path / "run" / "swiftformer_xs.onnx") as r:
        assert r.info()["providers"]
    assert r.session is None and r.info() == {}
    assert report.hop("onnx-simplified").runner["providers"]  # the runner's facts are in the hop


# ---- a fake artifact whose inputs are quantized on the way in (like an image input) -----------------------

def _quantize(x: np.ndarray) -> np.ndarray:
    return (np.round(x / STEP) * STEP).astype(np.float32)


class _QuantizingRunner(Runner):
    mode, backend = "emulated", "quantizing fake"

    def __init__(self, path, says_so: bool):
        self.inner, self.says_so = OnnxRuntimeRunner(path), says_so

    def run(self, x):
        return self.inner.run(_quantize(x))

    def max_batch(self):
        return self.inner.max_batch()

    def reference_inputs(self, x):
        return _quantize(x) if self.says_so else x

    def info(self):
        return {"grid": STEP}

    def close(self):
        CLOSED.append(self.backend)
        self.inner.close()


class _DeviceLaterRunner(_QuantizingRunner):
    """Like CoreML's device runner: its mode is known only once it has predicted."""
    backend = "device-later fake"
    mode = None

    def run(self, x):
        self.mode = "device"
        return super().run(x)


class QuantTarget(Target):
    name, suffix = "quant", ".quant"
    says_so = True

    def lower(self, deploy_model, spec: LowerSpec):
        path = Path(spec.out_dir) / f"{spec.name}{self.suffix}"
        path.write_bytes(Path(spec.onnx_path).read_bytes())
        return Artifact(self.name, path, spec.precision)

    def runner(self, artifact, mode=None):
        return _QuantizingRunner(artifact.path, self.says_so)


class SilentQuantTarget(QuantTarget):
    name = "silentquant"
    says_so = False


class DeviceLaterTarget(QuantTarget):
    name = "devicelater"

    def runner(self, artifact, mode=None):
        return _DeviceLaterRunner(artifact.path, True)


@pytest.fixture(autouse=True)
def fake_targets(monkeypatch):
    mod = types.ModuleType("vitedge_test_interface_targets")
    for cls in (QuantTarget, SilentQuantTarget, DeviceLaterTarget):
        setattr(mod, cls.__name__, cls)
        monkeypatch.setitem(TARGETS, cls.name, f"{mod.__name__}:{cls.__name__}")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    CLOSED.clear()


def test_hops_compare_against_the_inputs_the_artifact_really_sees(tmp_path):
    report = export("swiftformer_xs", "quant,silentquant", out=tmp_path / "run", **FAST)
    told, silent = report.hop("quant"), report.hop("silentquant")
    assert told.status == "passed", told.reason           # judged against train-form(quantized inputs)
    assert told.metrics.max_rel < 1e-4
    assert silent.status == "failed", silent.metrics      # the same artifact judged against the raw inputs
    assert told.runner == {"grid": STEP}                  # Runner.info() lands in the hop
    assert sorted(CLOSED) == ["quantizing fake", "quantizing fake"]  # every runner released after its hop


def test_a_device_runner_that_knows_its_mode_only_after_running_satisfies_mode_device(tmp_path):
    export("swiftformer_xs", "devicelater", out=tmp_path / "run", **FAST)
    art = tmp_path / "run" / "swiftformer_xs.quant"
    report = parity("swiftformer_xs", art, target="devicelater", samples=6, imgsz=32, overrides=SWIFT, mode="device",
                    require_verified=True)
    hop = report.hop("devicelater")
    assert (hop.status, hop.mode) == ("passed", "device"), hop.reason
    CLOSED.clear()
    emulated = parity("swiftformer_xs", art, target="quant", samples=6, imgsz=32, overrides=SWIFT, mode="device")
    assert emulated.hop("quant").status == "unverified" and "emulated" in emulated.hop("quant").reason
    assert CLOSED == ["quantizing fake"]  # released on the unverified path too


class _MemoryBaseStore:
    """The smallest BaseStore: one VerifiedBase in memory, its graph copied out of the build folder on `put`."""

    def __init__(self, folder: Path):
        self.folder, self.base = folder, None

    def get(self):
        return self.base

    def put(self, base):
        self.folder.mkdir()
        self.base = dataclasses.replace(base, onnx_path=Path(shutil.copy(base.onnx_path, self.folder / "base.onnx")))


def test_an_export_reusing_a_verified_base_builds_the_train_form_only_for_a_runner_that_changes_its_inputs(
        tmp_path, monkeypatch):
    store = _MemoryBaseStore(tmp_path / "base")
    assert export("swiftformer_xs", "onnx", out=tmp_path / "first", base_store=store, **FAST).exit_code == 0
    built, real = [], pipeline.build_train_form
    monkeypatch.setattr(pipeline, "build_train_form", lambda *a, **k: built.append(a) or real(*a, **k))

    fp16 = export("swiftformer_xs", "onnx", precision="fp16", out=tmp_path / "fp16", base_store=store, **FAST)
    assert fp16.hop("onnx-fp16").status == "passed" and built == []  # the base's reference serves the hop
    quant = export("swiftformer_xs", "quant", out=tmp_path / "quant", base_store=store, **FAST)
    told = quant.hop("quant")
    assert told.status == "passed" and told.metrics.max_rel < 1e-4, told.reason  # against the quantized inputs
    assert len(built) == 1


def test_a_reused_verified_base_carries_this_exports_labels_and_refuses_other_inputs(tmp_path):
    import onnx

    from vitedge.targets.graph.metadata import read_metadata

    store = _MemoryBaseStore(tmp_path / "base")
    first = export("swiftformer_xs", "onnx", out=tmp_path / "first", base_store=store, **FAST)
    assert first.exit_code == 0 and store.base is not None and first.reference["float32_threads"] == 2
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"class{i}\n" for i in range(10)))
    second = export("swiftformer_xs", "onnx", out=tmp_path / "second", base_store=store, labels=labels, **FAST)
    assert second.exit_code == 0 and second.reference["cache"] is None  # the base's ground truth, reused
    assert {**second.reference, "cache": first.reference["cache"]} == first.reference
    graph = onnx.load(str(tmp_path / "second" / "swiftformer_xs.onnx"))
    assert read_metadata(graph)["labels"] == [f"class{i}" for i in range(10)]
    assert "labels" not in read_metadata(onnx.load(str(store.base.onnx_path)))  # the shared base is untouched
    with pytest.raises(ValueError, match="parity inputs"):  # a store keyed wrongly: another parity set
        export("swiftformer_xs", "onnx", out=tmp_path / "third", base_store=store, **dict(FAST, samples=8))


def test_the_former_hub_keyword_still_reaches_the_store_with_a_deprecation_warning(tmp_path):
    class Asked(Exception):
        pass

    class Store:  # the export asks its store first (before any train-form is built): proof the store got there
        def get(self):
            raise Asked

        def put(self, base):
            raise AssertionError("not reached")

    with pytest.warns(DeprecationWarning, match=r"export\(base_store=\.\.\.\)"), pytest.raises(Asked):
        export("swiftformer_xs", "onnx", out=tmp_path / "old", hub=Store(), **FAST)
    assert not (tmp_path / "old").exists()
    with pytest.warns(DeprecationWarning), pytest.raises(VitedgeError, match="drop hub="):
        export("swiftformer_xs", "onnx", out=tmp_path / "both", hub=Store(), base_store=Store(), **FAST)
