"""SimA on DeiT: the chosen (DeiT) key layout, SimA over CLS + patches, the fold plan's exactness, ONNX parity."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.engine import FoldContext
from vitedge.exporter.reparam.sima import FixedOrderSimA
from vitedge.exporter.reparam.sima_deit import SimADeiTDeploy, plan_sima_deit
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint

from vitedge.models.reduced import reduced
from vitedge.tests.conftest import onnx_parity

# 64 px: N = 16 patches + CLS = 17 tokens; head_dim 16 (4 heads) -> kv_first, head_dim 32 (2 heads) -> qk_first
REDUCED = reduced("sima_deit")




def deit_keys(depth: int) -> list[str]:
    """timm DeiT's VisionTransformer keys, in order (docs/sima_deit_layout.md)."""
    keys = ["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]
    for i in range(depth):
        keys += [f"blocks.{i}.{m}.{p}" for m in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
                 for p in ("weight", "bias")]
    return keys + ["norm.weight", "norm.bias", "head.weight", "head.bias"]


def deit_params(c: int, depth: int = 12, n: int = 196, classes: int = 1000) -> int:
    block = 12 * c * c + 13 * c  # norms 4C, qkv 3C^2+3C, proj C^2+C, fc1 4C^2+4C, fc2 4C^2+C
    return 3 * 16 * 16 * c + c + c + (1 + n) * c + depth * block + 2 * c + c * classes + classes


def _trained_like(seed: int = 0, **overrides) -> nn.Module:
    return make_trained_like(create_model("sima_deit_tiny", **{**REDUCED, **overrides}), seed=seed).double().eval()


@pytest.mark.parametrize("name,c,params", [("sima_deit_tiny", 192, 5_717_416), ("sima_deit_small", 384, 22_050_664)])
def test_layout_is_deit(name, c, params):
    with torch.device("meta"):
        model = create_model(name)
        target = create_model(name)
    state = model.state_dict()
    assert list(state) == deit_keys(12)
    assert tuple(state["pos_embed"].shape) == (1, 197, c)
    assert tuple(state["blocks.0.attn.qkv.weight"].shape) == (3 * c, c)
    assert sum(p.numel() for p in model.parameters()) == params == deit_params(c)
    result = load_checkpoint(target, {"model": state})
    assert result.ok and result.loaded == len(state) and result.remaps == []
    assert model.vitedge_spec.stride == 16 and model.blocks[0].norm1.eps == 1e-6


def test_sima_normalizes_over_cls_and_patches():
    model = _trained_like(seed=1)
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    seen = {}
    attn = model.blocks[0].attn
    handle = attn.register_forward_hook(lambda m, inp, out: seen.update(x=inp[0], y=out))
    with torch.no_grad():
        model(x)
        handle.remove()
        t = seen["x"]
        assert t.shape == (2, 17, 64)  # CLS + 16 patches reach the attention
        b, n, c = t.shape
        q, k, v = attn.qkv(t).reshape(b, n, 3, 4, 16).permute(2, 0, 3, 1, 4)
        q, k = q / q.abs().sum(dim=2, keepdim=True), k / k.abs().sum(dim=2, keepdim=True)  # columns over 17 tokens
        ref = attn.proj((q @ (k.transpose(-2, -1) @ v)).transpose(1, 2).reshape(b, n, c))
    assert float((ref - seen["y"]).abs().max()) <= 1e-12 * float(ref.abs().max())


def test_order_rule_counts_the_cls_token():
    # head_dim 17: 16 patches alone would say qk_first (16 < 17); with the CLS token N = 17 is not < 17
    model = create_model("sima_deit_tiny", **{**REDUCED, "embed_dim": 68})
    summary = reparameterize(model).reparam_summary
    assert set(summary.attention_order.values()) == {"kv_first"}
    assert "N=17 >= d=17" in summary.attention_reason["blocks.0.attn"]


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(VitedgeError, match="64x64"):
        create_model("sima_deit_tiny", **REDUCED)(torch.zeros(1, 3, 96, 96))
    with pytest.raises(VitedgeError, match="divisible by 16"):
        reparameterize(create_model("sima_deit_tiny", **REDUCED), imgsz=90)
    deploy = reparameterize(create_model("sima_deit_tiny", **REDUCED), imgsz=96)  # pos_embed resampled on a copy
    assert deploy(torch.zeros(1, 3, 96, 96)).shape == (1, 10)


# --- re-parameterization -------------------------------------------------------------------------------------------

def _assert_deploy_form(model, deploy, depth):
    assert isinstance(deploy, SimADeiTDeploy)
    assert all(not m.elementwise_affine for m in deploy.modules() if isinstance(m, nn.LayerNorm))
    assert not any(isinstance(m, nn.Dropout) for m in deploy.modules())
    s = deploy.reparam_summary
    assert s.unfolded == [] and s.folded["layernorm_affine->linear"] == 2 * depth + 1
    assert s.folded["pos_embed->cls_token"] == 1
    # analytic count: every LayerNorm's 2C affine parameters gone, and pos_embed's CLS row (merged into cls_token)
    c = model.embed_dim
    folded = (2 * depth + 1) * 2 * c + c
    assert sum(p.numel() for p in deploy.parameters()) == sum(p.numel() for p in model.parameters()) - folded


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("heads,attn_order,expected", [(4, "auto", "kv_first"), (2, "auto", "qk_first"),
                                                       (4, "qk_first", "qk_first"), (2, "kv_first", "kv_first")])
def test_reparam_exact(heads, attn_order, expected, rewrites):
    model = _trained_like(seed=heads, num_heads=heads)
    deploy = reparameterize(model, attn_order=attn_order, rewrites=rewrites)
    res = verify_equivalence(model, deploy, samples=3)
    assert res.passed and res.max_abs <= 1e-9 * res.scale
    assert [b["name"] for b in res.blocks] == ["patch_embed", "blocks.0", "blocks.1"]
    _assert_deploy_form(model, deploy, depth=2)
    s = deploy.reparam_summary
    assert s.attention_order == {"blocks.0.attn": expected, "blocks.1.attn": expected}
    assert all(m.order == expected for m in deploy.modules() if isinstance(m, FixedOrderSimA))
    assert ("final_norm_on_cls_only" in s.rewrites) == rewrites == deploy.norm_cls_only
    if attn_order != "auto":
        assert "forced" in s.attention_reason["blocks.0.attn"]


def test_released_deploy_structure():
    with torch.device("meta"):
        model = create_model("sima_deit_small").eval()
        ctx = FoldContext(imgsz=224)
        deploy = plan_sima_deit(model, ctx)
    deploy.reparam_summary = ctx.summary
    _assert_deploy_form(model, deploy, depth=12)
    assert set(ctx.summary.attention_order.values()) == {"kv_first"}  # 197 tokens >= head_dim 64
    assert "N=197 >= d=64" in ctx.summary.attention_reason["blocks.11.attn"]


def test_gate_names_first_diverging_block():
    model = _trained_like(seed=7)
    deploy = reparameterize(model)
    with torch.no_grad():  # a broken fold: block 1's norm2 shift (W b) dropped from fc1's bias
        deploy.blocks[1].mlp.fc1.bias.copy_(model.blocks[1].mlp.fc1.bias)
    res = verify_equivalence(model, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "blocks.1"
    with pytest.raises(EquivalenceError, match="blocks.1"):
        verify_equivalence(model, deploy, samples=2)


# --- ONNX -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,heads", [("sima_deit_tiny", 4), ("sima_deit_small", 2)])
def test_every_name_gate_and_onnx_parity(name, heads):
    # head_dim 16 (kv_first) and 32 (qk_first) at 17 tokens: both association orders reach ONNX
    model = make_trained_like(create_model(name, **{**REDUCED, "num_heads": heads}), seed=8).double().eval()
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    metrics, ops = onnx_parity(model, deploy, 64)
    assert DEFAULT_TOLERANCES["fp32"].violations(metrics) == [], metrics
    assert "Einsum" not in ops and "BatchNormalization" not in ops
    assert ops.get("LayerNormalization") == 2 * 2 + 1  # SimA keeps its (affine-free) LayerNorms
