"""Which fusions ONNX Runtime applies to a graph: its optimized graph, at the level our runners use, counted.

ONNX Runtime rewrites a graph when it opens a session (GELU's Div/Erf/Add/Mul/Mul chain into one `Gelu`,
Conv + activation into a fused Conv, LayerNorm chains into `LayerNormalization`, ...). Those fusions are where
much of its speed comes from, and they match exact subgraph patterns: a graph rewrite that computes the same
function in a different form (onnxsim folding GELU's trailing `Mul(0.5)` into the next Conv's weights) can
make ONNX Runtime miss a pattern and run slower. `fused_op_counts` counts the fused ops in the graph ONNX
Runtime actually executes (written through `SessionOptions.optimized_model_filepath`) so two graphs of the
same function can be compared; `lost_fusions` says which kinds one graph has fewer of.
"""
from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import onnx

# Fused ops that ONNX Runtime's optimizers create in the standard ONNX domain (its contrib ops, in domain
# com.microsoft, all count as fused: no exporter writes them).
ONNX_DOMAIN_FUSED = ("LayerNormalization",)
CONTRIB = "com.microsoft"
NCHWC = "com.microsoft.nchwc"


def fused_op_counts(model: onnx.ModelProto | bytes | str | Path, threads: int = 1) -> dict[str, int]:
    """Fused ops per kind in ONNX Runtime's optimized CPU graph of `model`, sorted by kind.

    The optimization level is the session default our runners use (ORT_ENABLE_ALL, NCHWc layout included).
    Kinds: contrib op types (`Gelu`, `FusedConv`, `FusedMatMul`, `SkipLayerNormalization`, ...),
    `LayerNormalization`, and the NCHWc convolutions that absorbed an activation or a residual add
    (`NchwcConv+Relu`, `NchwcConv+Sum`, ...).
    """
    import onnxruntime as ort

    if isinstance(model, onnx.ModelProto):
        model = model.SerializeToString()
    elif isinstance(model, Path):
        model = str(model)
    with tempfile.TemporaryDirectory(prefix="vitedge-ort-opt-") as tmp:
        path = str(Path(tmp) / "optimized.onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3  # ORT warns that NCHWc graphs are machine-specific: we only count them
        opts.optimized_model_filepath = path
        ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        optimized = onnx.load(path)
    counts: Counter = Counter()
    for node in optimized.graph.node:
        kind = _fused_kind(node)
        if kind:
            counts[kind] += 1
    return dict(sorted(counts.items()))


def _fused_kind(node: onnx.NodeProto) -> str | None:
    if node.domain == CONTRIB:
        return node.op_type
    if node.domain in ("", "ai.onnx") and node.op_type in ONNX_DOMAIN_FUSED:
        return node.op_type
    if node.domain == NCHWC and node.op_type == "Conv":
        parts = [a.s.decode() for a in node.attribute if a.name == "activation"]
        if len(node.input) > 3 and node.input[3]:
            parts.append("Sum")  # the residual add folded into the convolution's output
        return "NchwcConv+" + "+".join(parts) if parts else None
    return None


def lost_fusions(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Kinds `after` has fewer of than `before`, with how many fewer (empty: nothing lost)."""
    return {k: n - after.get(k, 0) for k, n in sorted(before.items()) if after.get(k, 0) < n}
