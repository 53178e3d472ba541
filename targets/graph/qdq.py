"""Static int8 QDQ ONNX from the verified fp32 ONNX, through `onnxruntime.quantization` (graph-level, no torch).

`quantize_qdq(fp32, calibration)` returns the QDQ model and an `info` that says what was quantized, what stayed float
and why, and which samples calibrated:

1. `quant_pre_process` (symbolic + ONNX shape inference, ONNX Runtime's basic graph optimizations): quantization
   needs every activation's shape, and the optimizer folds what the quantizer would otherwise wrap in Q/DQ pairs.
2. The shared precision policy's float islands are found on the pre-processed graph (normalization reductions,
   softmax, SLA/SimA normalizers, tiny epsilons; the same `PrecisionPolicy.onnx_fp32_islands` the fp16 graph keeps
   in fp32) and passed to the quantizer as `nodes_to_exclude`: SLA's `q . sum_j k_j` and `q (k^T v)` MatMuls, whose
   operands grow with the token count, stay float.
   Besides, a group-1 Conv that reads at most IMAGE_CHANNELS channels (the stem reading the image) stays float
   for speed (IMAGE_CONV_RULE): its reduction (3 x k x k) is too short for the int8 kernels to gain on, while
   the image itself would have to be quantized first. Measured here, interleaved, 1 thread: swiftformer_xs int8
   1.20x -> 1.24-1.28x of fp32 with its 3x3 stem float; slab_deit_tiny 1.737x vs 1.729x (its 16x16 patch
   embedding: no difference); keeping stage convs or depthwise convs float instead only made it slower.
3. `quantize_static` in QDQ format: only GEMM-like ops (`Conv`, `Gemm`, `MatMul`) and, in the ONNX Runtime
   encoding, the elementwise `Add`, `Mul` and `Sigmoid` between them (ENCODINGS' op types); weights int8 symmetric per output
   channel, activations uint8 asymmetric per tensor (U8S8: the fast path of ONNX Runtime's x86 kernels with
   AVX-512 VNNI / AVX2). Quantizing every op type (S8S8) ran swiftformer_xs 1.7x slower than fp32: Q/DQ around
   Gelu, Div, Sqrt and the reductions costs more than int8 saves. Add and Mul are the exception: ONNX Runtime runs
   them as QLinearAdd / QLinearMul, so a residual Add or an attention product between two int8 Convs stays int8
   instead of leaving it through DequantizeLinear and re-entering through QuantizeLinear: a few percent
   (swiftformer_xs 1.23x -> 1.25x of fp32 against Conv/Gemm/MatMul only, interleaved, 1 thread, each graph in two
   sessions: sessions of one graph differ by up to 3 % here). Sigmoid: the GELU below. Calibration: MinMax over
   the given samples (see CALIBRATION for why).

Two encodings of one quantization (same calibration, same int8 weights of the Conv/Gemm/MatMul nodes; the ONNX
Runtime encoding also runs Add, Mul and GELU in int8, which TensorRT fuses on its own), ENCODINGS:
- "onnxruntime" (`NAME.int8.onnx`): activations uint8 asymmetric, as above, and every erf-GELU written as one
  `com.microsoft.Gelu` node before quantizing (gelu.fuse_erf_gelu says why: without it the QDQ graph loses ONNX
  Runtime's GELU fusion and swiftformer_xs's int8 graph ran 0.86x of fp32; with it 1.18x, one-off measurement),
  then by default (gelu="sigmoid") as x * sigmoid(1.702 x), which runs int8 as QLinearSigmoid + QLinearMul
  (sigmoid_gelu: |error| <= 0.0204; swiftformer_xs 1.22x -> 1.64x of fp32); gelu="exact" keeps the float Gelu;
- "tensorrt" (the graph a TensorRT int8 engine is built from): activations int8 *symmetric* (zero points 0) and
  biases left float (TensorRT fuses them into the int8 kernels). TensorRT's ONNX parser takes only int8 (or
  fp8 / int4) Q/DQ with a zero point of 0: no uint8 activations, no int32 bias DequantizeLinear (onnx-tensorrt
  docs/operators.md, QuantizeLinear / DequantizeLinear, 10.0-10.1 GA and main). The onnxruntime encoding is not used for both because
  ONNX Runtime runs symmetric int8 activations far slower on x86 (measured here on swiftformer_xs at 1 thread:
  0.55x of fp32 vs 0.93x for uint8 under the same load; docs/quantization.md).

Calibration samples and evaluation samples must differ: the caller passes the calibration array (and names its
samples in `calibration_ids`), `info["calibration"]` records the ids and a sha256 of the array, and
`targets.calibration.calibration_overlap(info, ids)` tells a caller which of its evaluation ids calibrated.
"""
from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import onnx

from ...errors import VitedgeError
from ..calibration import calibration_record
from .gelu import fuse_erf_gelu
from .sigmoid_gelu import MAX_ABS_ERROR, fold_sigmoid_gain, gelu_as_sigmoid
from .precision import default_policy, name_nodes

GEMM_OP_TYPES = ("Conv", "Gemm", "MatMul")
# quantized only where all data inputs and the output are int8 (QLinearAdd / QLinearMul / QLinearSigmoid)
ELEMENTWISE_OP_TYPES = ("Add", "Mul", "Sigmoid")
DEFAULT_OP_TYPES = GEMM_OP_TYPES + ELEMENTWISE_OP_TYPES
METHODS = ("minmax", "percentile", "entropy")
# MinMax: with the few dozen calibration images a user gives, the extreme values are what the model really
# produces, and the histogram methods measured no better on the trained fixtures (docs/quantization_spike.md):
# Percentile clipped real activations, Entropy was slower for the same accuracy.
CALIBRATION = "minmax"
# encoding -> (activation type, symmetric activations, biases quantized to int32, op types quantized). The TensorRT
# encoding keeps the GEMM-like ops only: that is the graph TensorRT's explicit-quantization guide starts from, and
# without a GPU here nothing else about it can be measured.
ENCODINGS = {"onnxruntime": ("QUInt8", False, True, DEFAULT_OP_TYPES),
             "tensorrt": ("QInt8", True, False, GEMM_OP_TYPES)}
# How the ONNX Runtime encoding computes GELU: "sigmoid" (default), x * sigmoid(1.702 x) in int8 (sigmoid_gelu says
# why and how close); "exact", one float com.microsoft.Gelu between Q/DQ pairs. The TensorRT encoding keeps the
# exported erf ops ("exact" only).
GELU_MODES = ("sigmoid", "exact")
GELU_OF = {"onnxruntime": GELU_MODES, "tensorrt": ("exact",)}  # encoding -> its GELU modes, the default first
DYNAMIC_BATCH = 16  # calibration batch when the graph's batch axis is dynamic
Q_OPS = ("QuantizeLinear", "DequantizeLinear")
IMAGE_CHANNELS = 4  # RGB(A): a Conv reading this few channels reads the image
IMAGE_CONV_RULE = "int8_image_conv"
IMAGE_CONV_WHY = (f"a group-1 Conv reading <= {IMAGE_CHANNELS} channels (the stem reading the image): its reduction "
                  "is too short for int8 kernels to gain on and the image would need quantizing first (speed)")


def image_convs(model: onnx.ModelProto) -> dict[str, str]:
    """{node name: IMAGE_CONV_RULE} for every group-1 Conv whose weight reads <= IMAGE_CHANNELS input channels."""
    inits = {i.name: i for i in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type != "Conv" or len(n.input) < 2 or n.input[1] not in inits:
            continue
        group = next((a.i for a in n.attribute if a.name == "group"), 1)
        w = inits[n.input[1]]
        if group == 1 and len(w.dims) == 4 and w.dims[1] <= IMAGE_CHANNELS:
            out[n.name] = IMAGE_CONV_RULE
    return out


@dataclass
class QdqModel:
    model: onnx.ModelProto
    info: dict


def _reader(input_name: str, batches: list[np.ndarray]):
    from onnxruntime.quantization import CalibrationDataReader

    class Samples(CalibrationDataReader):
        """The given numpy batches, once each, as {input name: batch}."""

        def __init__(self):
            self._it = iter(batches)

        def get_next(self):
            b = next(self._it, None)
            return None if b is None else {input_name: b}

        def rewind(self):
            self._it = iter(batches)

    return Samples()


def _input(model: onnx.ModelProto) -> tuple[str, int | None, tuple]:
    inp = model.graph.input[0]
    dims = inp.type.tensor_type.shape.dim
    batch = dims[0].dim_value if dims and dims[0].HasField("dim_value") else None
    rest = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims[1:])
    return inp.name, batch, rest


def _batches(x: np.ndarray, batch: int | None) -> list[np.ndarray]:
    step = batch or DYNAMIC_BATCH
    out = []
    for i in range(0, len(x), step):
        chunk = x[i:i + step]
        if batch and len(chunk) < batch:  # a static batch: pad by repeating (repeats do not move min/max)
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), axis=0)])
        out.append(np.ascontiguousarray(chunk, np.float32))
    return out


def _preprocess(model: onnx.ModelProto, tmp: Path) -> onnx.ModelProto:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = tmp / "pre.onnx"
    quant_pre_process(model, out)
    return onnx.load(str(out))


def quantize_qdq(fp32: onnx.ModelProto, calibration: np.ndarray, *, calibration_ids: Iterable | None = None,
                 policy=None, op_types: Iterable[str] | None = None, method: str = CALIBRATION,
                 preprocess: bool = True, encoding: str = "onnxruntime", gelu: str | None = None) -> QdqModel:
    """The static QDQ int8 model of `fp32` (see the module doc). `calibration`: float32 NCHW samples the graph takes
    (normalized images), never the ones it is evaluated on; `calibration_ids` names them for the record.
    `encoding`: "onnxruntime" or "tensorrt" (ENCODINGS); `op_types`: the op types to quantize (default: the
    encoding's); `gelu`: GELU_MODES (default: "sigmoid" for ONNX Runtime, "exact" for TensorRT)."""
    from onnxruntime import __version__ as ort_version, set_default_logger_severity
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    # the calibrator's own sessions log ONNX Runtime's warnings (unused initializers, in colour) at the default
    # level onto the user's stderr: vitedge's sessions keep errors only (ort.py), and so do these
    set_default_logger_severity(3)

    x = np.asarray(calibration, np.float32)
    if x.ndim != 4 or len(x) == 0:
        raise VitedgeError(f"int8 calibration needs float32 NCHW samples (at least 1); got shape {x.shape}: "
                           "pass --calib N with N >= 1")
    if encoding not in ENCODINGS:
        raise VitedgeError(f"QDQ encoding must be one of {', '.join(ENCODINGS)}; got {encoding!r}")
    gelu = gelu or GELU_OF[encoding][0]
    if gelu not in GELU_OF[encoding]:
        raise VitedgeError(f"GELU mode must be one of {', '.join(GELU_MODES)} ('exact' for the tensorrt encoding); "
                           f"got {gelu!r}")
    if method not in METHODS:
        raise VitedgeError(f"calibration method must be one of {', '.join(METHODS)}; got {method!r}")
    name, batch, rest = _input(fp32)
    if tuple(x.shape[1:]) != tuple(r if r else s for r, s in zip(rest, x.shape[1:])):
        raise VitedgeError(f"calibration samples have shape {x.shape[1:]}, the graph takes {rest}")
    policy = policy or default_policy()
    act_type, act_symmetric, quantize_bias, encoding_ops = ENCODINGS[encoding]
    op_types = tuple(encoding_ops if op_types is None else op_types)
    calib_method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
                    "entropy": CalibrationMethod.Entropy}[method]
    with tempfile.TemporaryDirectory(prefix="vitedge-qdq-") as tmp:
        tmp = Path(tmp)
        model = onnx.ModelProto()
        model.CopyFrom(fp32)
        if preprocess:
            model = _preprocess(model, tmp)
        gelus = sigmoids = folded = 0
        if encoding == "onnxruntime":  # GELUs stay one fused node between the Q/DQ pairs (gelu.fuse_erf_gelu)
            model, gelus = fuse_erf_gelu(model)
        if gelu == "sigmoid":  # ... or become x * sigmoid(1.702 x), int8 throughout (sigmoid_gelu)
            model, sigmoids = gelu_as_sigmoid(model)
        name_nodes(model)
        islands = {**image_convs(model), **policy.onnx_fp32_islands(model)}
        out = tmp / "int8.onnx"
        quantize_static(
            model, out, _reader(name, _batches(x, batch)), quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(op_types), per_channel=True, reduce_range=False,
            activation_type=getattr(QuantType, act_type), weight_type=QuantType.QInt8,
            nodes_to_exclude=sorted(islands), calibrate_method=calib_method,
            extra_options={"WeightSymmetric": True, "ActivationSymmetric": act_symmetric,
                           "QuantizeBias": quantize_bias})
        qdq = onnx.load(str(out))
    if sigmoids:
        qdq, folded = fold_sigmoid_gain(qdq)
    info = _info(model, qdq, islands, policy, op_types, preprocess)
    info["encoding"] = encoding
    info["gelu_fused"] = gelus  # erf-GELUs written as one com.microsoft.Gelu node (ONNX Runtime encoding only)
    info["gelu"] = {"mode": gelu, "as_sigmoid": sigmoids, "gain_folded": folded,
                    "max_abs_error": MAX_ABS_ERROR if sigmoids else 0.0,
                    "why": ("x * sigmoid(1.702 x): QLinearSigmoid (a lookup table) and QLinearMul keep the MLP int8 "
                            "(ONNX Runtime has no int8 GELU)") if sigmoids else "GELU computed in float"}
    if act_symmetric:
        info["activations"] = "int8 symmetric (zero point 0), per tensor"
    info["biases"] = "int32 (scale = input scale x weight scale)" if quantize_bias else "float"
    info["calibration"] = calibration_record(x, calibration_ids, method)
    info["onnxruntime"] = ort_version
    meta = {m.key: m for m in qdq.metadata_props}
    entry = meta.get("vitedge.int8") or qdq.metadata_props.add()
    entry.key, entry.value = "vitedge.int8", json.dumps(
        {"quantized": info["quantized"], "float_islands": len(islands), "calibration": info["calibration"],
         "encoding": encoding},
        sort_keys=True)
    return QdqModel(qdq, info)


def quantized_nodes(qdq: onnx.ModelProto, op_types: Iterable[str] = DEFAULT_OP_TYPES) -> dict[str, list[str]]:
    """{op type: node names} of the `op_types` nodes that run in int8: a GEMM-like node reading a DequantizeLinear
    output; an elementwise node (ELEMENTWISE_OP_TYPES) whose every input is a DequantizeLinear output and whose
    output goes to QuantizeLinear only (a float Add may read a dequantized Conv output without being quantized)."""
    dq_out = {o for n in qdq.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    q_in: dict[str, set[str]] = {}
    for n in qdq.graph.node:
        for i in n.input:
            q_in.setdefault(i, set()).add(n.op_type)
    out: dict[str, list[str]] = {}
    for n in qdq.graph.node:
        if n.op_type not in op_types:
            continue
        if n.op_type in ELEMENTWISE_OP_TYPES:
            int8 = all(i in dq_out for i in n.input) and q_in.get(n.output[0]) == {"QuantizeLinear"}
        else:
            int8 = any(i in dq_out for i in n.input)
        if int8:
            out.setdefault(n.op_type, []).append(n.name)
    return out


def _info(pre: onnx.ModelProto, qdq: onnx.ModelProto, islands: dict, policy, op_types: tuple, preprocess: bool) -> dict:
    quantized = quantized_nodes(qdq, op_types)
    qnames = {n for names in quantized.values() for n in names}
    why = {IMAGE_CONV_RULE: IMAGE_CONV_WHY, **{r.name: r.why for r in policy.rules}}
    island_ops = Counter()
    for node in pre.graph.node:
        if node.name in islands:
            island_ops[(islands[node.name], node.op_type)] += 1
    candidates = [n for n in pre.graph.node if n.op_type in op_types]
    unquantized = sorted(n.name for n in candidates if n.name not in qnames and n.name not in islands)
    others = Counter(n.op_type for n in pre.graph.node if n.op_type not in op_types)
    return {
        "format": "QDQ", "weights": "int8 symmetric, per output channel", "activations": "uint8 asymmetric, per tensor",
        "op_types": list(op_types), "preprocess": "quant_pre_process" if preprocess else None,
        "quantized": {t: len(v) for t, v in sorted(quantized.items())},
        "qdq_nodes": {t: sum(1 for n in qdq.graph.node if n.op_type == t) for t in Q_OPS},
        "float_islands": {"nodes": dict(sorted(islands.items())),
                          "by_rule": {rule: {"why": why.get(rule, ""), "ops": {t: c for (r, t), c in sorted(island_ops.items())
                                                                               if r == rule}}
                                      for rule in sorted(set(islands.values()))},
                          "excluded_quantizable": sorted(n.name for n in candidates if n.name in islands)},
        "float_op_types": {"why": f"only {', '.join(op_types)} run int8: Q/DQ around other ops costs more than it "
                                  "saves on ONNX Runtime CPU (Add/Mul/Sigmoid: where every input and the output are int8)", "ops": dict(sorted(others.items()))},
        "not_quantized": unquantized,
    }


__all__ = ["DEFAULT_OP_TYPES", "ELEMENTWISE_OP_TYPES", "GELU_MODES", "GEMM_OP_TYPES", "IMAGE_CONV_RULE", "image_convs", "ENCODINGS", "QdqModel", "quantize_qdq", "quantized_nodes"]
