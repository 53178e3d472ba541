"""The weights an ONNX graph stores, read back as float32 (the weights check and localization of every backend whose
artifact is an ONNX graph): the fp16 initializers and the int8 ones read through their DequantizeLinear (per-axis
scale and zero point). Torch-free."""
from __future__ import annotations

import numpy as np


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
    return out


