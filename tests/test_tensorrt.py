"""The fp16 ONNX graph (what TensorRT 11 builds from) and the TensorRT target.

CPU here: the fp16 graph preparation (walked tensor by tensor, then run by ONNX Runtime against the fp16
tolerance), profile derivation, the sidecar, the 10.x / 11.x dispatch (through a small fake `tensorrt`
module that records calls: it proves the dispatch only, never parity) and the unavailable reasons.
The engine build, its parity and the inspector check need an NVIDIA GPU: `@pytest.mark.gpu`.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto

from vitedge.exporter.inputs import parity_inputs
from vitedge.exporter.onnx_export import export_onnx, save_onnx, simplify_onnx
from vitedge.exporter.onnx_fp16 import prepare_fp16
from vitedge.exporter.parity import DEFAULT_TOLERANCES, compute_metrics
from vitedge.exporter.precision import FP16_MAX, default_policy
from vitedge.exporter.reparam.engine import reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.models.layers import EfficientAdditiveAttention
from vitedge.targets import LowerSpec, UnavailableError, get_target
from vitedge.targets.tensorrt import (MIN_FP16_SHARE, STRONG_FP16, WEAK_FP16, BatchProfile, EngineBuildError,
                                      TensorRTTarget, batch_profiles, build_path, check_engine_precision,
                                      layer_precisions)

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
# Reduced configurations of one model per family (full numerics at a size that keeps the file fast).
FAMILIES = {
    "swiftformer": ("swiftformer_xs", 64, dict(layers=[1, 1, 1, 1], embed_dims=[16, 24, 32, 48], num_classes=10)),
    "sima": ("sima_nano_12_p16", 32, dict(depth=2, num_classes=10)),
    "slab": ("slab_deit_tiny", 224, dict(depth=1, num_classes=10)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    name, imgsz, overrides = FAMILIES[request.param]
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fp32 = simplify_onnx(export_onnx(reparameterize(train, imgsz), imgsz, batch=None))
    return SimpleNamespace(name=name, imgsz=imgsz, train=train, fp32=fp32, prepared=prepare_fp16(fp32))


def _dtypes(model: onnx.ModelProto) -> dict[str, int]:
    g = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    out = {v.name: v.type.tensor_type.elem_type for v in list(g.value_info) + list(g.input) + list(g.output)}
    out.update({i.name: i.data_type for i in model.graph.initializer})
    return out


def test_fp16_graph_every_tensor_fp16_but_islands_and_io(family):
    prep = family.prepared
    model, islands = prep.model, prep.fp32_nodes
    onnx.checker.check_model(model, full_check=True)
    dt = _dtypes(model)
    assert [dt[i.name] for i in model.graph.input] == [F32] and [dt[o.name] for o in model.graph.output] == [F32]
    assert islands, "the policy found no fp32 island"
    floats = (F32, F16)
    allowed_f32 = {i.name for i in model.graph.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        ins = [t for t in node.input if t and dt.get(t) in floats]
        outs = [t for t in node.output if dt.get(t) in floats]
        if node.op_type in ("Shape", "Size"):
            continue  # reads only the shape: any dtype
        if node.op_type == "Cast":  # the boundaries: fp16 <-> fp32 only where an island or the I/O needs it
            want = {a.i for a in node.attribute if a.name == "to"}
            if want == {F32}:
                allowed_f32.update(outs)
            continue
        want = F32 if node.name in islands else F16
        assert all(dt[t] == want for t in ins + outs), (node.op_type, node.name, [(t, dt[t]) for t in ins + outs])
        if want == F32:
            allowed_f32.update(outs)
    stray = [t for t, d in dt.items() if d == F32 and t not in allowed_f32
             and not any(t in n.input for n in model.graph.node if n.name in islands)]
    assert not stray, stray[:10]
    # the heavy ops (convolutions and Linear layers) all run in fp16
    inits = {i.name for i in model.graph.initializer}
    heavy = [n for n in model.graph.node if n.op_type in ("Conv", "Gemm", "MatMul") and set(n.input) & inits]
    assert heavy and not any(n.name in islands for n in heavy)
    assert sum(d == F16 for d in dt.values()) > sum(d == F32 for d in dt.values())
    # each Cast the converter inserted is one fp16<->fp32 boundary of an island or of the graph I/O
    casts = [n for n in model.graph.node if n.op_type == "Cast"]
    original = [n for n in family.fp32.graph.node if n.op_type == "Cast"]
    assert len(casts) == prep.casts + len(original) + len(model.graph.output)


def test_fp16_graph_runs_in_onnxruntime_within_fp16_tolerance(family):
    """ONNX Runtime (CPU) runs the prepared graph: it stores every fp16 tensor in fp16, but computes ops it has
    no fp16 CPU kernel for in fp32 (see the report), so this is an fp16-storage check, not a device one."""
    ort = pytest.importorskip("onnxruntime")
    x = parity_inputs(24, family.imgsz)
    with torch.no_grad():
        ref = family.train(x).numpy()
    sess = ort.InferenceSession(family.prepared.model.SerializeToString(), providers=["CPUExecutionProvider"])
    y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    assert y.dtype == np.float32 and np.isfinite(y).all()
    m = compute_metrics(ref, y)
    assert DEFAULT_TOLERANCES["fp16"].violations(m) == [], m
    assert m.cosine >= 0.999 and m.psnr_db >= 35 and m.top1_agreement >= 0.99


class TinyNet(nn.Module):
    """Conv stem -> tokens -> SwiftFormer additive attention -> head: small, but with an fp32 island."""

    def __init__(self, big: float = 1.0):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 4, stride=4)
        self.attn = EfficientAdditiveAttention(16, 16)
        self.head = nn.Linear(16, 10)
        with torch.no_grad():
            self.head.bias[0] = big  # big > 65504 makes an initializer that fp16 cannot hold

    def forward(self, x):
        t = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(t + self.attn(t)).mean(1)


def _tiny_onnx(tmp_path: Path, batch=1, big: float = 1.0) -> Path:
    m = make_trained_like(TinyNet(big), seed=3).eval()
    if big != 1.0:
        with torch.no_grad():
            m.head.bias[0] = big
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return save_onnx(export_onnx(m, 32, batch=batch), tmp_path / "tiny.onnx")


def test_fp16_graph_reports_clamped_initializers(tmp_path):
    prep = prepare_fp16(onnx.load(str(_tiny_onnx(tmp_path, big=1e5))))
    assert len(prep.clamped) == 1 and prep.clamped[0]["values"] == 1 and prep.clamped[0]["max_abs"] == 1e5
    init = next(i for i in prep.model.graph.initializer if i.name == prep.clamped[0]["initializer"])
    assert init.data_type == F16 and float(np.abs(onnx.numpy_helper.to_array(init)).max()) == FP16_MAX
    assert json.loads(next(p.value for p in prep.model.metadata_props if p.key == "vitedge.fp16"))["clamped"]


def test_batch_profiles():
    assert batch_profiles(4) == [BatchProfile(4, 4, 4)]
    assert batch_profiles(None) == [BatchProfile(1, 1, 8)]
    assert batch_profiles(None, 32) == [BatchProfile(1, 1, 32)]
    assert batch_profiles(None, ranges=[(1, 1), (2, 16)]) == [BatchProfile(1, 1, 1), BatchProfile(2, 2, 16)]
    assert BatchProfile(1, 1, 8).shapes(224) == ((1, 3, 224, 224), (1, 3, 224, 224), (8, 3, 224, 224))
    with pytest.raises(ValueError):
        batch_profiles(None, ranges=[(4, 2)])
    with pytest.raises(ValueError):
        batch_profiles(2, ranges=[(1, 2)])


def test_build_path_dispatch():
    assert build_path(10, "fp16") == WEAK_FP16 and build_path(11, "fp16") == STRONG_FP16
    assert build_path(10, "fp32") == build_path(11, "fp32") == "fp32"
    with pytest.raises(ValueError):
        build_path(11, "int8")


def _inspector(formats: list[str]) -> dict:
    return {"Layers": [{"Name": f"l{i}", "Outputs": [{"Name": f"t{i}", "Format/Datatype": f}]}
                       for i, f in enumerate(formats)] + [{"Name": "shape", "Outputs": [{"Format/Datatype": "Int32"}]}]}


def test_layer_precisions_and_the_mostly_fp32_failure():
    fp16 = layer_precisions(_inspector(["Row major linear FP16 format"] * 9 + ["Row major linear FP32 format"]))
    assert fp16["layers"] == {"fp16": 9, "fp32": 1} and fp16["float_layers"] == 10
    assert check_engine_precision("fp16", fp16) == "mixed-fp16"
    mostly32 = layer_precisions(_inspector(["Half"] * 2 + ["Float"] * 8))
    assert mostly32["fp16_share"] < MIN_FP16_SHARE
    with pytest.raises(EngineBuildError, match="mostly fp32: 20% of 10 layers"):
        check_engine_precision("fp16", mostly32)
    with pytest.raises(EngineBuildError, match="no layer precisions"):
        check_engine_precision("fp16", layer_precisions({"Layers": ["a", "b"]}))
    assert check_engine_precision("fp32", layer_precisions(_inspector(["FP32"] * 3))) == "fp32"


class FakeTRT:
    """Just enough of the `tensorrt` module for build_engine, recording calls (dispatch tests only)."""

    def __init__(self, version: str, out_format: str = "Row major linear FP16 format"):
        self.__version__ = version
        self.calls: list[tuple] = []
        self.parsed: list[bytes] = []
        flags = ["TF32", "PREFER_PRECISION_CONSTRAINTS"] + (["FP16"] if int(version.split(".")[0]) < 11 else [])
        self.BuilderFlag = SimpleNamespace(**{f: f for f in flags})  # 11.x has no FP16 attribute at all
        self.MemoryPoolType = SimpleNamespace(WORKSPACE="WORKSPACE")
        self.ProfilingVerbosity = SimpleNamespace(DETAILED="DETAILED")
        self.LayerInformationFormat = SimpleNamespace(JSON="JSON")
        self.float32 = "float32"
        fake, rec = self, self.calls

        class Logger:
            WARNING = "WARNING"

            def __init__(self, level):
                pass

        class Layer:
            def __init__(self, name):
                self.name, self.num_outputs, self.precision = name, 1, None

            def set_output_type(self, i, t):
                rec.append(("set_output_type", self.name, t))

        class Network:
            layers: list = []

            @property
            def num_layers(self):
                return len(self.layers)

            def get_layer(self, i):
                return self.layers[i]

        class Parser:
            num_errors = 0

            def __init__(self, network, logger):
                self.network = network

            def parse(self, data):
                fake.parsed.append(bytes(data))
                # like TensorRT's parser, name layers after the ONNX nodes
                self.network.layers = [Layer(n.name) for n in onnx.load_from_string(bytes(data)).graph.node]
                return True

        class Profile:
            def set_shape(self, name, lo, opt, hi):
                rec.append(("set_shape", name, lo, opt, hi))

        class Cache:
            def serialize(self):
                return b"CACHE"

        class Config:
            profiling_verbosity = None

            def set_memory_pool_limit(self, pool, n):
                rec.append(("set_memory_pool_limit", pool, n))

            def set_flag(self, f):
                rec.append(("set_flag", f))

            def clear_flag(self, f):
                rec.append(("clear_flag", f))

            def add_optimization_profile(self, p):
                rec.append(("add_optimization_profile",))

            def create_timing_cache(self, blob):
                rec.append(("create_timing_cache", blob))
                return Cache()

            def set_timing_cache(self, cache, ignore_mismatch):
                rec.append(("set_timing_cache",))

            def get_timing_cache(self):
                return Cache()

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                rec.append(("create_network", flags))
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                rec.append(("build", config.profiling_verbosity))
                return b"\x00FAKE-PLAN\xff"

        class Inspector:
            def get_engine_information(self, fmt):
                return json.dumps(_inspector([out_format] * 4))

        class Engine:
            def create_engine_inspector(self):
                return Inspector()

        class Runtime:
            def __init__(self, logger):
                pass

            def deserialize_cuda_engine(self, plan):
                rec.append(("deserialize", plan))
                return Engine()

        self.Logger, self.Builder, self.OnnxParser, self.Runtime = Logger, Builder, Parser, Runtime


GPU = {"gpu": "Fake GPU", "compute_capability": "9.0", "cuda_driver": "12.8", "devices": 1}


def _lower(tmp_path: Path, fake: FakeTRT, precision: str, batch=1, options=None):
    target = TensorRTTarget(trt=fake, device=lambda: (GPU, None), memory=lambda: ("torch", None))
    onnx_path = _tiny_onnx(tmp_path, batch=batch)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    spec = LowerSpec(name="tiny", imgsz=32, batch=batch, precision=precision, out_dir=out, onnx_path=onnx_path,
                     metadata={"model": "tiny"}, options=options or {})
    return target.lower(None, spec), onnx_path


def test_trt10_fp16_uses_the_builder_flag_and_pins_islands(tmp_path):
    fake = FakeTRT("10.13.0")
    art, onnx_path = _lower(tmp_path, fake, "fp16")
    assert ("set_flag", "FP16") in fake.calls and ("clear_flag", "TF32") in fake.calls
    assert fake.parsed == [onnx_path.read_bytes()]  # the verified fp32 ONNX, as is
    islands = default_policy().onnx_fp32_nodes(onnx.load(str(onnx_path)))
    pinned = {c[1] for c in fake.calls if c[0] == "set_output_type"}
    assert pinned == islands and ("set_flag", "PREFER_PRECISION_CONSTRAINTS") in fake.calls
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["build_path"] == WEAK_FP16 and side["fp32_policy"]["pinned_layers"] == len(islands)


def test_trt11_fp16_builds_the_fp16_onnx_without_flags(tmp_path):
    fake = FakeTRT("11.1.0")
    art, onnx_path = _lower(tmp_path, fake, "fp16")
    assert not any(c[0] == "set_flag" for c in fake.calls)  # BuilderFlag.FP16 does not exist in 11.x
    parsed = onnx.load_from_string(fake.parsed[0])
    types = {i.type.tensor_type.elem_type for i in list(parsed.graph.input) + list(parsed.graph.output)}
    assert types == {F32}  # fp32 I/O
    assert sum(i.data_type == F16 for i in parsed.graph.initializer) > len(parsed.graph.initializer) / 2
    assert any(n.op_type == "Cast" for n in parsed.graph.node)
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["build_path"] == STRONG_FP16 and side["fp32_policy"]["fp16_graph"]["fp32_nodes"] > 0


@pytest.mark.parametrize("version", ["10.13.0", "11.1.0"])
def test_fp32_engines_parse_the_fp32_onnx_and_no_fp16(tmp_path, version):
    fake = FakeTRT(version, out_format="Row major linear FP32 format")
    art, onnx_path = _lower(tmp_path, fake, "fp32")
    assert fake.parsed == [onnx_path.read_bytes()] and not any(c[0] == "set_flag" for c in fake.calls)
    assert art.precision == "fp32" and art.info["precision_built"] == "fp32"


def test_mostly_fp32_engine_fails_the_fp16_lowering(tmp_path):
    with pytest.raises(EngineBuildError, match="mostly fp32"):
        _lower(tmp_path, FakeTRT("11.0.0", out_format="Row major linear FP32 format"), "fp16")
    assert not (tmp_path / "out" / "tiny.engine").exists()


def test_engine_file_sidecar_profiles_cache_workspace(tmp_path):
    fake = FakeTRT("10.13.0")
    cache = tmp_path / "cache" / "timing.cache"
    art, onnx_path = _lower(tmp_path, fake, "fp16", batch=None,
                            options={"max_batch": 16, "workspace": 2, "timing_cache": str(cache), "ios": None})
    assert art.path.name == "tiny.engine" and art.path.read_bytes() == b"\x00FAKE-PLAN\xff"  # nothing prepended
    assert ("set_shape", "image", (1, 3, 32, 32), (1, 3, 32, 32), (16, 3, 32, 32)) in fake.calls
    assert ("set_memory_pool_limit", "WORKSPACE", 2 << 30) in fake.calls
    assert ("build", "DETAILED") in fake.calls and cache.read_bytes() == b"CACHE"
    side_path = tmp_path / "out" / "tiny.engine.json"
    assert art.extra_files == [side_path]
    side = json.loads(side_path.read_text())
    assert side["inputs"] == [{"name": "image", "shape": ["batch", 3, 32, 32], "dtype": "float32"}]
    assert side["outputs"][0]["name"] == "logits" and side["outputs"][0]["dtype"] == "float32"
    assert side["profiles"] == [{"input": "image", "min": [1, 3, 32, 32], "opt": [1, 3, 32, 32],
                                 "max": [16, 3, 32, 32]}]
    assert side["precision_requested"] == "fp16" and side["precision_built"] == "fp16"
    assert side["versions"] == {"tensorrt": "10.13.0", "cuda_driver": "12.8", "gpu": "Fake GPU",
                                "compute_capability": "9.0"}
    import hashlib
    assert side["source_onnx"]["sha256"] == hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    assert side["timing_cache"] == {"path": str(cache), "bytes": 5} and side["workspace_bytes"] == 2 << 30
    assert side["tf32"] is False and side["layer_precisions"]["fp16_share"] == 1.0


def test_cache_is_read_back(tmp_path):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"OLD")
    fake = FakeTRT("11.1.0")
    _lower(tmp_path, fake, "fp32", options={"timing_cache": str(cache)})
    assert ("create_timing_cache", b"OLD") in fake.calls


def test_unavailable_reasons_name_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    no_gpu = lambda: (None, "no NVIDIA driver here (libcuda.so.1 not found)")  # noqa: E731
    t = TensorRTTarget(device=no_gpu, memory=lambda: (None, "no CUDA memory library"))
    ok, why = t.available()
    assert not ok and "tensorrt Python package is not installed" in why and "libcuda.so.1" in why
    ok, why = t.runnable()
    assert not ok and "no CUDA memory library" in why
    ok, why = TensorRTTarget(trt=FakeTRT("10.0.1"), device=no_gpu).available()
    assert not ok and "tensorrt" not in why and "libcuda.so.1" in why
    ok, why = TensorRTTarget(device=lambda: (GPU, None)).available()
    assert not ok and why.startswith("the tensorrt Python package is not installed")
    t = TensorRTTarget(trt=FakeTRT("10.0.1"), device=lambda: (GPU, None), memory=lambda: (None, "no CUDA memory"))
    assert t.available() == (True, None) and t.runnable() == (False, "no CUDA memory")
    with pytest.raises(UnavailableError, match="libcuda"):
        TensorRTTarget(trt=FakeTRT("10.0.1"), device=no_gpu).lower(None, None)


def test_registered_target_interface():
    t = get_target("trt")
    assert isinstance(t, TensorRTTarget) and t.name == "tensorrt" and t.suffix == ".engine"
    assert t.default_precision == "fp16" and t.precisions == ("fp32", "fp16") and t.dynamic_batch
    assert set(t.options) == {"workspace", "max_batch", "timing_cache"}


# ---- on a GPU -------------------------------------------------------------------------------------------

def _gpu_target() -> TensorRTTarget:
    t = TensorRTTarget()
    ok, why = t.runnable()
    if not ok:
        pytest.skip(f"TensorRT engine tests need an NVIDIA GPU with tensorrt: {why}")
    return t


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_engine_parity_and_precision(tmp_path, precision):
    target = _gpu_target()
    name, imgsz, overrides = FAMILIES["swiftformer"]
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_path = save_onnx(simplify_onnx(export_onnx(reparameterize(train, imgsz), imgsz, batch=None)),
                              tmp_path / f"{name}.onnx")
    spec = LowerSpec(name=name, imgsz=imgsz, batch=None, precision=precision, out_dir=tmp_path,
                     onnx_path=onnx_path, options={"max_batch": 8})
    art = target.lower(train, spec)
    side = json.loads((tmp_path / f"{name}.engine.json").read_text())
    if precision == "fp16":
        assert side["layer_precisions"]["fp16_share"] >= MIN_FP16_SHARE
    x = parity_inputs(32, imgsz)
    with torch.no_grad():
        ref = train(x).numpy()
    y = target.runner(art).run(x.numpy())
    m = compute_metrics(ref, y)
    tol = DEFAULT_TOLERANCES[precision]
    assert tol.violations(m) == [], m
