"""Precision truth for TensorRT engines, from the engine inspector's JSON (no TensorRT needed here).

The inspector (`IEngineInspector.get_engine_information(LayerInformationFormat.JSON)`, profiling verbosity
DETAILED) lists the engine's layers after fusion. What it can and cannot say:
- an ordinary layer ("CaskConvolution", "PointWiseV2", "Reduce", ...) reports each output's
  "Format/Datatype" ("Row major linear FP16 format", "Channel major FP16 format where channel % 8 == 0",
  "Row major linear FP32"; for compiler-generated kernels the bare type: "Half", "Float", "BFloat16");
- a Myelin layer (LayerType "Myelin", named "{ForeignNode[first...last]}") is a whole fused subgraph, often the
  transformer blocks, sometimes the whole network (NVIDIA/TensorRT#3768): only its boundary tensors are
  listed, so the precision inside is unknown;
- "Reformat" / "NoOp" layers move or cast data (the fp32 I/O casts of an fp16 engine among them): they say
  nothing about what the network computes in;
- "Metadata" holds the ONNX nodes a layer came from, "[ONNX Layer: NAME]" entries joined by \\x1f / \\x1e when
  layers were fused (the ONNX parser's processMetadata), or simply one after another (Myelin kernels);
- TensorRT 10.x at DETAILED verbosity also lists the kernels Myelin generated in place of one ForeignNode:
  LayerType "kgen" (named "__myl_<ops>_myl0_N", e.g. __myl_AddCastMeanSubMul..., a cast inside), "gemm" (the
  ONNX MatMul names joined by "+", "." turned "_", "_myl0_N" appended) and "shape_call" / "reshape" / "signal"
  / "wait" (no arithmetic). Their boundary tensors are visible, what they compute in is not: a kernel may cast
  in and out (Torch-TensorRT's explicit-typing log shows Half in, Float out).
So precision is counted on ordinary compute layers; Myelin layers are "unknown"; Myelin kernels' boundary types
may confirm an fp16 engine but never refute one; an fp16 request the inspector cannot decide is confirmed or
refuted by comparing its outputs with an fp32 engine of the same ONNX (TF32 off), see `precision_verdict`. An
inconclusive check is reported as such: never a pass, never a failure. The inspector's answer may be
{"Layers": [...]} or (as NVIDIA's TensorRT 11 layer-info tools also accept) a bare list. The formats reproduced
by tests/fixtures/tensorrt/ are cited in their README.
"""
from __future__ import annotations

import re

MIN_FP16_SHARE = 0.5      # visible compute layers: below this share of fp16 an fp16 engine is "mostly fp32"
FP32_LIKE_REL = 1e-5      # fp16 vs fp32 engine outputs closer than this (max|d| / max|y|): computes in fp32
REDUCED_REL = 1e-4        # ... at least this far apart: reduced precision confirmed (fp16 unit roundoff 4.9e-4)
MYELIN_TYPES = ("Myelin",)
DATA_MOVEMENT_TYPES = ("Reformat", "NoOp", "Shuffle", "Constant", "Copy", "Slice", "Concatenation",
                       "Gather", "Shape", "Identity", "Cast")
# kernels Myelin generated, listed one by one at DETAILED verbosity (TensorRT 10.x, 11.x): computing ones, and
# shape / synchronization ones with no arithmetic (NVIDIA's trt-perf-analysis groups the latter as "misc")
MYELIN_KERNEL_TYPES = ("kgen", "gemm")
MYELIN_CONTROL_TYPES = ("shape_call", "reshape", "signal", "wait", "signal_and_wait", "signal_wait")
_MYELIN_NAME = re.compile(r"^__?myl_|_myl\d+_\d+$")

_TOKENS = {"fp32": "fp32", "float": "fp32", "fp16": "fp16", "half": "fp16", "bfloat16": "bf16", "bf16": "bf16",
           "fp8": "fp8", "int8": "int8", "fp4": "fp4", "int4": "int4", "int32": "int", "int64": "int",
           "uint8": "int", "int16": "int", "bool": "int"}
_FLOATS = ("fp32", "fp16", "bf16", "fp8", "fp4", "int8", "int4")  # int8/int4 are quantized float compute
_ONNX_LAYER = re.compile(r"\[ONNX Layer: ([^\]]*?)(?: \| [^\]]*)?\]")


def dtype_of(fmt: str) -> str | None:
    """The element type named by an inspector "Format/Datatype" string, or None ("N/A", "None", unknown)."""
    for tok in re.split(r"[^0-9a-z]+", str(fmt).lower()):
        if tok in _TOKENS:
            return _TOKENS[tok]
    return None


def is_myelin(layer: dict) -> bool:
    """A Myelin ForeignNode: one fused subgraph, boundary tensors only."""
    return layer.get("LayerType") in MYELIN_TYPES or str(layer.get("Name", "")).startswith("{ForeignNode[")


def is_myelin_control(layer: dict) -> bool:
    return str(layer.get("LayerType", "")).lower() in MYELIN_CONTROL_TYPES


def is_myelin_kernel(layer: dict) -> bool:
    """A computing kernel Myelin generated (kgen, gemm, or a "__myl_" / "_myl0_N" name of another type)."""
    if is_myelin(layer) or is_myelin_control(layer):
        return False
    return (str(layer.get("LayerType", "")).lower() in MYELIN_KERNEL_TYPES
            or bool(_MYELIN_NAME.search(str(layer.get("Name", "")))))


def is_data_movement(layer: dict) -> bool:
    return (layer.get("LayerType") in DATA_MOVEMENT_TYPES or layer.get("ParameterType") in ("Reformat", "Shuffle")
            or is_myelin_control(layer))


def inspector_layers(info) -> list:
    """The layer records of an inspector answer: {"Layers": [...]} (TensorRT 10), a bare list, or "layers" /
    "LayerInfo" (what NVIDIA's TensorRT 11 layer-info tools accept); [] for anything else."""
    if isinstance(info, list):
        return info
    if isinstance(info, dict):
        for key in ("Layers", "layers", "LayerInfo", "layerInfo"):
            if isinstance(info.get(key), list):
                return info[key]
    return []


def _tensor_types(tensors) -> list[str]:
    out = []
    for t in tensors or []:
        if isinstance(t, dict):
            for key, val in t.items():
                if isinstance(val, str) and ("Format" in key or "Datatype" in key or "DataType" in key):
                    d = dtype_of(val)
                    if d is not None:
                        out.append(d)
    return out


def layer_precision(layer: dict) -> str | None:
    """What an ordinary layer computes in: its float outputs' type (its inputs' when it has none), fp16 when
    any output is fp16; None for layers with no float tensor (shape arithmetic)."""
    kinds = [d for d in _tensor_types(layer.get("Outputs")) if d in _FLOATS]
    kinds = kinds or [d for d in _tensor_types(layer.get("Inputs")) if d in _FLOATS]
    if not kinds:
        return None
    return "fp16" if "fp16" in kinds else sorted(set(kinds))[0]


def onnx_nodes(layer: dict) -> list[str]:
    """The ONNX node names an inspector layer came from (its Metadata; empty when TensorRT wrote none)."""
    return _ONNX_LAYER.findall(str(layer.get("Metadata") or ""))


def name_members(name: str) -> set[str]:
    """The network-layer names a fused layer's name is made of: "a + b", "PWN(PWN(a, b), c)"."""
    s = re.sub(r"\bPWN\(", "(", str(name))
    parts = re.split(r"\s\+\s|,\s|[()]", s)
    return {p.strip() for p in parts if p.strip()}


def _takes_int8(layer: dict) -> bool:
    """Int8 tensors at the layer's boundary, or an int8 GEMM/conv tactic ("i8i8", "int8x4", "imma")."""
    if "int8" in _tensor_types(layer.get("Inputs")) + _tensor_types(layer.get("Outputs")):
        return True
    return bool(re.search(r"i8i8|int8|imma", str(layer.get("TacticName", "")).lower()))


def layer_precisions(info) -> dict:
    """Per-precision counts of the inspector's ordinary compute layers, and what could not be counted.

    Keys: layers {precision: n}, float_layers (counted), fp16_share (None when nothing was countable),
    myelin_layers (ForeignNodes), myelin_names (first 5), myelin_kernels (kgen/gemm kernels: their boundary
    types in myelin_kernel_layers {precision: n}, never in `layers`), data_movement_layers (Myelin's shape_call
    / reshape / signal / wait included), total_layers, int8_layers (ordinary compute layers or kernels that take
    or give an int8 tensor or run an int8 tactic)."""
    counts: dict[str, int] = {}
    kernels: dict[str, int] = {}
    myelin, moves, total, int8, n_kernels = [], 0, 0, 0, 0
    for layer in inspector_layers(info):
        if not isinstance(layer, dict):
            continue  # ProfilingVerbosity below DETAILED: layer names only
        total += 1
        if is_myelin(layer):
            myelin.append(str(layer.get("Name", "")))
            continue
        if is_data_movement(layer):
            moves += 1
            continue
        p = layer_precision(layer)
        if is_myelin_kernel(layer):
            n_kernels += 1
            if p is not None:
                kernels[p] = kernels.get(p, 0) + 1
        elif p is not None:
            counts[p] = counts.get(p, 0) + 1
        int8 += _takes_int8(layer)
    n = sum(counts.values())
    return {"layers": counts, "float_layers": n, "fp16_share": counts.get("fp16", 0) / n if n else None,
            "myelin_layers": len(myelin), "myelin_names": myelin[:5], "myelin_kernels": n_kernels,
            "myelin_kernel_layers": kernels, "data_movement_layers": moves, "total_layers": total,
            "int8_layers": int8}


def compare_outputs(fp16: "object", fp32: "object") -> dict:
    """How far an fp16 engine's outputs are from an fp32 (TF32 off) engine's on the same inputs."""
    import numpy as np
    a, b = np.asarray(fp16, np.float64), np.asarray(fp32, np.float64)
    scale = float(np.abs(b).max()) or 1.0
    return {"max_rel_diff": float(np.abs(a - b).max()) / scale, "samples": int(len(b)),
            "finite": bool(np.isfinite(a).all())}


def precision_verdict(requested: str, precisions: dict, outputs: dict | None = None,
                      outputs_unavailable: str | None = None) -> dict:
    """{status: confirmed | refuted | inconclusive, built, evidence, reason} for an engine built for `requested`.

    fp16: with no Myelin layer or kernel and some visible compute layers, the inspector decides (fp16 share >=
    MIN_FP16_SHARE confirms, below refutes); with Myelin kernels and no ForeignNode, fp16 at the boundaries of at
    least that share of layers and kernels confirms (fp32 boundaries never refute: a kernel may cast inside);
    otherwise the outputs decide (`outputs` from `compare_outputs`: >= REDUCED_REL confirms, <= FP32_LIKE_REL
    refutes: it computes like fp32); anything else is inconclusive. fp32: confirmed unless a visible layer or
    kernel boundary is in reduced precision (no FP16 flag / an fp32 ONNX: the Myelin parts cannot either)."""
    share, n, fused = precisions["fp16_share"], precisions["float_layers"], precisions["myelin_layers"]
    kernels = precisions.get("myelin_kernel_layers") or {}
    seen = f"{n} visible compute layer(s) ({precisions['layers']}), {fused} Myelin layer(s) of unknown precision"
    if precisions.get("myelin_kernels"):
        seen += f", {precisions['myelin_kernels']} Myelin kernel(s) with boundary types {kernels}"
    if requested == "int8":
        return _int8_verdict(precisions, seen)
    if requested != "fp16":
        reduced = sorted({k for d in (precisions["layers"], kernels) for k in d if k != "fp32"})
        if reduced:
            return {"status": "refuted", "built": "mixed", "evidence": "inspector",
                    "reason": f"fp32 was asked but layers run in {reduced}: {seen}"}
        return {"status": "confirmed", "built": "fp32", "evidence": "inspector", "reason": seen}
    if fused == 0 and n > 0 and not kernels:
        if share >= MIN_FP16_SHARE:
            return {"status": "confirmed", "built": "fp16" if share == 1.0 else "mixed-fp16", "evidence": "inspector",
                    "reason": f"{share:.0%} of {seen} run in fp16"}
        return {"status": "refuted", "built": "mixed" if share else "fp32", "evidence": "inspector",
                "reason": f"fp16 was asked but the engine is mostly fp32: {share:.0%} of {seen} run in fp16"}
    half = precisions["layers"].get("fp16", 0) + kernels.get("fp16", 0)
    if fused == 0 and kernels and half >= MIN_FP16_SHARE * (n + sum(kernels.values())):
        # fp16 at kernel boundaries shows the FP16 flag took; fp32 boundaries prove nothing (a kernel may cast in)
        return {"status": "confirmed", "built": "mixed-fp16", "evidence": "inspector",
                "reason": f"fp16 at the boundaries of most visible layers and Myelin kernels: {seen}"}
    if outputs is not None:
        d = outputs["max_rel_diff"]
        vs = (f"outputs vs an fp32 engine (TF32 off) of the same ONNX on {outputs['samples']} inputs: "
              f"max rel diff {d:.2e}")
        if not outputs.get("finite", True):
            return {"status": "inconclusive", "built": "unknown", "evidence": "outputs",
                    "reason": f"the fp16 engine's outputs are not finite ({vs}); the parity hop judges them"}
        if d >= REDUCED_REL:
            return {"status": "confirmed", "built": "fp16", "evidence": "outputs",
                    "reason": f"reduced precision confirmed by {vs} (>= {REDUCED_REL:.0e}); {seen}"}
        if d <= FP32_LIKE_REL:
            return {"status": "refuted", "built": "fp32", "evidence": "outputs",
                    "reason": f"fp16 was asked but the engine computes like fp32: {vs} (<= {FP32_LIKE_REL:.0e}); "
                              f"{seen}"}
        return {"status": "inconclusive", "built": "unknown", "evidence": "outputs",
                "reason": f"{vs}, between {FP32_LIKE_REL:.0e} (fp32-like) and {REDUCED_REL:.0e} (fp16); {seen}"}
    why = outputs_unavailable or "no fp32 reference engine was compared"
    what = "no layer precision is visible" if n == 0 and fused == 0 else seen
    return {"status": "inconclusive", "built": "unknown", "evidence": "none", "reason": f"{what}; {why}"}


def check_outcome(check: dict) -> str:
    """The one rule for what a precision check means for a build, applied alike by the target's lowering,
    scripts/gpu_check.sh and the GPU tests: "fail" when refuted (the engine does not run in the precision asked
    for), "pass" when confirmed, "inconclusive" otherwise: neither a pass nor a failure, said so, and the parity
    hop judges the outputs. An inconclusive check is accepted because a correct engine can read so: int8 Q/DQ
    fused inside Myelin layers hides every int8 layer (the real int8 BERT engine of tests/fixtures/tensorrt/ does)
    and int8 has no reference engine to decide (an fp32 engine differs from it by its quantization); an fp16
    engine can read so where no fp32 reference engine could run or the outputs fall between the two bounds."""
    return {"refuted": "fail", "confirmed": "pass"}.get(check["status"], "inconclusive")


def _int8_verdict(precisions: dict, seen: str) -> dict:
    """int8 from a QDQ graph: confirmed when visible compute layers take or give int8 tensors; refuted when layers
    are visible, none does and nothing is hidden in Myelin (TensorRT dequantized everything and computes in
    float); otherwise inconclusive (the Q/DQ may sit inside Myelin layers). No reference engine is built: an int8
    engine differs from fp32 by its quantization, whatever precision the rest runs in."""
    k = precisions.get("int8_layers", 0)
    if k:
        return {"status": "confirmed", "built": "int8", "evidence": "inspector",
                "reason": f"{k} visible compute layer(s) take or give int8 tensors; {seen}"}
    if precisions["myelin_layers"] == 0 and precisions["float_layers"] and not precisions.get("myelin_kernels"):
        return {"status": "refuted", "built": "float", "evidence": "inspector",
                "reason": f"int8 was asked but no visible layer takes or gives int8 tensors: {seen}"}
    return {"status": "inconclusive", "built": "unknown", "evidence": "inspector",
            "reason": f"no visible layer takes int8 tensors and the Q/DQ may be fused inside Myelin layers; {seen}"}


def verify_pinned(info, pinned: dict[str, str]) -> dict:
    """Which pinned network layers ({layer name: ONNX node}) really run in fp32 in the built engine.

    A pinned layer is found by its name among an ordinary inspector layer's fused members, or by its ONNX node
    in that layer's Metadata. verified: found in an fp32 layer; not_fp32: found in a reduced-precision layer;
    in_myelin: named in a Myelin layer or kernel (by name, Myelin's "_" for ".", or Metadata), precision inside
    unknown; not_found: fused away or renamed beyond recognition."""
    ordinary, myelin = [], []
    for layer in inspector_layers(info):
        if isinstance(layer, dict):
            (myelin if is_myelin(layer) or is_myelin_kernel(layer) else ordinary).append(layer)
    by_name: dict[str, list[dict]] = {}
    by_node: dict[str, list[dict]] = {}
    for layer in ordinary:
        for m in name_members(layer.get("Name", "")):
            by_name.setdefault(m, []).append(layer)
        for node in onnx_nodes(layer):
            by_node.setdefault(node, []).append(layer)
    myelin_text = "\n".join(f"{x.get('Name', '')}\n{x.get('Metadata', '')}" for x in myelin)
    out: dict[str, list[str]] = {"verified": [], "not_fp32": [], "in_myelin": [], "not_found": []}
    for name, node in sorted(pinned.items()):
        hits = by_name.get(name) or by_node.get(node) or []
        precs = {layer_precision(h) for h in hits if not is_data_movement(h)} - {None}
        if precs:
            out["verified" if precs == {"fp32"} else "not_fp32"].append(name)
        elif hits:
            out["not_found"].append(name)  # only in data-movement layers: what it computes in is not visible
        elif (name in myelin_text or f"[ONNX Layer: {node}" in myelin_text
              or name.replace(".", "_") in myelin_text):
            out["in_myelin"].append(name)
        else:
            out["not_found"].append(name)
    summary = {k: len(v) for k, v in out.items()}
    summary["requested"] = len(pinned)
    summary["examples"] = {k: v[:5] for k, v in out.items() if v and k != "verified"}
    return summary


__all__ = ["MIN_FP16_SHARE", "FP32_LIKE_REL", "REDUCED_REL", "dtype_of", "is_myelin", "is_myelin_kernel",
           "is_myelin_control", "inspector_layers", "is_data_movement",
           "layer_precision", "onnx_nodes", "name_members", "layer_precisions", "compare_outputs",
           "precision_verdict", "check_outcome", "verify_pinned"]
