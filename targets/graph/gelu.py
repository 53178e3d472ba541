"""The erf-GELU subgraph in ONNX graphs, as ONNX Runtime fuses it (pure graph edits, no torch).

`restore_gelu_halves`: re-establish the pattern where a rewrite broke it. `fuse_erf_gelu`: replace each complete
pattern by one `com.microsoft.Gelu` node, for graphs only ONNX Runtime runs (the int8 QDQ graph: see there).

Measured: on the plain SwiftFormer graph onnxsim's `fuse_preceding_mul_into_conv` folds GELU's trailing
`Mul(0.5)` into the next 1x1 Conv's weights; ONNX Runtime's GeluFusion needs the full
`Div(x, sqrt 2) -> Erf -> Add(1) -> Mul(x) -> Mul(0.5)` chain, so all 20 GELUs run as five separate ops and
the graph is 13 % slower than the raw export. (SimA's convolutional patch embedding loses 3 of its GELUs
the same way, in the train-form and the deploy-form.) `onnx_export.simplify_keeping_fusions` calls
`restore_gelu_halves` when ONNX Runtime's fused-op count says a GELU fusion was lost.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import numpy_helper

_SQRT2 = math.sqrt(2.0)
MS_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib operators (Gelu: exact erf GELU)


# ---- re-establishing GELU's Mul(0.5) -----------------------------------------------------------------

def restore_gelu_halves(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` in which every erf-GELU that lost its `Mul(0.5)` into the Conv it feeds has it back.

    Pattern: m = x * (1 + erf(x / sqrt 2)) (Div by ~sqrt 2 or Mul by ~1/sqrt 2; operands in either order)
    whose only consumer is a Conv (as its data input) with constant weights W. Rewritten to
    Conv(m * 0.5, 2 W): the same function, with no rounding (powers of two), in the form ONNX Runtime fuses.
    Returns (model, number of GELUs restored); the input model is not changed.
    """
    model = copy_model(model)
    g = model.graph
    consts, producers, consumers, outputs = _index(g)
    uses = {name: len(c) for name, c in consumers.items()}
    restored = 0
    for erf in [n for n in g.node if n.op_type == "Erf"]:
        x = _gelu_input(producers.get(erf.input[0]), consts)
        add = _only(consumers.get(erf.output[0], []))
        if x is None or add is None or add.op_type != "Add" or not _other_is(add, erf.output[0], consts, 1.0):
            continue
        mul = _only(consumers.get(add.output[0], []))
        if mul is None or mul.op_type != "Mul" or sorted(mul.input) != sorted([x, add.output[0]]):
            continue
        conv = _only(consumers.get(mul.output[0], []))
        if (conv is None or conv.op_type != "Conv" or conv.input[0] != mul.output[0] or mul.output[0] in outputs
                or len(conv.input) < 2 or conv.input[1] not in consts):
            continue
        weight = consts[conv.input[1]]
        doubled = (weight.astype(np.float32) * np.float32(2.0)).astype(weight.dtype)
        if weight.dtype != np.float32 or not np.all(np.isfinite(doubled)):
            continue
        w_name = _fresh(g, conv.input[1] + "_x2")
        g.initializer.append(numpy_helper.from_array(doubled, w_name))
        half_name = _fresh(g, mul.output[0] + "_half")
        g.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), half_name + "_c"))
        old_w = conv.input[1]
        uses[old_w] -= 1
        conv.input[1] = w_name
        conv.input[0] = half_name
        half = onnx.helper.make_node("Mul", [mul.output[0], half_name + "_c"], [half_name], name=half_name)
        idx = list(g.node).index(conv)
        g.node.insert(idx, half)
        if uses[old_w] == 0:
            _drop_constant(g, old_w)
        restored += 1
    return model, restored


# ---- one Gelu node per complete pattern ---------------------------------------------------------------

def fuse_erf_gelu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every complete erf-GELU, `x * (1 + erf(x / sqrt 2)) * 0.5` (Div by ~sqrt 2 or Mul by
    ~1/sqrt 2, operands in either order, the 0.5 applied to x first or to the product last), replaced by
    `com.microsoft.Gelu(x)`:
    the same function, computed by ONNX Runtime's fused kernel. Only where every intermediate value has that one
    consumer and is no graph output. Returns (model, number fused).

    Why: the quantizer's QDQ graph gives each DequantizeLinear output one consumer (ONNX Runtime duplicates a
    shared DequantizeLinear per consumer), so the GELU after a quantized Conv reads x through two different
    nodes and ONNX Runtime's GeluFusion, which needs one x, no longer matches: measured on swiftformer_xs, its 20
    GELUs then run as 5 ops each and the int8 graph is slower than fp32. Fused before quantization, they stay
    one node."""
    model = copy_model(model)
    g = model.graph
    consts, producers, consumers, outputs = _index(g)
    dead, fused = set(), 0
    for erf in [n for n in g.node if n.op_type == "Erf"]:
        div = producers.get(erf.input[0])
        x = _gelu_input(div, consts)
        add = _only(consumers.get(erf.output[0], []))
        if x is None or add is None or add.op_type != "Add" or not _other_is(add, erf.output[0], consts, 1.0):
            continue
        mul = _only(consumers.get(add.output[0], []))
        if mul is None or mul.op_type != "Mul" or add.output[0] not in mul.input:
            continue
        other = [i for i in mul.input if i != add.output[0]]
        pre = producers.get(other[0]) if len(other) == 1 else None
        if other == [x]:  # x * (1 + erf) first, then * 0.5
            half = _only(consumers.get(mul.output[0], []))
            if half is None or half.op_type != "Mul" or not _other_is(half, mul.output[0], consts, 0.5):
                continue
            chain, last = (div, erf, add, mul), half
        elif (pre is not None and pre.op_type == "Mul" and x in pre.input
              and _other_is(pre, x, consts, 0.5)):  # (x * 0.5) * (1 + erf)
            chain, last = (div, erf, add, pre), mul
        else:
            continue
        if any(len(consumers.get(n.output[0], [])) != 1 or n.output[0] in outputs for n in chain):
            continue
        gelu = onnx.helper.make_node("Gelu", [x], [last.output[0]], name=_fresh(g, last.output[0] + "_gelu"),
                                     domain=MS_DOMAIN)
        g.node.insert(list(g.node).index(last), gelu)
        dead.update((n.op_type, n.output[0]) for n in (*chain, last))  # (protobuf wrappers are not stable ids)
        fused += 1
    if fused:
        keep = [n for n in g.node if (n.op_type, n.output[0]) not in dead]
        del g.node[:]
        g.node.extend(keep)
        if not any(o.domain == MS_DOMAIN for o in model.opset_import):
            model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    return model, fused


def _index(g: onnx.GraphProto) -> tuple[dict, dict, dict, set]:
    """(constants by name, producer node by output, consumer nodes by input, graph output names)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return _constants(g), {o: n for n in g.node for o in n.output}, consumers, {o.name for o in g.output}


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy of `model` (protobuf CopyFrom)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _constants(g: onnx.GraphProto) -> dict[str, np.ndarray]:
    out = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            out[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return out


def _scalar(name: str, consts: dict, value: float, rtol: float = 1e-6) -> bool:
    v = consts.get(name)
    return v is not None and v.size == 1 and abs(float(v.reshape(())) - value) <= rtol * abs(value)


def _gelu_input(div: onnx.NodeProto | None, consts: dict) -> str | None:
    """x of `x / sqrt 2` or `x * (1 / sqrt 2)`, else None."""
    if div is None or len(div.input) != 2:
        return None
    if div.op_type == "Div" and _scalar(div.input[1], consts, _SQRT2):
        return div.input[0]
    if div.op_type == "Mul":
        for a, b in (div.input, reversed(div.input)):
            if _scalar(b, consts, 1.0 / _SQRT2):
                return a
    return None


def _other_is(node: onnx.NodeProto, this: str, consts: dict, value: float) -> bool:
    others = [i for i in node.input if i != this]
    return len(others) == 1 and _scalar(others[0], consts, value)


def _only(nodes: list) -> onnx.NodeProto | None:
    return nodes[0] if len(nodes) == 1 else None


def _fresh(g: onnx.GraphProto, base: str) -> str:
    taken = {i.name for i in g.initializer} | {o for n in g.node for o in n.output} | {i.name for i in g.input}
    name, k = base, 1
    while name in taken or name + "_c" in taken:
        name, k = f"{base}_{k}", k + 1
    return name


def _drop_constant(g: onnx.GraphProto, name: str) -> None:
    for i, init in enumerate(g.initializer):
        if init.name == name:
            del g.initializer[i]
            return
    for i, n in enumerate(g.node):
        if n.op_type == "Constant" and n.output[0] == name:
            del g.node[i]
            return
