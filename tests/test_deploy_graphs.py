"""Deploy-form graph rewrites, checked on the simplified ONNX graph (issue 10) and proven by ONNX Runtime parity.

SwiftFormer (channels-first rewrites): no Einsum, Expand or Transpose anywhere. SLAB-DeiT / PRepBN-DeiT
(channel-first tokens): no Einsum or Expand, at most one Transpose per block and none outside the blocks.
The folded-only graphs (rewrites=False, the ablation baseline) must have more Transposes.
ONNX node names carry the torch module scope, e.g. `/blocks/blocks.0/attn/Transpose`.
"""
import copy
import re
from collections import Counter

import pytest

from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, node_counts, simplify_onnx
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.models.reduced import reduced
from vitedge.tests.conftest import onnx_parity

LAYOUT_OPS = ("Einsum", "Expand", "Transpose")
MAX_REL, MIN_COSINE = 1e-4, 0.99999

# name, overrides, imgsz, a block's module path (its ONNX scope is `/<parent>/<path>/...`)
SWIFT_SCOPE = r"network\.\d+\.\d+"
SLAB_SCOPE = r"blocks\.\d+"
CASES = [
    ("swiftformer_xs", reduced("swiftformer"), 64, SWIFT_SCOPE),
    ("swiftformer_xs", {}, 224, SWIFT_SCOPE),
    ("slab_deit_tiny", dict(depth=2), 224, SLAB_SCOPE),  # released width: head_dim 64, N=196, kv_first
    ("prepbn_deit_tiny", reduced("prepbn_deit"), 224, SLAB_SCOPE),
]
IDS = ["swiftformer-reduced-64", "swiftformer_xs-224", "slab_deit_tiny-depth2-224", "prepbn_deit_tiny-reduced-224"]


def _graph(deploy, imgsz: int):
    return simplify_onnx(check_onnx(export_onnx(copy.deepcopy(deploy), imgsz, batch=1)))


def _scoped_ops(graph, scope: str) -> tuple[Counter, Counter, set]:
    """(layout ops per block, layout ops outside blocks, every block scope seen in the graph)."""
    inside, outside, blocks = Counter(), Counter(), set()
    for node in graph.graph.node:
        m = re.match(rf"^/[^/]+/({scope})/", node.name)
        if m:
            blocks.add(m.group(1))
        if node.op_type in LAYOUT_OPS:
            if m:
                inside[(m.group(1), node.op_type)] += 1
            else:
                outside[node.op_type] += 1
    return inside, outside, blocks


@pytest.mark.parametrize("name,overrides,imgsz,scope", CASES, ids=IDS)
def test_rewritten_onnx_graph(name, overrides, imgsz, scope):
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    deploy = reparameterize(train, imgsz)
    graph = _graph(deploy, imgsz)
    counts = node_counts(graph)
    inside, outside, blocks = _scoped_ops(graph, scope)

    # every block of the train-form (module paths `network.i.j` / `blocks.i`) owns nodes under its scope
    expected = {n for n, _ in train.named_modules() if re.fullmatch(scope, n)}
    assert expected and blocks == expected, f"block scopes in the node names: {sorted(blocks)}"
    assert counts.get("Einsum", 0) == counts.get("Expand", 0) == 0, counts
    if name.startswith("swiftformer"):
        assert counts.get("Transpose", 0) == 0, (counts, dict(inside), dict(outside))
    else:
        per_block = Counter({b: n for (b, op), n in inside.items() if op == "Transpose"})
        assert max(per_block.values(), default=0) <= 1, per_block
        assert outside.get("Transpose", 0) == 0, outside  # the patch embed and pooling stay channels-first

    # The rewritten graph computes the train-form function (fp32, ONNX Runtime, dynamic batch).
    metrics, _ = onnx_parity(train, deploy, imgsz, samples=2)
    assert metrics.max_rel <= MAX_REL and metrics.cosine >= MIN_COSINE, metrics

    # The ablation is real: the folded-only graph keeps the token-layout transposes.
    folded = node_counts(_graph(reparameterize(train, imgsz, rewrites=False), imgsz))
    assert folded.get("Transpose", 0) > counts.get("Transpose", 0), (folded, counts)
