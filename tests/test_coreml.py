"""The coreml target: conversion of every family, the emulated parity hop on the saved package, image input,
conversion fixes, and the macOS dispatch with an injected stand-in for CoreML.framework.

Conversions are slow (coremltools runs ~100 graph passes), so each artifact is built once per module.

Length: one target's tests share its module-scoped conversions; split, each file would convert the families again.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import vitedge
from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES, check_hop, compute_metrics
from vitedge.errors import VitedgeError
from vitedge.models.reduced import reduced
from vitedge.models.trained_like import make_trained_like
from vitedge.targets import get_target
from vitedge.targets.base import Artifact, LowerSpec, UnavailableError
from vitedge.targets.coreml import (DEFAULT_EMULATED_SAMPLES, CoreMLTarget, DeviceCoreMLRunner,
                                    EmulatedCoreMLRunner, coreml_framework_status, load_program_spec, manifest_item_id,
                                    read_labels)
from vitedge.targets.coreml.mil_interpreter import UnsupportedOpError, load_program

# one reduced model per family (the golden fixtures' configs), trained-like weights
FAMILIES = {
    "swiftformer": ("swiftformer_xs", reduced("swiftformer"), 64),
    "slab_deit": ("slab_deit_tiny", reduced("slab_deit"), 224),
    "slab_swin": ("slab_swin_tiny", reduced("slab_swin"), 224),
    "sima": ("sima_tiny_12_p16", reduced("sima"), 224),
}
N = DEFAULT_EMULATED_SAMPLES


class Built:
    def __init__(self, family: str):
        name, overrides, imgsz = FAMILIES[family]
        self.name, self.imgsz = name, imgsz
        self.train = make_trained_like(vitedge.create_model(name, **overrides), seed=0).eval()
        self.deploy = vitedge.reparameterize(self.train, imgsz)
        self.x = parity_inputs(N, imgsz, seed=0).numpy()
        with torch.no_grad():
            self.reference = self.train(torch.from_numpy(self.x)).numpy()


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    cache: dict = {}
    root = tmp_path_factory.mktemp("coreml")

    def get(family: str, precision: str = "fp16", **options):
        key = (family, precision, tuple(sorted(options.items())))
        if family not in cache:
            cache[family] = Built(family)
        b = cache[family]
        if key not in cache:
            out = root / "_".join(str(k) for k in (family, precision, *options.values()))
            out.mkdir()
            meta = {"model": b.name, "weights": "untrained", "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
                    "reparam": b.deploy.reparam_summary.to_dict()["folded"], "checkpoint_sha256": None}
            spec = LowerSpec(name=b.name, imgsz=b.imgsz, batch=1, precision=precision, out_dir=out, onnx_path=None,
                             metadata=meta, options=options)
            cache[key] = get_target("coreml").lower(b.deploy, spec)
        return b, cache[key]

    return get


# -------------------------------------------------------------------------------------------- every family

@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_fp16_emulated_hop_passes(build, family):
    b, art = build(family, "fp16")
    assert art.path.name == f"{b.name}.mlpackage" and art.precision == "fp16"
    runner = CoreMLTarget().runner(art)
    assert isinstance(runner, EmulatedCoreMLRunner) and runner.max_samples == N
    hop = check_hop("coreml", runner, b.x, b.reference, DEFAULT_TOLERANCES["fp16"])
    assert hop.mode == "emulated"
    assert hop.status == "passed", hop.reason
    # the policy's fp32 islands are real: the program computes those ops in fp32, the rest in fp16
    by_dtype = art.info["ops_by_dtype"]
    assert art.info["fp32_islands"], "every family has a normalization or eps hazard kept in fp32"
    assert any("fp16" in v for v in by_dtype.values()) and any("fp32" in v for t, v in by_dtype.items() if t != "cast")
    assert art.info["emulator_unknown_ops"] == []
    assert art.info["precision_policy"]["rules"]


def test_fp32_conversion_passes_fp32_tolerance(build):
    b, art = build("swiftformer", "fp32")
    runner = CoreMLTarget().runner(art)
    hop = check_hop("coreml", runner, b.x, b.reference, DEFAULT_TOLERANCES["fp32"])
    assert hop.status == "passed", hop.reason
    assert set(art.info["ops_by_dtype"]["conv"]) == {"fp32"} and art.info["precision_policy"] is None


def test_fp16_and_fp32_programs_differ_measurably(build):
    b, a16 = build("swiftformer", "fp16")
    _, a32 = build("swiftformer", "fp32")
    y16 = CoreMLTarget().runner(a16).run(b.x)
    y32 = CoreMLTarget().runner(a32).run(b.x)
    m16, m32 = compute_metrics(b.reference, y16), compute_metrics(b.reference, y32)
    assert m16.max_rel > 20 * m32.max_rel                      # fp16 rounding is really emulated
    assert DEFAULT_TOLERANCES["fp32"].violations(m16)           # ... so fp16 would not pass the fp32 profile
    assert float(np.abs(y16 - y32).max()) > 1e-5 * float(np.abs(b.reference).max())


def test_corrupted_weight_bin_fails_the_hop(build, tmp_path):
    b, art = build("swiftformer", "fp16")
    path = tmp_path / art.path.name
    shutil.copytree(art.path, path)
    # the largest const blob: its metadata (at the proto's offset) says where its data starts
    program = load_program(path)
    spec = load_program_spec(path)
    offsets = [o.attributes["val"].blobFileValue.offset for o in
               spec.mlProgram.functions["main"].block_specializations[program.opset].operations
               if o.type == "const" and o.attributes["val"].WhichOneof("value") == "blobFileValue"]
    blob = path / "Data/com.apple.CoreML/weights/weight.bin"
    raw = bytearray(blob.read_bytes())
    sizes = {off: struct.unpack_from("<QQ", raw, off + 8) for off in offsets}  # (size in bytes, data offset)
    off = max(sizes, key=lambda o: sizes[o][0])
    size, data = sizes[off]
    assert struct.unpack_from("<I", raw, off)[0] == 0xDEADBEEF  # the blob metadata sentinel
    raw[data + size // 4: data + size // 4 + 256] = b"\xff" * 256  # fp16 0xFFFF is NaN
    blob.write_bytes(bytes(raw))
    hop = check_hop("coreml", EmulatedCoreMLRunner(path), b.x, b.reference, DEFAULT_TOLERANCES["fp16"])
    assert hop.status == "failed" and "non-finite" in hop.reason


def test_unknown_op_makes_the_emulated_runner_unavailable(build, tmp_path):
    from coremltools.proto import Model_pb2

    _, art = build("swiftformer", "fp16")
    path = tmp_path / art.path.name
    shutil.copytree(art.path, path)
    f = path / "Data/com.apple.CoreML/model.mlmodel"
    spec = Model_pb2.Model()
    spec.ParseFromString(f.read_bytes())
    fn = spec.mlProgram.functions["main"]
    next(o for o in fn.block_specializations[fn.opset].operations if o.type == "gelu").type = "gelu_v9"
    f.write_bytes(spec.SerializeToString())
    with pytest.raises(UnsupportedOpError, match="gelu_v9"):
        CoreMLTarget().runner(Artifact("coreml", path, "fp16"))
    assert issubclass(UnsupportedOpError, UnavailableError)  # the pipeline reports the hop "unverified"


# -------------------------------------------------------------------------------------------- image input

def test_image_input_on_pixels_matches_tensor_model_on_normalized(build):
    b, tensor_art = build("swiftformer", "fp32")
    _, image_art = build("swiftformer", "fp32", input="image")
    assert image_art.info["input_spec"]["std_fold"] == "1/std folded into patch_embed.0.weight"
    spec = load_program_spec(image_art.path)
    assert spec.description.input[0].type.WhichOneof("Type") == "imageType"
    from coremltools.proto import FeatureTypes_pb2
    assert spec.description.input[0].type.imageType.colorSpace == FeatureTypes_pb2.ImageFeatureType.RGB
    # 8-bit RGB pixel images, and the normalized tensors they stand for
    mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
    pixels = np.clip(np.round((b.x * std + mean) * 255), 0, 255).astype(np.float32)
    normalized = (pixels / 255 - mean) / std
    y_image = EmulatedCoreMLRunner(image_art.path).run_raw(pixels)
    y_tensor = EmulatedCoreMLRunner(tensor_art.path).run(normalized)
    with torch.no_grad():
        ref = b.train(torch.from_numpy(normalized)).numpy()
    assert not DEFAULT_TOLERANCES["fp32"].violations(compute_metrics(y_tensor, y_image))
    assert not DEFAULT_TOLERANCES["fp32"].violations(compute_metrics(ref, y_image))


def test_metadata_is_written(build):
    b, art = build("swiftformer", "fp16")
    spec = load_program_spec(art.path)
    md = spec.description.metadata
    assert md.author.startswith("vitedge") and md.license and md.versionString and b.name in md.shortDescription
    user = dict(md.userDefined)
    for key in ("model", "imgsz", "preprocessing", "reparam", "checkpoint_sha256", "toolchain"):
        assert key in user, key
    assert user["model"] == b.name and user["imgsz"] == str(b.imgsz)
    assert json.loads(user["preprocessing"])["mean"] == [0.485, 0.456, 0.406]
    assert "com.github.apple.coremltools.conversion_date" not in user  # it would make every day's bytes differ
    meta = CoreMLTarget().read_metadata(art.path)  # decoded, for `vitedge parity --artifact X.mlpackage`
    assert meta["imgsz"] == b.imgsz and meta["precision"] == "fp16" and meta["checkpoint_sha256"] is None
    manifest = json.loads((art.path / "Manifest.json").read_text())
    assert {k: v["path"] for k, v in manifest["itemInfoEntries"].items()} == {
        manifest_item_id(v["path"]): v["path"] for v in manifest["itemInfoEntries"].values()}
    assert manifest["rootModelIdentifier"] in manifest["itemInfoEntries"]


# -------------------------------------------------------------------------------------------- lowering details

class _Probe(nn.Module):
    """F.normalize (p=2 and p=1) and a reciprocal of small values: the conversion fixes, checked numerically."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 16)

    def forward(self, x):
        t = self.proj(x.flatten(2).mean(-1))
        a = F.normalize(t, dim=1)
        c = F.normalize(t, p=1, dim=1)
        r = 1.0 / (t.abs() * 1e-2 + 1e-4)  # denominators ~1e-3: coremltools' inverse eps 1e-4 would be 10% off
        return torch.cat([a, c, r * 1e-3], dim=1)


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    torch.manual_seed(0)
    model = _Probe().eval()
    out = tmp_path_factory.mktemp("probe")
    art = CoreMLTarget().lower(model, LowerSpec(name="probe", imgsz=8, batch=1, precision="fp32", out_dir=out,
                                                onnx_path=None))
    return model, art


def test_normalize_is_lowered_ane_friendly(probe):
    model, art = probe
    assert art.info["ane_lowering"]["normalize_rewrites"] == 2
    ops = art.info["ops"]
    assert "rsqrt" in ops and "reduce_l2_norm" not in ops and "tile" not in ops


def test_reciprocal_is_exact_after_conversion(probe):
    model, art = probe
    x = np.random.default_rng(1).standard_normal((4, 3, 8, 8)).astype(np.float32)
    y = EmulatedCoreMLRunner(art.path).run(x)
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert not DEFAULT_TOLERANCES["fp32"].violations(compute_metrics(ref, y))
    eps = [v for o in load_program(art.path).ops if o.type == "inverse" for k, v in o.inputs.items() if k == "epsilon"]
    assert eps, "torch.reciprocal lowers to MIL inverse"


def test_bad_options_are_user_errors(build, tmp_path):
    b, _ = build("swiftformer", "fp16")
    t = CoreMLTarget()

    def lower(**kw):
        spec = LowerSpec(name="m", imgsz=b.imgsz, batch=kw.pop("batch", 1), precision=kw.pop("precision", "fp16"),
                         out_dir=tmp_path, onnx_path=None, options=kw)
        t.lower(b.deploy, spec)

    with pytest.raises(VitedgeError, match="--ios"):
        lower(ios=15)
    with pytest.raises(VitedgeError, match="--ios"):
        t.validate_options({"ios": "iOS15"})  # the pipeline's early check, before any model is built
    with pytest.raises(VitedgeError, match="--input"):
        lower(input="video")
    with pytest.raises(VitedgeError, match="dynamic-batch"):
        lower(batch=None)
    with pytest.raises(VitedgeError, match="not found"):
        lower(labels=str(tmp_path / "missing.txt"))
    bad = tmp_path / "labels.txt"
    bad.write_text("cat\ndog\n")
    with pytest.raises(VitedgeError, match="2 labels but the model has 10"):
        lower(labels=str(bad))
    bad.write_text("a\nb\na\n")
    with pytest.raises(VitedgeError, match="repeats"):
        read_labels(bad)
    assert not list(tmp_path.glob("*.mlpackage"))  # nothing half-written


# -------------------------------------------------------------------------------------------- dispatch

class FakeCoreML:
    """Stands in for CoreML.framework: 'predicts' with the emulator and records what it was asked."""

    def __init__(self, outputs=True):
        self.loaded, self.calls, self.outputs = [], 0, outputs

    def load(self, path: Path, unit: str):
        self.loaded.append(unit)
        emu = EmulatedCoreMLRunner(path)
        fake = self

        class Model:
            def predict(self, feed):
                fake.calls += 1
                y = emu.program.run({"image": feed["image"]})
                return dict(y) if fake.outputs else {}
        return Model()

    def compute_plan(self, path: Path, unit: str) -> dict:
        return dict(self.plan)

    plan = {"ane": 40, "gpu": 0, "cpu": 3, "unknown": 0, "ops": 43, "ane_op_share": 40 / 43,
            "cost_share": {"ane": 0.9, "gpu": 0.0, "cpu": 0.1, "unknown": 0.0}, "per_op": [["softmax", "s", "cpu"]]}
    ane = True

    def has_neural_engine(self):
        return self.ane


def test_linux_dispatch_is_emulated_and_never_device(build):
    _, art = build("swiftformer", "fp16")
    ok, why = coreml_framework_status("linux")
    assert not ok and "macOS" in why
    assert CoreMLTarget(system="linux").runner(art).mode == "emulated"
    assert CoreMLTarget(system="linux").run_mode()[0] == "emulated"
    with pytest.raises(UnavailableError, match="macOS"):
        CoreMLTarget(system="linux").runner(art, mode="device")
    if not coreml_framework_status()[0]:  # this machine: no CoreML.framework
        assert CoreMLTarget().runner(art).mode == "emulated"


def test_macos_dispatch_with_injected_framework(build):
    b, art = build("swiftformer", "fp16")
    fake = FakeCoreML()
    runner = CoreMLTarget(framework=fake, system="darwin").runner(art)
    assert isinstance(runner, DeviceCoreMLRunner)
    assert fake.loaded == ["CPU_AND_NE", "CPU_ONLY"]        # ALL is never used
    assert runner.mode is None                               # no prediction yet: not "device"
    hop = check_hop("coreml", runner, b.x[:3], b.reference[:3], DEFAULT_TOLERANCES["fp16"])
    assert fake.calls == 6 and hop.mode == "device" and hop.status == "passed"
    assert runner.unit_max_abs_diff == {"CPU_ONLY": 0.0}
    assert runner.compute_plan()["CPU_AND_NE"]["ane"] == 40
    assert runner.info()["compute_plan"]["CPU_ONLY"]["cpu"] == 3 and runner.info()["mode"] == "device"
    assert CoreMLTarget(framework=fake, system="darwin").run_mode() == ("device", None)
    assert CoreMLTarget(framework=fake, system="darwin").runner(art, mode="emulated").mode == "emulated"


def test_device_runner_rejects_a_prediction_without_logits(build):
    b, art = build("swiftformer", "fp16")
    runner = CoreMLTarget(framework=FakeCoreML(outputs=False), system="darwin").runner(art)
    with pytest.raises(RuntimeError, match="logits"):
        runner.run(b.x[:1])
    assert runner.mode is None


# -------------------------------------------------------------------------------------------- compute plan (macOS)

def _plan_fakes(monkeypatch, devices, weights=None, ane_available=True):
    """coremltools' MLModel and MLComputePlan autospecced (spec_set), with a plan over real structure classes."""
    import coremltools as ct
    from coremltools.models import compute_device as cd
    from coremltools.models import compute_plan as cp
    from unittest.mock import create_autospec

    kinds = {"ane": cd.MLNeuralEngineComputeDevice, "gpu": cd.MLGPUComputeDevice, "cpu": cd.MLCPUComputeDevice}
    ops = [cp.MLModelStructureProgramOperation(inputs={}, operator_name="const", outputs=[], blocks=[],
                                               __proxy__=None)]
    usage = {}
    for i, dev in enumerate(devices):
        out = cp.MLModelStructureProgramNamedValueType(name=f"v{i}", type=None)
        op = cp.MLModelStructureProgramOperation(inputs={}, operator_name=f"op{i}", outputs=[out], blocks=[],
                                                 __proxy__=None)
        ops.append(op)
        usage[id(op)] = cp.MLComputePlanDeviceUsage(
            preferred_compute_device=create_autospec(kinds[dev], instance=True, spec_set=True),
            supported_compute_devices=[])
    block = cp.MLModelStructureProgramBlock(inputs=[], operations=ops, output_names=[])
    structure = cp.MLModelStructure(neuralnetwork=None, pipeline=None, program=cp.MLModelStructureProgram(
        functions={"main": cp.MLModelStructureProgramFunction(inputs=[], block=block)}))
    plan = create_autospec(cp.MLComputePlan, instance=True, spec_set=True)
    plan.model_structure = structure
    plan.get_compute_device_usage_for_mlprogram_operation.side_effect = lambda op: usage[id(op)]
    w = weights or [1.0] * len(devices)
    costs = {id(op): cp.MLComputePlanCost(weight=x) for op, x in zip(ops[1:], w)}
    plan.get_estimated_cost_for_mlprogram_operation.side_effect = lambda op: costs[id(op)]
    plan_cls = create_autospec(cp.MLComputePlan, spec_set=True)
    plan_cls.load_from_path.return_value = plan
    model_cls = create_autospec(ct.models.MLModel, spec_set=True)
    model_cls.return_value.get_compiled_model_path.return_value = "/tmp/model.mlmodelc"
    avail = [create_autospec(cd.MLCPUComputeDevice, instance=True, spec_set=True)]
    if ane_available:
        avail.append(create_autospec(cd.MLNeuralEngineComputeDevice, instance=True, spec_set=True))
    model_cls.get_available_compute_devices.return_value = avail
    monkeypatch.setattr(ct.models, "MLModel", model_cls)
    monkeypatch.setattr(cp, "MLComputePlan", plan_cls)
    return model_cls, plan_cls


def test_compute_plan_reports_each_ops_preferred_device(monkeypatch):
    from vitedge.targets.coreml import CoreMLFramework
    model_cls, plan_cls = _plan_fakes(monkeypatch, ["ane", "ane", "cpu", "gpu"], weights=[0.5, 0.3, 0.15, 0.05])
    plan = CoreMLFramework().compute_plan(Path("m.mlpackage"), "CPU_AND_NE")
    # the compiled path comes from get_compiled_model_path (coremltools 9), passed by keyword to load_from_path
    assert plan_cls.load_from_path.call_args.kwargs["path"] == "/tmp/model.mlmodelc"
    assert (plan["ane"], plan["cpu"], plan["gpu"], plan["ops"]) == (2, 1, 1, 4)  # const ops are not counted
    assert plan["per_op"][2] == ["op2", "v2", "cpu"] and plan["cost_share"]["ane"] == pytest.approx(0.8)
    assert CoreMLFramework().has_neural_engine() is True


def test_the_old_compiled_path_call_fails_against_coremltools(monkeypatch):
    """coremltools 9 has no MLModel.get_compiled_path: the old call fails against the autospecced class."""
    model_cls, _ = _plan_fakes(monkeypatch, ["ane"])
    with pytest.raises(AttributeError, match="get_compiled_path"):
        model_cls("m.mlpackage").get_compiled_path()


def test_info_reports_unavailable_plans_but_not_bugs(build, monkeypatch):
    from vitedge.targets.coreml import ComputePlanUnavailable
    b, art = build("swiftformer", "fp16")
    fake = FakeCoreML()
    runner = CoreMLTarget(framework=fake, system="darwin").runner(art)

    def unavailable(path, unit):
        raise ComputePlanUnavailable("MLComputePlan needs macOS 14.4+ (this is 13.6)")
    monkeypatch.setattr(fake, "compute_plan", unavailable)
    assert runner.info()["compute_plan"].startswith("unavailable (MLComputePlan needs macOS 14.4+")

    def buggy(path, unit):
        raise AttributeError("'MLModel' object has no attribute 'get_compiled_path'")
    monkeypatch.setattr(fake, "compute_plan", buggy)
    with pytest.raises(AttributeError):
        runner.info()


@pytest.mark.parametrize("devices, weights, ane, status", [
    (["ane"] * 9 + ["cpu"], None, True, "passed"),
    (["ane"] * 3 + ["cpu"] * 7, None, True, "failed"),
    (["ane"] * 2 + ["cpu"] * 8, [0.3, 0.3] + [0.05] * 8, True, "passed"),   # by estimated cost, not op count
    (["cpu"] * 10, None, False, "inconclusive"),                            # a virtualized Mac: no Neural Engine
])
def test_require_ane_gate(build, monkeypatch, devices, weights, ane, status):
    from vitedge.exporter.verdict.hops import ane_check as _ane_check
    from vitedge.targets.coreml import CoreMLFramework, summarize_compute_plan
    b, art = build("swiftformer", "fp16")
    model_cls, plan_cls = _plan_fakes(monkeypatch, devices, weights, ane_available=ane)
    fake = FakeCoreML()
    fake.plan = summarize_compute_plan(plan_cls.load_from_path.return_value)
    fake.ane = CoreMLFramework().has_neural_engine()
    runner = CoreMLTarget(framework=fake, system="darwin").runner(art)
    hop = check_hop("coreml", runner, b.x[:2], b.reference[:2], DEFAULT_TOLERANCES["fp16"])
    assert hop.status == "passed"
    _ane_check(hop, runner)
    assert hop.ane_residency["status"] == status
    assert hop.status == ("failed" if status == "failed" else "passed")  # inconclusive never fails or passes it
    if status == "failed":
        assert "--require-ane" in hop.reason and "below --require-ane's 50%" in hop.reason


def test_require_ane_off_macos_is_inconclusive_and_fails_only_require_verified(build, tmp_path):
    from vitedge.exporter.flow.verify import parity
    b, art = build("swiftformer", "fp16")
    name, overrides, imgsz = FAMILIES["swiftformer"]
    kw = dict(overrides=overrides, imgsz=imgsz, samples=4, require_ane=True)
    r = parity(name, art.path, **kw)
    hop = r.hop("coreml")
    assert hop.status == "passed" and hop.mode == "emulated"
    assert hop.ane_residency["status"] == "inconclusive" and r.exit_code == 0
    r = parity(name, art.path, require_verified=True, **kw)
    assert r.exit_code == 1 and r.inconclusive_checks() == [r.hop("coreml")]
