"""SLAB's DeiT backbones in the official state_dict layouts (MODELS.md §2.1-2.3).

- `SlabDeiT` (`classification/models/slab_deit.py`): simplified linear attention (SLA), every norm a
  progressive LinearNorm(LN -> RepBN), no CLS token in the forward (the `cls_token` key exists, unused),
  `pos_embed` (1, N, C), mean pooling. The SLA positional encodings cover the patch grid, so the model is
  locked to its `img_size`.
- `PRepBNDeiT` (`classification/models/deit.py`): softmax MHSA with a CLS token, `pos_embed` (1, 1+N, C),
  head on the CLS token; the norm is RepBN (tiny) or LinearNorm(step 300000) (small), as released.

Keys: `cls_token`, `pos_embed`, `patch_embed.proj`, `blocks.i.{norm1, attn, norm2, mlp.{fc1, fc2}}`, `norm`,
`head`. `norm_layer` takes a callable or a string (see `slab_norm_layer`).

SLAB releases both norm layouts (LinearNorm `X.norm1.*`/`X.norm2.*` and plain RepBN `X.*`); the two remaps at
the end load either into a model built with the other, registered with the family (for every model whose keys
show the other layout).

Length: one family, two official models over one shared base (its size resampling and feature maps included).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from functools import partial
from typing import Callable, Mapping

import torch
import torch.nn as nn

from ..errors import VitedgeError
from .layers import DropPath, LinearNorm, Mlp, RepBN, SimplifiedLinearAttention, init_vit_weights
from .layers.resample import Resized
from .preprocess import SLAB_RECIPE
from .features import Tap, token_map
from .registry import Remap, register_model, register_model_module

NormFactory = Callable[[int], nn.Module]

# Short names for the norms the released SLAB models use.
NORM_ALIASES = {
    "linear_repbn": "LinearNorm(norm1=LayerNorm(eps=1e-6), norm2=RepBN, step=60000)",
    "repbn": "RepBN",
    "layernorm": "LayerNorm(eps=1e-6)",
}
_CALL = re.compile(r"^\s*(\w+)\s*(?:\((.*)\))?\s*$", re.S)


def _split_args(text: str) -> dict[str, str]:
    """`a=1, b=F(x=2)` -> {'a': '1', 'b': 'F(x=2)'} (commas inside parentheses kept)."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    out = {}
    for p in parts:
        key, eq, val = p.partition("=")
        if not eq:
            raise ValueError(f"expected key=value, got {p.strip()!r}")
        out[key.strip()] = val.strip()
    return out


def _parse_norm(text: str) -> NormFactory:
    m = _CALL.match(text)
    if not m:
        raise ValueError(f"cannot parse {text!r}")
    name, args = m.group(1), _split_args(m.group(2) or "")
    if name == "LayerNorm":
        return partial(nn.LayerNorm, **{k: float(v) for k, v in args.items()})
    if name == "RepBN":
        if args:
            raise ValueError("RepBN takes no arguments here")
        return RepBN
    if name == "LinearNorm":
        kw = {}
        for k, v in args.items():
            if k in ("norm1", "norm2"):
                kw[k] = _parse_norm(v)
            elif k in ("step", "warm"):
                kw[k] = int(float(v))
            elif k == "r0":
                kw[k] = float(v)
            else:
                raise ValueError(f"unknown LinearNorm argument {k!r}")
        return partial(LinearNorm, **kw)
    raise ValueError(f"unknown norm {name!r}")


def slab_norm_layer(norm_layer: str | NormFactory | None, default: str = "layernorm") -> NormFactory:
    """A `dim -> nn.Module` norm factory from a callable, an alias (`linear_repbn`, `repbn`, `layernorm`) or the
    golden fixtures' spelling, e.g. 'LinearNorm(norm1=LayerNorm(eps=1e-6), norm2=RepBN, step=60000)' or 'RepBN'."""
    if norm_layer is None:
        norm_layer = default
    if callable(norm_layer):
        return norm_layer
    text = NORM_ALIASES.get(str(norm_layer).strip().lower(), str(norm_layer))
    try:
        return _parse_norm(text)
    except ValueError as e:
        raise VitedgeError(
            f"bad norm_layer {norm_layer!r} ({e}): use {', '.join(NORM_ALIASES)} or e.g. "
            f"'LinearNorm(norm1=LayerNorm(eps=1e-6), norm2=RepBN, step=60000)'") from None


class PatchEmbed(nn.Module):
    """Non-overlapping patches -> tokens (B, N, C), row-major over the grid (key `proj`)."""

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, embed_dim: int = 768):
        super().__init__()
        if img_size % patch_size:
            raise VitedgeError(f"img_size {img_size} is not a multiple of patch_size {patch_size}: pick a multiple")
        self.grid = (img_size // patch_size,) * 2
        self.num_patches = self.grid[0] * self.grid[1]
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Standard softmax multi-head self-attention (keys `qkv`, `proj`)."""
    trained_like_qk_scale = 0.5  # test weights: softmax neither flat nor one-hot (golden recipe)


    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, attn_drop: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = self.attn_drop(((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class _GELUDrop(nn.Module):
    """GELU then dropout: the official Mlp's hidden dropout, without adding state_dict keys."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.act, self.drop = nn.GELU(), nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.act(x))


class Block(nn.Module):
    """Pre-norm transformer block: `x + attn(norm1 x)`, `x + mlp(norm2 x)` (keys `norm1`, `attn`, `norm2`, `mlp`)."""

    def __init__(self, dim: int, attn: nn.Module, norm_layer: NormFactory, mlp_ratio: float = 4.0,
                 drop: float = 0.0, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = attn
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=partial(_GELUDrop, drop))
        self.drop = nn.Dropout(drop)  # the official proj_drop (after attn.proj) and Mlp output dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.drop(self.attn(self.norm1(x))))
        return x + self.drop_path(self.drop(self.mlp(self.norm2(x))))


class DeiTBase(nn.Module):
    """What both SLAB DeiT classes share: patch embed, tokens, blocks, final norm, head, init."""

    num_prefix_tokens = 0  # tokens in front of the patches in the forward (CLS)

    def __init__(self, img_size: int = 224, patch_size: int = 16, in_chans: int = 3, num_classes: int = 1000,
                 embed_dim: int = 768, depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, drop_rate: float = 0.0, attn_drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, norm_layer: str | NormFactory | None = None, **attn_kwargs):
        super().__init__()
        if embed_dim % num_heads:
            raise VitedgeError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: change either")
        self.num_classes = num_classes
        self.embed_dim = self.num_features = embed_dim
        self.num_heads = num_heads
        self.img_size = img_size
        norm = slab_norm_layer(norm_layer)
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, embed_dim)
        n = self.patch_embed.num_patches
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, self.num_prefix_tokens + n, embed_dim))
        self.pos_drop = nn.Dropout(drop_rate)
        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth decay rule
        self.blocks = nn.Sequential(*[
            Block(embed_dim, self._make_attn(embed_dim, num_heads, n, qkv_bias, attn_drop_rate, **attn_kwargs),
                  norm, mlp_ratio, drop_rate, dpr[i])
            for i in range(depth)])
        self.norm = norm(embed_dim)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _make_attn(self, dim, num_heads, num_tokens, qkv_bias, attn_drop, **kw) -> nn.Module:
        raise NotImplementedError

    def _init_weights(self) -> None:
        init_vit_weights(self, self.pos_embed, self.cls_token)  # official DeiT init; convs default

    def set_input_size(self, hw: tuple[int, int]) -> list[dict]:
        """Run at H x W (multiples of the patch): `pos_embed` (prefix tokens kept) and each SLA block's positional
        encoding resampled from the pretrained 14x14 grid, timm's `resample_abs_pos_embed` (docs/models.md)."""
        p = self.patch_embed.proj.kernel_size[0]
        native = (self.img_size // p,) * 2
        grid = (hw[0] // p, hw[1] // p)
        r = Resized(self)
        r.table(self, "pos_embed", "pos_embed", native, grid, self.num_prefix_tokens)
        for i, blk in enumerate(self.blocks):
            if isinstance(blk.attn, SimplifiedLinearAttention):
                r.table(blk.attn, "positional_encoding", f"blocks.{i}.attn.positional_encoding", native, grid,
                        what="SLA positional encoding")
                blk.attn.num_tokens, blk.attn.grid = grid[0] * grid[1], grid
        self.patch_embed.grid, self.patch_embed.num_patches = grid, grid[0] * grid[1]
        self.input_hw = tuple(hw)
        return r.records

    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        want = getattr(self, "input_hw", (self.img_size, self.img_size))
        if (h, w) != tuple(want):
            raise VitedgeError(f"{type(self).__name__} is set for {want[0]}x{want[1]} inputs (its positional "
                               f"embeddings' grid); got {h}x{w}: set_input_size((H, W)) first (vitedge does, for "
                               "--imgsz)")
        return self.patch_embed(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    classifier_modules = ("norm", "head")   # what a backbone checkpoint does not need

    def feature_info(self) -> list[Tap]:
        """One map: the last block's patch tokens (stride 16), before the classifier's final norm, as timm's
        forward_intermediates gives a ViT's (the official repository has no dense-prediction code)."""
        return [Tap(0, self.patch_embed.proj.stride[0], self.embed_dim)]

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return [token_map(self.forward_features(x), x.shape[-2:], self.patch_embed.proj.stride[0])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.norm(self.forward_features(x))))


class SlabDeiT(DeiTBase):
    """SLAB-DeiT: SLA blocks over the patch tokens only, mean pooling; `cls_token` is kept (unused) for the keys.

    `attn_order` ("auto" = SLAB's FLOP rule, or "qk_first" / "kv_first") is the SLA association order.
    """

    def __init__(self, *args, norm_layer: str | NormFactory | None = "linear_repbn", attn_order: str = "auto",
                 kernel_size: int = 5, **kwargs):
        super().__init__(*args, norm_layer=norm_layer, attn_order=attn_order, kernel_size=kernel_size, **kwargs)

    def _make_attn(self, dim, num_heads, num_tokens, qkv_bias, attn_drop, attn_order="auto",
                   kernel_size=5) -> nn.Module:
        # attn_drop is unused by the official SLA (built but never applied).
        return SimplifiedLinearAttention(dim, num_heads, num_tokens=num_tokens, qkv_bias=qkv_bias,
                                         kernel_size=kernel_size, attn_order=attn_order)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.pos_drop(self._embed(x) + self.pos_embed))

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class PRepBNDeiT(DeiTBase):
    """PRepBN-DeiT: standard DeiT (softmax attention, CLS token, head on CLS) with RepBN / LinearNorm norms."""

    num_prefix_tokens = 1

    def __init__(self, *args, norm_layer: str | NormFactory | None = "repbn", **kwargs):
        super().__init__(*args, norm_layer=norm_layer, **kwargs)

    def _make_attn(self, dim, num_heads, num_tokens, qkv_bias, attn_drop) -> nn.Module:
        return Attention(dim, num_heads, qkv_bias, attn_drop)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self._embed(x)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        return self.blocks(self.pos_drop(x + self.pos_embed))

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, 0]


_SLAB_NOTE = "the 14x14 SLA positional encodings resampled bicubic to the patch grid"
_PREPBN_NOTE = "pos_embed (1+14x14) resampled bicubic to the patch grid, CLS kept"
_PREPBN_SMALL_NORM = "LinearNorm(norm1=LayerNorm(eps=1e-6), norm2=RepBN, step=300000)"
_VARIANTS = {
    # name: (class, default kwargs, sizes note); MODELS.md §2.3
    "slab_deit_tiny": (SlabDeiT, dict(embed_dim=192, depth=12, num_heads=3, norm_layer="linear_repbn"), _SLAB_NOTE),
    "slab_deit_small": (SlabDeiT, dict(embed_dim=384, depth=12, num_heads=6, norm_layer="linear_repbn"), _SLAB_NOTE),
    "prepbn_deit_tiny": (PRepBNDeiT, dict(embed_dim=192, depth=12, num_heads=3, norm_layer="RepBN"), _PREPBN_NOTE),
    # The official small PRepBN model uses LinearNorm at its default step, unlike tiny (RepBN directly).
    "prepbn_deit_small": (PRepBNDeiT, dict(embed_dim=384, depth=12, num_heads=6, norm_layer=_PREPBN_SMALL_NORM),
                          _PREPBN_NOTE),
}

for _name, (_cls, _kw, _note) in _VARIANTS.items():
    register_model(_name, "slab", stride=16, sizes_note=_note, patch_size=16, mlp_ratio=4,
                   qkv_bias=True, **_kw)(_cls)


# ---- the two SLAB norm layouts (checkpoint remaps) ----------------------------------------------------

def _join(prefix: str, rest: str) -> str:
    return f"{prefix}.{rest}" if prefix else rest


def _linearnorm_prefixes(ck: set, model: set) -> list[str]:
    """Checkpoint LinearNorm prefixes X (`X.norm2.alpha`) where the model has a plain RepBN (`X.alpha`)."""
    out = []
    for k in ck:
        if k.endswith("norm2.alpha"):
            x = k[: -len("norm2.alpha")].rstrip(".")
            if _join(x, "alpha") in model and k not in model:
                out.append(x)
    return sorted(out)


def _repbn_prefixes(ck: set, model: set) -> list[str]:
    """Checkpoint RepBN prefixes X (`X.alpha`) where the model has a LinearNorm (`X.norm2.alpha`)."""
    out = []
    for k in ck:
        if k.endswith("alpha") and (k == "alpha" or k.endswith(".alpha")):
            x = k[: -len("alpha")].rstrip(".")
            if _join(x, "norm2.alpha") in model and k not in model:
                out.append(x)
    return sorted(out)


def _split_norm_key(k: str, prefixes: set) -> tuple[str | None, str]:
    # Longest matching prefix first: `blocks.0.norm2` must win over `blocks.0` for `blocks.0.norm2.norm2.alpha`.
    parts = k.split(".")
    for i in range(len(parts) - 1, -1, -1):
        x = ".".join(parts[:i])
        if x in prefixes:
            return x, ".".join(parts[i:])
    return None, k


def _linearnorm_to_repbn(sd: Mapping, model_sd: Mapping) -> tuple[OrderedDict, str]:
    prefixes = set(_linearnorm_prefixes(set(sd), set(model_sd)))
    out = OrderedDict()
    for k, v in sd.items():
        x, rest = _split_norm_key(k, prefixes)
        if x is None:
            out[k] = v
        elif rest.startswith("norm2."):
            out[_join(x, rest[len("norm2."):])] = v
        # norm1.* (the LayerNorm) and the schedule counters have no place in a RepBN: dropped
    return out, (f"SLAB LinearNorm layout -> RepBN model ({len(prefixes)} norms: X.norm2.* -> X.*, "
                 "dropped X.norm1.* and X.warm/iter/total_step)")


def _repbn_to_linearnorm(sd: Mapping, model_sd: Mapping) -> tuple[OrderedDict, str]:
    prefixes = _repbn_prefixes(set(sd), set(model_sd))
    pset = set(prefixes)
    out = OrderedDict()
    for k, v in sd.items():
        x, rest = _split_norm_key(k, pset)
        out[k if x is None else _join(x, "norm2." + rest)] = v
    for x in prefixes:
        # A RepBN checkpoint is a finished schedule: eval and train both use RepBN alone (lambda = 0).
        out[_join(x, "warm")] = torch.zeros((), dtype=torch.long)
        out[_join(x, "iter")] = torch.zeros((), dtype=torch.long)
        total = model_sd[_join(x, "total_step")]
        on_meta = total.device.type == "meta"
        out[_join(x, "total_step")] = torch.zeros((), dtype=torch.long) if on_meta else total.clone()
        for k, v in model_sd.items():  # the LayerNorm keeps its init values; with lambda = 0 it is never used
            if k.startswith(_join(x, "norm1.")):
                out[k] = v.clone() if v.device.type != "meta" else v
    return out, (f"SLAB RepBN layout -> LinearNorm model ({len(prefixes)} norms: X.* -> X.norm2.*, schedule set "
                 "finished (warm=0, iter=0, total_step from the model), LayerNorm norm1 left at its init)")


NORM_LAYOUT_REMAPS = (
    Remap("slab_linearnorm_to_repbn", lambda ck, m: bool(_linearnorm_prefixes(ck, m)), _linearnorm_to_repbn),
    Remap("slab_repbn_to_linearnorm", lambda ck, m: bool(_repbn_prefixes(ck, m)), _repbn_to_linearnorm),
)
register_model_module(__name__, plan="slab_deit", remaps=NORM_LAYOUT_REMAPS, recipe=SLAB_RECIPE)
