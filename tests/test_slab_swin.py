"""SLAB-Swin and PRepBN-Swin: official layouts and numerics (golden), sizes, and the re-parameterization."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.reparam.engine import reparameterize
from vitedge.exporter.reparam.primitives import ChannelAffine, count_params
from vitedge.exporter.reparam.slab_swin import PatchMergingDeploy, SwinBlockDeploy, WindowAttentionDeploy
from vitedge.errors import VitedgeError
from vitedge.models.layers import LinearNorm, RepBN, SimplifiedLinearAttention
from vitedge.models.reduced import reduced
from vitedge.models.registry import create_model
from vitedge.models.slab_swin import SlabSwinTransformer, SwinTransformer, WindowAttention
from vitedge.models.trained_like import make_trained_like

from vitedge.tests.conftest import assert_close_rel, load_golden

# The golden fixture's overrides of slab_swin_tiny (embed 16, depths 1,1,2,1, heads 1,2,4,8, mlp 2, 10 classes).
MINI = reduced("slab_swin")
# PRepBN-Swin-T's layout (window 7 at 56/28/14/7, shifted odd blocks, one-window last stage), narrow.
PREPBN_MINI = dict(embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8], mlp_ratio=2.0, num_classes=10,
                   drop_path_rate=0.0)
# Windowed + shifted SLA (window 7 in L stages, as SLAB's detection config) and a mixed 'M' stage
# (block 0 linear, block 1 softmax), with an absolute position embedding.
WINDOWED_SLA = dict(embed_dim=16, depths=[2, 2, 2, 1], num_heads=[1, 2, 4, 8], mlp_ratio=2.0, num_classes=10,
                    drop_path_rate=0.0, window_size=7, attn_type="LMSS1", ape=True)
NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm, RepBN, LinearNorm)


@pytest.fixture(scope="module")
def golden_mini():
    io = load_golden("slab_swin_mini_io.pt")
    ck = load_golden("slab_swin_mini.pth")["model"]
    return io, ck


def _golden_model(io, ck, **extra) -> SlabSwinTransformer:
    model = create_model("slab_swin_tiny", **io["overrides"], **extra)
    model.load_state_dict(ck, strict=True)
    return model


# ---------------------------------------------------------------- golden (official code outputs)

@pytest.mark.parametrize("attn_order", ["auto", "qk_first"])
def test_golden_eval(golden_mini, attn_order):
    io, ck = golden_mini
    model = _golden_model(io, ck, attn_order=attn_order).eval()
    assert list(model.state_dict()) == list(ck)  # same keys, same order (reduction before norm, attn_mask first)
    assert count_params(model) == io["num_params"]
    with torch.no_grad():
        assert_close_rel(model(io["input"]), io["output"], 1e-5)


def test_golden_train_mid_schedule(golden_mini):
    _, ck = golden_mini
    io = load_golden("slab_swin_mini_train_mid_io.pt")
    model = _golden_model(io, ck)
    norms = [m for m in model.modules() if isinstance(m, LinearNorm)]
    assert len(norms) == 15
    for m in norms:
        for k, v in io["buffers_before"].items():
            getattr(m, k).fill_(v)
    model.train()
    with torch.no_grad():
        y = model(io["input"])
    assert_close_rel(y, io["output"], 1e-5)
    after, sd = io["state_after_buffers"], model.state_dict()
    assert len(after) == 90
    for k, ref in after.items():
        if ref.is_floating_point():
            assert_close_rel(sd[k], ref, 1e-5)
        else:
            assert torch.equal(sd[k], ref), k
    assert all(int(m.iter) == io["buffers_after_iter"][0] == 29999 for m in norms)


def test_window_rule_and_structural_buffers(golden_mini):
    io, ck = golden_mini
    model = create_model("slab_swin_tiny", **io["overrides"])  # fresh: buffers regenerated, not loaded
    got = [{"stage": i, "block": j, "attn": type(b.attn).__name__, "window": b.window_size, "shift": b.shift_size,
            "heads": b.num_heads, "has_mask": b.attn_mask is not None}
           for i, layer in enumerate(model.layers) for j, b in enumerate(layer.blocks)]
    want = [{k: blk[k] for k in ("stage", "block", "attn", "window", "shift", "heads", "has_mask")}
            for blk in io["blocks"]]
    assert got == want
    sd = model.state_dict()
    for k, v in ck.items():
        if k.endswith(("relative_position_index", "attn_mask")):
            assert sd[k].dtype == v.dtype and torch.equal(sd[k], v), k
    assert sd["layers.2.blocks.0.attn.relative_position_index"].dtype == torch.int64


def test_slab_window_rule_variants():
    with torch.device("meta"):
        # 1536 px: token grids 384/192/96/48, tiled by the 64 (L) and 12 (S) windows.
        big = SlabSwinTransformer(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=64,
                                  attn_type="LLSS", img_size=1536)
        det = SlabSwinTransformer(**{k: v for k, v in WINDOWED_SLA.items() if k != "ape"})
    assert [b.window_size for b in big.layers[2].blocks] == [12, 12]  # S stages use 12 when window > 56
    assert big.layers[0].blocks[0].window_size == 64                   # L stage: 384x384 map, 64-token windows
    with pytest.raises(VitedgeError, match="does not tile"):             # a window that cannot tile the grid
        with torch.device("meta"):
            SlabSwinTransformer(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], window_size=64,
                                attn_type="LLSS", img_size=384)
    assert [(type(b.attn), b.window_size, b.shift_size) for b in det.layers[0].blocks] == [
        (SimplifiedLinearAttention, 7, 0), (SimplifiedLinearAttention, 7, 3)]
    assert [type(b.attn) for b in det.layers[1].blocks] == [SimplifiedLinearAttention, WindowAttention]
    with pytest.raises(VitedgeError, match="attn_type"):
        SlabSwinTransformer(attn_type="LLX")


# ---------------------------------------------------------------- full variants: sizes and keys (meta device)

@pytest.mark.parametrize("name,millions", [("slab_swin_tiny", 29.22), ("slab_swin_small", 50.55),
                                           ("prepbn_swin_tiny", 28.29)])
def test_full_variant_params(name, millions):
    with torch.device("meta"):
        model = create_model(name)
    assert round(count_params(model) / 1e6, 2) == millions


def test_full_variant_keys():
    with torch.device("meta"):
        slab, prepbn = create_model("slab_swin_tiny"), create_model("prepbn_swin_tiny")
    sd = slab.state_dict()
    shapes = {"layers.0.blocks.0.attn.positional_encoding": (1, 3136, 96),
              "layers.1.blocks.1.attn.positional_encoding": (1, 784, 192),
              "layers.0.blocks.0.attn.dwc.weight": (32, 1, 5, 5),
              "layers.2.blocks.0.attn.relative_position_bias_table": (169, 12),
              "layers.2.blocks.1.attn.relative_position_index": (49, 49),
              "layers.2.blocks.1.attn_mask": (4, 49, 49),
              "layers.0.downsample.reduction.weight": (192, 384),
              "patch_embed.norm.norm2.alpha": (1,), "norm.norm2.bn.running_var": (768,), "head.weight": (1000, 768)}
    for k, shape in shapes.items():
        assert tuple(sd[k].shape) == shape, k
    assert "layers.0.blocks.1.attn_mask" not in sd and "layers.3.blocks.1.attn_mask" not in sd  # L stage / 7x7
    assert "layers.0.downsample.reduction.bias" not in sd
    keys = list(sd)
    assert keys.index("layers.0.downsample.reduction.weight") < keys.index("layers.0.downsample.norm.warm")
    assert keys.index("layers.2.blocks.1.attn_mask") == keys.index("layers.2.blocks.0.mlp.fc2.bias") + 1
    lns = [m for m in slab.modules() if isinstance(m, LinearNorm)]
    assert len(lns) == 1 + 2 * 12 + 3 + 1 and all(m.norm1.eps == 1e-5 for m in lns)
    fresh = [m for m in create_model("slab_swin_tiny", **MINI).modules() if isinstance(m, LinearNorm)]
    assert all((int(m.total_step), int(m.iter), int(m.warm)) == (60000, 60000, 0) for m in fresh)
    psd = prepbn.state_dict()
    assert tuple(psd["layers.0.blocks.0.norm1.alpha"].shape) == (1,)
    assert tuple(psd["layers.0.blocks.1.attn_mask"].shape) == (64, 49, 49)
    assert "layers.3.blocks.1.attn_mask" not in psd and not any(k.endswith(".iter") for k in psd)
    assert all(isinstance(b.attn, WindowAttention) for layer in prepbn.layers for b in layer.blocks)


# ---------------------------------------------------------------- re-parameterization

@torch.no_grad()
def _conditioned(model: nn.Module, seed: int = 0) -> nn.Module:
    """Trained-like weights (with make_trained_like's RepBN recalibration and softmax q,k scaling), float64."""
    return make_trained_like(model, seed).double().eval()


@pytest.fixture(scope="module")
def slab_mini():
    return _conditioned(create_model("slab_swin_tiny", **MINI), seed=3)


@pytest.fixture(scope="module")
def prepbn_mini():
    return _conditioned(create_model("prepbn_swin_tiny", **PREPBN_MINI), seed=4)


def _analytic_deploy_params(model) -> int:
    """Linear/Conv weights and biases (+ SLA positional encodings, ape): norms gone, reductions gain a bias,
    relative position bias tables become constant buffers."""
    e, k_cls = model.embed_dim, model.num_classes
    p = model.patch_embed.patch_size
    n = 3 * e * p * p + e + model.num_features * k_cls + k_cls
    n += model.patch_embed.num_patches * e if model.ape else 0
    for i, layer in enumerate(model.layers):
        c = e * 2 ** i
        for b in layer.blocks:
            hid = int(c * b.mlp_ratio)
            n += (3 * c * c + 3 * c) + (c * c + c) + (c * hid + hid) + (hid * c + c)
            if b.attn_type == "L":
                d, ks = c // b.num_heads, b.attn.dwc.kernel_size[0]
                n += b.window_size ** 2 * c + d * ks * ks + d
        if layer.downsample is not None:
            n += 4 * c * 2 * c + 2 * c
    return n


def _assert_clean_deploy(deploy, model) -> None:
    assert not [n for n, m in deploy.named_modules() if isinstance(m, NORMS)]
    unfolded = {u["module"] for u in deploy.reparam_summary.unfolded}
    assert {n for n, m in deploy.named_modules() if isinstance(m, ChannelAffine)} <= unfolded
    assert count_params(deploy) == _analytic_deploy_params(model)


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("attn_order", ["auto", "qk_first", "kv_first"])
def test_reparam_slab_mini(slab_mini, rewrites, attn_order):
    deploy = reparameterize(slab_mini, attn_order=attn_order, rewrites=rewrites)
    res = verify_equivalence(slab_mini, deploy, samples=3)
    assert res.passed and len(res.blocks) == 1 + 5 + 3
    _assert_clean_deploy(deploy, slab_mini)
    s = deploy.reparam_summary
    assert s.folded["norm->attn.qkv"] == s.folded["norm->mlp.fc1"] == 5
    assert s.folded["norm->downsample.reduction"] == 3 and s.folded["norm->head"] == 1
    assert s.folded["relative_position_bias->constant"] == 3 and s.folded["shift_mask->constant"] == 1
    assert s.unfolded == [] and s.schedule == []
    expect = "kv_first" if attn_order == "auto" else attn_order  # auto: N = 3136 / 784 > head_dim 16
    assert s.attention_order == {"layers.0.blocks.0.attn": expect, "layers.1.blocks.0.attn": expect}
    why = s.attention_reason["layers.0.blocks.0.attn"]
    assert ("FLOP rule: N=3136" in why) if attn_order == "auto" else why.startswith("forced")
    assert deploy.layers[0].blocks[0].attn.attn_order == expect  # fixed in the deploy-form
    shifted, merging = deploy.layers[2].blocks[1], deploy.layers[0].downsample
    assert isinstance(shifted.attn, WindowAttentionDeploy) and isinstance(merging, PatchMergingDeploy)
    if rewrites:
        assert shifted.attn.scale is None and shifted.attn.bias is None
        assert tuple(shifted.attn.window_bias.shape) == (4, 4, 49, 49)
        assert not deploy.layers[0].blocks[0].partition and merging.as_reshape
        assert set(s.rewrites) == {"softmax_scale_into_qkv", "shift_mask_merged_with_bias",
                                   "single_window_without_partition", "patch_merging_as_reshape"}
    else:
        assert shifted.attn.scale == 16 ** -0.5 and tuple(shifted.attn.bias.shape) == (4, 49, 49)
        assert tuple(shifted.attn.window_bias.shape) == (4, 1, 49, 49)
        assert deploy.layers[0].blocks[0].partition and not merging.as_reshape and s.rewrites == []


@pytest.mark.parametrize("rewrites", [True, False])
def test_reparam_prepbn_mini(prepbn_mini, rewrites):
    deploy = reparameterize(prepbn_mini, rewrites=rewrites)
    assert verify_equivalence(prepbn_mini, deploy, samples=3).passed
    _assert_clean_deploy(deploy, prepbn_mini)
    s = deploy.reparam_summary
    assert s.attention_order == {} and s.folded["shift_mask->constant"] == 3  # stages 0-2; stage 3 is one window
    assert tuple(deploy.layers[0].blocks[1].attn.window_bias.shape)[0] == 64  # 56x56 map, 7x7 windows
    assert tuple(deploy.layers[2].blocks[1].attn.window_bias.shape) == (4, 4 if rewrites else 1, 49, 49)
    assert deploy.layers[3].blocks[1].shift_size == 0 and deploy.layers[3].blocks[1].attn.window_bias is None


@pytest.mark.parametrize("rewrites", [True, False])
def test_reparam_windowed_sla_mixed_ape(rewrites):
    model = _conditioned(create_model("slab_swin_tiny", **WINDOWED_SLA), seed=5)
    deploy = reparameterize(model, rewrites=rewrites)
    assert verify_equivalence(model, deploy, samples=3).passed
    _assert_clean_deploy(deploy, model)
    blk = deploy.layers[0].blocks[1]
    assert isinstance(blk, SwinBlockDeploy) and blk.shift_size == 3 and blk.partition
    assert isinstance(blk.attn, SimplifiedLinearAttention)  # SLA ignores the shift mask, as officially
    assert deploy.reparam_summary.attention_order["layers.0.blocks.1.attn"] == "kv_first"  # N=49 > d=16


def test_reparam_full_size_tiny():
    for name in ("slab_swin_tiny", "prepbn_swin_tiny"):
        model = _conditioned(create_model(name), seed=6)
        deploy = reparameterize(model)
        assert verify_equivalence(model, deploy, samples=1).passed, name
        _assert_clean_deploy(deploy, model)


def test_head_without_classes_keeps_listed_affine(slab_mini):
    model = _conditioned(create_model("slab_swin_tiny", **{**MINI, "num_classes": 0}), seed=3)
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    assert [u["module"] for u in deploy.reparam_summary.unfolded] == ["norm"]
    assert isinstance(deploy.head, ChannelAffine)


def _patch_affine(model):
    return model.patch_embed.norm.norm2.affine()


def test_patch_embed_fold_keeps_conv_bias(slab_mini):
    """Regression: SLAB's PatchEmbed.merge_bn sets b' = g (bias - mu)/sqrt(v+eps) + beta, dropping alpha*bias."""
    model = slab_mini
    deploy = reparameterize(model)
    conv, folded = model.patch_embed.proj, deploy.patch_embed.proj
    a, b = _patch_affine(model)
    assert conv.bias.abs().min() > 0 and model.patch_embed.norm.norm2.alpha.abs().min() > 0.1
    torch.testing.assert_close(folded.bias, a * conv.bias + b, rtol=0, atol=1e-12)
    bn = model.patch_embed.norm.norm2.bn
    slab_bias = bn.weight * (conv.bias - bn.running_mean) / torch.sqrt(bn.running_var + bn.eps) + bn.bias
    with torch.no_grad():
        folded.bias.copy_(slab_bias)
    with pytest.raises(EquivalenceError) as err:
        verify_equivalence(model, deploy, samples=2)
    assert err.value.diverging_module == "patch_embed"


def test_broken_fold_names_first_diverging_block(slab_mini):
    deploy = reparameterize(slab_mini)
    with torch.no_grad():  # forget the shift mask (keep the relative position bias) in the one shifted block
        attn = deploy.layers[2].blocks[1].attn
        rpb = slab_mini.layers[2].blocks[1].attn.relative_position_bias()
        attn.window_bias.copy_(rpb.expand_as(attn.window_bias))
    res = verify_equivalence(slab_mini, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "layers.2.blocks.1"
    names = [b["name"] for b in res.blocks]
    first = names.index("layers.2.blocks.1")
    assert all(b["passed"] for b in res.blocks[:first]) and not res.blocks[first]["passed"]


def test_golden_deploy_fp32_matches_official(golden_mini):
    io, ck = golden_mini
    model = _golden_model(io, ck)
    deploy = reparameterize(model)
    with torch.no_grad():
        assert_close_rel(deploy(io["input"]), io["output"], 1e-5)


def test_reparam_at_another_size_and_rejects_unfoldable_norms(slab_mini):
    deploy = reparameterize(slab_mini, imgsz=256)  # padded windows (models/slab_swin.py set_input_size)
    assert deploy(torch.zeros(1, 3, 256, 256, dtype=torch.float64)).shape[0] == 1 and slab_mini.patch_embed.img_size == 224
    ln_model = SwinTransformer(**{**PREPBN_MINI, "depths": [1, 1, 1, 1]}, norm_layer=nn.LayerNorm)
    with pytest.raises(VitedgeError, match="LayerNorm"):
        reparameterize(ln_model)


def test_unfinished_schedule_warns(golden_mini):
    io, ck = golden_mini
    model = _golden_model(io, ck)
    model.layers[0].blocks[0].norm1.iter.fill_(30000)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        deploy = reparameterize(model)
    assert any("schedule" in str(x.message) for x in w)
    assert deploy.reparam_summary.schedule[0]["module"] == "layers.0.blocks.0.norm1"
