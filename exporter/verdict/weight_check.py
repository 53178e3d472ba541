"""The stored weights of an fp16 or compressed artifact against the deploy-form's, per output channel.

The outputs alone cannot show every change to a saved artifact: a compressed artifact's own error is 1-5 % of the
largest logit, so a sign-flipped or x1.1 channel whose effect on the outputs stays within that passes any per-sample
rule that correct artifacts pass. The weights show it. Each weight of the artifact that maps to a deploy-form
parameter by name and shape (ONNX initializers keep the parameter's name, an int8 one with `_quantized`; CoreML consts
carry it with `_` for `.` and suffixes such as `_to_fp16`, `_quantized`, `_palettized`) or, in an ExecuTorch program
whose XNNPACK graphs carry no names, by shape and values (`by_nearest`: the same-shape parameter it is nearest to)
is read back from the saved file by the artifact's target (Target.read_weights: fp16 initializers, int8
initializers through their DequantizeLinear scales, the package's weight.bin through the MIL interpreter's own
kernels, a .pte's XNNPACK filters through their per-channel scales) and each output channel's deviation from the
deploy-form's float32 values, ||w_art - w||_c, is compared with what a correct artifact of that precision does to that channel: the precision's
emulation (exporter/verdict/emulate: fp16 rounding, int8 per channel, with PT2E's 2^-12 scale floor for a .pte, a
k-means palette) gives ||w_emul - w||_c. A channel fails when its deviation exceeds max(WEIGHT_FLOOR x ||w||_c,
K x that, raised to the tensor's median), K the precision's `weight_k` (precisions.py, with its reasons).

Biases are weights: each kind's reader returns them too, judged per channel against how a correct artifact stores a
bias (stored_biases.py: one fp16 ulp for a float bias, half the int32 step its layer's scales give for an int8 one).

Weights that map to no parameter (a converter's fused or renamed constants) are counted, not judged; an artifact
none of whose weights maps is `not run`, saying so (unverified under --require-verified).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from ...precisions import HALF_ULP, TABLE
from ...targets import target_for_file
from ...targets.base import StoredWeights, Target
from ...targets.graph.weights import onnx_stored_weights
from .criteria import NoiseRule
from .emulate import stored_weight
from .stored_biases import emulated_bias, is_bias

WEIGHT_FLOOR = HALF_ULP      # relative to the channel's norm: half an fp16 ulp
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


def judge_weights(hop, deploy: nn.Module, path: str | Path, precision: str, target: Target | None = None,
                  entry: str | None = None) -> None:
    """After an fp16 or compressed artifact's hop that ran: its weights check in `hop.weights`; a failed check fails
    the hop, one that raised leaves a passed hop unverified (a check that raised is never a pass). `target`: the
    artifact's (default: the one whose row names its suffix), whose reader reads the stored weights; `entry`: the
    function / method of a multi-size artifact the hop ran (its weights are checked against `deploy`)."""
    if hop.status not in ("passed", "failed") or TABLE.get(precision) is None or TABLE[precision].weight_k is None:
        return
    target = target or target_for_file(path)
    try:
        read = {"entry": entry} if entry else {}
        stored = target.read_weights(path, **read) if target is not None else None
        if stored is None:  # a TensorRT engine: its weights are not readable outside TensorRT
            why = target.weights_unread if target is not None else "no target reads this artifact's weights"
            hop.weights = {"status": "not applicable", "why": f"{Path(path).name}: {why}"}
            return
        check = check_weights(deploy, path, precision, target, stored)
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


def check_weights(deploy: nn.Module, path: str | Path, precision: str, target: Target | None = None,
                  read: StoredWeights | None = None) -> WeightCheck:
    """Judge the weights stored in the artifact at `path` (precision fp16 or a compressed kind) against `deploy`,
    read by `target`'s reader (default: the target whose row names the suffix; `read`: what it already read)."""
    path = Path(path)
    if read is None:
        target = target or target_for_file(path)
        read = target.read_weights(path) if target is not None else None
        if read is None:
            raise ValueError(f"{path.name}: {target.weights_unread if target else 'no target reads its weights'}")
    stored, min_scale = read_stored(read, deploy, precision)
    params = reference_params(deploy, read)
    k = TABLE[precision].weight_k
    # a palette's lookup table serves a whole tensor (iOS 16-17) or 16 channels (iOS 18), and another k-means lands
    # its centres elsewhere: its channels are judged together
    per_tensor = TABLE[precision].palette
    check = WeightCheck("passed")
    for name, raw in stored.items():
        p = params.get(_key(name))
        bias = p is not None and is_bias(_key(name), p)  # biases are weights: judged per channel (stored_biases.py)
        value = None if p is None or (p.dim() < 2 and not bias) else _aligned(np.asarray(raw, np.float64),
                                                                               tuple(p.shape))
        if value is None:
            check.unmatched += 1
            continue
        rows = 1 if (per_tensor and not bias) or p.shape[0] == 1 else p.shape[0]  # (1, ...): a table, not channels
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


def read_stored(read: StoredWeights, deploy: nn.Module, precision: str) -> tuple[dict[str, np.ndarray], float]:
    """({name: float32 value} of the weights the artifact stores (`read`: its target's reader), named by the
    deploy-form parameter they store where the file carries no names (an ExecuTorch program: `by_nearest`, against
    each parameter as `precision` stores it) or, in an ONNX graph, by their module's scope; the floor its int8
    quantizer puts on a channel's scale, for the emulation (PT2E's observer eps; none for ONNX and CoreML))."""
    if read.graph is not None:
        return _named_by_scope(read.graph, read.values, deploy), read.scale_floor
    if read.named:
        return read.values, read.scale_floor
    floor = read.scale_floor
    expected = {n: stored_weight(p, precision, floor).double().numpy() for n, p in deploy.named_parameters()
                if p.dim() >= 2}
    return by_nearest(read.values, expected, read.biases), floor


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


def reference_params(deploy: nn.Module, read: StoredWeights) -> dict[str, torch.Tensor]:
    """{parameter name with `_` for `.`: tensor} of the deploy-form as the artifact was built from it (an image-input
    package carries 1/std folded into its first conv: the reference gets the same fold, `read.reference`)."""
    ref = read.reference(deploy) if read.reference is not None else deploy
    return {_key(n): p for n, p in ref.named_parameters()}


def onnx_weights(path: Path, deploy: nn.Module | None = None) -> dict[str, np.ndarray]:
    """{initializer name: float32 value} of the fp16 initializers and of the int8 ones read through their
    DequantizeLinear (per-axis scale and zero point). With `deploy`, a weight the exporter left unnamed (a Linear's
    transposed `onnx::MatMul_N`) is keyed by the parameter of the module its MatMul / Gemm belongs to, transposed
    back to (out, in)."""
    import onnx

    model = onnx.load(str(path))
    out = onnx_stored_weights(model)
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
