"""Errors planted in saved artifacts, to show that the parity verdict catches them: one output channel of one
mid-network weight of an ONNX graph, scaled; errors planted in saved fp16 artifacts (a CoreML package's weight.bin,
an fp16 ONNX initializer, a weight in an ExecuTorch program); and in saved compressed artifacts (an int8 QDQ graph's
per-channel weight scales, a compressed package's scales or lookup table in weight.bin, a .pte's int8 data).

The tooling of the sensitivity studies: the criteria tests, benchmarks/parity_noise.py (the study that picks the
noise rule's floor and K), benchmarks/fp16_verdicts.py (the fp16 rule's), benchmarks/compressed_verdicts.py (the
compressed rule's) and benchmarks/all_models.py. It reads every backend's stored format, so it sits above the
backends (tests/test_architecture.py TARGETS_ACROSS); no backend and nothing in the pipeline imports it.

Length: one job, a plant per stored format (ONNX, CoreML packages single and multifunction, .pte, QDQ), each small.
"""
from __future__ import annotations

import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")


@dataclass(frozen=True)
class Planted:
    node: str         # the node whose weight was changed
    op: str
    initializer: str  # the weight's initializer name
    channel: int      # the output channel scaled
    factor: float


def weight_nodes(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, int]]:
    """(node, weight initializer, output-channel axis) of every Conv/Gemm/MatMul whose weight is an initializer
    of rank >= 2, in graph order."""
    inits = {i.name: i for i in model.graph.initializer}
    out = []
    for node in model.graph.node:
        if node.op_type not in WEIGHT_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        w = inits[node.input[1]]
        if len(w.dims) < 2:
            continue
        if node.op_type == "Conv":
            axis = 0
        elif node.op_type == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            axis = 0 if trans_b else 1
        else:
            axis = len(w.dims) - 1
        out.append((node, node.input[1], axis))
    return out


def plant_channel_scale(model: onnx.ModelProto, factor: float, position: float = 0.5,
                        channel: int | None = None) -> tuple[onnx.ModelProto, Planted]:
    """A copy of `model` with one output channel of the weight of the Conv/Gemm/MatMul at `position` (0..1 along
    the graph's weight nodes; 0.5 = mid-network) multiplied by `factor`. The channel defaults to the middle one.
    A weight shared by several nodes is skipped in favour of the next unshared one."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    cands = weight_nodes(m)
    if not cands:
        raise ValueError("no Conv/Gemm/MatMul with an initializer weight in this graph")
    uses: dict[str, int] = {}
    for node in m.graph.node:
        for i in node.input:
            uses[i] = uses.get(i, 0) + 1
    start = min(int(position * len(cands)), len(cands) - 1)
    order = list(range(start, len(cands))) + list(range(start - 1, -1, -1))
    pick = next((cands[i] for i in order if uses[cands[i][1]] == 1), None)
    if pick is None:
        raise ValueError("every weight initializer is shared")
    node, name, axis = pick
    init = next(i for i in m.graph.initializer if i.name == name)
    w = numpy_helper.to_array(init).copy()
    ch = w.shape[axis] // 2 if channel is None else channel
    idx = [slice(None)] * w.ndim
    idx[axis] = ch
    w[tuple(idx)] = (w[tuple(idx)].astype(np.float64) * factor).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(w, name))
    return m, Planted(node.name, node.op_type, name, int(ch), float(factor))


def planted_module(graph: onnx.ModelProto, where: Planted, deploy) -> str:
    """The deploy-form module owning the weight a plant changed, known from the plant itself rather than from
    localization's own node-to-module mapping: the one deploy-form parameter whose values the planted initializer
    held in the unplanted `graph`, as stored or transposed (a Linear becomes a Gemm/MatMul on W^T)."""
    w = numpy_helper.to_array(next(i for i in graph.graph.initializer if i.name == where.initializer))
    owners = [name.rpartition(".")[0] for name, p in list(deploy.named_parameters()) + list(deploy.named_buffers())
              if any(v.shape == w.shape and np.array_equal(v, w)
                     for v in (p.detach().numpy(), p.detach().numpy().T))]
    if len(owners) != 1:
        raise ValueError(f"{where.initializer} holds the values of {len(owners)} deploy-form parameters, not one")
    return owners[0]


# what a plant does to a (output channels, ...) weight: the whole layer zeroed, or its middle channel scaled
PLANT_FACTORS = {"zero_layer": None, "sign_flip": -1.0, "x10": 10.0, "x2": 2.0, "x0": 0.0, "x1.1": 1.1}


def change_weight(w: np.ndarray, plant: str) -> np.ndarray:
    """`w` (output channels first) with `plant` applied: a PLANT_FACTORS name, or "xF" for any factor F."""
    w = w.copy()
    factor = PLANT_FACTORS[plant] if plant in PLANT_FACTORS else float(plant.removeprefix("x"))
    if factor is None:
        return w * 0
    w[w.shape[0] // 2] *= factor
    return w


def _fp16_weights(package, function: str = "main") -> tuple:
    """(the package's Model protobuf, its spec file, its weight.bin, [(const value, bytes, data offset, shape)] of
    `function`'s float16 weights of rank >= 2 in weight.bin, in program order)."""
    from .coreml.mil_interpreter import package_paths
    from .coreml.coremltools_import import quiet_coremltools

    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, weights = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    fn = spec.mlProgram.functions[function]
    raw = (weights / "weight.bin").read_bytes()
    found = []
    for op in fn.block_specializations[fn.opset].operations:
        v = op.attributes["val"] if op.type == "const" else None
        if v is None or v.WhichOneof("value") != "blobFileValue":
            continue
        shape = [d.constant.size for d in v.type.tensorType.dimensions]
        sentinel, _, size, data = struct.unpack_from("<IIQQ", raw, v.blobFileValue.offset)
        if sentinel == 0xDEADBEEF and len(shape) >= 2 and shape[0] >= 4 and size == 2 * int(np.prod(shape)):
            found.append((v, size, data, shape))
    return spec, spec_file, weights / "weight.bin", found


def package_weight_blobs(package) -> list[tuple[int, int, list[int]]]:
    """(offset, bytes, shape) of the float16 weights of rank >= 2 in the package's weight.bin, in program order."""
    return [(data, size, shape) for _, size, data, shape in _fp16_weights(package)[3]]


def plant_package_weights(src, dst, plant: str, position: float) -> None:
    """Copy the .mlpackage `src` to `dst` with `plant` applied to the float16 weight at `position` (0..1) of the
    program's order, in weight.bin itself."""
    shutil.copytree(src, dst)
    blobs = package_weight_blobs(dst)
    offset, size, shape = blobs[min(int(position * len(blobs)), len(blobs) - 1)]
    path = next(dst.rglob("weight.bin"))
    raw = bytearray(path.read_bytes())
    w = np.frombuffer(bytes(raw[offset:offset + size]), np.float16).reshape(shape[0], -1).astype(np.float32)
    raw[offset:offset + size] = change_weight(w, plant).astype(np.float16).tobytes()
    path.write_bytes(bytes(raw))


def plant_fp16_initializer(src, dst, plant: str, position: float) -> None:
    """Save the fp16 ONNX `src` as `dst` with `plant` applied to its float16 weight initializer at `position`."""
    graph = onnx.load(str(src))
    weights = [i for i in graph.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16 and len(i.dims) >= 2
               and i.dims[0] >= 4]
    init = weights[min(int(position * len(weights)), len(weights) - 1)]
    w = numpy_helper.to_array(init).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(change_weight(w.reshape(w.shape[0], -1), plant).reshape(w.shape)
                                          .astype(np.float16), init.name))
    onnx.save(graph, str(dst))


# the compression parameter planted in, per CoreML constexpr op: one entry per output channel (a scale) or per
# lookup table (a palette: the whole tensor's on iOS 16-17, so a "channel" plant there scales the whole layer)
PACKAGE_PARAMS = {"constexpr_affine_dequantize": "scale", "constexpr_blockwise_shift_scale": "scale",
                  "constexpr_lut_to_dense": "lut"}
MIL_DTYPES = {10: np.float16, 11: np.float32}


def package_compression_blobs(package) -> list[tuple[str, int, int, np.dtype, list[int]]]:
    """(op name, offset, bytes, dtype, shape) of each compressed weight's scale or lookup table in weight.bin, in
    program order."""
    from .coreml.mil_interpreter import package_paths
    from .coreml.coremltools_import import quiet_coremltools

    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, weights = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    fn = spec.mlProgram.functions["main"]
    ops = fn.block_specializations[fn.opset].operations
    consts = {op.outputs[0].name: op.attributes["val"] for op in ops if op.type == "const"}
    found = []
    for op in ops:
        param = PACKAGE_PARAMS.get(op.type)
        if param is None:
            continue
        args = op.inputs[param].arguments if param in op.inputs else []
        if param in op.attributes:    # iOS 16-17: an attribute; iOS 18: an input holding the value or naming a const
            v = op.attributes[param]
        elif args and args[0].WhichOneof("binding") == "value":
            v = args[0].value
        else:
            v = consts.get(args[0].name) if args else None
        if v is None or v.WhichOneof("value") != "blobFileValue":
            continue
        dtype = MIL_DTYPES[v.type.tensorType.dataType]
        with open(weights / "weight.bin", "rb") as f:
            f.seek(v.blobFileValue.offset)
            sentinel, _, size, data = struct.unpack("<IIQQ", f.read(24))
        if sentinel == 0xDEADBEEF:
            found.append((op.outputs[0].name, data, size, dtype, [d.constant.size for d in v.type.tensorType.dimensions]))
    return found


def plant_package_compression(src, dst, plant: str, position: float) -> str:
    """Copy the compressed .mlpackage `src` to `dst` with `plant` applied to the scale (per output channel) or
    lookup table of the compressed weight at `position` (0..1) of the program's order, in weight.bin itself;
    returns the weight's name."""
    shutil.copytree(src, dst)
    blobs = package_compression_blobs(dst)
    if not blobs:
        raise ValueError(f"{src} holds no compressed weight")
    name, offset, size, dtype, shape = blobs[min(int(position * len(blobs)), len(blobs) - 1)]
    path = next(dst.rglob("weight.bin"))
    raw = bytearray(path.read_bytes())
    v = np.frombuffer(bytes(raw[offset:offset + size]), dtype).astype(np.float32)
    rows = 1 if len(shape) == 1 and name.endswith("_palettized") else shape[0]  # one table: the whole layer
    raw[offset:offset + size] = change_weight(v.reshape(rows, -1), plant).astype(dtype).tobytes()
    path.write_bytes(bytes(raw))
    return name


def plant_int8_scale(src, dst, plant: str, position: float) -> str:
    """Save the int8 QDQ ONNX `src` as `dst` with `plant` applied to the per-channel scales of the quantized weight
    at `position` (0..1) of the graph's order (a DequantizeLinear reading an int8 initializer); returns its name."""
    graph = onnx.load(str(src))
    inits = {i.name: i for i in graph.graph.initializer}
    weights = [n for n in graph.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
               and inits[n.input[0]].data_type == onnx.TensorProto.INT8 and len(inits[n.input[0]].dims) >= 2
               and n.input[1] in inits and int(np.prod(inits[n.input[1]].dims)) > 1]
    if not weights:
        raise ValueError(f"{src} holds no per-channel int8 weight")
    node = weights[min(int(position * len(weights)), len(weights) - 1)]
    scale = inits[node.input[1]]
    v = numpy_helper.to_array(scale).astype(np.float64)
    changed = change_weight(v.reshape(v.shape[0], -1), plant).reshape(v.shape)
    scale.CopyFrom(numpy_helper.from_array(changed.astype(numpy_helper.to_array(scale).dtype), scale.name))
    onnx.save(graph, str(dst))
    return node.input[0]


def _rewrite_once(src, dst, old: bytes, new: bytes, what: str) -> None:
    """Copy `src` to `dst` with the one occurrence of `old` replaced by `new` (same length); ValueError naming `what`
    when it is not stored exactly once."""
    raw = bytearray(open(src, "rb").read())
    at = raw.find(old)
    if at < 0 or raw.find(old, at + 1) >= 0:
        raise ValueError(f"{what} is not stored once in the program")
    raw[at:at + len(old)] = new
    open(dst, "wb").write(bytes(raw))


def plant_pte_weight(src, dst, weight: np.ndarray, plant: str) -> None:
    """Copy the ExecuTorch program `src` to `dst` with `plant` applied to `weight` (a float32 deploy-form parameter,
    output channels first) where the program stores it: XNNPACK's delegate keeps linear and 1x1 convolution
    weights as raw float32 bytes, found by their exact contents."""
    w = np.ascontiguousarray(weight, np.float32)
    _rewrite_once(src, dst, w.tobytes(), change_weight(w.reshape(w.shape[0], -1), plant).astype(np.float32).tobytes(),
                  "the weight (raw float32)")


def int8_pte_scales(weight: np.ndarray) -> np.ndarray:
    """The per-output-channel float32 scales PT2E's symmetric int8 quantizer (XNNPACK's) gives `weight`: max|w| / 127
    per channel, as its observer computes them in float32 (measured: found byte-exact in lowered programs). Its
    observer floors a scale at 2^-12: a weight with a channel below that floor is not found this way."""
    w = np.ascontiguousarray(weight, np.float32)
    return (np.abs(w.reshape(w.shape[0], -1)).max(1) / np.float32(127.0)).astype(np.float32)


def plant_pte_int8_scale(src, dst, weight: np.ndarray, plant: str) -> None:
    """Copy the int8 ExecuTorch program `src` to `dst` with `plant` applied to the per-channel scales of `weight`
    (a float32 deploy-form parameter, output channels first) where XNNPACK's delegate stores them: a raw float32 run
    in the program, found by its exact contents. Scaling a channel's scale scales its dequantized weights."""
    s = int8_pte_scales(weight)
    _rewrite_once(src, dst, s.tobytes(), change_weight(s[:, None], plant).astype(np.float32).tobytes(),
                  "the weight's int8 scales (raw float32)")


def plant_pte_int8_data(src, dst, weight: np.ndarray, plant: str) -> None:
    """Copy the int8 ExecuTorch program `src` to `dst` with `plant` applied to the int8 data of `weight` (a float32
    deploy-form parameter, output channels first): XNNPACK stores it as raw int8, round(w / scale) per output channel,
    convolutions permuted to OHWI, found by its exact contents. For plants a scale cannot carry (zero, sign flip:
    XNNPACK refuses non-positive scales at load); an int8 channel scaled past +-127 saturates."""
    w = np.ascontiguousarray(weight, np.float32)
    ohwi = w.transpose(0, *range(2, w.ndim), 1) if w.ndim > 2 else w
    q = np.clip(np.round(ohwi.reshape(w.shape[0], -1) / int8_pte_scales(w)[:, None]), -127, 127).astype(np.int8)
    planted = np.clip(change_weight(q.astype(np.float32), plant), -127, 127).astype(np.int8)
    _rewrite_once(src, dst, q.tobytes(), planted.tobytes(), "the weight's int8 data")


def _blob(package: Path, op_type: str, param: str) -> tuple[Path, int, int]:
    """(weight.bin, data offset, data bytes) of `param` of the program's first `op_type` op stored in weight.bin.
    A blob entry starts with a 64-byte header: sentinel 0xDEADBEEF, dtype, size in bytes, data offset."""
    from .coreml.mil_interpreter import package_paths
    from .coreml.coremltools_import import quiet_coremltools

    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, weights = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    fn = spec.mlProgram.functions["main"]
    for o in fn.block_specializations[fn.opset].operations:
        if o.type != op_type:
            continue
        v = o.attributes[param] if param in o.attributes else o.inputs[param].arguments[0].value
        if v.WhichOneof("value") == "blobFileValue":
            path = weights / "weight.bin"
            with open(path, "rb") as f:
                f.seek(v.blobFileValue.offset)
                sentinel, _, size, data = struct.unpack("<IIQQ", f.read(24))
            assert sentinel == 0xDEADBEEF
            return path, data, size
    raise AssertionError(f"no {op_type} with a stored {param}")


def corrupt_package(src: Path, dst: Path, op_type: str, param: str, change) -> None:
    """Copy the package `src` to `dst` and apply `change` (fp16 array -> array) to `param` of its first `op_type`
    op, in weight.bin: a reversed lookup table, sign-flipped scales."""
    shutil.copytree(src, dst)
    path, offset, size = _blob(dst, op_type, param)
    raw = bytearray(path.read_bytes())
    values = np.frombuffer(bytes(raw[offset:offset + size]), np.float16)
    raw[offset:offset + size] = change(values).astype(np.float16).tobytes()
    path.write_bytes(bytes(raw))


# ---- biases (biases are weights: the weights check judges them too) -----------------------------------------

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
    from .coreml.mil_interpreter import package_paths
    from .coreml.coremltools_import import quiet_coremltools

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
    from .executorch.weights import read_weights

    w = next(w for w in read_weights(src) if w.node == node and w.bias is not None and w.bias_step is not None)
    q = np.round(w.bias.astype(np.float64) / w.bias_step).astype(np.int32)
    planted = change_weight(q[:, None].astype(np.float64), plant)[:, 0].astype(np.int32)
    _rewrite_once(src, dst, q.tobytes(), planted.tobytes(), "the bias's int32 data")


def plant_function_weights(package, function: str, plant: str, position: float) -> None:
    """`plant` applied, in place, to the float16 weight at `position` (0..1) of `function`'s program order in a
    multifunction package, for that function alone: where functions share the weight's bytes (coremltools stores a
    weight every function holds once), a changed copy is appended to weight.bin and only `function`'s const points
    to it."""
    spec, spec_file, path, consts = _fp16_weights(package, function)
    raw = bytearray(path.read_bytes())
    v, size, data, shape = consts[min(int(position * len(consts)), len(consts) - 1)]
    w = np.frombuffer(bytes(raw[data:data + size]), np.float16).reshape(shape[0], -1).astype(np.float32)
    meta = bytearray(raw[v.blobFileValue.offset:v.blobFileValue.offset + 64])  # the blob's 64-byte metadata
    at = -(-len(raw) // 64) * 64  # blobs are 64-byte aligned
    struct.pack_into("<Q", meta, 16, at + 64)  # its data follows it
    raw += bytes(at - len(raw)) + meta + change_weight(w, plant).astype(np.float16).tobytes()
    struct.pack_into("<I", raw, 0, struct.unpack_from("<I", raw, 0)[0] + 1)  # the storage header's blob count
    path.write_bytes(bytes(raw))
    v.blobFileValue.offset = at
    spec_file.write_bytes(spec.SerializeToString())
