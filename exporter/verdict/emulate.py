"""Independent emulations of a deployed precision in torch: what a correct artifact of that precision does to each
sample, computed from the deploy-form without looking at the artifact. Their error against float64 is the per-sample
reference the fp16 rule and the compressed rule scale their allowance from (exporter/verdict/criteria.py, parity.judge).

- `fp16`: the weights and every leaf module's output rounded to float16, the arithmetic inside a module in float32
  (parity.fp16_reference).
- compressed kinds (`int8`, `w8`, `palette4`, `palette6`, `w8a8`): the weights of every Conv/Linear compressed the
  way the kind stores them, and where the kind quantizes activations every leaf module's output fake-quantized:
  - `int8` (ONNX QDQ): weights int8 symmetric per output channel (the Conv that reads the image stays float, as in
    targets/graph/qdq.py), activations uint8 asymmetric per tensor; float32 otherwise.
  - `w8` / `w8a8` (CoreML): weights of `weight_threshold` elements or more int8 symmetric per output channel; `w8a8`
    also int8 symmetric activations per tensor; fp16 everything else (the package computes in fp16).
  - `palette4` / `palette6` (CoreML): those weights replaced by a 16- / 64-entry k-means lookup table per tensor (the
    iOS 16-17 layout; iOS 18's per-16-channel tables are finer, so its artifacts sit below this reference); fp16
    everything else.
  Activation ranges are the min/max over the inputs judged (a correct artifact calibrated on other natural images
  of the same kind has ranges of the same size). The reference is one legitimate computation of the kind, not the
  artifact's own: its error is the size, not the direction, of a correct artifact's error on that sample.
"""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn

from ...models.features import pack
from ...precisions import TABLE, Emulation, compressed_names

# each compressed kind's facts (what it stores, fp16 compute or not) are its precision row's `emulation`
IMAGE_CHANNELS = 4               # a group-1 conv reading <= 4 channels reads the image: int8 keeps it float
KMEANS_ITERATIONS = 12
BATCH = 32


def fp16_reference(model: nn.Module, x: np.ndarray, batch: int = BATCH) -> np.ndarray:
    """`model` as fp16 storage computes it (see the module doc); one thread, so its rounding is the machine's own."""
    m = _copy(model)
    _round_weights(m, lambda w: w.half().float())
    return _forward(m, x, batch, output=_half, input_fp16=True)


def compressed_reference(model: nn.Module, x: np.ndarray, kind: str, batch: int = BATCH) -> np.ndarray:
    """`model` (the deploy-form) computed as a correct artifact of compressed `kind` would (see the module doc)."""
    if kind not in compressed_names():
        raise ValueError(f"no emulation of compressed kind {kind!r}; one of {', '.join(compressed_names())}")
    e = TABLE[kind].emulation
    m = _copy(model)
    fp16 = e.fp16_compute
    with torch.no_grad():
        for mod in m.modules():
            if not isinstance(mod, (nn.Conv2d, nn.Conv1d, nn.Linear)):
                continue
            if (e.image_conv_float and isinstance(mod, nn.Conv2d) and mod.groups == 1
                    and mod.in_channels <= IMAGE_CHANNELS):
                continue
            mod.weight.copy_(stored_weight(mod.weight, kind))
    if fp16:
        _round_weights(m, lambda w: w.half().float())
    base = _half if fp16 else None
    if e.activations is None:
        return _forward(m, x, batch, output=base, input_fp16=fp16)
    ranges = _ranges(m, x, batch, base, fp16)
    symmetric = e.activations == "int8"
    return _forward(m, x, batch, output=lambda mod, y: _fake_quant(base(mod, y) if base else y, ranges.get(mod),
                                                                    symmetric), input_fp16=fp16)


def stored_weight(w: torch.Tensor, precision: str, min_scale: float = 0.0) -> torch.Tensor:
    """A Conv/Linear weight (output channels first) as a correct artifact of `precision` stores it (fp16, or a
    compressed kind: see the module doc), in float32. `min_scale`: the int8 quantizer's floor on a channel's scale
    (PT2E's XNNPACK quantizer: its observer's eps, 2^-12; none for the ONNX and CoreML kinds)."""
    w = w.detach().float()
    e: Emulation = TABLE[precision].emulation
    if e.weights == "fp16":
        return w.half().float()
    if w.numel() < e.min_elements:  # too small to compress: stored as the rest is
        return w.half().float() if e.fp16_compute else w
    if e.weights == "palette":
        q = _palette(w, 2 ** TABLE[precision].bits)
    else:  # a CoreML package stores its per-channel scales in float16 (constexpr_affine_dequantize on fp16 weights)
        q = _int8_per_channel(w, torch.float16 if e.fp16_scales else torch.float32, min_scale)
    return q.half().float() if e.fp16_compute else q


def _copy(model: nn.Module) -> nn.Module:
    return copy.deepcopy(model).float().eval()


def _round_weights(m: nn.Module, fn) -> None:
    with torch.no_grad():
        for t in list(m.parameters()) + list(m.buffers()):
            if t.is_floating_point():
                t.copy_(fn(t))


def _half(_module, y):
    return y.half().float()


def _int8_per_channel(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32, min_scale: float = 0.0) -> torch.Tensor:
    """Symmetric int8 per output channel (axis 0): scale max|w| / 127 (at least `min_scale`), round to nearest,
    dequantized with the scale as stored in `scale_dtype` (float16: a near-dead channel whose scale underflows below
    2^-25 comes back as zeros)."""
    flat = w.reshape(w.shape[0], -1)
    scale = torch.clamp(flat.abs().amax(dim=1, keepdim=True) / 127.0, min=min_scale)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.clamp(torch.round(flat / scale), -127, 127) * scale.to(scale_dtype).float()).reshape(w.shape)


def _palette(w: torch.Tensor, entries: int) -> torch.Tensor:
    """Each value replaced by the nearest of `entries` 1-D k-means centres of the tensor (quantile-initialized)."""
    v = w.reshape(-1).double()
    centres = torch.quantile(v[torch.linspace(0, len(v) - 1, min(len(v), 1 << 16)).long()],
                             torch.linspace(0, 1, entries, dtype=torch.float64))
    for _ in range(KMEANS_ITERATIONS):
        nearest = _nearest(v, centres)
        sums = torch.zeros_like(centres).index_add_(0, nearest, v)
        counts = torch.bincount(nearest, minlength=entries).double()
        centres = torch.where(counts > 0, sums / counts.clamp(min=1), centres).sort().values
    return centres[_nearest(v, centres)].reshape(w.shape).to(w.dtype)


def _nearest(v: torch.Tensor, centres: torch.Tensor) -> torch.Tensor:
    """Index of the nearest of the sorted `centres` for each value (by the midpoints: O(n) memory)."""
    return torch.searchsorted((centres[1:] + centres[:-1]) / 2, v)


def _fake_quant(y, rng, symmetric: bool):
    """`y` through 8-bit quantization with range `rng` (lo, hi): int8 symmetric or uint8 asymmetric."""
    if rng is None or not torch.is_tensor(y) or not y.is_floating_point():
        return y
    lo, hi = min(rng[0], 0.0), max(rng[1], 0.0)
    if symmetric:
        scale = max(abs(lo), abs(hi)) / 127.0
        return y if scale == 0 else torch.clamp(torch.round(y / scale), -127, 127) * scale
    scale = (hi - lo) / 255.0
    if scale == 0:
        return y
    zero = round(-lo / scale)
    return (torch.clamp(torch.round(y / scale) + zero, 0, 255) - zero) * scale


def _ranges(m: nn.Module, x: np.ndarray, batch: int, base, fp16: bool) -> dict:
    """{leaf module: (min, max) of its output over `x`} with the compressed weights in place."""
    found: dict = {}

    def record(mod, y):
        y = base(mod, y) if base else y
        if torch.is_tensor(y) and y.is_floating_point():
            lo, hi = float(y.min()), float(y.max())
            old = found.get(mod, (lo, hi))
            found[mod] = (min(old[0], lo), max(old[1], hi))
        return y

    _forward(m, x, batch, output=record, input_fp16=fp16)
    return found


def _forward(m: nn.Module, x: np.ndarray, batch: int, output=None, input_fp16: bool = False) -> np.ndarray:
    """`m` on `x` in chunks, each leaf module's floating output passed through `output(module, y)`; one thread."""
    hooks = []
    if output is not None:
        def hook(mod, _inputs, y):
            return output(mod, y) if torch.is_tensor(y) and y.is_floating_point() else y

        hooks = [mod.register_forward_hook(hook) for mod in m.modules() if next(mod.children(), None) is None]
    xt = torch.as_tensor(np.asarray(x, np.float32))
    if input_fp16:
        xt = xt.half().float()
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference's rounding must not depend on the machine
    try:
        with torch.no_grad():
            return np.concatenate([pack(m(xt[i:i + batch])).double().numpy() for i in range(0, len(xt), batch)])
    finally:
        torch.set_num_threads(before)
        for h in hooks:
            h.remove()
