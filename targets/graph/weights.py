"""The weights an ONNX graph stores, read back as float32 (the weights check and localization of every backend whose
artifact is an ONNX graph): the fp16 initializers and the int8 ones read through their DequantizeLinear (per-axis
scale and zero point). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class StoredBias:
    """A stored bias: its value as the artifact's own encoding reads, and the int32 step a correct artifact rounds
    it to (per channel), or None for a float bias. Reads as its value (`np.asarray`)."""
    value: np.ndarray
    step: np.ndarray | None = None

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.value, dtype)


def onnx_stored_weights(model) -> dict[str, np.ndarray]:
    """{initializer name: float32 value} of the weights `model` (an onnx.ModelProto) stores."""
    import onnx
    from onnx import numpy_helper

    return _stored_onnx(model, onnx, numpy_helper)


def _stored_onnx(model, onnx, numpy_helper) -> dict[str, np.ndarray]:
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for i in model.graph.initializer:
        if i.data_type == onnx.TensorProto.FLOAT16 and len(i.dims) >= 2:
            out[i.name] = numpy_helper.to_array(i).astype(np.float32)
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or n.input[0] not in inits or len(inits[n.input[0]].dims) < 2:
            continue
        q = numpy_helper.to_array(inits[n.input[0]]).astype(np.float64)
        if n.input[1] not in inits:
            continue
        scale = numpy_helper.to_array(inits[n.input[1]]).astype(np.float64)
        zero = (numpy_helper.to_array(inits[n.input[2]]).astype(np.float64)
                if len(n.input) > 2 and n.input[2] in inits else np.zeros_like(scale))
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        shape = [1] * q.ndim
        if scale.size > 1:
            shape[axis] = scale.size
        out[n.input[0]] = ((q - zero.reshape(shape)) * scale.reshape(shape)).astype(np.float32)
    out.update(onnx_biases(model, inits))  # biases are weights (exporter/verdict/stored_biases.py)
    return out


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


