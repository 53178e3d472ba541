"""The fp16 ONNX graph: every float tensor fp16 except the policy's fp32 islands and the fp32 graph I/O.

This is what `vitedge export --precision fp16` writes as `NAME.fp16.onnx`, what ONNX Runtime runs for the
fp16 parity hop, and what TensorRT 11 (strongly typed: precision comes from the ONNX dtypes) builds from.

How: each node gets a compute dtype (fp32 in an island, fp16 elsewhere, none for nodes that touch no float
tensor); a float input whose dtype differs from its node's gets a Cast (one per tensor and dtype); float
initializers and Constant values are stored in the dtype their consumers need (values beyond fp16's range
are clamped to +-65504 and reported); graph outputs produced in fp16 get a final Cast back to fp32.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from .precision import FP16_MAX, PrecisionPolicy, default_policy, name_nodes

F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16
# Inputs that the ONNX spec types as float32 regardless of the data dtype (index positions).
_FP32_ONLY_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}
# Ops that accept any input dtype and whose outputs are not float.
_ANY_INPUT = frozenset({"Shape", "Size"})


@dataclass
class Fp16Graph:
    model: onnx.ModelProto
    fp32_nodes: dict[str, str]                        # node name -> policy rule keeping it fp32
    clamped: list[dict] = field(default_factory=list)  # initializers with values beyond +-65504
    flushed: list[dict] = field(default_factory=list)  # initializers with non-zero values that become 0
    casts: int = 0

    def summary(self) -> dict:
        n = len(self.model.graph.node)
        return {"fp32_nodes": len(self.fp32_nodes), "nodes": n, "casts_inserted": self.casts,
                "clamped_initializers": self.clamped, "flushed_initializers": self.flushed,
                "fp32_islands": sorted(self.fp32_nodes)}


def _to_fp16(name: str, arr: np.ndarray, clamped: list, flushed: list) -> np.ndarray:
    a = np.asarray(arr, dtype=np.float32)
    over = np.abs(a) > FP16_MAX
    if over.any():
        clamped.append({"initializer": name, "values": int(over.sum()), "max_abs": float(np.abs(a).max())})
    lost = (a != 0) & (np.abs(a) < 2.0 ** -25)
    if lost.any():
        flushed.append({"initializer": name, "values": int(lost.sum()), "min_abs": float(np.abs(a[lost]).min())})
    return np.clip(a, -FP16_MAX, FP16_MAX).astype(np.float16)


def _constants_to_initializers(graph: onnx.GraphProto) -> None:
    """Float `Constant` nodes become initializers, so one code path stores every constant's dtype."""
    keep = []
    for node in graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value" \
                and node.attribute[0].t.data_type == F32:
            t = onnx.TensorProto()
            t.CopyFrom(node.attribute[0].t)
            t.name = node.output[0]
            graph.initializer.append(t)
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)


def _float_dtypes(model: onnx.ModelProto) -> dict[str, int]:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    dt = {}
    for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        dt[vi.name] = vi.type.tensor_type.elem_type
    for init in model.graph.initializer:
        dt[init.name] = init.data_type
    return dt


def prepare_fp16(fp32_model: onnx.ModelProto, policy: PrecisionPolicy | None = None) -> Fp16Graph:
    """The fp16 graph of `fp32_model` under `policy`, with what the conversion did."""
    policy = policy or default_policy()
    model = onnx.ModelProto()
    model.CopyFrom(fp32_model)
    g = model.graph
    _constants_to_initializers(g)
    name_nodes(model)
    islands = policy.onnx_fp32_islands(model)
    dtypes = _float_dtypes(model)
    is_f32 = lambda name: dtypes.get(name) == F32  # noqa: E731  (only fp32 tensors change type)

    # Each node's compute dtype: None for nodes touching no fp32 tensor (shape arithmetic).
    node_dt: dict[str, int | None] = {}
    for node in g.node:
        touches = any(is_f32(t) for t in list(node.input) + list(node.output) if t)
        node_dt[node.name] = (F32 if node.name in islands else F16) if touches else None
    # Tensor dtype after conversion, for every fp32 tensor produced by a node.
    produced = {}
    for node in g.node:
        for o in node.output:
            if is_f32(o) and node_dt[node.name] is not None:
                produced[o] = node_dt[node.name]

    conv = Fp16Graph(model, islands)
    graph_inputs = {i.name for i in g.input}
    inits = {t.name: t for t in g.initializer if t.name not in graph_inputs}

    def wanted(node) -> list[tuple[int, str, int]]:
        """(input index, tensor, dtype the node needs) for each fp32 input of a converted node."""
        want = node_dt[node.name]
        if want is None or node.op_type in _ANY_INPUT or node.op_type == "Cast":
            return []
        fixed = _FP32_ONLY_INPUTS.get(node.op_type, ())
        return [(i, t, F32 if i in fixed else want) for i, t in enumerate(node.input) if t and is_f32(t)]

    # Initializers: stored in fp16 when only fp16 consumers use them; an extra fp16 copy when both dtypes are.
    uses: dict[str, set[int]] = {}
    for node in g.node:
        for _, t, need in wanted(node):
            if t in inits:
                uses.setdefault(t, set()).add(need)
    const_as: dict[tuple[str, int], str] = {}
    for name, need in uses.items():
        if F16 in need:
            arr16 = _to_fp16(name, numpy_helper.to_array(inits[name]), conv.clamped, conv.flushed)
            new = name if need == {F16} else f"{name}__fp16"
            if new == name:
                inits[name].CopyFrom(numpy_helper.from_array(arr16, name))
            else:
                g.initializer.append(numpy_helper.from_array(arr16, new))
            const_as[(name, F16)] = new
        if F32 in need:
            const_as[(name, F32)] = name

    # Graph outputs produced in fp16 are renamed inside the graph and cast back to fp32 under their name.
    renames, tails = {}, []
    out_names = {o.name for o in g.output}
    for node in g.node:
        for k, o in enumerate(node.output):
            if o in out_names and produced.get(o) == F16:
                renames[o] = node.output[k] = f"{o}__fp16"
                produced[renames[o]] = F16
                tails.append(helper.make_node("Cast", [renames[o]], [o], name=f"{o}__to_fp32", to=F32))

    # Constants in the needed dtype; Casts for activations whose dtype differs from their consumer's.
    cast_cache: dict[tuple[str, int], str] = {}
    new_nodes = []
    for node in g.node:
        todo = wanted(node)
        for i, t in enumerate(node.input):
            if t in renames:
                node.input[i] = renames[t]
        if node.op_type == "Cast" and node_dt[node.name] == F16:
            for a in node.attribute:
                if a.name == "to" and a.i == F32:
                    a.i = F16
        if node.op_type == "ConstantOfShape" and node_dt[node.name] == F16:
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == F32:
                    a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float16)))
        for i, t, need in todo:
            if t in inits:
                node.input[i] = const_as[(t, need)]
                continue
            src = node.input[i]
            if produced.get(src, F32) == need:  # graph inputs are fp32
                continue
            if (src, need) not in cast_cache:
                out = f"{src}__to_{'fp16' if need == F16 else 'fp32'}"
                new_nodes.append(helper.make_node("Cast", [src], [out], name=out, to=need))
                cast_cache[(src, need)] = out
                conv.casts += 1
            node.input[i] = cast_cache[(src, need)]
        new_nodes.append(node)
    new_nodes.extend(tails)
    del g.node[:]
    g.node.extend(_toposort(new_nodes, {i.name for i in g.input} | {t.name for t in g.initializer}))
    del g.value_info[:]
    unused = {t.name for t in g.initializer} - {i for n in g.node for i in n.input}
    keep = [t for t in g.initializer if t.name not in unused]
    del g.initializer[:]
    g.initializer.extend(keep)
    meta = {m.key: m for m in model.metadata_props}
    entry = meta.get("vitedge.fp16") or model.metadata_props.add()
    entry.key, entry.value = "vitedge.fp16", json.dumps({"fp32_nodes": len(islands), "casts": conv.casts,
                                                          "clamped": conv.clamped})
    onnx.checker.check_model(model, full_check=True)
    conv.model = model
    return conv


def _toposort(nodes: list, available: set[str]) -> list:
    """Nodes in an order where every input is produced first (inserted Casts go right before their users)."""
    ready = set(available) | {""}
    out, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(i in ready for i in n.input):
                out.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            raise ValueError(f"fp16 graph has a cycle or a dangling input at node {rest[0].name}")
        pending = rest
    return out


def convert_onnx_fp16(fp32_model: onnx.ModelProto, policy: PrecisionPolicy | None = None) -> onnx.ModelProto:
    """fp16 ONNX with fp32 inputs/outputs and the policy's fp32 islands (see module doc)."""
    return prepare_fp16(fp32_model, policy).model


__all__ = ["Fp16Graph", "prepare_fp16", "convert_onnx_fp16"]
