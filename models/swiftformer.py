"""SwiftFormer (ICCV 2023) in the official state_dict layout (Amshaker/SwiftFormer `models/swiftformer.py`).

Official checkpoints (`{'model': sd}`) load with `strict=True` and no remapping: `patch_embed` is the
Sequential stem (indices 0-5), `network` is [stage0, Embedding, stage1, Embedding, stage2, Embedding, stage3],
each stage a Sequential of ConvEncoders ending in `vit_num` SwiftFormerEncoders, then `norm`, `head`,
`dist_head`. The attention uses the current official math (alpha l2-normalized over tokens, not softmax).
timm's port names the same weights differently (`stem`, `stages.i.blocks`, ...): `TIMM_NAMES` below maps them
back, registered with the family like timm's own `checkpoint_filter_fn`; Hugging Face transformers' port
(`swiftformer.encoder.network.i.blocks.j`, ...) is mapped in models/swiftformer_hf.py.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Mapping

import torch
import torch.nn as nn

from ..errors import VitedgeError
from .features import Tap
from .layers import DropPath, EfficientAdditiveAttention, init_trunc_normal
from .preprocess import SWIFTFORMER_RECIPE
from .registry import Remap, register_model, register_model_module
from .swiftformer_hf import TRANSFORMERS_NAMES, TRANSFORMERS_PORT

__all__ = ["SwiftFormer", "ConvEncoder", "SwiftFormerLocalRepresentation", "SwiftFormerEncoder", "Mlp", "Embedding"]


def stem(in_chs: int, out_chs: int) -> nn.Sequential:
    """Two conv3x3-s2 + BN + ReLU (keys `patch_embed.{0,1,3,4}`)."""
    return nn.Sequential(
        nn.Conv2d(in_chs, out_chs // 2, kernel_size=3, stride=2, padding=1),
        nn.BatchNorm2d(out_chs // 2),
        nn.ReLU(),
        nn.Conv2d(out_chs // 2, out_chs, kernel_size=3, stride=2, padding=1),
        nn.BatchNorm2d(out_chs),
        nn.ReLU(),
    )


class Embedding(nn.Module):
    """Downsampling between stages: conv (3x3 s2 p1 in every released variant) + BN."""

    def __init__(self, patch_size: int = 16, stride: int = 16, padding: int = 0, in_chans: int = 3,
                 embed_dim: int = 768, norm_layer=nn.BatchNorm2d):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=stride, padding=padding)
        self.norm = norm_layer(embed_dim) if norm_layer else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


class ConvEncoder(nn.Module):
    """`x + layer_scale * pwconv2(GELU(pwconv1(BN(dwconv3x3(x)))))`."""

    def __init__(self, dim: int, hidden_dim: int = 64, kernel_size: int = 3, drop_path: float = 0.0,
                 use_layer_scale: bool = True):
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=kernel_size, padding=kernel_size // 2, groups=dim)
        self.norm = nn.BatchNorm2d(dim)
        self.pwconv1 = nn.Conv2d(dim, hidden_dim, kernel_size=1)
        self.act = nn.GELU()
        self.pwconv2 = nn.Conv2d(hidden_dim, dim, kernel_size=1)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.use_layer_scale = use_layer_scale
        if use_layer_scale:
            self.layer_scale = nn.Parameter(torch.ones(dim, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.pwconv2(self.act(self.pwconv1(self.norm(self.dwconv(x)))))
        if self.use_layer_scale:
            y = self.layer_scale * y
        return x + self.drop_path(y)


class SwiftFormerLocalRepresentation(ConvEncoder):
    """The encoder's local branch: a ConvEncoder whose pointwise convs keep the width (C -> C -> C)."""

    def __init__(self, dim: int, kernel_size: int = 3, drop_path: float = 0.0, use_layer_scale: bool = True):
        super().__init__(dim, hidden_dim=dim, kernel_size=kernel_size, drop_path=drop_path,
                         use_layer_scale=use_layer_scale)


class Mlp(nn.Module):
    """`fc2(GELU(fc1(BN(x))))` with 1x1 convs; the BN (`norm1`) comes before fc1."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer=nn.GELU, drop: float = 0.0):
        super().__init__()
        out_features = out_features or in_features
        hidden_features = hidden_features or in_features
        self.norm1 = nn.BatchNorm2d(in_features)
        self.fc1 = nn.Conv2d(in_features, hidden_features, 1)
        self.act = act_layer()
        self.fc2 = nn.Conv2d(hidden_features, out_features, 1)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(self.norm1(x))))
        return self.drop(self.fc2(x))


class SwiftFormerEncoder(nn.Module):
    """LocalRep, then `x + ls1 * Attn(tokens)` (tokens = NHWC rows), then `x + ls2 * Mlp(x)`."""

    def __init__(self, dim: int, mlp_ratio: float = 4.0, act_layer=nn.GELU, drop: float = 0.0,
                 drop_path: float = 0.0, use_layer_scale: bool = True, layer_scale_init_value: float = 1e-5,
                 attn_weights: str = "l2"):
        super().__init__()
        # The official code hard-codes the local branch's layer scale and its zero drop path.
        self.local_representation = SwiftFormerLocalRepresentation(dim=dim, kernel_size=3, drop_path=0.0,
                                                                   use_layer_scale=True)
        self.attn = EfficientAdditiveAttention(in_dims=dim, token_dim=dim, num_heads=1, weights=attn_weights)
        self.linear = Mlp(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer, drop=drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.use_layer_scale = use_layer_scale
        if use_layer_scale:
            self.layer_scale_1 = nn.Parameter(layer_scale_init_value * torch.ones(dim, 1, 1))
            self.layer_scale_2 = nn.Parameter(layer_scale_init_value * torch.ones(dim, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.local_representation(x)
        b, c, h, w = x.shape
        a = self.attn(x.permute(0, 2, 3, 1).reshape(b, h * w, c)).reshape(b, h, w, c).permute(0, 3, 1, 2)
        x = x + self.drop_path(self.layer_scale_1 * a if self.use_layer_scale else a)
        m = self.linear(x)
        return x + self.drop_path(self.layer_scale_2 * m if self.use_layer_scale else m)


def Stage(dim: int, index: int, layers: list[int], mlp_ratio: float = 4.0, act_layer=nn.GELU,
          drop_rate: float = 0.0, drop_path_rate: float = 0.0, use_layer_scale: bool = True,
          layer_scale_init_value: float = 1e-5, vit_num: int = 1, attn_weights: str = "l2") -> nn.Sequential:
    """The official stage builder: the last `vit_num` blocks are SwiftFormerEncoders, the rest ConvEncoders.

    As in the official code only the encoders receive the drop-path rate (ConvEncoders get 0), and
    `drop_rate` is accepted but not passed on (the Mlp dropout stays 0).
    """
    blocks = []
    for block_idx in range(layers[index]):
        block_dpr = drop_path_rate * (block_idx + sum(layers[:index])) / max(sum(layers) - 1, 1)
        if layers[index] - block_idx <= vit_num:
            blocks.append(SwiftFormerEncoder(dim, mlp_ratio=mlp_ratio, act_layer=act_layer, drop_path=block_dpr,
                                             use_layer_scale=use_layer_scale,
                                             layer_scale_init_value=layer_scale_init_value,
                                             attn_weights=attn_weights))
        else:
            blocks.append(ConvEncoder(dim=dim, hidden_dim=int(mlp_ratio * dim), kernel_size=3))
    return nn.Sequential(*blocks)


class SwiftFormer(nn.Module):
    """The classification SwiftFormer. Eval returns `(head(p) + dist_head(p)) / 2`, train the tuple of both
    heads, `distillation=False` only `head(p)`; p is the spatial mean of `norm(x)`. `attn_weights`: "l2" (the
    current official attention) or "softmax" (the first release's, kept by the transformers port: every token
    weight 1; layers.EfficientAdditiveAttention)."""

    def __init__(self, layers: list[int], embed_dims: list[int], mlp_ratios: float = 4,
                 downsamples: list[bool] | None = None, act_layer=nn.GELU, num_classes: int = 1000,
                 down_patch_size: int = 3, down_stride: int = 2, down_pad: int = 1, drop_rate: float = 0.0,
                 drop_path_rate: float = 0.0, use_layer_scale: bool = True, layer_scale_init_value: float = 1e-5,
                 vit_num: int = 1, distillation: bool = True, attn_weights: str = "l2"):
        super().__init__()
        if len(layers) != len(embed_dims) or not layers:
            raise VitedgeError(f"layers ({len(layers)} stages) and embed_dims ({len(embed_dims)} widths) must have "
                               "the same, non-zero length: give one width per stage")
        downsamples = downsamples if downsamples is not None else [True] * len(layers)
        self.num_classes = num_classes
        self.dist = distillation
        self.patch_embed = stem(3, embed_dims[0])
        network = []
        for i in range(len(layers)):
            network.append(Stage(embed_dims[i], i, layers, mlp_ratio=mlp_ratios, act_layer=act_layer,
                                 drop_rate=drop_rate, drop_path_rate=drop_path_rate,
                                 use_layer_scale=use_layer_scale, layer_scale_init_value=layer_scale_init_value,
                                 vit_num=vit_num, attn_weights=attn_weights))
            if i >= len(layers) - 1:
                break
            if downsamples[i] or embed_dims[i] != embed_dims[i + 1]:
                network.append(Embedding(patch_size=down_patch_size, stride=down_stride, padding=down_pad,
                                         in_chans=embed_dims[i], embed_dim=embed_dims[i + 1]))
        self.network = nn.ModuleList(network)
        self.norm = nn.BatchNorm2d(embed_dims[-1])
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        if distillation:
            self.dist_head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        # As the official code: every Conv2d/Linear gets trunc_normal(0.02) and a zero bias; `w_g` keeps randn.
        init_trunc_normal(self, std=0.02)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for block in self.network:
            x = block(x)
        return self.norm(x)

    classifier_modules = ("norm", "head", "dist_head")   # what a detection checkpoint does not hold

    def feature_info(self) -> list[Tap]:
        return swiftformer_taps(self.network)

    def forward_intermediates(self, x: torch.Tensor, indices) -> list[torch.Tensor]:
        return swiftformer_intermediates(self.patch_embed, self.network, x, indices)

    def forward(self, x: torch.Tensor):
        p = self.forward_features(x).flatten(2).mean(-1)
        if not self.dist:
            return self.head(p)
        out = self.head(p), self.dist_head(p)
        return out if self.training else (out[0] + out[1]) / 2


def swiftformer_taps(network: nn.ModuleList) -> list[Tap]:
    """The official `fork_feat` outputs: after every stage (`network` 0, 2, 4, 6), each through its BatchNorm2d
    `norm{i}` (stride 4, 8, 16, 32); the train-form and the deploy-form share it (the same `network` indices)."""
    taps, stride = [], 4
    for i, block in enumerate(network):
        if i and not isinstance(network[i - 1], nn.Sequential):  # an Embedding (downsample) came before
            stride *= 2
        if isinstance(block, nn.Sequential):
            taps.append(Tap(i, stride, _width(block), nn.BatchNorm2d))
    return taps


def _width(stage: nn.Sequential) -> int:
    return next(m.in_channels for m in stage.modules() if isinstance(m, nn.Conv2d))  # its first conv reads C


def swiftformer_intermediates(patch_embed: nn.Module, network: nn.ModuleList, x: torch.Tensor,
                              indices) -> list[torch.Tensor]:
    """The stage outputs at `indices` (positions in `swiftformer_taps`), NCHW; stops after the last one."""
    stages = [i for i, block in enumerate(network) if isinstance(block, nn.Sequential)]
    wanted = [stages[i] for i in indices]
    x, outs = patch_embed(x), []
    for i, block in enumerate(network[:max(wanted) + 1]):
        x = block(x)
        if i in wanted:
            outs.append(x)
    return outs


_COMMON = dict(default_imgsz=224, stride=32, downsamples=[True, True, True, True], vit_num=1)


@register_model("swiftformer_xs", "swiftformer", layers=[3, 3, 6, 4], embed_dims=[48, 56, 112, 220], **_COMMON)
def swiftformer_xs(**kwargs) -> SwiftFormer:
    return SwiftFormer(**kwargs)


@register_model("swiftformer_s", "swiftformer", layers=[3, 3, 9, 6], embed_dims=[48, 64, 168, 224], **_COMMON)
def swiftformer_s(**kwargs) -> SwiftFormer:
    return SwiftFormer(**kwargs)


@register_model("swiftformer_l1", "swiftformer", layers=[4, 3, 10, 5], embed_dims=[48, 96, 192, 384], **_COMMON)
def swiftformer_l1(**kwargs) -> SwiftFormer:
    return SwiftFormer(**kwargs)


@register_model("swiftformer_l3", "swiftformer", layers=[4, 4, 12, 6], embed_dims=[64, 128, 320, 512], **_COMMON)
def swiftformer_l3(**kwargs) -> SwiftFormer:
    return SwiftFormer(**kwargs)


# ---- timm's key names (checkpoint remap) -------------------------------------------------------------

def _timm_key(k: str) -> str:
    # Inverse of timm's checkpoint_filter_fn (timm 1.0.31 models/swiftformer.py).
    if k.startswith("stem."):
        k = "patch_embed." + k[len("stem."):]
    elif k.startswith("head_dist."):
        k = "dist_head." + k[len("head_dist."):]
    m = re.match(r"stages\.(\d+)\.(blocks|downsample)\.(.*)", k)
    if m:
        i, rest = int(m[1]), m[3]
        k = f"network.{2 * i}.{rest}" if m[2] == "blocks" else f"network.{2 * i - 1}.{rest}"
    k = k.replace(".attn.proj.", ".attn.Proj.")
    return re.sub(r"\.(layer_scale(?:_[12])?)\.gamma$", r".\1", k)


def _is_timm_layout(ck: set, model: set) -> bool:
    return (any(k.startswith(("stem.", "stages.")) for k in ck) and "patch_embed.0.weight" in model
            and any(k.startswith("network.") for k in model))


def _from_timm(sd: Mapping, model_sd: Mapping) -> tuple[OrderedDict, str]:
    out = OrderedDict((_timm_key(k), v) for k, v in sd.items())
    return out, ("timm SwiftFormer key names -> official (stem->patch_embed, stages.i.blocks->network.2i, "
                 "stages.i.downsample->network.2i-1, head_dist->dist_head, attn.proj->attn.Proj, "
                 "*.gamma->layer_scale*)")


TIMM_NAMES = Remap("timm_swiftformer", _is_timm_layout, _from_timm)
register_model_module(__name__, plan="swiftformer", remaps=(TIMM_NAMES, TRANSFORMERS_NAMES),
                      recipe=SWIFTFORMER_RECIPE, ports=(TRANSFORMERS_PORT,))
