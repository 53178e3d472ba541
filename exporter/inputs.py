"""The documented parity input set: seeded noise plus structured images, normalized like ImageNet.

Categories, cycled in this order so any prefix of the set mixes all of them:
  0 noise      N(0, 1) in normalized space (the usual random check)
  1 gradient   linear ramps in a random direction, per-channel random endpoints in [0, 1] pixel space
  2 checker    checkerboards with periods 2..32 px and random colours
  3 smooth     natural-image-like noise: a 1/f spectrum (random phases), rescaled to [0, 1]
  4 blocks     piecewise-constant random rectangles (edges at every scale), in [0, 1]
  5 extreme    saturated pixels (all-0, all-1, single-channel) mixed with noise: range corners
Pixel-space images are normalized with the model's mean/std. Same seed, size and count give the same tensor.
"""
from __future__ import annotations

import torch

from ..models.registry import IMAGENET_MEAN, IMAGENET_STD
from ..models.synthetic import synthetic_batch  # the pattern makers (shared with trained-like calibration)

CATEGORIES = ("noise", "gradient", "checker", "smooth", "blocks", "extreme")
DEFAULT_SAMPLES = 256


def parity_inputs(n: int = DEFAULT_SAMPLES, imgsz: int = 224, seed: int = 0, mean=IMAGENET_MEAN,
                  std=IMAGENET_STD, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`n` inputs (n, 3, imgsz, imgsz), normalized, deterministic in (n, imgsz, seed)."""
    if n <= 0:
        raise ValueError("need at least one parity sample")
    return synthetic_batch([CATEGORIES[i % len(CATEGORIES)] for i in range(n)], imgsz, seed, mean, std, dtype)


def describe() -> str:
    return __doc__
