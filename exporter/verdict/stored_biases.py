"""Biases are weights: the bias vectors an artifact stores, and what a correct artifact's storage does to one.

The weights check (weight_check.py) judges a bias like a weight, each output channel on its own (its deviation
from the deploy-form's value over max(|b_c|, the vector's median |b|)), against how a correct artifact stores it:
- as a float (an fp16 or fp32 initializer, a CoreML const): within one fp16 ulp of the value, the coarsest float
  a correct artifact keeps a bias in (one ulp, not half: a converter that computes a bias in another order, a
  fused op's, lands one ulp away; measured on the trained SwiftFormer's w8 package, whose near-dead biases of
  3e-7 are a few fp16 subnormal ulps);
- as int32 (an int8 QDQ graph's Conv / Gemm / MatMul + Add bias, an XNNPACK int8 program's qcint32 bias): rounded
  to the step the int8 kernels take for it, the layer's input scale x its weight's per-channel scale. That step is
  read from those two scales, never from the bias's own: ONNX Runtime's fused kernels ignore a bias's
  DequantizeLinear scale (a x10 scale changed nothing it computes, yet another runtime reads it), so the bias's
  stored value (int32 x its own scale) is judged against the deploy-form's at the expected step. Where the two
  scales cannot be found, the bias's own scale stands in (weaker: a bias zeroed through a huge own scale passes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class StoredBias:
    """A stored bias: its value as the artifact's own encoding reads, and the int32 step a correct artifact rounds
    it to (per channel), or None for a float bias. Reads as its value (`np.asarray`)."""
    value: np.ndarray
    step: np.ndarray | None = None

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype)


def is_bias(key: str, param: torch.Tensor) -> bool:
    """A deploy-form parameter (name with `_` for `.`) that is a layer's bias vector."""
    return param.dim() == 1 and (key == "bias" or key.endswith("_bias"))


def emulated_bias(bias: torch.Tensor, stored) -> torch.Tensor:
    """The deploy-form's `bias` (float64) moved by the most a correct artifact's storage moves it, per channel: half
    the int32 step where `stored` carries one, else one fp16 ulp of the value (module doc)."""
    b = bias.detach().double()
    step = getattr(stored, "step", None)
    if step is None:
        bound = np.spacing(np.abs(b.numpy()).astype(np.float16)).astype(np.float64)
    else:
        bound = np.broadcast_to(np.asarray(step, np.float64).reshape(-1), b.shape) / 2
    return b + torch.as_tensor(np.array(bound, np.float64))


def onnx_biases(model, inits: dict) -> dict[str, np.ndarray | StoredBias]:
    """{initializer name: stored bias} of an ONNX graph: every 1-D float initializer named as a bias, and every
    int32 one read through its DequantizeLinear, with the step its layer's input and weight scales give it."""
    import onnx
    from onnx import numpy_helper

    out = {}
    for name, i in inits.items():
        if len(i.dims) == 1 and name.endswith("bias") and i.data_type in (onnx.TensorProto.FLOAT,
                                                                           onnx.TensorProto.FLOAT16):
            out[name] = numpy_helper.to_array(i).astype(np.float32)
    producers = {o: n for n in model.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for n in model.graph.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)

    def array(name):
        return numpy_helper.to_array(inits[name]).astype(np.float64) if name in inits else None

    def dq_scale(tensor):
        node = producers.get(tensor)
        return array(node.input[1]) if node is not None and node.op_type == "DequantizeLinear" else None

    for n in model.graph.node:
        q = inits.get(n.input[0]) if n.op_type == "DequantizeLinear" else None
        if q is None or q.data_type != onnx.TensorProto.INT32 or len(q.dims) != 1 or n.input[1] not in inits:
            continue
        own = array(n.input[1])
        zero = array(n.input[2]) if len(n.input) > 2 and n.input[2] in inits else 0.0
        value = (array(n.input[0]) - zero) * own
        step = None
        for c in consumers.get(n.output[0], []):
            layer = c
            if c.op_type == "Add":  # MatMul + Add: the scales are the MatMul's
                other = next((x for x in c.input if x != n.output[0]), None)
                layer = producers.get(other)
            if layer is not None and layer.op_type in ("Conv", "Gemm", "MatMul") and len(layer.input) >= 2:
                s_in, s_w = dq_scale(layer.input[0]), dq_scale(layer.input[1])
                if s_in is not None and s_w is not None and s_in.size == 1:
                    step = float(s_in.reshape(())) * s_w.reshape(-1)
                    break
        out[n.input[0]] = StoredBias(value.astype(np.float32), own if step is None else step)
    return out
