"""The fp16 precision policy (ONNX islands, MIL op selector) and the fp16 range analysis."""
from __future__ import annotations

import io
import json
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitedge.exporter.verdict.fp16_ranges import analyze_fp16_ranges, check_fp16_safe
from vitedge.targets.graph.precision import FP16_MAX, default_policy, fp16_flushes_to_zero, is_tiny_eps
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.layers import (EfficientAdditiveAttention, SimAAttention, SimplifiedLinearAttention,
                                   linear_attention)


class Hazards(nn.Module):
    """Every fp16 hazard of MODELS.md on a (B, N, C) token tensor, built from the project's layers."""

    def __init__(self, dim: int = 16, tokens: int = 16, sla_module: bool = True):
        super().__init__()
        self.sla_module = sla_module  # False: the SLA core alone (coremltools cannot trace the module's dtype cast)
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.additive = EfficientAdditiveAttention(dim, dim)             # F.normalize (l2), eps 1e-12
        self.sima = SimAAttention(dim, num_heads=2, qkv_bias=True)       # l1 over tokens, eps 1e-12
        self.sla = SimplifiedLinearAttention(dim, 2, tokens)            # 1 / (q . sum k + 1e-6)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        x = x + self.additive(self.ln(x))
        x = x + self.sima(x)
        x = x + (self.sla(x, hw=(4, 4)) if self.sla_module else linear_attention(x.relu(), x.relu(), x, "kv_first"))
        x = x * torch.rsqrt(torch.clamp(torch.sum(x * x, -1, keepdim=True), min=1e-24))  # normalize rewrite
        return self.fc(x).softmax(-1).mean(1)


def _export(model: nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), buf, dynamo=False, opset_version=17, input_names=["x"],
                          output_names=["y"])
    return onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module")
def hazards_graph():
    torch.manual_seed(0)
    m = make_trained_like(Hazards(), seed=1).eval()
    return m, _export(m, torch.randn(2, 16, 16))


def _consumers(model, name):
    return [n for n in model.graph.node if name in n.input]


def _chain_to_rescale(model, seed) -> list:
    """A reduction, the elementwise ops after it, up to the first Mul/Div that applies it to another tensor."""
    consts = {i.name for i in model.graph.initializer} | {o for n in model.graph.node if n.op_type == "Constant"
                                                           for o in n.output}
    path = [seed]
    while True:
        nxt = _consumers(model, path[-1].output[0])
        assert len(nxt) == 1, [n.name for n in nxt]
        node = nxt[0]
        path.append(node)
        if node.op_type in ("Mul", "Div") and any(i not in consts and i != path[-2].output[0] for i in node.input):
            return path
        assert node.op_type in ("Clip", "Expand", "Max", "Sqrt", "Reciprocal", "Div"), node.op_type


def test_onnx_islands_cover_each_normalization_chain(hazards_graph):
    _, model = hazards_graph
    islands = default_policy().onnx_fp32_islands(model)
    by_type = lambda t: [n for n in model.graph.node if n.op_type == t]  # noqa: E731
    reductions = by_type("ReduceL2") + by_type("ReduceL1")
    assert len(by_type("ReduceL2")) == 3 and len(by_type("ReduceL1")) == 2  # q, k, alpha / q, k
    for seed in reductions:
        chain = _chain_to_rescale(model, seed)
        assert [n.op_type for n in chain] == [seed.op_type, "Clip", "Expand", "Div"]
        assert all(n.name in islands for n in chain), [(n.name, n.name in islands) for n in chain]
    # SLA: sum_j k_j, q . sum k, + 1e-6, the reciprocal, the numerator products and the rescale stay fp32.
    sla = [n for n in model.graph.node if n.name.startswith("/sla/")]
    for t in ("ReduceSum", "Reciprocal"):
        assert all(n.name in islands for n in sla if n.op_type == t)
    inits = {i.name for i in model.graph.initializer}
    sla_matmuls = [n for n in sla if n.op_type == "MatMul" and not set(n.input) & inits]
    assert len(sla_matmuls) == 3 and all(n.name in islands for n in sla_matmuls)
    rescale = _consumers(model, next(n for n in sla if n.op_type == "Reciprocal").output[0])
    assert all(n.name in islands for n in rescale)
    # the rsqrt rewrite: x*x -> ReduceSum -> Clip(eps^2) -> Sqrt -> 1/. -> x * .
    top = [n for n in model.graph.node if n.name.count("/") == 1]
    rewrite = next(n for n in top if n.op_type == "ReduceSum")
    square = next(n for n in top if n.output[0] == rewrite.input[0])
    assert square.op_type == "Mul" and square.input[0] == square.input[1] and square.name in islands
    chain = _chain_to_rescale(model, rewrite)
    assert [n.op_type for n in chain] == ["ReduceSum", "Clip", "Sqrt", "Div", "Mul"]
    assert all(n.name in islands for n in chain)
    assert all(n.name in islands for n in by_type("LayerNormalization") + by_type("Softmax"))
    # Linear layers (MatMul/Gemm with weights), GELU and the attention products of SimA stay fp16.
    weighted = [n for n in model.graph.node if n.op_type in ("MatMul", "Gemm") and set(n.input) & inits]
    assert weighted and not any(n.name in islands for n in weighted)
    sima_mm = [n for n in model.graph.node if n.name.startswith("/sima/") and n.op_type == "MatMul"
               and not set(n.input) & inits]
    assert sima_mm and not any(n.name in islands for n in sima_mm)
    assert len(islands) < len(model.graph.node) / 2


def test_onnx_islands_on_a_family_graph():
    """SimA deploy-form (reduced): every l1 normalization, rewritten as t / max(sum|t|, eps) (2 per SimA block,
    2 per class-attention block), is an island: |t|, the token sum, the eps clamp and the division."""
    from vitedge.exporter.onnx.onnx_export import export_onnx
    from vitedge.exporter.reparam.engine import reparameterize

    m = make_trained_like(create_model("sima_nano_12_p16", depth=2, num_classes=10), seed=0).eval()
    model = export_onnx(reparameterize(m, 32), 32)
    islands = default_policy().onnx_fp32_nodes(model)
    producer = {o: n for n in model.graph.node for o in n.output}
    l1 = [n for n in model.graph.node if n.op_type == "ReduceL1" or n.op_type == "ReduceSum"
          and producer.get(n.input[0]) is not None and producer[n.input[0]].op_type == "Abs"]
    assert len(l1) == 2 * 2 + 2 * 2
    for seed in l1:
        chain = _chain_to_rescale(model, seed)
        assert chain[-1].op_type == "Div" and all(n.name in islands for n in chain)
        if seed.op_type == "ReduceSum":
            assert producer[seed.input[0]].name in islands  # the |t| feeding it
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert convs and not any(n.name in islands for n in convs)


def test_mil_selector_keeps_islands_fp32_in_a_converted_program():
    ct = pytest.importorskip("coremltools")
    from coremltools.converters.mil.mil import types

    model = make_trained_like(Hazards(sla_module=False), seed=1).eval()
    policy = default_policy()
    x = torch.randn(1, 16, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model.eval(), (x,))
        prog = ct.convert(traced, inputs=[ct.TensorType(name="x", shape=x.shape)], convert_to="milinternal",
                          minimum_deployment_target=ct.target.iOS16,
                          compute_precision=ct.transform.FP16ComputePrecision(op_selector=policy.mil_op_selector))
    ops = [op for op in prog.functions["main"].operations if op.op_type not in ("const", "cast")]
    dtype = lambda op: op.outputs[0].dtype  # noqa: E731
    for t in ("reduce_l2_norm", "reduce_sum", "layer_norm", "softmax", "rsqrt", "inverse"):
        found = [op for op in ops if op.op_type == t]
        assert found, t
        assert all(dtype(op) == types.fp32 for op in found), (t, [types.builtin_to_string(dtype(o)) for o in found])
    for t in ("linear", "gelu") if any(op.op_type == "gelu" for op in ops) else ("linear",):
        found = [op for op in ops if op.op_type == t]
        assert found and all(dtype(op) == types.fp16 for op in found), t
    # the eps clamp of every normalization (maximum with 1e-12, which is 0 in fp16) stays fp32
    eps_ops = [op for op in ops if op.op_type in ("maximum", "clip")]
    assert eps_ops and all(dtype(op) == types.fp32 for op in eps_ops)


class _Var:
    def __init__(self, op=None, val=None, dtype="fp32"):
        self.op, self.val, self._dtype, self.child_ops = op, val, dtype, []

    def is_tensor_or_scalar_of(self, dtype):
        return dtype == self._dtype


class _Op:
    """The attributes of a coremltools MIL Operation the selector reads."""

    def __init__(self, name, op_type, block, **inputs):
        self.name, self.op_type, self.enclosing_block, self.inputs = name, op_type, block, inputs
        self.outputs = [_Var(self)]
        for v in inputs.values():
            v.child_ops.append(self)
        block.operations.append(self)


def test_mil_selector_on_op_like_objects():
    class Block:
        operations: list

    b = Block()
    b.operations = []
    x = _Var()
    def const(name, v):
        op = _Op(name, "const", b)
        op.outputs[0].val = np.float32(v)
        return op.outputs[0]

    c_eps, c_half = const("eps", 1e-6), const("half", 0.5)
    w = _Op("w", "linear", b, x=x)
    s = _Op("s", "reduce_sum", b, x=w.outputs[0])
    a = _Op("a", "add", b, x=s.outputs[0], y=c_eps)
    inv = _Op("inv", "inverse", b, x=a.outputs[0])
    out = _Op("out", "mul", b, x=w.outputs[0], y=inv.outputs[0])
    scaled = _Op("scaled", "mul", b, x=out.outputs[0], y=c_half)
    sel = default_policy().mil_op_selector
    assert [sel(op) for op in (w, s, a, inv, out, scaled)] == [True, False, False, False, False, True]


def test_policy_to_dict_is_json():
    d = default_policy().to_dict()
    json.dumps(d)
    names = [r["name"] for r in d["rules"]]
    assert {"lp_normalize", "tiny_eps", "layernorm", "softmax"} <= set(names)


def test_eps_helpers():
    assert fp16_flushes_to_zero(1e-12) and not fp16_flushes_to_zero(1e-6) and not fp16_flushes_to_zero(0.0)
    assert is_tiny_eps(1e-6) and is_tiny_eps(1e-12) and not is_tiny_eps(1e-3) and not is_tiny_eps(0.0)


class Scaled(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        with torch.no_grad():
            self.fc.weight.mul_(scale)

    def forward(self, x):
        t = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(F.normalize(self.fc(t), dim=-1)).mean(1)


def test_analysis_finds_injected_overflow_and_names_the_module():
    x = torch.randn(4, 3, 8, 8)
    clean = analyze_fp16_ranges(Scaled(1.0).eval(), x)
    assert not clean.overflowing_modules
    check_fp16_safe(clean)
    bad = analyze_fp16_ranges(Scaled(1e6).eval(), x)
    assert bad.modules["fc"]["max_abs"] > FP16_MAX
    # fc overflows; so does the sum of squares inside the model's F.normalize, but that is an fp32 island
    assert bad.overflowing_modules == ["<model>", "fc"]
    assert bad.modules["<model>"]["ops"]["sum_of_powers<normalize"] > FP16_MAX
    assert [(h.module, h.op, h.covered_by) for h in bad.uncovered()] == [("fc", "linear", None)]
    with pytest.raises(VitedgeError, match=r"module 'fc' \(linear\).*65504"):
        check_fp16_safe(bad)
    json.dumps(bad.to_dict())


def test_analysis_eps_underflow_and_island_coverage():
    class EpsModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.sima = SimAAttention(8, num_heads=2)
            self.bn = nn.BatchNorm1d(8, eps=1e-9).eval()

        def forward(self, x):
            return self.bn(self.sima(x).transpose(1, 2)).transpose(1, 2)

    a = analyze_fp16_ranges(EpsModel().eval(), torch.randn(2, 16, 8))
    norm_eps = [e for e in a.eps if e.op == "normalize"]
    assert norm_eps and all(e.module == "sima" and e.value == 1e-12 and e.flushes_to_zero and e.hazard
                            for e in norm_eps)
    kinds = {(h.module, h.op, h.kind): h.covered_by for h in a.hazards}
    assert kinds[("sima", "normalize", "eps_underflow")] == "lp_normalize"
    assert kinds[("bn", "batch_norm", "eps_underflow")] is None  # an eps that flushes outside any island
    with pytest.raises(VitedgeError, match="module 'bn'.*eps 1e-09"):
        check_fp16_safe(a)


def test_analysis_mirrors_the_sla_island():
    """Large SLA activations: the token sum, q . sum k, 1/(.+1e-6) and the numerator overflow fp16, but all lie
    in the policy's island, so fp16 stays allowed; the 1e-6 eps is flagged (1/1e-6 > 65504) and covered."""
    sla = make_trained_like(SimplifiedLinearAttention(16, 2, 64), seed=0).eval()
    a = analyze_fp16_ranges(sla, torch.rand(2, 64, 16) * 60)
    ops = a.modules["<model>"]["ops"]
    assert ops["matmul<sum"] > FP16_MAX and ops["matmul<add_eps"] > FP16_MAX and ops["add_eps"] > FP16_MAX
    assert 0 < ops["reciprocal<add_eps"] < 1 and ops["mul<add_eps"] < FP16_MAX  # z, and the rescaled output
    assert any(e.op == "add_eps" and e.reciprocal_overflows and e.hazard for e in a.eps)
    assert a.hazards and not a.uncovered()
    check_fp16_safe(a)
