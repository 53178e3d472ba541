"""float32 <-> float16 casts for the MIL interpreter, through torch.

numpy's float16 casts are scalar code: rounding every fp16 op output that way took ~60 % of the emulated CoreML
hop; torch's vectorized casts are ~4x faster on one thread and give the same bits (IEEE round to nearest even,
subnormals kept, overflow to +-inf; tests/test_mil_interpreter.py compares them bit for bit)."""
from __future__ import annotations

import numpy as np
import torch

TORCH_MIN = 4096  # elements from which the casts go through torch (below, the call overhead dominates)


def to_fp16(x) -> np.ndarray:
    """`x` as a float16 array (nearest, overflowing to +-inf)."""
    a = np.asarray(x, np.float32)
    if a.size < TORCH_MIN:
        with np.errstate(over="ignore", invalid="ignore"):
            return a.astype(np.float16)
    return torch.from_numpy(np.ascontiguousarray(a)).to(torch.float16).numpy()  # (no copy when contiguous)


def from_fp16(x16: np.ndarray) -> np.ndarray:
    """A float16 array widened to float32 (exact)."""
    if x16.size < TORCH_MIN:
        return x16.astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(x16)).to(torch.float32).numpy()


def round_fp16(x) -> np.ndarray:
    """float32 -> nearest float16 -> float32, overflowing to +-inf like an fp16 register."""
    return from_fp16(to_fp16(x))
