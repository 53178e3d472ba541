"""F.normalize written as a plain reduction and a broadcast rescale (exact in real arithmetic).

Exporters lower `F.normalize` to ReduceL2/ReduceL1 + Expand + Div (ONNX) or reduce_l2_norm + tile + real_div
(CoreML); these forms need neither the Expand/tile nor the norm op, which the Neural Engine and ONNX Runtime run
better. Used by the deploy-form rewrites (SwiftFormer `l2_normalize_rsqrt` and `l2_normalize_reduce_l2`, SimA
`l1_normalize_broadcast_div`) and by the CoreML lowering of models that still call F.normalize.
"""
from __future__ import annotations

import torch


def l2_normalize_rsqrt(x: torch.Tensor, dim, eps: float = 1e-12) -> torch.Tensor:
    """`F.normalize(x, p=2, dim=dim, eps=eps)` as `x * rsqrt(max(sum(x^2), eps^2))`: max(sqrt(s), eps) equals
    sqrt(max(s, eps^2))."""
    return x * torch.rsqrt(torch.clamp_min((x * x).sum(dim=dim, keepdim=True), eps * eps))


def l2_normalize_reduce_l2(x: torch.Tensor, dim, eps: float = 1e-12) -> torch.Tensor:
    """`F.normalize(x, p=2, dim=dim, eps=eps)` as `x * (1 / max(||x||, eps))`: F.normalize's own formula, with
    the norm one ONNX op (ReduceL2: the squares are never a tensor of their own), the reciprocal taken on the
    reduced tensor and a broadcast multiply (what it is worth: docs/benchmarks/rewrite_ablation.md)."""
    return x * torch.reciprocal(torch.linalg.vector_norm(x, 2, dim=dim, keepdim=True).clamp_min(eps))


def l1_normalize_div(x: torch.Tensor, dim, eps: float = 1e-12) -> torch.Tensor:
    """`F.normalize(x, p=1, dim=dim, eps=eps)` as `x / max(sum|x|, eps)` with a broadcast division."""
    return x / torch.clamp_min(x.abs().sum(dim=dim, keepdim=True), eps)
