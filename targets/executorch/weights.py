"""The weights an ExecuTorch program (.pte) stores in its XNNPACK delegates, read back from the file's bytes.

The program is parsed with ExecuTorch's own deserializer (`deserialize_pte_binary`: the program flatbuffer, its
delegate payloads and its named data). Each XNNPACK payload is an XNNHeader, then the delegate's flatbuffer graph
(decoded to JSON by ExecuTorch's bundled `flatc` with XNNPACK's schema.fbs), then its own constant data. Every
constant a Conv2d, DepthwiseConv2d or FullyConnected node reads as its filter is returned in float32:

- int8 (`xnn_datatype_qcint8`, PT2E's per-channel weights): int8 data x the per-channel float32 scales of its
  PerChannelQuant (inline, or a constant buffer by index), along its `channel_dim`; per-tensor int8
  (`qint8`) as (q - zero point) x scale;
- float32 (`xnn_datatype_fp32`, an fp32 program's weights) as stored.

A constant's bytes come from the delegate's constant data (offset, size) or, where its entry carries a named key,
from the program's named data. Filters are returned in the deploy-form's layout: a convolution's OHWI back to OIHW,
a depthwise convolution's 1HWO to O1HW, a fully-connected filter as O x I (I x O when its node's
XNN_FLAG_TRANSPOSE_WEIGHTS is set). XNNPACK graphs carry no parameter names: each weight is named by where it sits
(`forward.delegate0.value3`); exporter/verdict/weight_check.py maps it to a deploy-form parameter by its values.

The node's bias comes with its filter: float32 as stored, or int32 (`xnn_datatype_qcint32`) x its per-channel
scales, with the step the int8 kernel takes for it, the node's input scale x the filter's per-channel scales
(exporter/verdict/stored_biases.py judges it at that step, not at its own scales).
"""
from __future__ import annotations

import importlib.resources
import json
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

FILTER_NODES = {"XNNConv2d": (0, 3, 1, 2), "XNNDepthwiseConv2d": (3, 0, 1, 2), "XNNFullyConnected": None}
XNN_FLAG_TRANSPOSE_WEIGHTS = 0x1   # xnnpack.h: a fully-connected filter stored I x O
NOT_OFFSET = 2 ** 64 - 1           # a ConstantDataOffset whose data lives in the program's named data
INT8 = ("xnn_datatype_qcint8", "xnn_datatype_qint8")


@dataclass
class StoredWeight:
    name: str            # where it sits: plan.delegateN.valueID
    node: str            # the XNNPACK node that reads it as its filter
    dtype: str           # "int8" or "fp32"
    value: np.ndarray    # float32, in the deploy-form's layout
    bias: np.ndarray | None = None        # the node's bias, float32 (None: the node has none stored)
    bias_step: np.ndarray | None = None   # an int32 bias's expected step per channel (None: a float bias)


def read_weights(path: str | Path) -> list[StoredWeight]:
    """Every Conv2d / DepthwiseConv2d / FullyConnected filter of the program's XNNPACK delegates (module doc)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    pte = deserialize_pte_binary(Path(path).read_bytes())
    named = pte.named_data
    blobs = {} if named is None else {k: bytes(named.buffers[e.buffer_index]) for k, e in named.pte_data.items()}
    out = []
    for plan in pte.program.execution_plan:
        for d, delegate in enumerate(plan.delegates):
            if delegate.id != "XnnpackBackend":
                continue
            payload = bytes(pte.program.backend_delegate_data[delegate.processed.index].data)
            out += _delegate_weights(payload, blobs, f"{plan.name}.delegate{d}")
    return out


def _delegate_weights(payload: bytes, blobs: dict[str, bytes], where: str) -> list[StoredWeight]:
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    head = XNNHeader.from_bytes(payload[:XNNHeader.EXPECTED_LENGTH])
    graph = graph_json(payload[head.flatbuffer_offset:head.flatbuffer_offset + head.flatbuffer_size])
    constants = payload[head.constant_data_offset:head.constant_data_offset + head.constant_data_size]

    def data(index: int) -> bytes:
        entry = graph["constant_data"][index]
        if entry.get("named_key"):
            return blobs[entry["named_key"]][:entry["size"]]
        if entry["offset"] == NOT_OFFSET:
            raise ValueError(f"{where}: constant {index} has neither an offset nor a named key")
        return constants[entry["offset"]:entry["offset"] + entry["size"]]

    values = {}
    for v in graph["xvalues"]:
        u = v["xvalue_union"]
        tensor = u.get("tensor_value", u)
        values[tensor["id_out"]] = (v["xvalue_union_type"], u, tensor)
    out = []
    for node in graph["xnodes"]:
        kind, n = node["xnode_union_type"], node["xnode_union"]
        if kind not in FILTER_NODES or n.get("filter_id") not in values:
            continue
        vtype, u, tensor = values[n["filter_id"]]
        if not tensor.get("constant_buffer_idx"):
            continue  # a filter computed at run time: nothing stored
        dtype, value = _dequantized(vtype, u, tensor, data)
        bias, step = _bias(n, values, data)
        perm = FILTER_NODES[kind]
        if perm is not None and value.ndim == 4:
            value = value.transpose(perm)
        elif kind == "XNNFullyConnected" and n.get("flags", 0) & XNN_FLAG_TRANSPOSE_WEIGHTS:
            value = value.T
        out.append(StoredWeight(f"{where}.value{tensor['id_out']}", kind, dtype, np.array(value, np.float32),
                                bias, step))
    return out


def _bias(node: dict, values: dict, data) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(the node's stored bias in float32, its int32 step: input scale x filter scales) or (None, None)."""
    if node.get("bias_id") not in values:
        return None, None
    vtype, u, tensor = values[node["bias_id"]]
    if not tensor.get("constant_buffer_idx"):
        return None, None
    dims = tuple(tensor["dims"])
    if vtype == "XNNTensorValue" and tensor["datatype"] == "xnn_datatype_fp32":
        return np.frombuffer(data(tensor["constant_buffer_idx"]), np.float32, int(np.prod(dims))).copy(), None
    if tensor["datatype"] != "xnn_datatype_qcint32" or u.get("quant_params_type") != "PerChannelQuant":
        raise ValueError(f"a bias of datatype {tensor['datatype']} ({u.get('quant_params_type')}) is not read")
    q = np.frombuffer(data(tensor["constant_buffer_idx"]), np.int32, int(np.prod(dims))).astype(np.float64)
    own = _scales(u["quant_params"], data)
    step = own
    _, fu, _ = values[node["filter_id"]]
    inp = values.get(node.get("input1_id"))
    if inp is not None and inp[1].get("quant_params_type") == "PerTensorQuant" and \
            fu.get("quant_params_type") == "PerChannelQuant":
        step = float(inp[1]["quant_params"]["scale"]) * _scales(fu["quant_params"], data)
    return (q * own).astype(np.float32), step


def _scales(params: dict, data) -> np.ndarray:
    """A PerChannelQuant's float32 scales, inline or in a constant buffer."""
    scale = np.asarray(params.get("scale") or [], np.float64)
    if scale.size == 0:
        scale = np.frombuffer(data(params["scale_buffer_idx"]), np.float32, params["num_scales"]).astype(np.float64)
    return scale


def _dequantized(vtype: str, u: dict, tensor: dict, data) -> tuple[str, np.ndarray]:
    dims = tuple(tensor["dims"])
    dt = tensor["datatype"]
    if vtype == "XNNTensorValue" and dt == "xnn_datatype_fp32":
        return "fp32", np.frombuffer(data(tensor["constant_buffer_idx"]), np.float32, int(np.prod(dims))).reshape(dims)
    if dt not in INT8:
        raise ValueError(f"a filter of datatype {dt} ({vtype}) is not read")
    q = np.frombuffer(data(tensor["constant_buffer_idx"]), np.int8, int(np.prod(dims))).reshape(dims)
    params, qtype = u["quant_params"], u["quant_params_type"]
    if qtype == "PerTensorQuant":
        return "int8", ((q.astype(np.float32) - np.float32(params["zero_point"])) * np.float32(params["scale"]))
    if qtype != "PerChannelQuant":
        raise ValueError(f"int8 filters quantized {qtype} are not read")
    scale = _scales(params, data).astype(np.float32)
    shape = [1] * q.ndim
    shape[params["channel_dim"]] = scale.size
    return "int8", q.astype(np.float32) * scale.reshape(shape)


def graph_json(flatbuffer: bytes) -> dict:
    """An XNNPACK delegate's flatbuffer graph as a dict, decoded by ExecuTorch's `flatc` with XNNPACK's schema."""
    import executorch.backends.xnnpack.serialization as schema_package
    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    with tempfile.TemporaryDirectory() as d:
        schema = Path(d) / "schema.fbs"
        schema.write_bytes(importlib.resources.files(schema_package).joinpath("schema.fbs").read_bytes())
        (Path(d) / "graph.bin").write_bytes(flatbuffer)
        _flatc_decompile(d, str(schema), str(Path(d) / "graph.bin"))
        text = (Path(d) / "graph.json").read_text()
    # flatc writes a node's unbounded output range as bare inf / nan, which JSON lacks
    return json.loads(re.sub(r"(?<=[\s:\[,-])(inf|nan)\b", lambda m: "Infinity" if m[1] == "inf" else "NaN", text))
