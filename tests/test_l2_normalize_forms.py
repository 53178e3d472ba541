"""SwiftFormer's l2-normalize forms (issue 17): each is F.normalize's function, and each reaches the graph it is for.

`l2_normalize_reduce_l2` (x * 1/max(||x||, eps)) is what eager PyTorch and the ONNX graphs run; the CoreML lowering,
which records the model with torch.jit.trace, keeps the rsqrt form (x * rsqrt(max(sum x^2, eps^2))).
"""
from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, node_counts, simplify_onnx
from vitedge.exporter.reparam import available_rewrites, reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.models.layers.normalize import l2_normalize_reduce_l2, l2_normalize_rsqrt
from vitedge.models.reduced import reduced
from vitedge.tests.conftest import onnx_parity

REDUCED = reduced("swiftformer")
ATTENTION_BLOCKS = 4  # one SwiftFormerEncoder per stage (its last block), three l2-normalizations in each


@pytest.mark.parametrize("fn", [l2_normalize_reduce_l2, l2_normalize_rsqrt])
@pytest.mark.parametrize("dim", [1, -1, (2, 3)])
def test_forms_are_f_normalize_in_float64(fn, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 8, 5, 6, generator=g, dtype=torch.float64) * 10 ** torch.randint(-3, 4, (3, 1, 1, 1),
                                                                                        generator=g)
    x[0, :, 0, 0] = 0.0          # a zero vector along dim=1: F.normalize gives 0, not NaN
    x[1, :, 1, 1] = 1e-14        # a norm below eps: F.normalize divides by eps
    ref = F.normalize(x, dim=dim, eps=1e-12)
    out = fn(x, dim, 1e-12)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-14, atol=1e-300)


def _deploy(rewrites=True):
    train = make_trained_like(create_model("swiftformer_xs", **REDUCED), seed=0).eval()
    return train, reparameterize(train, 64, rewrites=rewrites)


def _graph(deploy) -> Counter:
    return Counter(node_counts(simplify_onnx(check_onnx(export_onnx(copy.deepcopy(deploy), 64, batch=1)))))


def test_onnx_graph_takes_the_reduce_l2_form_and_the_ablation_the_rsqrt_form():
    train, deploy = _deploy()
    ops = _graph(deploy)
    assert ops["ReduceL2"] == 3 * ATTENTION_BLOCKS and ops["Sqrt"] == 0, ops
    assert ops["ReduceSum"] == ATTENTION_BLOCKS  # only the global query's sum over pixels is left
    metrics, _ = onnx_parity(train, deploy, 64, samples=2)
    assert metrics.max_rel <= 1e-4 and metrics.cosine >= 0.99999, metrics

    others = [r for r in available_rewrites(train) if r != "l2_normalize_reduce_l2"]
    _, ablation = _deploy(others)
    ops = _graph(ablation)
    assert ops["ReduceL2"] == 0 and ops["Sqrt"] == 3 * ATTENTION_BLOCKS, ops


def test_coreml_trace_keeps_the_rsqrt_form_and_computes_the_same():
    _, deploy = _deploy()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        traced = torch.jit.trace(copy.deepcopy(deploy), x, check_trace=False)
        kinds = Counter(n.kind() for n in traced.inlined_graph.nodes())
        assert kinds["aten::rsqrt"] == 3 * ATTENTION_BLOCKS and kinds["aten::linalg_vector_norm"] == 0, kinds
        eager, recorded = deploy(x), traced(x)
    assert (eager - recorded).abs().max() <= 1e-5 * eager.abs().max()
