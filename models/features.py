"""Dense prediction: a backbone's multi-scale feature maps as the model's outputs (`--features`), the timm way.

A family's model class says where its feature maps are (`feature_info()`: one `Tap` per output it can give, in
stage order, with the stride, the channels and the per-output module its official dense-prediction code puts there:
a detection norm, or XCiT's resampling `fpn{i}`) and computes them (`forward_intermediates(x, indices)`: NCHW maps,
in order). `FeatureMaps` wraps such a backbone: its outputs are the chosen taps' maps, each through its own
per-output module (named as the official code names it: `norm{i}`, `fpn{i}`), named for their stride (`feat_s4`,
...). The fold plan of the wrapper (exporter/reparam/features.py) folds
the backbone with its family's plan and each detection norm into a per-channel affine.

Every module with several outputs (a FeatureMaps, or a user's own head on a backbone) is judged output by output:
`pack` lays its outputs side by side per sample (one row per sample, each output a block of columns) so that the
parity ladder's arrays stay (samples, values), and `output_columns` says which columns belong to which output.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn as nn

from ..errors import VitedgeError
from .outputs import LOGITS, OutputSpec, feature_name

@dataclass(frozen=True)
class Tap:
    """One feature map a backbone can give: its stride, channels and the per-output module of its official code."""
    index: int                        # the official out index (SwiftFormer: the `network` index 0, 2, 4, 6)
    stride: int
    channels: int
    norm: Callable[[int], nn.Module] | None = None   # builds the per-output module (None: the map as is)
    module: str | None = None         # its attribute (and checkpoint key) name; None: `norm{index}`
    side: Callable[[int], int] | None = None  # input side -> map side, where not ceil(side / stride)

    @property
    def attr(self) -> str:
        return self.module or f"norm{self.index}"

    def map_side(self, n: int) -> int:
        return self.side(n) if self.side is not None else -(-n // self.stride)


def token_map(tokens: torch.Tensor, hw, patch: int) -> torch.Tensor:
    """The patch tokens of `tokens` as an NCHW map: (B, [1+]N, C) token-first, or (B, C, [1+]N, 1) / (B, C, H, W)
    channel-first (the deploy-forms' layouts); a leading class token (one more than the grid) is dropped. `hw` is
    the input size, `patch` the token grid's stride (the grid: ceil(H / patch) x ceil(W / patch))."""
    gh, gw = -(-int(hw[0]) // patch), -(-int(hw[1]) // patch)
    if tokens.dim() == 3:  # (B, N, C)
        tokens = tokens[:, tokens.shape[1] - gh * gw:].transpose(1, 2)
    else:  # (B, C, N, 1) or (B, C, H, W)
        tokens = tokens.flatten(2)
        tokens = tokens[:, :, tokens.shape[2] - gh * gw:]
    return tokens.reshape(tokens.shape[0], -1, gh, gw)


class ChannelsLayerNorm(nn.LayerNorm):
    """nn.LayerNorm over the channels of an NCHW map (the official Swin detection backbones' `norm{i}`, applied
    to the tokens before they become a map); the same parameters and keys as nn.LayerNorm."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class FeatureMaps(nn.Module):
    """`backbone`'s feature maps at `indices` (positions in its `feature_info()`; None: the family's official
    detection outputs, `default_feature_indices`), each through its detection norm; returns a tuple of NCHW maps in
    stage order. The classifier's own final norm and head stay in `backbone` (unused), so a classification
    checkpoint still loads into it."""

    def __init__(self, backbone: nn.Module, indices: Sequence[int] | None = None):
        super().__init__()
        taps = feature_taps(backbone)
        chosen = default_feature_indices(backbone) if indices is None else tuple(int(i) for i in indices)
        bad = [i for i in chosen if not 0 <= i < len(taps)]
        if bad or not chosen or len(set(chosen)) != len(chosen):
            raise VitedgeError(f"--features indices must be distinct positions 0..{len(taps) - 1} of "
                               f"{type(backbone).__name__}'s {len(taps)} feature maps (strides "
                               f"{', '.join(str(t.stride) for t in taps)}); got {list(chosen) or 'none'}")
        self.backbone = backbone
        self.indices = tuple(sorted(chosen))
        self.taps = tuple(taps[i] for i in self.indices)
        for t in self.taps:
            if t.norm is not None:
                self.add_module(t.attr, t.norm(t.channels))
        for attr in ("vitedge_name", "vitedge_spec", "vitedge_overrides", "vitedge_recipe"):
            if hasattr(backbone, attr):
                setattr(self, attr, getattr(backbone, attr))

    def names(self) -> tuple[str, ...]:
        return tuple(feature_name(t.stride) for t in self.taps)

    def specs(self, hw: tuple[int, int]) -> tuple[OutputSpec, ...]:
        """The outputs at input size `hw` (H, W): channels, the map's size (ceil(H / stride) unless the tap says
        otherwise) and stride."""
        return tuple(OutputSpec(feature_name(t.stride), (t.channels, t.map_side(hw[0]), t.map_side(hw[1])),
                                t.stride) for t in self.taps)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        maps = self.backbone.forward_intermediates(x, self.indices)
        return tuple(getattr(self, t.attr, nn.Identity())(m) for t, m in zip(self.taps, maps))


@torch.no_grad()
def make_trained_like_norms(model: FeatureMaps, seed: int = 0, imgsz: int | None = None) -> FeatureMaps:
    """Seeded trained-like per-output modules (the demo weights' recipe, models/trained_like.py): each BatchNorm's
    statistics set from what it sees on the calibration batch of synthetic images (the tap's map, or inside an
    `fpn{i}` the map its layers before it give), then perturbed (mean + N(0, 0.1) std, var x U(0.5, 1.5)) so they
    are no batch's; weights 1 + N(0, 0.1), biases N(0, 0.05) (a LayerNorm's too)."""
    from .registry import default_imgsz
    from .synthetic import synthetic_batch
    from .trained_like import CALIBRATION_KINDS, CALIBRATION_SEED

    g = torch.Generator().manual_seed(seed + 1)
    x = synthetic_batch(CALIBRATION_KINDS, imgsz or default_imgsz(model.backbone), CALIBRATION_SEED)
    maps = model.backbone.eval().forward_intermediates(x.to(next(model.parameters()).dtype), model.indices)
    for t, m in zip(model.taps, maps):
        module = getattr(model, t.attr, None)
        if module is None:
            continue
        for norm in module.modules():
            if isinstance(norm, nn.LayerNorm):  # no statistics to set: its affine only
                norm.weight.copy_(1 + 0.1 * torch.randn(norm.weight.shape, generator=g))
                norm.bias.copy_(0.05 * torch.randn(norm.bias.shape, generator=g))
            if not isinstance(norm, nn.modules.batchnorm._BatchNorm):
                continue
            seen = []
            hook = norm.register_forward_pre_hook(lambda _, args: seen.append(args[0]))
            module.eval()(m)
            hook.remove()
            mean, std = seen[0].mean(dim=(0, 2, 3)), seen[0].std(dim=(0, 2, 3)).clamp_min(1e-3)
            n = mean.numel()
            norm.running_mean.copy_(mean + 0.1 * std * torch.randn(n, generator=g))
            norm.running_var.copy_(std ** 2 * (0.5 + torch.rand(n, generator=g)))
            norm.weight.copy_(1 + 0.1 * torch.randn(n, generator=g))
            norm.bias.copy_(0.05 * torch.randn(n, generator=g))
    return model


def feature_taps(backbone: nn.Module) -> list[Tap]:
    info = getattr(backbone, "feature_info", None)
    if info is None or not hasattr(backbone, "forward_intermediates"):
        raise VitedgeError(f"--features: {type(backbone).__name__} does not give feature maps (no feature_info and "
                           "forward_intermediates): build the backbone with vitedge.create_model")
    return list(info())


def default_feature_indices(backbone: nn.Module) -> tuple[int, ...]:
    """The official detection outputs of `backbone`'s family (its `default_features`, else every tap)."""
    return tuple(getattr(backbone, "default_features", range(len(feature_taps(backbone)))))


# ---- several outputs, side by side per sample ------------------------------------------------------------

def as_outputs(out) -> tuple[torch.Tensor, ...]:
    """A module's output as a tuple of tensors (a tensor, a tuple / list, or a dict in its order)."""
    if isinstance(out, torch.Tensor):
        return (out,)
    if isinstance(out, dict):
        out = tuple(out.values())
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return tuple(out)
    raise VitedgeError(f"a model's output must be a tensor, or a tuple, list or dict of tensors; got "
                       f"{type(out).__name__}")


def pack(out) -> torch.Tensor:
    """One (batch, values) tensor from a module's output(s): each output flattened per sample, side by side (a
    classifier's (batch, classes) logits are returned as they are)."""
    outs = as_outputs(out)
    if len(outs) == 1:
        return outs[0] if outs[0].dim() == 2 else outs[0].reshape(outs[0].shape[0], -1)
    return torch.cat([o.reshape(o.shape[0], -1) for o in outs], dim=1)


def output_names(model: nn.Module, count: int) -> tuple[str, ...]:
    """The exported names of `model`'s `count` outputs: a FeatureMaps' stride names, a user module's
    `vitedge_output_names`, else `logits` for one output and `output{i}` for several."""
    names = model.names() if isinstance(model, FeatureMaps) else getattr(model, "vitedge_output_names", None)
    if names is None:
        names = (LOGITS,) if count == 1 else tuple(f"output{i}" for i in range(count))
    names = tuple(str(n) for n in names)
    if len(names) != count or len(set(names)) != count:
        raise VitedgeError(f"the model has {count} outputs but names {list(names)}: give one distinct name per "
                           "output (vitedge_output_names)")
    return names


@torch.no_grad()
def output_specs(model: nn.Module, hw: tuple[int, int]) -> tuple[OutputSpec, ...]:
    """Every output of `model` at input size `hw` (H, W): a FeatureMaps says its own; another module is run once
    on a zero image (its outputs' shapes follow its input)."""
    if isinstance(model, FeatureMaps):
        return model.specs(hw)
    p = next((p for p in model.parameters() if p.is_floating_point()), None)
    x = torch.zeros(1, 3, *hw, dtype=p.dtype if p is not None else torch.float32)
    outs = as_outputs(model.eval()(x))
    strides = getattr(model, "vitedge_output_strides", None) or (None,) * len(outs)
    return tuple(OutputSpec(n, tuple(o.shape[1:]), s)
                 for n, o, s in zip(output_names(model, len(outs)), outs, strides))
