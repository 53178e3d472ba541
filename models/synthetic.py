"""Seeded synthetic images: the pixel patterns behind the parity set's categories (exporter/verdict/inputs.py) and the
calibration batch of trained-like weights (models/trained_like.py), in one place.

Every maker draws from the generator it is given, in a fixed order, and returns a (3, h, w) image in [0, 1]
pixel space; `synthetic_batch` normalizes them with a mean/std ("noise" is drawn directly in normalized space).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from .registry import IMAGENET_MEAN, IMAGENET_STD
from .input_size import as_hw


def _gradient(g, h, w):
    theta = torch.rand(1, generator=g).item() * 2 * math.pi
    yy, xx = torch.meshgrid(torch.linspace(0, 1, h), torch.linspace(0, 1, w), indexing="ij")
    t = (math.cos(theta) * xx + math.sin(theta) * yy)
    t = (t - t.min()) / (t.max() - t.min() + 1e-12)
    lo, hi = torch.rand(3, 1, 1, generator=g), torch.rand(3, 1, 1, generator=g)
    return lo + (hi - lo) * t


def _checker(g, h, w):
    period = int(2 ** (1 + torch.randint(0, 5, (1,), generator=g).item()))
    yy, xx = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    mask = (((yy // period) + (xx // period)) % 2).float()
    c0, c1 = torch.rand(3, 1, 1, generator=g), torch.rand(3, 1, 1, generator=g)
    return c0 * (1 - mask) + c1 * mask


def _smooth(g, h, w):
    # The inverse FFT in float64 (numpy), then snapped to a 2^-16 grid: torch's float32 FFT rounded differently in
    # about one run of ten (its kernels follow the buffers' alignment), which changed a parity input by ~1e-6 and
    # with it a package's bytes. Rounding a float64 result to 16 bits absorbs any such last-bit difference.
    fy = np.fft.fftfreq(h).reshape(-1, 1)
    fx = np.fft.rfftfreq(w).reshape(1, -1)
    amp = 1.0 / np.maximum(np.sqrt(fy ** 2 + fx ** 2), 1.0 / max(h, w))
    phase = torch.rand(3, h, w // 2 + 1, generator=g).double().numpy() * 2 * math.pi
    img = np.fft.irfft2(amp * np.exp(1j * phase), s=(h, w))
    img = img - img.min(axis=(1, 2), keepdims=True)
    img = img / (img.max(axis=(1, 2), keepdims=True) + 1e-12)
    return torch.from_numpy(np.round(img * 65536.0) / 65536.0)


def _blocks(g, h, w):
    img = torch.rand(3, 1, 1, generator=g).expand(3, h, w).clone()
    for _ in range(12):
        y0, x0 = torch.randint(0, h, (1,), generator=g).item(), torch.randint(0, w, (1,), generator=g).item()
        hh, ww = torch.randint(1, h + 1, (1,), generator=g).item(), torch.randint(1, w + 1, (1,), generator=g).item()
        img[:, y0:y0 + hh, x0:x0 + ww] = torch.rand(3, 1, 1, generator=g)
    return img


def _extreme(g, h, w):
    kind = torch.randint(0, 4, (1,), generator=g).item()
    if kind == 0:
        return torch.zeros(3, h, w)
    if kind == 1:
        return torch.ones(3, h, w)
    if kind == 2:
        img = torch.zeros(3, h, w)
        img[torch.randint(0, 3, (1,), generator=g).item()] = 1.0
        return img
    return (torch.rand(3, h, w, generator=g) > 0.5).float()


MAKERS = {"gradient": _gradient, "checker": _checker, "smooth": _smooth, "blocks": _blocks, "extreme": _extreme}
KINDS = ("noise", *MAKERS)


def synthetic_batch(kinds: Sequence[str], imgsz: int, seed: int, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One normalized image per entry of `kinds` (len(kinds), 3, imgsz, imgsz), all drawn from one generator
    seeded with `seed`, in order: deterministic in (kinds, imgsz, seed, mean, std)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.tensor(mean, dtype=torch.float64).reshape(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).reshape(3, 1, 1)
    h, w = as_hw(imgsz)
    out = torch.empty(len(kinds), 3, h, w, dtype=torch.float64)
    for i, kind in enumerate(kinds):
        if kind == "noise":
            out[i] = torch.randn(3, h, w, generator=g, dtype=torch.float64)
        else:
            out[i] = (MAKERS[kind](g, h, w).double() - m) / s
    return out.to(dtype)
