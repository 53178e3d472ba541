"""The stored weights of an fp16 or compressed artifact against the deploy-form's, per output channel.

The outputs alone cannot show every change to a saved artifact: a compressed artifact's own error is 1-5 % of the
largest logit, so a sign-flipped or x1.1 channel whose effect on the outputs stays within that passes any per-sample
rule that correct artifacts pass. The weights show it. Each weight of the artifact that maps to a deploy-form
parameter by name and shape (ONNX initializers keep the parameter's name, an int8 one with `_quantized`; CoreML consts
carry it with `_` for `.` and suffixes such as `_to_fp16`, `_quantized`, `_palettized`) or, in an ExecuTorch program
whose XNNPACK graphs carry no names, by shape and values (`by_nearest`: the same-shape parameter it is nearest to)
is read back from the saved file (fp16 initializers, int8 initializers through their DequantizeLinear scales, the
package's weight.bin through the MIL interpreter's own kernels, a .pte's XNNPACK filters through their per-channel
scales: targets/executorch/weights.py) and each output channel's deviation from the deploy-form's float32 values,
||w_art - w||_c, is compared with what a correct artifact of that precision does to that channel: the precision's
emulation (exporter/verdict/emulate: fp16 rounding, int8 per channel, with PT2E's 2^-12 scale floor for a .pte, a
k-means palette) gives ||w_emul - w||_c. A channel fails when its deviation exceeds max(WEIGHT_FLOOR x ||w||_c,
WEIGHT_K x that, raised to the tensor's median): K and the floor from benchmarks/fp16_verdicts.py and benchmarks/compressed_verdicts.py (README "Weights check").

Biases are weights: each kind's reader returns them too, judged per channel against how a correct artifact stores a
bias (stored_biases.py: one fp16 ulp for a float bias, half the int32 step its layer's scales give for an int8 one).

Weights that map to no parameter (a converter's fused or renamed constants) are counted, not judged; an artifact
none of whose weights maps is `not run`, saying so (unverified under --require-verified).
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ...precisions import TABLE
from .criteria import NoiseRule
from .emulate import stored_weight
from .stored_biases import StoredBias, emulated_bias, is_bias, onnx_biases

# correct artifacts' channels: fp16 and the int8 kinds exactly the emulation's rounding (ratio 1, 1.6 for a near-dead
# channel's fp16 scale); palettes up to 1.16x (coremltools' k-means against the emulation's), so K = 2 there: a x1.1
# tensor moves by 0.1 ||w||, 2x a 6-bit palette's own error; a x1.1 channel is 20-400x an fp16 or int8 channel's
WEIGHT_K = {"fp16": 4.0, "int8": 4.0, "w8": 4.0, "w8a8": 4.0, "palette4": 2.0, "palette6": 2.0}
WEIGHT_FLOOR = 2.0 ** -11      # relative to the channel's norm: half an fp16 ulp
# a palette's lookup table serves a whole tensor (iOS 16-17) or 16 channels (iOS 18), and another k-means lands its
# centres elsewhere: its channels are judged together
PER_TENSOR = tuple(n for n, p in TABLE.items() if p.tolerance_profile == "palette")
READERS = (".onnx", ".mlpackage", ".pte")
SUFFIXES = ("_palettized", "_quantized", "_dequantized", "_to_fp16", "_fp16")


@dataclass
class WeightCheck:
    status: str                      # passed / failed / not run
    checked: int = 0                 # weights judged
    unmatched: int = 0               # artifact weights that map to no deploy-form parameter
    worst: dict | None = None        # {"weight", "channel", "deviation", "allowance", "ratio"}
    why: str | None = None
    failing: list = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {"status": self.status, "checked": self.checked, "unmatched": self.unmatched, "worst": self.worst}
        if self.why:
            out["why"] = self.why
        if self.failing:
            out["failing"] = self.failing[:5]
        return out

    def describe(self) -> str:
        w = self.worst
        return (f"weights check: {w['weight']} output channel {w['channel']} deviates from the deploy-form by "
                f"{w['deviation']:.3g} of its norm, {w['ratio']:.3g}x what the precision's own storage allows "
                f"({w['allowance']:.3g}; {len(self.failing)} channel(s) of {self.checked} weights beyond it)")


def judge_weights(hop, deploy: nn.Module, path: str | Path, precision: str) -> None:
    """After an fp16 or compressed artifact's hop that ran: its weights check in `hop.weights`; a failed check fails
    the hop, one that raised leaves a passed hop unverified (a check that raised is never a pass)."""
    if hop.status not in ("passed", "failed") or precision not in WEIGHT_K:
        return
    if Path(path).suffix not in READERS:  # a TensorRT engine: its weights are not readable outside TensorRT
        hop.weights = {"status": "not applicable", "why": f"the stored weights of a {Path(path).suffix} artifact "
                                                          "are not read (ONNX graphs, CoreML packages and "
                                                          "ExecuTorch programs are)"}
        return
    try:
        check = check_weights(deploy, path, precision)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
        hop.weights = {"status": "error", "why": why}
        if hop.status == "passed":
            hop.status = "unverified"
            hop.reason = f"the weights check raised ({why}): the outputs passed, the stored weights are unchecked"
        return
    hop.weights = check.as_dict()
    if check.status == "failed":
        hop.reason = "; ".join(filter(None, [hop.reason, check.describe()]))
        hop.status = "failed"


def check_weights(deploy: nn.Module, path: str | Path, precision: str) -> WeightCheck:
    """Judge the weights stored in the artifact at `path` (precision fp16 or a compressed kind) against `deploy`."""
    path = Path(path)
    stored, min_scale = read_stored(path, deploy, precision)
    params = reference_params(deploy, path)
    k = WEIGHT_K[precision]
    check = WeightCheck("passed")
    for name, raw in stored.items():
        p = params.get(_key(name))
        bias = p is not None and is_bias(_key(name), p)  # biases are weights: judged per channel (stored_biases.py)
        value = None if p is None or (p.dim() < 2 and not bias) else _aligned(np.asarray(raw, np.float64),
                                                                               tuple(p.shape))
        if value is None:
            check.unmatched += 1
            continue
        rows = 1 if (precision in PER_TENSOR and not bias) or p.shape[0] == 1 else p.shape[0]  # (1, ...): a table
        w = p.detach().double().reshape(rows, -1)
        art = torch.as_tensor(value).reshape(w.shape)
        emul = (emulated_bias(p, raw) if bias else
                stored_weight(p.detach().float(), precision, min_scale).double()).reshape(w.shape)
        norm = w.norm(dim=1)
        norm = torch.maximum(norm, norm.median()).clamp(min=1e-30)  # a near-dead channel is judged at its tensor's scale
        dev = ((art - w).norm(dim=1) / norm).numpy()
        ref = ((emul - w).norm(dim=1) / norm).numpy()
        allowed = NoiseRule(WEIGHT_FLOOR, k).allowance(ref)
        ratio = np.where(np.isfinite(dev), dev / allowed, np.inf)
        check.checked += 1
        c = int(np.argmax(ratio))
        row = {"weight": name, "channel": c, "deviation": float(dev[c]), "allowance": float(allowed[c]),
               "ratio": float(ratio[c])}
        if check.worst is None or row["ratio"] > check.worst["ratio"]:
            check.worst = row
        check.failing += [f"{name}[{int(i)}]" for i in np.flatnonzero(~(ratio <= 1.0))]
    if check.checked == 0:
        return WeightCheck("not run", unmatched=check.unmatched,
                           why=f"none of the artifact's {check.unmatched} weights maps to a deploy-form parameter "
                               "by name (or, unnamed, by values) and shape")
    check.status = "failed" if check.failing else "passed"
    return check


def read_stored(path: Path, deploy: nn.Module, precision: str) -> tuple[dict[str, np.ndarray], float]:
    """({name: float32 value} of the weights the artifact at `path` stores, named by the deploy-form parameter they
    store where the file carries no names (an ExecuTorch program: `by_nearest`, against each parameter as
    `precision` stores it); the floor its int8 quantizer puts on a channel's scale, for the emulation (PT2E's
    observer eps; none for ONNX and CoreML))."""
    if path.suffix == ".onnx":
        return onnx_weights(path, deploy), 0.0
    if path.suffix == ".mlpackage":
        return package_weights_all(path), 0.0
    from ...targets.executorch.quantize import weight_scale_floor
    from ...targets.executorch.weights import read_weights

    floor = weight_scale_floor()
    expected = {n: stored_weight(p, precision, floor).double().numpy() for n, p in deploy.named_parameters()
                if p.dim() >= 2}
    weights = read_weights(path)
    biases = {w.name: StoredBias(w.bias, w.bias_step) for w in weights if w.bias is not None}
    return by_nearest({w.name: w.value for w in weights}, expected, biases), floor


def by_nearest(stored: dict[str, np.ndarray], expected: dict[str, np.ndarray], biases: dict | None = None
               ) -> dict[str, np.ndarray]:
    """Unnamed stored weights keyed by the deploy-form parameter each stores: of the parameters of the same shape
    (size-1 axes aside), the one whose `expected` stored value (the precision's emulation) it is nearest to by the
    median over output channels of ||w_stored - w||_c / ||w||_c, one parameter per stored weight, the nearest
    pairs first. The median ignores a few planted channels, so a tampered weight still pairs with its own parameter
    (and then fails on its deviation); a zeroed weight is equally far from all and takes the parameter the others
    leave. A stored weight with no same-shape parameter left keeps its own name and is counted unmatched (an
    ExecuTorch program's channel sums, 1x1 convolutions with ones that vitedge's rewrites put in: no parameter).
    `biases`: {stored weight name: its layer's stored bias}, each keyed by the bias of the parameter its weight
    pairs with (`<module>.bias` for `<module>.weight`)."""
    pairs = []
    for name, value in stored.items():
        for key, w in expected.items():
            v = _aligned(np.asarray(value, np.float64), w.shape)
            if v is not None:
                pairs.append((_channel_distance(v, w), name, key, v))
    out, used = {}, set()
    for _, name, key, v in sorted(pairs, key=lambda t: t[0]):
        if name not in out and key not in used:
            out[name] = (key, v)
            used.add(key)
    named = {key: v for key, v in out.values()}
    named.update({name: value for name, value in stored.items() if name not in out})
    for name, b in (biases or {}).items():
        key = out[name][0] if name in out else None
        named[key.removesuffix("weight") + "bias" if key and key.endswith("weight") else f"{name}.bias"] = b
    return named


def _channel_distance(v: np.ndarray, w: np.ndarray) -> float:
    rows = w.reshape(w.shape[0], -1)
    norm = np.linalg.norm(rows, axis=1)
    norm = np.maximum(norm, np.median(norm)) + 1e-30
    return float(np.median(np.linalg.norm(v.reshape(rows.shape) - rows, axis=1) / norm))


def _aligned(value: np.ndarray, shape: tuple) -> np.ndarray | None:
    """`value` in the parameter's layout: as stored where only size-1 axes differ (a 1x1 convolution's weight as a
    matrix), transposed where the exporter stored the table transposed (a position table folded into (1, C, N)
    for (1, N, C)); None where neither holds (matching by element count alone would compare scrambled values)."""
    got, want = tuple(d for d in value.shape if d != 1), tuple(d for d in shape if d != 1)
    if got == want:
        return value.reshape(shape)
    if len(got) == 2 and got[::-1] == want:
        return value.reshape(got).T.reshape(shape)
    return None


def _key(name: str) -> str:
    for suffix in SUFFIXES:
        name = name.removesuffix(suffix)
    return name.replace(".", "_")


def reference_params(deploy: nn.Module, path: Path) -> dict[str, torch.Tensor]:
    """{parameter name with `_` for `.`: tensor} of the deploy-form as the artifact was built from it (an image-input
    package carries 1/std folded into its first conv: the reference gets the same fold)."""
    ref = deploy
    if path.suffix == ".mlpackage":
        from ...targets.coreml.convert import fold_input_std
        from ...targets.coreml.mil_interpreter import load_program

        program = load_program(path)
        if program.input_kind == "image":
            pre = json.loads(dict(program.spec.description.metadata.userDefined).get("preprocessing") or "{}")
            imgsz = int(next(iter(program.inputs.values()))[1][-1])
            ref, _ = fold_input_std(copy.deepcopy(deploy).float().eval(), pre["std"], imgsz)
    return {_key(n): p for n, p in ref.named_parameters()}


def onnx_weights(path: Path, deploy: nn.Module | None = None) -> dict[str, np.ndarray]:
    """{initializer name: float32 value} of the fp16 initializers and of the int8 ones read through their
    DequantizeLinear (per-axis scale and zero point). With `deploy`, a weight the exporter left unnamed (a Linear's
    transposed `onnx::MatMul_N`) is keyed by the parameter of the module its MatMul / Gemm belongs to, transposed
    back to (out, in)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    out = _stored_onnx(model, onnx, numpy_helper)
    return out if deploy is None else _named_by_scope(model, out, deploy)


def _named_by_scope(model, stored: dict[str, np.ndarray], deploy: nn.Module) -> dict[str, np.ndarray]:
    from .localize import node_scopes, param_owners

    params = dict(deploy.named_parameters())
    known = {_key(n) for n in params}
    producers = {o: n for n in model.graph.node for o in n.output}
    scopes = node_scopes(model, {n for n, _ in deploy.named_modules() if n}, param_owners(deploy))
    out = {}
    for i, node in enumerate(model.graph.node):
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or not scopes[i]:
            continue
        src = node.input[1]
        while src not in stored and src in producers and producers[src].op_type in ("DequantizeLinear", "Cast"):
            src = producers[src].input[0]
        p = params.get(f"{scopes[i]}.weight")
        if src in stored and _key(src) not in known and p is not None and stored[src].ndim == 2:
            trans_b = node.op_type == "Gemm" and any(a.name == "transB" and a.i for a in node.attribute)
            value = stored[src] if trans_b else stored[src].T
            if tuple(value.shape) == tuple(p.shape[:2]) and p[0].numel() == value.shape[1]:
                out[src] = (f"{scopes[i]}.weight", value)
    renamed = {name: value for name, value in stored.items() if name not in out}
    renamed.update({param: value for param, value in out.values()})
    return renamed


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
    out.update(onnx_biases(model, inits))
    return out


def _arg(binding, env: dict):
    if isinstance(binding, list):
        return [_arg(b, env) for b in binding]
    kind, v = binding
    return env[v] if kind == "var" else v


def package_weights(program) -> dict[str, np.ndarray]:
    """{MIL weight name without its compression suffixes: decompressed float32 value} for every compressed weight
    of a loaded package program, computed by the interpreter's kernels from the bytes on disk."""
    from ...targets.coreml.mil_ops import OPS, OpArgs

    out = {}
    for o in program.ops:
        if not o.type.startswith("constexpr_"):
            continue
        args = OpArgs(o.type, o.name, {k: _arg(b, program.consts) for k, b in o.inputs.items()},
                      [dt for _, dt in o.outputs])
        name = o.outputs[0][0]
        for suffix in ("_palettized", "_quantized", "_dequantized", "_to_fp16"):
            name = name.removesuffix(suffix)
        out[name] = np.asarray(OPS[o.type](args)[0], np.float32)
    return out


def package_weights_all(path: Path) -> dict[str, np.ndarray]:
    """{MIL name: float32 value} of every float const of rank >= 2 and every compressed weight (decompressed by the
    interpreter's kernels) of the saved package."""
    from ...targets.coreml.mil_interpreter import load_program

    program = load_program(path)
    out = {name: np.asarray(v, np.float32) for name, v in program.consts.items()
           if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)
           and (v.ndim >= 2 or (v.ndim == 1 and _key(name).endswith("_bias")))}
    out.update(package_weights(program))
    return out
