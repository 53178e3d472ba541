"""The fp16 ONNX graph (what TensorRT 11 builds from) and the TensorRT target.

CPU here: the fp16 graph preparation (walked tensor by tensor, then run by ONNX Runtime against the fp16
tolerance), profile derivation, the sidecar, precision truth on inspector JSON in the TensorRT 10 / 11 formats
(tests/fixtures/tensorrt/), and the 10.x / 11.x dispatch, island pinning and the runner's buffer lifetime through
a `spec_set` fake `tensorrt` built from targets/tensorrt/api.py (tests/trt_fake.py: it proves wiring, never
parity) and the unavailable reasons.
The engine build, its parity and the inspector check need an NVIDIA GPU: `@pytest.mark.gpu`.
"""
from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
from onnx import numpy_helper
import pytest
import torch
import torch.nn as nn
from onnx import TensorProto

from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.onnx.onnx_export import export_onnx, save_onnx, simplify_onnx
from vitedge.targets.graph.onnx_fp16 import prepare_fp16
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES, compute_metrics
from vitedge.targets.graph.precision import FP16_MAX, default_policy
from vitedge.exporter.reparam.engine import reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.models.layers import EfficientAdditiveAttention
from vitedge.targets import LowerSpec, UnavailableError, get_target
from vitedge.targets.tensorrt.target import (MIN_FP16_SHARE, MOVE_OPS, STRONG_FP16, STRONG_INT8,
                                             BatchProfile, EngineBuildError, TensorRTCallError, TensorRTTarget,
                                             batch_profiles, build_path, check_engine_precision, check_outcome,
                                             layer_precisions, precision_verdict, verify_pinned)
from vitedge.targets.tensorrt.precision import compare_outputs, dtype_of, name_members, onnx_nodes
from vitedge.tests._ci import gpu_unavailable

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
    assert build_path(10, "fp16") == build_path(11, "fp16") == STRONG_FP16  # strong typing on 10.x as on 11.x
    assert build_path(10, "fp32") == build_path(11, "fp32") == "fp32"
    assert build_path(10, "int8") == build_path(11, "int8") == STRONG_INT8
    with pytest.raises(ValueError):
        build_path(11, "int4")


FIXTURES = Path(__file__).parent / "fixtures" / "tensorrt"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


# ---- precision truth on inspector JSON (the real TensorRT 10 / 11 formats, see fixtures/tensorrt/README.md) ---

def test_inspector_counts_ordinary_layers_and_skips_data_movement():
    p = layer_precisions(_fixture("trt10_fp16_ordinary_layers.json"))
    # conv, pool, gemm in fp16; the ReduceL2 and PWN(sqrt, div) island in fp32; reformats and the NoOp not counted
    assert p["layers"] == {"fp16": 3, "fp32": 2} and p["float_layers"] == 5 and p["myelin_layers"] == 0
    assert p["data_movement_layers"] == 4 and p["total_layers"] == 9
    v = precision_verdict("fp16", p)
    assert v["status"] == "confirmed" and v["built"] == "mixed-fp16" and v["evidence"] == "inspector"


def test_inspector_refutes_an_fp16_engine_that_is_mostly_fp32():
    p = layer_precisions(_fixture("trt10_fp16_flag_mostly_fp32.json"))
    assert p["fp16_share"] < MIN_FP16_SHARE and p["myelin_layers"] == 0
    v = precision_verdict("fp16", p)
    assert v["status"] == "refuted" and "mostly fp32" in v["reason"]
    with pytest.raises(EngineBuildError, match="mostly fp32"):
        check_engine_precision("fp16", p)


@pytest.mark.parametrize("name", ["trt10_fp16_vit_foreignnode.json", "trt10_fp16_vit_foreignnode_fp32_boundaries.json",
                                  "trt11_fp16_whole_network_foreignnode.json"])
def test_foreign_nodes_are_unknown_never_fp32(name):
    """A Myelin ForeignNode hides its precision: without an output comparison the check is inconclusive (the
    old output-dtype count read the fp32-boundary engines as 0-33 % fp16 and refused them)."""
    p = layer_precisions(_fixture(name))
    assert p["myelin_layers"] == 1 and p["myelin_names"][0].startswith("{ForeignNode[")
    v = precision_verdict("fp16", p, outputs_unavailable="no CUDA memory library")
    assert v["status"] == "inconclusive" and "no CUDA memory library" in v["reason"]
    assert dtype_of("Half") == "fp16" and dtype_of("Float") == "fp32" and dtype_of("N/A") is None


@pytest.mark.parametrize("d, status", [(3e-3, "confirmed"), (2e-6, "refuted"), (3e-5, "inconclusive")])
def test_foreign_nodes_decided_by_the_fp32_reference_engine(d, status):
    p = layer_precisions(_fixture("trt11_fp16_whole_network_foreignnode.json"))
    v = precision_verdict("fp16", p, {"max_rel_diff": d, "samples": 4, "finite": True})
    assert v["status"] == status and v["evidence"] == "outputs"
    if status == "refuted":
        assert "computes like fp32" in v["reason"]


def test_fp32_request_and_helpers():
    p32 = layer_precisions(_fixture("trt11_fp32_whole_network_foreignnode.json"))
    assert precision_verdict("fp32", p32)["status"] == "confirmed"
    assert precision_verdict("fp32", layer_precisions(_fixture("trt10_fp16_ordinary_layers.json")))["status"] == "refuted"
    assert name_members("PWN(PWN(/a/Mul, /a/Add), /a/Sqrt)") == {"/a/Mul", "/a/Add", "/a/Sqrt"}
    assert name_members("/stem/conv/Conv + /stem/act/Relu") == {"/stem/conv/Conv", "/stem/act/Relu"}
    layer = _fixture("trt10_fp16_vit_foreignnode.json")["Layers"][2]
    assert "/blocks.0/attn/Softmax" in onnx_nodes(layer)
    assert compare_outputs(np.ones((2, 3), np.float32) * 1.001, np.ones((2, 3)))["max_rel_diff"] == pytest.approx(1e-3, rel=1e-3)


def test_pinned_layers_are_verified_by_the_inspector():
    info = _fixture("trt10_fp16_ordinary_layers.json")
    pinned = {"/attn/ReduceL2": "/attn/ReduceL2", "/attn/ReduceL2_1": "/attn/ReduceL2", "/attn/Div": "/attn/Div",
              "/head/Gemm": "/head/Gemm", "/gone/Mul": "/gone/Mul"}
    v = verify_pinned(info, pinned)
    assert v["requested"] == 5 and v["verified"] == 3 and v["not_fp32"] == 1 and v["not_found"] == 1
    assert v["examples"]["not_fp32"] == ["/head/Gemm"]
    vit = verify_pinned(_fixture("trt10_fp16_vit_foreignnode.json"), {"/blocks.0/attn/Softmax": "/blocks.0/attn/Softmax"})
    assert vit["in_myelin"] == 1 and vit["verified"] == 0


# ---- the 10.x / 11.x dispatch against the table-built, spec_set fake module ---------------------------------

GPU = {"gpu": "Fake GPU", "compute_capability": "9.0", "cuda_driver": "12.8", "devices": 1}


def _lower(tmp_path: Path, fake, precision: str, batch=1, options=None, onnx_path=None, memory=True):
    mem = (lambda: (fake.memory, None)) if memory else (lambda: (None, "no CUDA memory library"))
    target = TensorRTTarget(trt=fake.module, device=lambda: (GPU, None), memory=mem)
    onnx_path = onnx_path or _tiny_onnx(tmp_path, batch=batch)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    spec = LowerSpec(name="tiny", imgsz=32, batch=batch, precision=precision, out_dir=out, onnx_path=onnx_path,
                     metadata={"model": "tiny"}, options=options or {})
    return target.lower(None, spec), onnx_path


def _inspector_of(model: onnx.ModelProto) -> dict:
    """An inspector answer for the fake's fp16-cast graph in the TensorRT 10 format, one layer per node (named after
    it, "[ONNX Layer: NODE]" metadata, as the ONNX parser registers them): the fp32 island nodes run in fp32 except
    the first (left in fp16), the last island fused into a Myelin layer, every other node in fp16."""
    islands = sorted(default_policy().onnx_fp32_nodes(model))
    islands = [n.name for n in model.graph.node if n.name in islands and n.op_type not in MOVE_OPS]
    out = []
    for n in model.graph.node:
        fmt = "Row major linear FP32" if n.name in islands[1:] else "Row major linear FP16 format"
        out.append({"Name": n.name, "LayerType": "PointWiseV2", "Inputs": [], "StreamId": 0, "Metadata":
                    f"[ONNX Layer: {n.name}]", "Outputs": [{"Name": n.name + "_out", "Location": "Device",
                                                           "Dimensions": [1, 16], "Format/Datatype": fmt}]})
    if islands:
        last = next(o for o in out if o["Name"] == islands[-1])
        out.remove(last)
        out.append({"Name": "{ForeignNode[/x..." + islands[-1] + "]}", "LayerType": "Myelin", "Inputs": [],
                    "Outputs": [], "TacticName": "", "StreamId": 0, "Metadata": last["Metadata"]})
    return {"Layers": out, "Bindings": ["image", "logits"]}


@pytest.mark.parametrize("version, flags", [("10.0.1", [2]), ("10.16.1", [2]), ("11.1.0", [0])])
def test_fp16_is_built_strongly_typed_from_the_fp16_onnx_on_10x_as_on_11x(tmp_path, trt_fake, version, flags):
    """fp16 on 10.x goes the 11.x way: the fp16-cast ONNX (fp32 islands kept by its casts) parsed into a strongly
    typed network (1 << the creation flag, NvInfer.h kSTRONGLY_TYPED = 1, from 10.0), never BuilderFlag.FP16 with
    per-layer precision (deprecated since 10.12, ignored inside Myelin regions): the table has no such row, so
    the spec_set fake refuses the old calls. The inspector then says which island nodes really run in fp32."""
    fake = trt_fake.FakeTRT(version, inspector=_inspector_of)
    art, onnx_path = _lower(tmp_path, fake, "fp16")
    assert fake.network_flags[0] == flags[0] and fake.flags() == []  # no precision flag on either major
    fp16_onnx = onnx.load_from_string(fake.parsed[0])
    assert sum(i.data_type == F16 for i in fp16_onnx.graph.initializer) > len(fp16_onnx.graph.initializer) / 2
    assert {i.type.tensor_type.elem_type for i in list(fp16_onnx.graph.input) + list(fp16_onnx.graph.output)} == {F32}
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["build_path"] == STRONG_FP16 and side["precision_check"]["status"] != "refuted"
    islands = [n for n in default_policy().onnx_fp32_nodes(fp16_onnx)
               if {x.name: x.op_type for x in fp16_onnx.graph.node}[n] not in MOVE_OPS]
    pol = side["fp32_policy"]
    assert len(islands) >= 3 and pol["pinning"]["requested"] == len(islands)
    # the sidecar records what the inspector confirms, not what was asked: one island in fp16, one in Myelin
    assert pol["pinning"]["not_fp32"] == 1 and pol["pinning"]["in_myelin"] == 1
    assert pol["pinned_layers"] == pol["pinning"]["verified"] == len(islands) - 2 == art.info["fp32_pinned_layers"]
    assert pol["fp16_graph"]["fp32_nodes"] == pol["islands"] >= len(islands)


def test_unnamed_nodes_are_named_before_the_islands_are_checked(tmp_path, trt_fake):
    model = onnx.load(str(_tiny_onnx(tmp_path)))
    for n in model.graph.node:
        n.name = ""  # an exporter that names nothing: onnx-tensorrt would call them node_of_<output>
    path = tmp_path / "unnamed.onnx"
    onnx.save(model, str(path))
    fake = trt_fake.FakeTRT("10.13.0", inspector=_inspector_of)
    art, _ = _lower(tmp_path, fake, "fp16", onnx_path=path)
    parsed = onnx.load_from_string(fake.parsed[0])
    assert all(n.name for n in parsed.graph.node)  # the policy's names, which the inspector's layers carry
    assert art.info["fp32_pinned_layers"] > 0


def test_the_builder_flag_path_is_gone_from_the_table():
    """What the old 10.x path called: absent from the table, so neither the code (test_tensorrt_api's AST walk) nor
    the fake can use it."""
    from vitedge.targets.tensorrt.api import ROWS
    used = {(r.owner, r.member) for r in ROWS}
    assert not used & {("BuilderFlag", "FP16"), ("BuilderFlag", "PREFER_PRECISION_CONSTRAINTS"),
                       ("ILayer", "precision"), ("ILayer", "set_output_type")}


def test_trt11_fp16_builds_the_fp16_onnx_and_confirms_by_outputs(tmp_path, trt_fake):
    fake = trt_fake.FakeTRT("11.1.0", inspector=_fixture("trt11_fp16_whole_network_foreignnode.json"))
    art, onnx_path = _lower(tmp_path, fake, "fp16")
    assert fake.flags() == []  # BuilderFlag.FP16 does not exist in 11.x; nothing else is set
    assert fake.flags("clear_flag") == ["BuilderFlag.TF32"] * 2  # the fp16 engine and the fp32 reference
    fp16_onnx, fp32_onnx = (onnx.load_from_string(b) for b in fake.parsed)
    types = {i.type.tensor_type.elem_type for i in list(fp16_onnx.graph.input) + list(fp16_onnx.graph.output)}
    assert types == {F32}  # fp32 I/O
    assert sum(i.data_type == F16 for i in fp16_onnx.graph.initializer) > len(fp16_onnx.graph.initializer) / 2
    assert not any(i.data_type == F16 for i in fp32_onnx.graph.initializer)  # the reference: the fp32 ONNX
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["build_path"] == STRONG_FP16 and side["fp32_policy"]["fp16_graph"]["fp32_nodes"] > 0
    check = side["precision_check"]
    assert check["status"] == "confirmed" and check["evidence"] == "outputs" and side["precision_built"] == "fp16"
    assert art.info["precision_check"] == check
    assert all(c.execute_async_v3.called for c in fake.contexts) and fake.memory.buffers == {}  # runners closed


def test_trt11_fp16_without_cuda_memory_is_inconclusive_not_failed(tmp_path, trt_fake):
    fake = trt_fake.FakeTRT("11.1.0", inspector=_fixture("trt11_fp16_whole_network_foreignnode.json"))
    art, _ = _lower(tmp_path, fake, "fp16", memory=False)
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["precision_check"]["status"] == "inconclusive" and side["precision_built"] == "unknown"
    assert len(fake.parsed) == 1 and art.path.exists()


def test_fp16_engine_computing_like_fp32_is_refused(tmp_path, trt_fake):
    """The flag silently ignored: the 'fp16' plan runs in fp32, the outputs match the reference: refuted."""
    fake = trt_fake.FakeTRT("11.1.0", inspector=_fixture("trt11_fp16_whole_network_foreignnode.json"))
    fake._strong_fp16 = lambda: False  # the fake then runs the fp16 plan in float32
    with pytest.raises(EngineBuildError, match="computes like fp32"):
        _lower(tmp_path, fake, "fp16")
    assert not (tmp_path / "out" / "tiny.engine").exists()


@pytest.mark.parametrize("version", ["10.13.0", "11.1.0"])
def test_fp32_engines_parse_the_fp32_onnx_and_no_fp16(tmp_path, trt_fake, version):
    fake = trt_fake.FakeTRT(version, inspector=_fixture("trt11_fp32_whole_network_foreignnode.json"))
    art, onnx_path = _lower(tmp_path, fake, "fp32")
    assert fake.parsed == [onnx_path.read_bytes()] and fake.flags() == []
    assert art.precision == "fp32" and art.info["precision_built"] == "fp32"


def _qdq_onnx(tmp_path: Path) -> Path:
    """The tiny graph as the pipeline's tensorrt-encoding QDQ graph (int8 Q/DQ, zero points 0)."""
    from vitedge.targets.graph.qdq import quantize_qdq

    fp32 = onnx.load(str(_tiny_onnx(tmp_path)))
    calib = np.random.default_rng(0).standard_normal((8, 3, 32, 32)).astype(np.float32)
    path = tmp_path / "tiny.int8.tensorrt.onnx"
    onnx.save(quantize_qdq(fp32, calib, encoding="tensorrt").model, str(path))
    return path


def _lower_int8(tmp_path: Path, fake):
    target = TensorRTTarget(trt=fake.module, device=lambda: (GPU, None), memory=lambda: (fake.memory, None))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    qdq_path = _qdq_onnx(tmp_path)
    spec = LowerSpec(name="tiny", imgsz=32, batch=1, precision="int8", out_dir=out, onnx_path=_tiny_onnx(tmp_path),
                     metadata={"model": "tiny"}, qdq_path=qdq_path)
    return target.lower(None, spec), qdq_path


def _layer(name: str, fmt_in: str, fmt_out: str, kind: str = "CaskConvolution") -> dict:
    return {"Name": name, "LayerType": kind, "Inputs": [{"Name": "a", "Format/Datatype": fmt_in}],
            "Outputs": [{"Name": "b", "Format/Datatype": fmt_out}], "Metadata": ""}


INT8_ENGINE = {"Layers": [_layer("conv_q", "Channel major INT8 format where channel % 32 == 0",
                                 "Row major linear FP32"),
                          _layer("pool", "Row major linear FP32", "Row major linear FP32", "Reduce")]}


@pytest.mark.parametrize("version,flags", [("10.13.0", 1 << 1), ("11.1.0", 0)])
def test_int8_engine_is_built_strongly_typed_from_the_qdq_graph(tmp_path, trt_fake, version, flags):
    """Explicit quantization: the engine parses exactly the QDQ graph's bytes, strongly typed (the creation flag,
    NvInfer.h kSTRONGLY_TYPED = 1, on 10.x; always so on 11.x), with no precision flag; the inspector's int8
    layers confirm it."""
    fake = trt_fake.FakeTRT(version, inspector=INT8_ENGINE)
    art, qdq_path = _lower_int8(tmp_path, fake)
    assert fake.parsed == [qdq_path.read_bytes()] and fake.network_flags == [flags]
    assert fake.flags() == [] and fake.flags("clear_flag") == ["BuilderFlag.TF32"]
    qdq = onnx.load(str(qdq_path))
    zero_points = [i for i in qdq.graph.initializer if i.name.endswith("_zero_point")]
    assert zero_points and all(i.data_type == TensorProto.INT8 and not numpy_helper.to_array(i).any()
                               for i in zero_points)  # what TensorRT's parser takes: int8, zero point 0, no int32
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["build_path"] == STRONG_INT8 and side["source_onnx"]["file"] == qdq_path.name
    assert side["precision_check"]["status"] == "confirmed" and art.info["precision_built"] == "int8"


def test_int8_engine_without_int8_layers_is_refused_or_inconclusive(tmp_path, trt_fake):
    floats = {"Layers": [_layer("conv", "Row major linear FP32", "Row major linear FP32")]}
    with pytest.raises(EngineBuildError, match="no visible layer takes or gives int8"):
        _lower_int8(tmp_path, trt_fake.FakeTRT("11.1.0", inspector=floats))
    myelin = {"Layers": [{"Name": "{ForeignNode[/conv...]}", "LayerType": "Myelin", "Inputs": [], "Outputs": []}]}
    art, _ = _lower_int8(tmp_path, trt_fake.FakeTRT("10.13.0", inspector=myelin))
    assert art.info["precision_check"]["status"] == "inconclusive"


def test_mostly_fp32_engine_fails_the_fp16_lowering(tmp_path, trt_fake):
    with pytest.raises(EngineBuildError, match="mostly fp32"):
        _lower(tmp_path, trt_fake.FakeTRT("10.13.0", inspector=_fixture("trt10_fp16_flag_mostly_fp32.json")), "fp16")
    assert not (tmp_path / "out" / "tiny.engine").exists()


def test_engine_file_sidecar_profiles_cache_workspace(tmp_path, trt_fake):
    fake = trt_fake.FakeTRT("10.13.0", inspector=_fixture("trt10_fp16_ordinary_layers.json"))
    cache = tmp_path / "cache" / "timing.cache"
    art, onnx_path = _lower(tmp_path, fake, "fp16", batch=None,
                            options={"max_batch": 16, "workspace": 2, "timing_cache": str(cache), "ios": None})
    assert art.path.name == "tiny.engine" and art.path.read_bytes().startswith(b"PLAN-fp16")  # nothing prepended
    cfg = fake.configs[0]
    cfg.set_memory_pool_limit.assert_called_once_with("MemoryPoolType.WORKSPACE", 2 << 30)
    assert cfg.profiling_verbosity == "ProfilingVerbosity.DETAILED" and cache.read_bytes() == b"CACHE"
    side_path = tmp_path / "out" / "tiny.engine.json"
    assert art.extra_files == [side_path]
    side = json.loads(side_path.read_text())
    assert side["inputs"] == [{"name": "image", "shape": ["batch", 3, 32, 32], "dtype": "float32"}]
    assert side["outputs"][0]["name"] == "logits" and side["outputs"][0]["dtype"] == "float32"
    assert side["profiles"] == [{"input": "image", "min": [1, 3, 32, 32], "opt": [1, 3, 32, 32],
                                 "max": [16, 3, 32, 32]}]
    assert side["precision_requested"] == "fp16" and side["precision_built"] == "mixed-fp16"
    assert side["versions"] == {"tensorrt": "10.13.0", "cuda_driver": "12.8", "gpu": "Fake GPU",
                                "compute_capability": "9.0"}
    import hashlib
    assert side["source_onnx"]["sha256"] == hashlib.sha256(onnx_path.read_bytes()).hexdigest()
    assert side["timing_cache"] == {"path": str(cache), "bytes": 5} and side["workspace_bytes"] == 2 << 30
    assert side["tf32"] is False and side["layer_precisions"]["fp16_share"] == 0.6


def test_cache_is_read_back(tmp_path, trt_fake):
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"OLD")
    fake = trt_fake.FakeTRT("11.1.0", inspector=_fixture("trt11_fp32_whole_network_foreignnode.json"))
    _lower(tmp_path, fake, "fp32", options={"timing_cache": str(cache)})
    fake.configs[0].create_timing_cache.assert_called_once_with(b"OLD")


@pytest.mark.parametrize("version", ["10.13.0", "11.1.0"])
def test_runner_holds_buffers_and_releases_them(tmp_path, trt_fake, version):
    fake = trt_fake.FakeTRT(version, inspector=_fixture("trt11_fp32_whole_network_foreignnode.json"))
    art, _ = _lower(tmp_path, fake, "fp32")
    target = TensorRTTarget(trt=fake.module, device=lambda: (GPU, None), memory=lambda: (fake.memory, None))
    x = np.random.default_rng(0).standard_normal((11, 3, 8, 8)).astype(np.float32)
    with target.runner(art) as r:
        assert r.max_batch() == 8
        y = r.run(x)  # two chunks: 8 and 3
        assert y.shape == (11, 10) and np.allclose(y, trt_fake._linear(x, np.float32), atol=1e-5)
        n_buffers = len(fake.memory.buffers)
        r.run(x)
        assert len(fake.memory.buffers) == n_buffers  # no allocation after the first run of each batch size
        r.prepare(x[:1])  # a new batch size: its buffers are allocated here, before any timed execute
        n_buffers = len(fake.memory.buffers)
        assert r.execute() >= 0.0 and r.execute() >= 0.0 and len(fake.memory.buffers) == n_buffers
    assert fake.memory.buffers == {} and fake.memory.closed and r.engine is None and r.context is None
    r.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        r.run(x)


def test_unavailable_reasons_name_what_is_missing(monkeypatch, trt_fake):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    no_gpu = lambda: (None, "no NVIDIA driver here (libcuda.so.1 not found)")  # noqa: E731
    t = TensorRTTarget(device=no_gpu, memory=lambda: (None, "no CUDA memory library"))
    ok, why = t.available()
    assert not ok and "tensorrt Python package is not installed" in why and "libcuda.so.1" in why
    ok, why = t.runnable()
    assert not ok and "no CUDA memory library" in why
    fake = trt_fake.FakeTRT("10.0.1").module
    ok, why = TensorRTTarget(trt=fake, device=no_gpu).available()
    assert not ok and "tensorrt" not in why and "libcuda.so.1" in why
    ok, why = TensorRTTarget(device=lambda: (GPU, None)).available()
    assert not ok and why.startswith("the tensorrt Python package is not installed")
    t = TensorRTTarget(trt=fake, device=lambda: (GPU, None), memory=lambda: (None, "no CUDA memory"))
    assert t.available() == (True, None) and t.runnable() == (False, "no CUDA memory")
    with pytest.raises(UnavailableError, match="libcuda"):
        TensorRTTarget(trt=fake, device=no_gpu).lower(None, None)


def test_registered_target_interface():
    t = get_target("trt")
    assert isinstance(t, TensorRTTarget) and t.name == "tensorrt" and t.suffix == ".engine"
    assert t.default_precision == "fp16" and t.precisions == ("fp32", "fp16", "int8") and t.dynamic_batch
    assert t.qdq_encoding == "tensorrt"
    assert set(t.options) == {"workspace", "max_batch", "timing_cache"}


# inspector output from real engines (fixtures/tensorrt/README.md; verdicts in test_tensorrt_inspector_fixtures.py)
KERNEL_FIXTURES = ["trt10_10_bert_myelin_kernels.json", "torch_tensorrt_kgen_explicit_typing.json",
                   "torch_tensorrt_kgen_weak_typing.json", "trt10_10_bert_foreignnode.json",
                   "trt11_modeled_list_root_kernels.json", "trex_resnet_a100_fp16_first_layers.json"]


@pytest.mark.parametrize("version", ["10.13.0", "11.1.0"])
@pytest.mark.parametrize("name", KERNEL_FIXTURES)
def test_lowering_never_raises_on_a_correct_fp16_engine_of_a_real_inspector_form(tmp_path, trt_fake, name, version):
    """The fake's fp16 engine really rounds in fp16: where the inspector cannot decide, the fp32 reference engine's
    outputs confirm it (the old share rule refused the explicit-typing kernels, the old parser the bare list)."""
    fake = trt_fake.FakeTRT(version, inspector=_fixture(name))
    art, _ = _lower(tmp_path, fake, "fp16")
    check = art.info["precision_check"]
    assert check["status"] == "confirmed", check
    pinning = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())["fp32_policy"]["pinning"]
    assert pinning is not None  # both majors check the fp32 islands against these layers


# ---- every TensorRT call that reports failure by its return value is checked -----------------------------------

def _fp32_engine(tmp_path, trt_fake, version="10.13.0"):
    fake = trt_fake.FakeTRT(version, inspector=_fixture("trt11_fp32_whole_network_foreignnode.json"))
    art, _ = _lower(tmp_path, fake, "fp32", batch=None)
    return fake, art, TensorRTTarget(trt=fake.module, device=lambda: (GPU, None), memory=lambda: (fake.memory, None))


X8 = np.zeros((2, 3, 8, 8), np.float32)


@pytest.mark.parametrize("call, match", [
    ("set_input_shape", r"set_input_shape\('image', \(2, 3, 8, 8\)\) returned False: .*input 'image'"),
    ("set_tensor_address", r"set_tensor_address\('image', 0x[0-9a-f]+\) returned False: tensor 'image'"),
    ("execute_async_v3", r"execute_async_v3\(stream 0x7\) returned False: .*\['image'\].*\['logits'\]")])
def test_a_false_from_the_context_raises_naming_the_tensor_and_value(tmp_path, trt_fake, call, match):
    fake, art, target = _fp32_engine(tmp_path, trt_fake)
    with target.runner(art) as r:
        getattr(fake.contexts[-1], call).side_effect = None
        getattr(fake.contexts[-1], call).return_value = False
        with pytest.raises(TensorRTCallError, match=match):
            r.run(X8)


def test_an_output_address_refused_names_the_output(tmp_path, trt_fake):
    fake, art, target = _fp32_engine(tmp_path, trt_fake)
    with target.runner(art) as r:
        fake.contexts[-1].set_tensor_address.side_effect = lambda name, memory: name != "logits"
        with pytest.raises(TensorRTCallError, match=r"set_tensor_address\('logits', 0x[0-9a-f]+\) returned False"):
            r.run(X8)


def test_a_refused_profile_switch_names_the_profile(tmp_path, trt_fake):
    fake, art, target = _fp32_engine(tmp_path, trt_fake, "11.1.0")
    with target.runner(art) as r:
        r.profiles = [(1, 1, 1), (2, 2, 8)]  # a second profile, as `batch_ranges` builds
        fake.contexts[-1].set_optimization_profile_async.return_value = False
        with pytest.raises(TensorRTCallError, match=r"set_optimization_profile_async\(1, stream 0x7\) for input "
                                                    r"'image' returned False: .*profile 1 .*\(2, 2, 8\)"):
            r.run(X8)


def test_a_raising_profile_switch_keeps_the_message(tmp_path, trt_fake):
    """The real binding raises RuntimeError("Error in set optimization profile async.") instead of returning False
    (pyCore.cpp, release/10.0 to 11.1: PY_ASSERT_RUNTIME_ERROR): the message naming the profile is still given."""
    fake, art, target = _fp32_engine(tmp_path, trt_fake, "11.1.0")
    with target.runner(art) as r:
        r.profiles = [(1, 1, 1), (2, 2, 8)]
        fake.contexts[-1].set_optimization_profile_async.side_effect = RuntimeError(
            "Error in set optimization profile async.")
        with pytest.raises(TensorRTCallError, match=r"set_optimization_profile_async\(1, stream 0x7\) for input "
                                                    r"'image' raised RuntimeError\('Error in set optimization "
                                                    r"profile async.'\): cannot switch to optimization profile 1 "
                                                    r".*\(2, 2, 8\)"):
            r.run(X8)


@pytest.mark.parametrize("python, says", [((3, 13), "vitedge[tensorrt10]' (CUDA 12"),
                                          ((3, 14), "has no wheel for Python 3.14")])
def test_the_install_hint_says_tensorrt10_has_no_python_314_wheel(monkeypatch, python, says):
    from vitedge.targets.tensorrt import target as trt_target
    assert says in trt_target.install_hint(python)
    if python >= (3, 14):
        assert "vitedge[tensorrt11]" in trt_target.install_hint(python)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    monkeypatch.setattr(trt_target.sys, "version_info", (*python, 0, "final", 0))
    with pytest.raises(UnavailableError, match=re.escape(says)):
        trt_target.import_tensorrt()


def test_no_execution_context_is_an_error_not_a_crash_later(tmp_path, trt_fake, monkeypatch):
    fake, art, target = _fp32_engine(tmp_path, trt_fake)
    engine_of = fake._engine

    def no_context(serialized_engine):
        e = engine_of(serialized_engine)
        e.create_execution_context.side_effect = lambda strategy=None: None
        return e
    monkeypatch.setattr(fake.classes["Runtime"], "side_effect", lambda logger: _runtime(fake, no_context))
    with pytest.raises(TensorRTCallError, match=r"create_execution_context\(\) returned None"):
        target.runner(art)


def _runtime(fake, engine):
    r = fake.instance("Runtime")
    r.deserialize_cuda_engine.side_effect = engine
    return r


@pytest.mark.parametrize("call, value, match", [
    ("set_timing_cache", False, r"set_timing_cache\(cache of .*timing.cache, ignore_mismatch=False\) returned "
                                r"False: .*another TensorRT version or GPU.*--timing-cache"),
    ("add_optimization_profile", -1, r"add_optimization_profile returned -1 for input 'image' min/opt/max")])
def test_a_build_call_reporting_failure_is_an_engine_build_error(tmp_path, trt_fake, call, value, match):
    fake = trt_fake.FakeTRT("10.13.0", inspector=_fixture("trt11_fp32_whole_network_foreignnode.json"))
    make = fake._config

    def config():
        c = make()
        getattr(c, call).side_effect = None
        getattr(c, call).return_value = value
        return c
    fake._config = config
    with pytest.raises(EngineBuildError, match=match):
        _lower(tmp_path, fake, "fp32", options={"timing_cache": str(tmp_path / "timing.cache")})
    assert not (tmp_path / "out" / "tiny.engine").exists()


# ---- on a GPU -------------------------------------------------------------------------------------------

def _gpu_target() -> TensorRTTarget:
    t = TensorRTTarget()
    ok, why = t.runnable()
    if not ok:
        gpu_unavailable(f"TensorRT engine tests need an NVIDIA GPU with tensorrt: {why}")
    return t


def _assert_precision_check(side: dict, precision: str) -> None:
    """What the GPU tests require of an engine's precision check: the target's one rule (check_outcome: refuted
    fails, inconclusive is neither and the parity assertions judge), and a built precision that says what was
    checked. Never the fp16 share alone: it is None when no ordinary compute layer is visible."""
    check = side["precision_check"]
    outcome = check_outcome(check)
    assert outcome != "fail", check
    built = {"fp32": {"fp32"}, "fp16": {"fp16", "mixed-fp16"}, "int8": {"int8"}}[precision]
    assert side["precision_built"] in (built if outcome == "pass" else {"unknown"}), side["precision_built"]


# engines the product accepts whose inspector shows no ordinary compute layer (fp16_share None)
NO_VISIBLE_COMPUTE = ["trt11_fp16_whole_network_foreignnode.json", "trt10_10_bert_myelin_kernels.json",
                      "torch_tensorrt_kgen_explicit_typing.json"]


@pytest.mark.parametrize("memory", [True, False])
@pytest.mark.parametrize("name", NO_VISIBLE_COMPUTE)
def test_the_gpu_tests_precision_assertion_holds_on_engines_the_product_accepts(tmp_path, trt_fake, name, memory):
    """The GPU test's assertion, run here on sidecars of fp16 engines whose precision only the outputs decide (or
    nothing, without CUDA memory): the old `fp16_share >= MIN_FP16_SHARE` was a TypeError on each."""
    fake = trt_fake.FakeTRT("10.16.1", inspector=_fixture(name))
    _lower(tmp_path, fake, "fp16", memory=memory)
    side = json.loads((tmp_path / "out" / "tiny.engine.json").read_text())
    assert side["layer_precisions"]["fp16_share"] is None
    _assert_precision_check(side, "fp16")  # confirmed (kernel boundaries or outputs), or inconclusive without memory


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
    _assert_precision_check(json.loads((tmp_path / f"{name}.engine.json").read_text()), precision)
    x = parity_inputs(32, imgsz)
    with torch.no_grad():
        ref = train(x).numpy()
    y = target.runner(art).run(x.numpy())
    m = compute_metrics(ref, y)
    tol = DEFAULT_TOLERANCES[precision]
    assert tol.violations(m) == [], m


@pytest.mark.gpu
def test_gpu_int8_engine_from_the_qdq_graph(tmp_path):
    """On a GPU: the trained SwiftFormer fixture's tensorrt-encoding QDQ graph builds, the inspector confirms int8
    layers, and the engine agrees with the train-form on held-out digits within the int8 profile."""
    target = _gpu_target()
    from vitedge.targets.graph.qdq import quantize_qdq
    from vitedge.exporter.verdict import trained_reference as tf

    name = "swiftformer_digits"
    calib, _ = tf.calibration_images(name, 64)
    qdq_path = tmp_path / "ref.int8.tensorrt.onnx"
    onnx.save(quantize_qdq(tf.onnx_fp32(name), calib, encoding="tensorrt").model, str(qdq_path))
    spec = LowerSpec(name="ref", imgsz=32, batch=None, precision="int8", out_dir=tmp_path, onnx_path=None,
                     options={"max_batch": 64}, qdq_path=qdq_path)
    art = target.lower(None, spec)
    _assert_precision_check(json.loads((tmp_path / "ref.engine.json").read_text()), "int8")
    x, _ = tf.heldout(name)
    train, _ = tf.deploy_form(name)
    with target.runner(art) as r:
        m = compute_metrics(tf.torch_logits(train, x), r.run(x))
    assert DEFAULT_TOLERANCES["int8"].violations(m) == [], m
