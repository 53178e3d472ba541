"""The seeded float32 rounding drawn at every module output of the second float32 reference run (Monte Carlo
arithmetic: docs/parity_criteria.md, *the rounding drawn at every depth*).

Each leaf module's float32 output is multiplied by (1 + ROUNDING_ULPS * eps32 * (2u - 1)), u uniform in [0, 1),
computed in float32 exactly as before. The factors are drawn once per seed into one buffer (FACTORS of them, from
torch's seeded generator); every output element then reads its factor from that buffer at an offset that is a
counter-based hash (splitmix64) of (seed, leaf module's index, call of that module within the forward, sample's
index in the whole input set). So the draw:

- is one multiply per output, in the output's own memory layout (the former per-call `torch.rand` and four
  elementwise passes in mixed layouts cost ~6x the plain channels-last forward);
- depends on the seed and those counters only: not on the intra-op thread count (reading a buffer is exact), nor
  on how the inputs are chunked (each sample's factors are keyed by its own index wherever the output carries the
  batch in its first dimension, as every batch-major layout here does);
- has the former per-element distribution; factors of different outputs are windows of one buffer at hashed
  offsets (a sample's output longer than the buffer wraps around it), as many streams of one generator are.
"""
from __future__ import annotations

import functools
from contextlib import contextmanager

ROUNDING_ULPS = 1.0
ROUNDING_SEED = 0
FACTORS = 1 << 22  # 16 MiB of float32 factors per seed, drawn once per process
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finalizer: a counter-based hash, the same on every machine."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def offset(seed: int, *counters: int) -> int:
    """The buffer offset of one (seed, module, call, sample) key."""
    h = _mix(seed)
    for c in counters:
        h = _mix(h ^ c)
    return h % FACTORS


@functools.lru_cache(maxsize=2)
def factors(seed: int):
    """The seed's factors, twice over (so any window of up to FACTORS starting inside the first copy is one slice)."""
    import torch

    u = torch.rand(FACTORS, generator=torch.Generator().manual_seed(seed))
    f = 1 + ROUNDING_ULPS * float(torch.finfo(torch.float32).eps) * (2 * u - 1)
    return torch.cat([f, f])


class RoundingDraw:
    """Forward hooks on every leaf module of a float32 model (changed in place) that draw the seeded rounding;
    `chunk(first, n)` tells the hooks which samples of the whole input set the next forward carries."""

    def __init__(self, model, seed: int = ROUNDING_SEED):
        self.seed, self.first, self.n, self.calls = int(seed), 0, None, {}
        self.leaves = [m for m in model.modules() if next(m.children(), None) is None]
        for i, m in enumerate(self.leaves):
            m.register_forward_hook(functools.partial(self._hook, i))

    @contextmanager
    def chunk(self, first: int, n: int):
        self.first, self.n, self.calls = int(first), int(n), {}
        try:
            yield
        finally:
            self.n = None

    def _hook(self, index, _module, _inputs, out):
        import torch

        if not (isinstance(out, torch.Tensor) and out.dtype == torch.float32) or out.numel() == 0:
            return None
        call = self.calls[index] = self.calls.get(index, -1) + 1
        if not (out.is_contiguous() or (out.dim() == 4 and out.is_contiguous(memory_format=torch.channels_last))):
            out = out.contiguous()
        n = self.n or (out.shape[0] if out.dim() else 1)
        batched = out.dim() > 0 and out.shape[0] % n == 0 and (out.shape[0] > 1 or n == 1)
        rows = n if batched else 1
        step = out.shape[0] // rows if out.dim() else 1
        f = factors(self.seed)
        result = torch.empty_like(out)
        for r in range(rows):
            part = out[r * step:(r + 1) * step] if out.dim() else out
            key = (index, call, self.first + r) if batched else (index, call)
            torch.mul(part, self._window(f, offset(self.seed, *key), part), out=result[r * step:(r + 1) * step]
                      if out.dim() else result)
        return result

    @staticmethod
    def _window(f, start: int, part):
        """The factors for `part` from `start`, laid out in `part`'s own (dense) strides."""
        import torch

        m = part.numel()
        if m > FACTORS:  # longer than the buffer: it wraps around
            f = f[:FACTORS].repeat(-(-(start + m) // FACTORS))
        return torch.as_strided(f, part.shape, part.stride(), start)


def rounding_draw(model, seed: int = ROUNDING_SEED) -> RoundingDraw:
    """Hook the seeded rounding draw onto every leaf module of `model` (a float32 copy, changed in place)."""
    return RoundingDraw(model, seed)
