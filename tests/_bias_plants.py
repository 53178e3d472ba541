"""Errors planted in the biases of saved artifacts (biases are weights: the weights check judges them too): an int8
QDQ graph's int32 bias scale, a CoreML package's float16 bias in weight.bin, an int8 ExecuTorch program's int32
bias data. Each changes the middle output channel of one named layer's bias, as tests/_plant.change_weight does."""
from __future__ import annotations

import shutil
import struct

import numpy as np
import onnx
from onnx import numpy_helper

from vitedge.tests._plant import _rewrite_once, change_weight


def plant_int8_bias_scale(src, dst, bias: str, plant: str) -> None:
    """Save the int8 QDQ ONNX `src` as `dst` with `plant` applied to the per-channel scale of the int32 bias of the
    deploy-form parameter `bias` (its DequantizeLinear reads `<bias>_quantized`)."""
    graph = onnx.load(str(src))
    inits = {i.name: i for i in graph.graph.initializer}
    node = next(n for n in graph.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == f"{bias}_quantized")
    scale = inits[node.input[1]]
    v = numpy_helper.to_array(scale)
    scale.CopyFrom(numpy_helper.from_array(change_weight(v[:, None], plant)[:, 0].astype(v.dtype), scale.name))
    onnx.save(graph, str(dst))


def plant_package_bias(src, dst, bias: str, plant: str) -> None:
    """Copy the .mlpackage `src` to `dst` with `plant` applied to the float16 bias const of the deploy-form parameter
    `bias` (MIL name `<bias with _>_to_fp16`), in weight.bin itself."""
    from vitedge.targets.coreml.mil_interpreter import package_paths, quiet_coremltools

    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    shutil.copytree(src, dst)
    spec_file, weights = package_paths(dst)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    fn = spec.mlProgram.functions["main"]
    want = bias.replace(".", "_") + "_to_fp16"
    op = next(o for o in fn.block_specializations[fn.opset].operations
              if o.type == "const" and o.outputs[0].name == want)
    path = weights / "weight.bin"
    raw = bytearray(path.read_bytes())
    sentinel, _, size, offset = struct.unpack("<IIQQ", raw[op.attributes["val"].blobFileValue.offset:][:24])
    assert sentinel == 0xDEADBEEF
    b = np.frombuffer(bytes(raw[offset:offset + size]), np.float16).astype(np.float32)
    raw[offset:offset + size] = change_weight(b[:, None], plant)[:, 0].astype(np.float16).tobytes()
    path.write_bytes(bytes(raw))


def plant_pte_int8_bias(src, dst, node: str, plant: str) -> None:
    """Copy the int8 ExecuTorch program `src` to `dst` with `plant` applied to the int32 bias data of its first
    XNNPACK node of kind `node` (e.g. "XNNFullyConnected": the head), found by its exact contents."""
    from vitedge.targets.executorch.weights import read_weights

    w = next(w for w in read_weights(src) if w.node == node and w.bias is not None and w.bias_step is not None)
    q = np.round(w.bias.astype(np.float64) / w.bias_step).astype(np.int32)
    planted = change_weight(q[:, None].astype(np.float64), plant)[:, 0].astype(np.int32)
    _rewrite_once(src, dst, q.tobytes(), planted.tobytes(), "the bias's int32 data")
