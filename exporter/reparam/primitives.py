"""Fold primitives: pure functions on modules, each exact in real arithmetic.

The fold plans (one file per model module beside this one) are short lists of calls to these.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...errors import VitedgeError
from ...models.layers.norms import LinearNorm, RepBN


def bn_affine(bn: nn.modules.batchnorm._BatchNorm) -> tuple[torch.Tensor, torch.Tensor]:
    """Eval BatchNorm as per-channel `a * x + b`."""
    inv = torch.rsqrt(bn.running_var + bn.eps)
    a = inv if bn.weight is None else bn.weight * inv
    b = -bn.running_mean * a
    if bn.bias is not None:
        b = b + bn.bias
    return a, b


def ln_is_foldable(ln: nn.Module) -> bool:
    return False  # LayerNorm depends on the token's own statistics: never a constant affine


def _clone_with_bias(m: nn.Module) -> nn.Module:
    """A copy of a Linear/Conv with a (possibly zero) bias parameter, same dtype/device."""
    w = m.weight
    if isinstance(m, nn.Linear):
        new = nn.Linear(m.in_features, m.out_features, bias=True)
    elif isinstance(m, nn.ConvTranspose2d):  # (its positional arguments differ: output_padding)
        new = nn.ConvTranspose2d(m.in_channels, m.out_channels, m.kernel_size, stride=m.stride, padding=m.padding,
                                 output_padding=m.output_padding, groups=m.groups, bias=True, dilation=m.dilation)
    else:
        new = type(m)(m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation, m.groups,
                      bias=True, padding_mode=m.padding_mode)
    new = new.to(dtype=w.dtype, device=w.device)
    with torch.no_grad():
        new.weight.copy_(w)
        new.bias.copy_(m.bias if m.bias is not None else torch.zeros_like(new.bias))
    return new


@torch.no_grad()
def affine_after(m: nn.Module, a: torch.Tensor, b: torch.Tensor) -> nn.Module:
    """`a * m(x) + b` (per output channel) as one Linear/Conv: W' = a W, b' = a bias + b.

    Exact for any padding: the affine acts on outputs. (This is the correct patch-embed-with-bias
    fold that SLAB's own merge code gets wrong by dropping `a * bias`.)
    """
    new = _clone_with_bias(m)
    shape = (-1,) + (1,) * (new.weight.dim() - 1)
    if isinstance(m, nn.ConvTranspose2d):  # weight (in, out / groups, kh, kw): the outputs are its dim 1
        if m.groups != 1:
            raise ValueError("affine_after: a grouped transposed conv is not supported")
        shape = (1, -1, 1, 1)
    new.weight.mul_(a.reshape(shape).to(new.weight))
    new.bias.mul_(a.to(new.bias)).add_(b.to(new.bias))
    return new


@torch.no_grad()
def affine_before(m: nn.Module, a: torch.Tensor, b: torch.Tensor) -> nn.Module:
    """`m(a * x + b)` (per input channel) as one Linear or 1x1/unpadded dense Conv: W' = W diag(a), b' = bias + W b.

    Only exact when every output sees the shift `b` at every tap: Linear, or a Conv with no padding
    and groups=1. Zero-padded convs are handled by `affine_before_padded_depthwise`.
    """
    if isinstance(m, nn.Conv2d):
        if any(p != 0 for p in m.padding) or m.groups != 1:
            raise ValueError("affine_before: conv with padding or groups is not exact; use affine_before_padded_depthwise")
    new = _clone_with_bias(m)
    w = new.weight
    shape = (1, -1) + (1,) * (w.dim() - 2)
    shift = (w * b.to(w).reshape(shape)).flatten(1).sum(1)
    new.bias.add_(shift)
    w.mul_(a.to(w).reshape(shape))
    return new


@torch.no_grad()
def scale_output(m: nn.Module, s: torch.Tensor) -> nn.Module:
    """`s * m(x)` per output channel (layer scale absorption)."""
    return affine_after(m, s.reshape(-1), torch.zeros_like(s.reshape(-1)))


@torch.no_grad()
def fuse_conv_bn(conv: nn.Conv2d, bn: nn.modules.batchnorm._BatchNorm) -> nn.Conv2d:
    """`bn(conv(x))` as one conv."""
    return affine_after(conv, *bn_affine(bn))


class ChannelAffine(nn.Module):
    """An explicit per-channel `scale * x + shift` on a given axis, for what cannot fold exactly.

    The re-parameterization summary lists every instance as unfolded with its reason.
    """

    def __init__(self, scale: torch.Tensor | None, shift: torch.Tensor | None, dim: int = 1):
        super().__init__()
        self.dim = dim
        self.register_buffer("scale", None if scale is None else scale.detach().clone())
        self.register_buffer("shift", None if shift is None else shift.detach().clone())

    def _view(self, t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shape = [1] * x.dim()
        shape[self.dim] = -1
        return t.reshape(shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is not None:
            x = x * self._view(self.scale, x)
        if self.shift is not None:
            x = x + self._view(self.shift, x)
        return x


@torch.no_grad()
def affine_before_padded_depthwise(conv: nn.Conv2d, a: torch.Tensor, b: torch.Tensor,
                                   max_shift: float = 1e4) -> tuple[nn.Module, nn.Module]:
    """`conv(a * x + b)` for a zero-padded depthwise conv: the scale folds exactly; the shift does not.

    With zero padding, border outputs see `b` only at in-image taps, so `conv(b)` is spatially varying.
    Returns `(ChannelAffine(None, b / a), conv')` with `conv' = conv(diag(a) .)`, since
    `conv(a x + b) = conv'(x + b / a)`: the shift stays an explicit per-channel add before the conv (exact
    everywhere). When some `a` is 0 or `|b / a| > max_shift` (fp16 range), nothing folds:
    `(ChannelAffine(a, b), conv)`.
    """
    if conv.groups != conv.in_channels or conv.in_channels != conv.out_channels:
        raise ValueError("affine_before_padded_depthwise expects a depthwise conv")
    new = _clone_with_bias(conv)
    a, b = a.to(new.weight), b.to(new.weight)
    if bool((a == 0).any()) or float((b / a).abs().max()) > max_shift:
        return ChannelAffine(a, b, dim=1), new
    new.weight.mul_(a.reshape(-1, 1, 1, 1))
    return ChannelAffine(None, b / a, dim=1), new


@torch.no_grad()
def linear_to_conv1x1(linear: nn.Linear) -> nn.Conv2d:
    """The same Linear acting on the channel axis of an NCHW tensor, as a 1x1 conv (channels-first rewrites)."""
    w = linear.weight
    conv = nn.Conv2d(linear.in_features, linear.out_features, 1, bias=linear.bias is not None)
    conv = conv.to(dtype=w.dtype, device=w.device)
    conv.weight.copy_(w.reshape(linear.out_features, linear.in_features, 1, 1))
    if linear.bias is not None:
        conv.bias.copy_(linear.bias)
    return conv


@torch.no_grad()
def split_outputs(layer: nn.Linear | nn.Conv2d, parts: int) -> list[nn.Module]:
    """`layer` (a Linear or an ungrouped Conv2d) as `parts` layers of the same kind, each computing one equal
    slice of its outputs, in order: the same products and sums per output, so exact."""
    w, b = layer.weight, layer.bias
    out = []
    for i, wi in enumerate(w.chunk(parts)):
        if isinstance(layer, nn.Linear):
            new = nn.Linear(layer.in_features, wi.shape[0], bias=b is not None)
        else:
            new = nn.Conv2d(layer.in_channels, wi.shape[0], layer.kernel_size, layer.stride, layer.padding,
                            layer.dilation, bias=b is not None)
        new = new.to(dtype=w.dtype, device=w.device)
        new.weight.copy_(wi)
        if b is not None:
            new.bias.copy_(b.chunk(parts)[i])
        out.append(new)
    return out


@torch.no_grad()
def tile_depthwise(dwc: nn.Conv2d, times: int) -> nn.Conv2d:
    """A depthwise conv shared by `times` groups of channels (SLA's dwc, run per head on (B*h, d, H, W)) as one
    depthwise conv over all of them ((B, h*d, H, W), head-major): its weights repeated, the same taps per output."""
    c = dwc.out_channels * times
    new = nn.Conv2d(c, c, dwc.kernel_size, dwc.stride, dwc.padding, dwc.dilation, groups=c,
                    bias=dwc.bias is not None, padding_mode=dwc.padding_mode).to(dtype=dwc.weight.dtype,
                                                                                  device=dwc.weight.device)
    new.weight.copy_(dwc.weight.repeat(times, 1, 1, 1))
    if dwc.bias is not None:
        new.bias.copy_(dwc.bias.repeat(times))
    return new


def replace_module(root: nn.Module, path: str, new: nn.Module) -> None:
    """Replace the submodule at dotted `path` (ModuleList/Sequential indices allowed)."""
    parent_path, _, leaf = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    setattr(parent, leaf, new)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class PatchEmbedDeploy(nn.Module):
    """Patch-embed conv (its norm folded in; a conv stem Sequential for SimA) -> (B, N, C) tokens, row-major over
    the grid (key `proj`): the deploy-form patch embed of every token-layout family."""

    def __init__(self, proj: nn.Module):
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class PositionPlanesPatchEmbed(nn.Module):
    """`conv(x) + pos` as one conv: `conv'(cat(x, planes))` (key `proj`), tokens out as (B, N, C) or, with
    `grid_out`, as the conv's own (B, C, H, W) map.

    `planes` are constant 0/1 input channels, k = ceil(N / (ph pw)) of them: token t's patch holds a single 1, at
    channel t // (ph pw), offset t % (ph pw); the extra weights hold pos[t] at that channel and offset, so the conv
    adds exactly pos[t] to token t (a product by 1, the rest by 0: the same function, the sum in another order).
    Why: a positional embedding added after the patch conv starts the residual stream from an Add of a constant,
    which ONNX Runtime's NCHWc layout pass does not take, so every block's residual Adds and 1x1 convs reorder
    between layouts; started by the conv itself, the stream stays blocked (docs/benchmarks/index.md, design probes).
    While torch.jit.trace records a CoreML lowering it computes `conv(x) + pos` instead (the `pos` buffer):
    coremltools' weight tools fail on a constant that feeds a concat, and CoreML has no NCHWc pass to serve.
    """

    def __init__(self, proj: nn.Conv2d, pos: torch.Tensor, grid: tuple[int, int], grid_out: bool = False):
        super().__init__()
        (ph, pw), (gh, gw) = proj.kernel_size, grid
        if proj.stride != (ph, pw) or proj.padding != (0, 0) or proj.dilation != (1, 1) or proj.groups != 1:
            raise ValueError("PositionPlanesPatchEmbed takes a non-overlapping, unpadded patch conv")
        c = proj.out_channels
        pos = pos.detach().reshape(gh * gw, c)
        extra, planes = _position_planes(pos, (ph, pw), grid)
        k = planes.shape[1]
        self.proj = nn.Conv2d(proj.in_channels + k, c, (ph, pw), (ph, pw), bias=proj.bias is not None)
        self.proj.to(proj.weight)
        with torch.no_grad():
            self.proj.weight.copy_(torch.cat((proj.weight, extra), dim=1))
            if proj.bias is not None:
                self.proj.bias.copy_(proj.bias)
        self.register_buffer("planes", planes)
        self.register_buffer("pos", pos.T.reshape(1, c, gh, gw).clone())
        self.grid_out = grid_out

    def copies_disagree(self) -> str | None:
        """Where the positions' two copies (the conv's extra weights and planes, the `pos` buffer) differ: an
        edited deploy checkpoint would run one function in ONNX and another in CoreML. None when they agree."""
        _, c, gh, gw = self.pos.shape
        extra, planes = _position_planes(self.pos.reshape(c, gh * gw).T, self.proj.kernel_size, (gh, gw))
        if not torch.equal(self.planes, planes):  # (False on a shape mismatch too)
            return "the constant position planes are not the ones its positions need"
        if not torch.equal(self.proj.weight[:, -extra.shape[1]:], extra):
            return "the patch conv's position weights differ from the pos buffer"
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing() and not torch.onnx.is_in_onnx_export():  # the CoreML lowering (class doc)
            w = self.proj.weight[:, :x.shape[1]]
            y = F.conv2d(x, w, self.proj.bias, self.proj.stride) + self.pos
        else:
            y = self.proj(torch.cat((x, self.planes.expand(x.shape[0], -1, -1, -1)), dim=1))
        return y if self.grid_out else y.flatten(2).transpose(1, 2)


def _position_planes(pos: torch.Tensor, patch: tuple[int, int], grid: tuple[int, int]):
    """(extra conv weights (C, k, ph, pw), constant planes (1, k, gh ph, gw pw)) that add `pos` (N, C) to each
    token's patch (PositionPlanesPatchEmbed's class doc)."""
    (ph, pw), (gh, gw) = patch, grid
    n, c = pos.shape
    k = -(-n // (ph * pw))
    t = torch.arange(n)
    ch, u, v = t // (ph * pw), (t % (ph * pw)) // pw, t % pw
    extra = pos.new_zeros(c, k, ph, pw)
    extra[:, ch, u, v] = pos.T
    planes = pos.new_zeros(1, k, gh * ph, gw * pw)
    planes[0, ch, (t // gw) * ph + u, (t % gw) * pw + v] = 1.0
    return extra, planes


class PreNormBlockDeploy(nn.Module):
    """`x + attn(norm1 x)`, `x + mlp(norm2 x)`: a ViT block once its norms' affines are folded into qkv / fc1
    (the norms left are Identity or affine-free)."""

    def __init__(self, norm1: nn.Module, attn: nn.Module, norm2: nn.Module, mlp: nn.Module):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ErfGELU(nn.Module):
    """Exact (erf) GELU written `(0.5 x) (1 + erf(x / sqrt 2))`: ONNX Runtime's GeluFusion pattern 1.

    torch exports GELU as `(x (1 + erf)) * 0.5`, and onnxsim folds that trailing 0.5 into the next 1x1 conv
    (never into a Gemm), leaving an unfused Div/Erf/Add/Mul chain (measured: docs/benchmarks/index.md, design probes).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return (x * 0.5) * (1.0 + torch.erf(x / math.sqrt(2.0)))
        return torch.nn.functional.gelu(x)  # same function; eager PyTorch has a fused kernel for it


def repbn_affine(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Eval-mode per-channel `(a, b)` of a SLAB norm (a LinearNorm evaluates as its RepBN alone), or None when
    the norm is no constant affine (LayerNorm, RMSNorm: per-token statistics)."""
    inner = norm.norm2 if isinstance(norm, LinearNorm) else norm
    if not isinstance(inner, RepBN):
        return None
    a, b = inner.affine()
    return a.expand_as(b), b


def require_repbn_affine(norm: nn.Module, path: str = "norm") -> tuple[torch.Tensor, torch.Tensor]:
    """`repbn_affine`, or a VitedgeError naming the norm that cannot fold."""
    ab = repbn_affine(norm)
    if ab is None:
        inner = norm.norm2 if isinstance(norm, LinearNorm) else norm
        raise VitedgeError(f"{path} is a {type(inner).__name__}, which uses per-token statistics and cannot fold: "
                           "build the model with its default RepBN/LinearNorm norm_layer")
    return ab
