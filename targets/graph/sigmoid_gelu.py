"""GELU as `x * sigmoid(1.702 x)` in the int8 QDQ graph for ONNX Runtime (pure graph edits, no torch).

ONNX Runtime's CPU kernels have no int8 GELU: between two int8 Convs each GELU leaves int8 (DequantizeLinear),
runs erf in float and re-enters (QuantizeLinear). On swiftformer_xs that is 3.1 ms for the 20 GELUs plus most of
3.7 ms of Q/DQ, of a 15.5 ms int8 run (ONNX Runtime profile, 1 thread). Written as `x * sigmoid(1.702 x)`, both
ops have int8 kernels: `QLinearSigmoid` is a 256-entry lookup table and `QLinearMul` an int8 product, so the
whole MLP stays int8. Interleaved, 1 thread, 224 px: swiftformer_xs int8 1.22x -> 1.64x of fp32.

It is an approximation: |GELU(x) - x sigmoid(1.702 x)| <= MAX_ABS_ERROR = 0.0204 for every x (at |x| = 2.27;
`max_abs_error` computes it on a dense grid), less than one uint8 step wherever the GELU output's calibrated
range is wider than 255 x 0.0204 = 5.2. On the trained fixtures it changes no top-1 decision of the 364 held-out
digits and the mean cosine to fp32 stays 0.9999 (SwiftFormer) / 0.9994 (SLAB-DeiT), as with the exact GELU. The
int8 hop judges the artifact like any other (the `int8` profile); `quantize_qdq(..., gelu="exact")` keeps the
exact float GELU.

Two steps:
- `gelu_as_sigmoid` (before quantizing): every `com.microsoft.Gelu` (gelu.fuse_erf_gelu) becomes
  `Mul(x, k) -> Sigmoid -> Mul(x, .)`, nodes named `<gelu>_kx`, `<gelu>_sig`, `<gelu>_mul`.
- `fold_sigmoid_gain` (after quantizing): the quantized `Mul(x, k)` is removed; the Sigmoid reads x's uint8
  tensor through a DequantizeLinear whose scale is k times x's. Sigmoid(k x) exactly, one int8 op fewer per GELU and
  one rounding fewer (the product k x is never requantized).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .gelu import MS_DOMAIN, _index, copy_model

K = 1.702  # Hendrycks & Gimpel's sigmoid approximation of the normal CDF: Phi(x) ~ sigmoid(1.702 x)
MAX_ABS_ERROR = 0.0204  # max_abs_error() = 0.020335
SUFFIXES = ("_kx", "_sig", "_mul")


def max_abs_error(k: float = K) -> float:
    """max |GELU(x) - x sigmoid(k x)| over a dense grid of [-12, 12] (GELU by erf, in float64)."""
    from math import erf, sqrt

    x = np.linspace(-12.0, 12.0, 480001)
    gelu = 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))
    return float(np.abs(gelu - x / (1.0 + np.exp(-k * x))).max())


def gelu_as_sigmoid(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every `com.microsoft.Gelu(x)` written as `x * sigmoid(K x)`. Returns (model, count)."""
    model = copy_model(model)
    g = model.graph
    gelus = [n for n in g.node if n.op_type == "Gelu" and n.domain == MS_DOMAIN]
    if not gelus:
        return model, 0
    k_name = "vitedge_sigmoid_gelu_k"
    g.initializer.append(numpy_helper.from_array(np.array(K, np.float32), k_name))
    nodes = []
    for n in g.node:
        if not (n.op_type == "Gelu" and n.domain == MS_DOMAIN):
            nodes.append(n)
            continue
        x, y = n.input[0], n.output[0]
        kx, sig, mul = (n.name + s for s in SUFFIXES)
        nodes += [onnx.helper.make_node("Mul", [x, k_name], [kx], name=kx),
                  onnx.helper.make_node("Sigmoid", [kx], [sig], name=sig),
                  onnx.helper.make_node("Mul", [x, sig], [y], name=mul)]
    del g.node[:]
    g.node.extend(nodes)
    return model, len(gelus)


def fold_sigmoid_gain(qdq: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of the quantized `qdq` in which each `<gelu>_kx` Mul that runs int8 (DQ(x) and DQ(k) in, Q out) is
    dropped and its Sigmoid reads `DequantizeLinear(x_q, K * x_scale, x_zero_point)`. A Mul that did not run int8
    (its Sigmoid's input is not a Q -> DQ pair) is left as it is. Returns (model, folded)."""
    model = copy_model(qdq)
    g = model.graph
    consts, producers, consumers, _ = _index(g)
    by_name = {n.name: n for n in g.node}
    dead: set[str] = set()
    folded = 0
    for kx in [n for n in g.node if n.op_type == "Mul" and n.name.endswith(SUFFIXES[0])]:
        sig = by_name.get(kx.name[:-len(SUFFIXES[0])] + SUFFIXES[1])
        dq_b = producers.get(sig.input[0]) if sig is not None else None
        q_b = producers.get(dq_b.input[0]) if dq_b is not None and dq_b.op_type == "DequantizeLinear" else None
        dq_x = producers.get(kx.input[0])
        if (q_b is None or q_b.op_type != "QuantizeLinear" or q_b.input[0] != kx.output[0]
                or dq_x is None or dq_x.op_type != "DequantizeLinear" or dq_x.input[1] not in consts
                or len(consumers.get(q_b.output[0], [])) != 1 or len(consumers.get(kx.output[0], [])) != 1
                or len(consumers.get(dq_b.output[0], [])) != 1):
            continue
        scale = consts[dq_x.input[1]]
        if scale.size != 1:  # per-channel activations: not what the quantizer writes; leave it
            continue
        s_name = f"{sig.name}_input_scale"
        g.initializer.append(numpy_helper.from_array((scale.astype(np.float64) * K).astype(scale.dtype), s_name))
        dq = onnx.helper.make_node("DequantizeLinear", [dq_x.input[0], s_name, *dq_x.input[2:]], [sig.name + "_in"],
                                   name=sig.name + "_in_DequantizeLinear")
        for a in dq_x.attribute:
            dq.attribute.append(a)
        sig.input[0] = dq.output[0]
        g.node.insert(list(g.node).index(sig), dq)
        dead.update(n.name for n in (kx, q_b, dq_b))
        folded += 1
    if folded:
        keep = [n for n in g.node if n.name not in dead]
        del g.node[:]
        g.node.extend(keep)
        _drop_unused(g)
    return model, folded


def _drop_unused(g: onnx.GraphProto) -> None:
    """Remove the nodes and initializers nothing reads any more (the constant k's DequantizeLinear, its scales)."""
    outputs = {o.name for o in g.output}
    while True:
        used = {i for n in g.node for i in n.input} | outputs
        dead = [n for n in g.node if n.op_type == "DequantizeLinear" and not any(o in used for o in n.output)]
        if not dead:
            break
        names = {n.name for n in dead}
        keep = [n for n in g.node if n.name not in names]
        del g.node[:]
        g.node.extend(keep)
    used = {i for n in g.node for i in n.input} | outputs
    keep_init = [i for i in g.initializer if i.name in used]
    del g.initializer[:]
    g.initializer.extend(keep_init)


__all__ = ["K", "MAX_ABS_ERROR", "fold_sigmoid_gain", "gelu_as_sigmoid", "max_abs_error"]
