"""The second float32 computation of the ground truth draws a random float32 rounding at every module output
(parity.rounding_draw): seeded, of the size of float32 rounding, and it widens the allowance of exactly the
samples where torch's own kernels happen to land close to float64."""
from __future__ import annotations

import copy

import numpy as np
import torch
import torch.nn as nn

from vitedge.exporter.verdict import parity
from vitedge.exporter.verdict.criteria import sample_errors

EPS32 = float(np.finfo(np.float32).eps)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GELU(), nn.Conv2d(8, 8, 3, padding=1, groups=8),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()


def _x(n=6) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(n, 3, 8, 8)).astype(np.float32)


def test_rounding_draw_is_seeded_of_float32_size_and_leaves_the_model_alone():
    model, x = _model(), _x()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    a = parity.ground_truth(model, x, ("stress",) * len(x))
    b = parity.ground_truth(model, x, ("stress",) * len(x))
    np.testing.assert_array_equal(a.y32_alt, b.y32_alt)  # same inputs, same verdict: the draw is seeded
    assert not model._forward_hooks and all(not m._forward_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    plain = copy.deepcopy(model).to(memory_format=torch.channels_last)
    with torch.no_grad():
        y_plain = plain(torch.from_numpy(x).contiguous(memory_format=torch.channels_last)).double().numpy()
    moved = sample_errors(a.y64, a.y32_alt) - sample_errors(a.y64, y_plain)
    drawn = sample_errors(y_plain, a.y32_alt)
    assert (drawn > 0).all(), "the draw changed no output"
    assert drawn.max() < 64 * EPS32, drawn  # float32 rounding, a few ulps at this depth: not a planted error
    assert np.isfinite(moved).all()


def test_the_drawn_factor_is_one_plus_ulps_times_a_uniform_in_minus_one_one():
    """Each module output is multiplied by exactly 1 + ROUNDING_ULPS * eps32 * (2u - 1), u the seeded generator's
    uniform draw, whatever the draw is computed with."""
    module = nn.Identity()
    parity.rounding_draw(module, torch.Generator().manual_seed(3))
    x = torch.from_numpy(_x(2))
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(3))
    expected = x * (1 + parity.ROUNDING_ULPS * EPS32 * (2 * u - 1))
    assert torch.equal(module(x), expected) and not torch.equal(module(x), x)


def test_a_model_whose_kernels_are_exact_still_gets_a_rounding_level_noise():
    """A model that float32 computes exactly (integer weights and inputs: every float32 run equals float64) has
    zero torch noise; the drawn rounding still gives each sample a float32-sized noise, growing with depth."""
    def chain(depth: int) -> nn.Module:
        layers = []
        for _ in range(depth):
            lin = nn.Linear(4, 4)
            with torch.no_grad():
                lin.weight.copy_(torch.tensor([[1.0, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]]))
                lin.bias.zero_()
            layers.append(lin)
        return nn.Sequential(*layers).eval()

    x = np.arange(1, 33, dtype=np.float32).reshape(8, 4)
    noise = {}
    for depth in (1, 8):
        t = parity.ground_truth(chain(depth), x, ("stress",) * len(x))
        assert sample_errors(t.y64, t.y32).max() == 0.0  # torch's float32 is exact here
        noise[depth] = np.median(t.noise)
        assert 0 < t.noise.min() and t.noise.max() < 16 * depth * EPS32
    assert noise[8] > noise[1]  # rounding at every depth: a deeper computation gets a larger noise
