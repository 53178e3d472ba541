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


def _exact_model() -> nn.Module:
    """Every float32 kernel exact whatever its blocking: each output is the sum of two inputs (a 0/1 weight), so any
    difference between runs is the draw's."""
    lin = nn.Linear(32, 32, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(32) + torch.eye(32).roll(1, 1))
    return nn.Sequential(lin, nn.ReLU(), copy.deepcopy(lin), nn.Hardtanh(-1e6, 1e6), copy.deepcopy(lin)).eval()


def _draw_outputs(model, x, batch, threads, seed=parity.ROUNDING_SEED):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        m = copy.deepcopy(model)
        draw = parity.rounding_draw(m, seed)
        xt = torch.from_numpy(x)
        outs = []
        with torch.no_grad():
            for i in range(0, len(x), batch):
                with draw.chunk(i, len(xt[i:i + batch])):
                    outs.append(m(xt[i:i + batch]).numpy())
        return np.concatenate(outs)
    finally:
        torch.set_num_threads(before)


def test_the_draw_is_the_same_at_any_thread_count_and_chunking_and_changes_with_the_seed():
    """The seeded draw reads one buffer at hashed offsets: bit-identical on 1, 2 and 3 intra-op threads and for
    any chunking of the inputs (each sample keyed by its own index), so bundles and cached truths do not move.
    Outputs of 100k+ elements per chunk: torch splits its elementwise work over threads."""
    model = _exact_model()
    x = np.random.default_rng(0).integers(-8, 8, size=(7, 16, 32, 32)).astype(np.float32)
    ref = _draw_outputs(model, x, batch=4, threads=1)
    for batch, threads in ((4, 2), (4, 3), (7, 2), (1, 1), (3, 2)):
        np.testing.assert_array_equal(_draw_outputs(model, x, batch, threads), ref, err_msg=f"{batch=} {threads=}")
    with torch.no_grad():
        y_plain = model(torch.from_numpy(x)).numpy()
    assert not np.array_equal(ref, y_plain)
    assert not np.array_equal(ref, _draw_outputs(model, x, 4, 1, seed=parity.ROUNDING_SEED + 1))


def test_each_output_element_is_scaled_by_the_former_distribution():
    """Every element gets 1 + eps32 * (2u - 1) rounded to float32, u uniform: the values and frequencies of the
    former per-call draw; outputs of different samples, modules and calls get different factors."""
    from vitedge.exporter.verdict import rounding

    f = rounding.factors(0)[:rounding.FACTORS].double().numpy()
    d = (f - 1) / EPS32  # steps of eps32 / 2 below 1, eps32 above: -1, -0.5, 0, 1
    values, counts = np.unique(d, return_counts=True)
    assert set(values) <= {-1.0, -0.5, 0.0, 1.0}
    share = dict(zip(values, counts / len(f)))
    # 1 + eps32 * U(-1, 1) rounded to nearest: 1 - eps below -3/4 eps, 1 - eps/2 up to -1/4, 1 up to +1/2, then 1 + eps
    expected = {-1.0: 1 / 8, -0.5: 1 / 4, 0.0: 3 / 8, 1.0: 1 / 4}
    assert all(abs(share[v] - p) < 0.002 for v, p in expected.items()), share
    lin = nn.Linear(64, 64).eval()
    draw = rounding.rounding_draw(lin, 0)
    xi = torch.randn(2, 64)
    with torch.no_grad(), draw.chunk(0, 2):
        a = lin(xi)
        b = lin(xi)  # the module's second call in the same forward
    plain = torch.nn.functional.linear(xi, lin.weight, lin.bias)
    ra, rb = (a / plain).double(), (b / plain).double()
    assert not torch.equal(ra[0], ra[1]) and not torch.equal(ra, rb)
    assert ((ra - 1).abs() <= 2 * EPS32).all()


def test_golden_vectors_are_byte_identical_at_any_thread_count():
    from vitedge.exporter.packaging.bundle import golden_vectors

    model = _model()
    got = []
    for threads in (1, 2, 3):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            got.append(golden_vectors(model, 8, (0.5,) * 3, (0.25,) * 3, n=4))
        finally:
            torch.set_num_threads(before)
    for pixels, logits in got[1:]:
        assert pixels.tobytes() == got[0][0].tobytes() and logits.tobytes() == got[0][1].tobytes()
