"""SimA (XCiT): official golden parity, variant table, key layouts, and the re-parameterization's exactness."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.primitives import affine_before_padded_depthwise, bn_affine
from vitedge.exporter.reparam.sima import SimADeploy
from vitedge.models import VitedgeError, create_model, get_spec, list_models, make_trained_like
from vitedge.models.layers import sima_rule
from vitedge.models.reduced import reduced
from vitedge.models.sima_xcit import LPI, patch_grid

from vitedge.tests.conftest import assert_close_rel, load_golden

GOLDEN_CASES = [("sima_mini.pth", "sima_mini_224_io.pt"), ("sima_mini.pth", "sima_mini_80_io.pt"),
                ("sima_mini_notn.pth", "sima_mini_notn_224_io.pt"), ("sima_mini_notn.pth", "sima_mini_notn_80_io.pt")]

# MODELS.md §3.1: measured parameter counts of the p16 variants, at the precision the table gives (millions)
PARAMS_P16 = {"sima_nano_12_p16": "3.05", "sima_tiny_12_p16": "6.72", "sima_small_12_p16": "26.25",
              "sima_tiny_24_p16": "12.12", "sima_small_24_p16": "47.67", "sima_medium_24_p16": "84.40",
              "sima_large_24_p16": "189.1"}

# A reduced config with head_dim 32: 64 px -> N = 16 < 32 (qk_first), 96 px -> N = 36 >= 32 (kv_first)
SMALL = reduced("sima_narrow")




def _golden_model(ck_name: str, io: dict) -> nn.Module:
    model = create_model(io["base_variant"], **io["overrides"])  # released names are ours unchanged
    model.load_state_dict(load_golden(ck_name)["model"], strict=True)
    return model.eval()


@pytest.mark.parametrize("ck_name,io_name", GOLDEN_CASES)
def test_golden_matches_official(ck_name, io_name):
    io = load_golden(io_name)
    model = _golden_model(ck_name, io)
    assert sum(p.numel() for p in model.parameters()) == io["num_params"]
    assert len(model.state_dict()) == io["official_state_dict_keys"]
    with torch.no_grad():
        y = model(io["input"])
    assert_close_rel(y, io["output"], 1e-5)
    # the deploy-form (folded in fp64, run in fp32 as exported) reproduces the official output too
    size = io["input"].shape[-1]
    deploy = reparameterize(model.double(), imgsz=size).float()
    with torch.no_grad():
        assert_close_rel(deploy(io["input"]), io["output"], 1e-5)
    order = "qk_first" if "(q @ k^T) @ v" == io["attention_order"] else "kv_first"
    assert set(deploy.reparam_summary.attention_order.values()) == {order}


def test_golden_key_order_is_official():
    io = load_golden("sima_mini_224_io.pt")
    ours = list(create_model(io["base_variant"], **io["overrides"]).state_dict())
    assert ours == list(load_golden("sima_mini.pth")["model"])


def test_train_mode_returns_pair():
    model = create_model("sima_nano_12_p16", **SMALL).train()
    a, b = model(torch.randn(2, 3, 32, 32))
    assert a is b and a.shape == (2, 10)


def test_param_counts_match_models_md():
    assert sorted(list_models("sima")) == sorted(list(PARAMS_P16) + [n.replace("_p16", "_p8") for n in PARAMS_P16])
    for name, expected in PARAMS_P16.items():
        with torch.device("meta"):  # shapes only: no memory, no init cost
            n = sum(p.numel() for p in create_model(name).parameters())
        decimals = len(expected.split(".")[1])
        assert f"{n / 1e6:.{decimals}f}" == expected, name


@pytest.mark.parametrize("variant", ["sima_nano_12_p16", "sima_large_24_p16"])
def test_p8_key_layout(variant):
    with torch.device("meta"):
        p16 = create_model(variant).state_dict()
        p8 = create_model(variant.replace("_p16", "_p8")).state_dict()
    c = p16["cls_token"].shape[-1]
    stem = lambda sd: {k: tuple(v.shape) for k, v in sd.items() if k.startswith("patch_embed.")}  # noqa: E731
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    expected = {}
    for idx, (cin, cout) in zip((0, 2, 4), ((3, c // 4), (c // 4, c // 2), (c // 2, c))):
        expected[f"patch_embed.proj.{idx}.0.weight"] = (cout, cin, 3, 3)
        expected.update({f"patch_embed.proj.{idx}.1.{k}": (() if k == "num_batches_tracked" else (cout,)) for k in bn})
    assert stem(p8) == expected
    assert len(stem(p16)) == len(expected) + 6 and "patch_embed.proj.6.0.weight" in p16
    assert {k: v.shape for k, v in p8.items() if k not in stem(p8)} == \
           {k: v.shape for k, v in p16.items() if k not in stem(p16)}
    assert get_spec(variant).stride == 16 and get_spec(variant.replace("_p16", "_p8")).stride == 8


def test_patch_grid_matches_stem():
    model = create_model("sima_nano_12_p8", **SMALL).eval()
    for size in (32, 40):
        with torch.no_grad():
            tokens, (h, w) = model.patch_embed(torch.zeros(1, 3, size, size))
        assert h == w == patch_grid(size, 8) and tokens.shape[1] == h * w


# ------------------------------------------------------------------------------------------ re-parameterization

def _small_model(tokens_norm: bool = True, seed: int = 0, variant: str = "sima_nano_12_p16", **kw) -> nn.Module:
    model = create_model(variant, **{**SMALL, "tokens_norm": tokens_norm, **kw}).double()
    return make_trained_like(model, seed=seed).eval()


@pytest.mark.parametrize("imgsz,rule_order", [(64, "qk_first"), (96, "kv_first")])
@pytest.mark.parametrize("attn_order", ["auto", "qk_first", "kv_first"])
@pytest.mark.parametrize("rewrites", [True, False])
def test_reparam_is_exact(imgsz, rule_order, attn_order, rewrites):
    tokens_norm = (imgsz == 64) == rewrites  # both class-attention variants, across the matrix
    model = _small_model(tokens_norm, seed=imgsz)
    deploy = reparameterize(model, imgsz=imgsz, attn_order=attn_order, rewrites=rewrites)
    res = verify_equivalence(model, deploy, imgsz)
    assert res.passed and res.max_abs <= 1e-9 * res.scale
    assert [b["name"] for b in res.blocks][:3] == ["patch_embed", "blocks.0", "blocks.1"]
    n, d = patch_grid(imgsz, 16) ** 2, 32
    assert sima_rule(n, d) == rule_order
    summary = deploy.reparam_summary
    expect = rule_order if attn_order == "auto" else attn_order
    assert summary.attention_order == {"blocks.0.attn": expect, "blocks.1.attn": expect}
    assert all(m.order == expect for m in deploy.modules() if hasattr(m, "order"))
    reason = summary.attention_reason["blocks.0.attn"]
    assert (f"N={n}" in reason and f"d={d}" in reason) if attn_order == "auto" else "forced" in reason
    assert bool(summary.rewrites) == rewrites
    # the last class-attention block computes the CLS token only under the rewrite
    assert deploy.cls_attn_blocks[-1].cls_only == rewrites


def test_reparam_p8_and_eta_none():
    # eta=None: the layer scales are the constant 1.0 (no gamma keys); p8 stem with three convs
    model = _small_model(seed=5, variant="sima_nano_12_p8", eta=None)
    assert not any("gamma" in k for k in model.state_dict())
    deploy = reparameterize(model, imgsz=32)
    assert verify_equivalence(model, deploy, 32, samples=3).passed
    assert deploy.reparam_summary.folded["conv+bn"] == 3


def test_model_attn_order_is_respected_and_override_wins():
    model = _small_model(seed=1, attn_order="kv_first")
    auto = reparameterize(model, imgsz=64)  # N=16 < d=32 would say qk_first
    assert set(auto.reparam_summary.attention_order.values()) == {"kv_first"}
    assert "model's attn_order" in auto.reparam_summary.attention_reason["blocks.0.attn"]
    forced = reparameterize(model, imgsz=64, attn_order="qk_first")
    assert set(forced.reparam_summary.attention_order.values()) == {"qk_first"}
    assert "override" in forced.reparam_summary.attention_reason["blocks.1.attn"]


def test_order_tie_goes_kv_first():
    # official rule `N < d`: at N == d it takes Q(K^T V)
    model = create_model("sima_nano_12_p16", embed_dim=36, depth=1, num_heads=1, num_classes=10)
    summary = reparameterize(model, imgsz=96).reparam_summary
    assert summary.attention_order == {"blocks.0.attn": "kv_first"}
    assert "N=36 >= d=36" in summary.attention_reason["blocks.0.attn"]


def test_deploy_form_structure():
    model = _small_model(seed=2)
    deploy = reparameterize(model, imgsz=64)
    assert isinstance(deploy, SimADeploy)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in deploy.modules())
    for blk in deploy.blocks:  # SimA blocks: LayerNorms keep no scale (folded), norm3 only its shift
        assert not blk.norm1.elementwise_affine and not blk.norm2.elementwise_affine
        assert blk.norm3.scale is None and blk.norm3.shift is not None
        assert blk.local_mp.shift.scale is None and blk.local_mp.shift.shift is not None
    assert deploy.pos_embed.shape == (1, 16, 32)
    assert not deploy.norm.elementwise_affine  # final norm affine lives in the head
    folded = deploy.reparam_summary.folded
    assert folded["conv+bn"] == 4 and folded["fourier_pos->constant"] == 1
    assert folded["layernorm_affine->linear"] == 2 * 2 + 1
    unfolded = {u["module"] for u in deploy.reparam_summary.unfolded}
    assert {"blocks.0.norm3", "blocks.0.local_mp.bn", "cls_attn_blocks.0.norm1"} <= unfolded
    with pytest.raises(VitedgeError, match="64x64"):
        deploy(torch.zeros(1, 3, 96, 96, dtype=torch.float64))


def test_lpi_bn_shift_border_naive_fold_is_wrong():
    lpi = make_trained_like(LPI(16).double().eval(), seed=11)
    g = lpi.act(lpi.conv1(torch.randn(2, 16, 6, 6, dtype=torch.float64)))
    with torch.no_grad():
        ref = lpi.conv2(lpi.bn(g))
        a, b = bn_affine(lpi.bn)
        w, bias = lpi.conv2.weight, lpi.conv2.bias
        # naive: treat conv2(b) as the per-channel constant sum(w) * b, as if every tap saw the shift
        naive = F.conv2d(g, w * a.reshape(-1, 1, 1, 1), bias + w.sum(dim=(1, 2, 3)) * b, padding=1, groups=16)
        aff, conv = affine_before_padded_depthwise(lpi.conv2, a, b)
        ours = conv(aff(g))
    scale = float(ref.abs().max())
    err = (naive - ref).abs()
    interior = err[..., 1:-1, 1:-1]
    border = err.clone()
    border[..., 1:-1, 1:-1] = 0
    assert float(interior.max()) <= 1e-12 * scale  # the naive fold is right in the interior ...
    assert float(border.max()) > 1e-2 * scale      # ... and wrong at every border
    assert aff.scale is None  # the scale did fold into the conv
    assert float((ours - ref).abs().max()) <= 1e-12 * scale


def test_padded_depthwise_zero_scale_falls_back_exactly():
    lpi = make_trained_like(LPI(8).double().eval(), seed=12)
    with torch.no_grad():
        lpi.bn.weight[3] = 0.0  # a dead channel: shift / scale is undefined
        g = torch.randn(1, 8, 5, 5, dtype=torch.float64)
        a, b = bn_affine(lpi.bn)
        aff, conv = affine_before_padded_depthwise(lpi.conv2, a, b)
        assert aff.scale is not None  # nothing folded
        assert torch.allclose(conv(aff(g)), lpi.conv2(lpi.bn(g)), rtol=0, atol=1e-12)


def test_gate_names_first_diverging_block():
    model = _small_model(seed=3)
    deploy = reparameterize(model, imgsz=64)
    lpi = deploy.blocks[1].local_mp
    with torch.no_grad():  # break block 1 on purpose: the naive LPI shift fold (wrong at the borders)
        lpi.conv2.bias += lpi.conv2.weight.sum(dim=(1, 2, 3)) * lpi.shift.shift
        lpi.shift.shift = None
    res = verify_equivalence(model, deploy, 64, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "blocks.1"
    assert [b["passed"] for b in res.blocks][:3] == [True, True, False]
    with pytest.raises(EquivalenceError, match="blocks.1"):
        verify_equivalence(model, deploy, 64, samples=2)
