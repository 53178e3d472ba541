"""Attention layers of the three families, with the attention order as an explicit, inspectable choice.

`attn_order` is one of ORDERS. "auto" applies each family's official FLOP rule (ties included);
`resolve_order()` is the single place that decides, and the re-parameterizer records its answer per block.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

ORDERS = ("auto", "qk_first", "kv_first")


def sla_rule(nq: int, nk: int, dqk: int, dv: int) -> str:
    """SLAB's exact FLOP comparison: K^T V first iff nq*nk*(dqk+dv) > dqk*dv*(nq+nk)."""
    return "kv_first" if nq * nk * (dqk + dv) > dqk * dv * (nq + nk) else "qk_first"


def sima_rule(n: int, d: int) -> str:
    """SimA's official rule: (Q K^T) V iff N < d (cheaper exactly then: 2N^2 d < 2N d^2)."""
    return "qk_first" if n < d else "kv_first"


def order_record(rule: str, nq: int, nk: int, d: int, requested: str, order: str) -> dict:
    """What report.json records of one SLA or SimA block's order: the family's rule, the block's real token counts
    and head width at the export's size, the multiply count of each order per head (the rule's own comparison) and
    the order chosen (the rule's, unless forced)."""
    if rule == "sla":
        costs = {"qk_first": nq * nk * 2 * d, "kv_first": d * d * (nq + nk)}
        by_rule = sla_rule(nq, nk, d, d)
    else:
        costs = {"qk_first": 2 * nq * nq * d, "kv_first": 2 * nq * d * d}
        by_rule = sima_rule(nq, d)
    return {"rule": rule, "n": nq, "n_kv": nk, "d": d, "macs_per_head": costs, "rule_order": by_rule,
            "requested": requested, "order": order}


def resolve_order(requested: str, auto: str) -> str:
    if requested not in ORDERS:
        raise ValueError(f"attn_order must be one of {ORDERS}, got {requested!r}")
    return auto if requested == "auto" else requested


def order_reason(requested: str, rule: str, nq: int, nk: int, dqk: int, dv: int) -> str:
    if requested != "auto":
        return f"forced {requested} by override"
    return (f"{rule} by FLOP rule: N={nq}, N'={nk}, d_qk={dqk}, d_v={dv}: "
            f"N*N'*(d_qk+d_v)={nq * nk * (dqk + dv)} vs d_qk*d_v*(N+N')={dqk * dv * (nq + nk)}")


def _split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    # "b n (h c) -> (b h) n c"
    b, n, c = t.shape
    return t.reshape(b, n, heads, c // heads).transpose(1, 2).reshape(b * heads, n, c // heads)


def _merge_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    # "(b h) n c -> b n (h c)"
    bh, n, c = t.shape
    return t.reshape(bh // heads, heads, n, c).transpose(1, 2).reshape(bh // heads, n, heads * c)


def linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str, eps: float = 1e-6) -> torch.Tensor:
    """SLA core on (BH, N, d): `z_i * q_i (sum_j k_j v_j^T)` with `z_i = 1/(q_i . sum_j k_j + eps)`."""
    z = 1.0 / (q @ k.sum(dim=1, keepdim=True).transpose(1, 2) + eps)  # (BH, N, 1)
    if order == "kv_first":
        out = q @ (k.transpose(1, 2) @ v)
    else:
        out = (q @ k.transpose(1, 2)) @ v
    return out * z


class SimplifiedLinearAttention(nn.Module):
    """SLAB's SLA (keys `qkv`, `proj`, `dwc`, `positional_encoding`).

    ReLU kernel on q and k (+ positional encoding on k), normalized linear attention per head, plus a
    depth-wise conv (shared across heads) on v laid out as the token grid. `num_tokens` fixes the
    positional-encoding length (the window or image token count).
    """

    def __init__(self, dim: int, num_heads: int, num_tokens: int, qkv_bias: bool = True,
                 kernel_size: int = 5, attn_order: str = "auto", **_unused):
        super().__init__()
        self.dim, self.num_heads = dim, num_heads
        self.head_dim = dim // num_heads
        self.num_tokens = num_tokens
        self.grid = None  # (h, w) of the tokens where the caller passes no `hw` (None: a square grid)
        self.attn_order = attn_order
        resolve_order(attn_order, "kv_first")  # validate early
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.dwc = nn.Conv2d(self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2,
                             groups=self.head_dim)
        self.positional_encoding = nn.Parameter(torch.zeros(1, num_tokens, dim))

    def order_for(self, n: int) -> str:
        d = self.head_dim
        return resolve_order(self.attn_order, sla_rule(n, n, d, d))

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, c).unbind(2)
        k = k + self.positional_encoding
        q, k = F.relu(q), F.relu(k)
        h = self.num_heads
        q, k, v = _split_heads(q, h), _split_heads(k, h), _split_heads(v, h)
        # The official DeiT/Swin code computes this part in fp32 under autocast(enabled=False);
        # float64 stays float64 (the equivalence gate runs in fp64).
        dt = torch.promote_types(v.dtype, torch.float32)
        out = linear_attention(q.to(dt), k.to(dt), v.to(dt), self.order_for(n)).to(v.dtype)
        hh, ww = hw if hw is not None else self.grid or (int(n ** 0.5),) * 2
        fmap = v.reshape(b * h, hh, ww, self.head_dim).permute(0, 3, 1, 2)
        out = out + self.dwc(fmap).flatten(2).transpose(1, 2)
        return self.proj(_merge_heads(out, h))


ATTN_WEIGHTS = ("l2", "softmax")


class EfficientAdditiveAttention(nn.Module):
    """SwiftFormer's additive attention (keys `to_query`, `to_key`, `w_g`, `Proj`, `final`).

    q, k l2-normalized per token; alpha = (q . w_g) * D^-1/2; global query g = sum_n alpha'_n q_n;
    out = final(Proj(g * k) + q). `weights` says what alpha' is:
    - "l2" (the current official code): alpha l2-normalized over the tokens;
    - "softmax" (the first official release, and the Hugging Face transformers port to this day): a softmax over
      alpha's last axis, which has size 1, so every weight is exactly 1 and g = sum_n q_n (w_g has no effect).
    """

    def __init__(self, in_dims: int = 512, token_dim: int = 256, num_heads: int = 1, weights: str = "l2"):
        super().__init__()
        if weights not in ATTN_WEIGHTS:
            raise ValueError(f"attn_weights must be one of {ATTN_WEIGHTS}; got {weights!r}")
        self.weights = weights
        self.to_query = nn.Linear(in_dims, token_dim * num_heads)
        self.to_key = nn.Linear(in_dims, token_dim * num_heads)
        self.w_g = nn.Parameter(torch.randn(token_dim * num_heads, 1))
        self.scale_factor = token_dim ** -0.5
        self.Proj = nn.Linear(token_dim * num_heads, token_dim * num_heads)
        self.final = nn.Linear(token_dim * num_heads, token_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        query = F.normalize(self.to_query(x), dim=-1)
        key = F.normalize(self.to_key(x), dim=-1)
        a = (query @ self.w_g) * self.scale_factor
        a = a.softmax(dim=-1) if self.weights == "softmax" else F.normalize(a, dim=1)
        g = torch.sum(a * query, dim=1, keepdim=True)  # (B, 1, D), broadcast over tokens
        return self.final(self.Proj(g * key) + query)


def l1_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, order: str) -> torch.Tensor:
    """SimA core on (..., N, d) with q, k already l1-normalized over tokens."""
    if order == "qk_first":
        return (q @ k.transpose(-2, -1)) @ v
    return q @ (k.transpose(-2, -1) @ v)


class SimAAttention(nn.Module):
    """SimA: q, k l1-normalized along the token axis (per batch, head, channel), no softmax (keys `qkv`, `proj`)."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_order: str = "auto",
                 eps: float = 1e-12, **_unused):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.attn_order = attn_order
        self.eps = eps
        resolve_order(attn_order, "kv_first")
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def order_for(self, n: int) -> str:
        return resolve_order(self.attn_order, sima_rule(n, self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q = F.normalize(q, p=1, dim=-2, eps=self.eps)
        k = F.normalize(k, p=1, dim=-2, eps=self.eps)
        out = l1_attention(q, k, v, self.order_for(n))
        return self.proj(out.transpose(1, 2).reshape(b, n, c))
