"""SLAB-PVT and PRepBN-PVT: official key layout and counts, the fold plan's exactness, ONNX parity."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.onnx.onnx_export import NORM_OPS
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.engine import FoldContext
from vitedge.exporter.reparam.primitives import ChannelAffine
from vitedge.exporter.reparam.slab_pvt import PVTDeploy, plan_pvt
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint
from vitedge.models.layers import LinearNorm, RepBN
from vitedge.models.reduced import reduced
from vitedge.models.slab_pvt import PVTLinearAttention

from vitedge.tests.conftest import onnx_parity

# Reduced config (64 px: grids 16, 8, 4, 2); the released ones differ only in widths, depths and img_size.
REDUCED = reduced("slab_pvt")
NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, RepBN, LinearNorm, nn.Dropout, ChannelAffine)
LINEARNORM = ("warm", "iter", "total_step", "norm1.weight", "norm1.bias", "norm2.alpha", "norm2.bn.weight",
              "norm2.bn.bias", "norm2.bn.running_mean", "norm2.bn.running_var", "norm2.bn.num_batches_tracked")
# MODELS.md §2.3 measured parameter counts (millions, as printed)
PARAMS = {"slab_pvt_tiny": 12.16, "slab_pvt_small": 21.68, "slab_pvt_medium": 37.27, "prepbn_pvt_tiny": 13.24}
DEPTHS = {"tiny": (2, 2, 2, 2), "small": (3, 4, 6, 3), "medium": (3, 4, 18, 3)}




def official_keys(depths, attn_type: str, sr_ratios=(8, 4, 2, 1), la_sr_ratios=(1, 1, 1, 1)) -> list[str]:
    """The official PyramidVisionTransformer state_dict keys, in order, written out from its constructor."""
    keys = [f"pos_embed{i}" for i in range(1, 5)]
    for i in range(4):
        s = f"patch_embed{i + 1}"
        keys += [f"{s}.proj.weight", f"{s}.proj.bias"] + [f"{s}.norm.{k}" for k in LINEARNORM]
        sr = sr_ratios[i] if attn_type[i] == "S" else la_sr_ratios[i]
        for j in range(depths[i]):
            b = f"block{i + 1}.{j}"
            attn = ["positional_encoding"] if attn_type[i] == "L" else []
            attn += ["q.weight", "q.bias", "kv.weight", "kv.bias", "proj.weight", "proj.bias"]
            if sr > 1:
                attn += ["sr.weight", "sr.bias"] + [f"norm.{k}" for k in LINEARNORM]
            if attn_type[i] == "L":
                attn += ["dwc.weight", "dwc.bias"]
            keys += ([f"{b}.norm1.{k}" for k in LINEARNORM] + [f"{b}.attn.{k}" for k in attn] +
                     [f"{b}.norm2.{k}" for k in LINEARNORM] +
                     [f"{b}.mlp.{m}.{p}" for m in ("fc1", "fc2") for p in ("weight", "bias")])
    return keys + ["head.weight", "head.bias"]


def _trained_like(name: str, seed: int = 0, **overrides) -> nn.Module:
    # fp64 before folding: the gate compares at 1e-9, below fp32 weight rounding
    return make_trained_like(create_model(name, **{**REDUCED, **overrides}), seed=seed).double().eval()


# --- released variants: official keys, shapes, counts (meta device) ------------------------------------------------

@pytest.mark.parametrize("size", sorted(DEPTHS))
@pytest.mark.parametrize("kind", ["slab", "prepbn"])
def test_released_layout_loads_and_counts(kind, size):
    name = f"{kind}_pvt_{size}"
    with torch.device("meta"):
        model = create_model(name)
        target = create_model(name)
    state = model.state_dict()
    assert list(state) == official_keys(DEPTHS[size], "LLLL" if kind == "slab" else "SSSS")
    result = load_checkpoint(target, {"model": state})  # an official-layout state_dict: no missing/unexpected keys
    assert result.ok and result.loaded == len(state) and result.remaps == []
    shapes = {"pos_embed1": (1, 3136, 64), "pos_embed4": (1, 49, 512), "patch_embed1.proj.weight": (64, 3, 4, 4),
              "patch_embed2.proj.weight": (128, 64, 2, 2), "block3.0.mlp.fc1.weight": (1280, 320),
              "head.weight": (1000, 512)}
    if kind == "slab":
        shapes.update({"block1.0.attn.positional_encoding": (1, 3136, 64), "block1.0.attn.dwc.weight": (64, 1, 5, 5),
                       "block4.0.attn.positional_encoding": (1, 49, 512), "block1.0.attn.kv.weight": (128, 64)})
    else:
        shapes.update({"block1.0.attn.sr.weight": (64, 64, 8, 8), "block3.0.attn.sr.weight": (320, 320, 2, 2)})
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    if name in PARAMS:
        assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS[name]
    spec = model.vitedge_spec
    assert (spec.fixed_imgsz, spec.stride) == (None, 32)


def test_linear_norm_defaults():
    model = create_model("slab_pvt_tiny", **REDUCED)
    ln = model.block1[0].norm1
    assert isinstance(ln, LinearNorm) and int(ln.total_step) == int(ln.iter) == 300000 and int(ln.warm) == 0
    assert ln.norm1.eps == 1e-6 and isinstance(ln.norm2, RepBN)


def test_stage_pos_embed_is_an_identity_resize_at_the_native_size():
    model = _trained_like("prepbn_pvt_tiny", seed=1)
    for i, grid in enumerate([(16, 16), (8, 8), (4, 4), (2, 2)]):
        assert torch.equal(model.stage_pos_embed(i, grid), getattr(model, f"pos_embed{i + 1}"))


def test_official_crash_size_is_a_clear_error():
    # 128 px on a 64-px model: stage 2 gets 16x16 tokens, stage 1's count, where the official code skips the resize
    model = create_model("prepbn_pvt_tiny", **REDUCED).eval()
    with pytest.raises(VitedgeError, match="stage 2"):
        model(torch.zeros(1, 3, 128, 128))


def test_slab_sla_order_uses_reduced_key_count():
    attn = create_model("slab_pvt_tiny", **REDUCED, la_sr_ratios="4111").block1[0].attn
    assert isinstance(attn, PVTLinearAttention) and attn.positional_encoding.shape[1] == 16
    assert attn.order_for(256, 16) == "kv_first" and attn.order_for(16, 16) == "qk_first"


# --- re-parameterization -------------------------------------------------------------------------------------------

def _assert_deploy_form(model, deploy):
    bad = [n for n, m in deploy.named_modules() if isinstance(m, NORM_TYPES)]
    assert not bad, f"norm/dropout/affine modules left in the deploy-form: {bad}"
    s = deploy.reparam_summary
    assert s.unfolded == []
    blocks = [f"block{i + 1}.{j}" for i in range(4) for j in range(len(getattr(model, f"block{i + 1}")))]
    assert list(s.attention_order) == [f"{b}.attn" for b in blocks]
    assert s.folded["norm->patch_embed.proj"] == 4 and s.folded["norm->mlp.fc1"] == len(blocks)
    # every norm's parameters are gone, nothing else (q/kv/sr/proj all carry biases already); pos embeds take the
    # export grid's size
    norm_params = sum(p.numel() for m in model.modules() if isinstance(m, LinearNorm) for p in m.parameters())
    pos = sum(getattr(deploy, f"pos_embed{i}").numel() - getattr(model, f"pos_embed{i}").numel() for i in range(1, 5))
    assert sum(p.numel() for p in deploy.parameters()) == sum(p.numel() for p in model.parameters()) - norm_params + pos


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("order", ["auto", "qk_first", "kv_first"])
def test_slab_reparam_exact(order, rewrites):
    model = _trained_like("slab_pvt_tiny", seed=2)
    deploy = reparameterize(model, attn_order=order, rewrites=rewrites)
    res = verify_equivalence(model, deploy, samples=2)
    assert res.passed and res.max_abs <= 1e-9 * res.scale
    assert [b["name"] for b in res.blocks][:3] == ["patch_embed1", "block1.0", "patch_embed2"]
    _assert_deploy_form(model, deploy)
    s = deploy.reparam_summary
    assert s.folded["identity_pos_resize_removed"] == 3 and "pos_resize->constant" not in s.folded
    if order == "auto":  # FLOP rule, N = N' (sr 1): kv_first iff N > d; 256, 64, 16, 4 tokens vs d = 16 (tie: qk)
        assert [s.attention_order[f"block{i}.0.attn"] for i in (1, 2, 3, 4)] == ["kv_first"] * 2 + ["qk_first"] * 2
        assert "N*N'*(d_qk+d_v)=8192 vs d_qk*d_v*(N+N')=8192" in s.attention_reason["block3.0.attn"]
    else:
        assert set(s.attention_order.values()) == {order}
        assert all("forced" in r for r in s.attention_reason.values())
    assert ("pvt_q_kv_merged_into_qkv" in s.rewrites) == rewrites


def test_slab_spatial_reduction_path_exact():
    # la_sr_ratios 4,2: the LinearNorm inside sr -> norm -> kv folds into kv, v's token resize becomes a MatMul
    model = _trained_like("slab_pvt_tiny", seed=3, la_sr_ratios="4211")
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    s = deploy.reparam_summary
    assert s.folded["sr_norm->attn.kv"] == s.folded["norm->attn.sr"] == s.folded["v_token_resize->matmul"] == 3
    assert deploy.block1[0].attn.v_resize.shape == (256, 16)
    assert "N=256, N'=16" in s.attention_reason["block1.0.attn"]
    _assert_deploy_form(model, deploy)


@pytest.mark.parametrize("imgsz", [64, 96])
def test_prepbn_reparam_exact(imgsz):
    # 96 px on the 64-px model: every stage's pos embed is really resized (a constant for that size)
    model = _trained_like("prepbn_pvt_tiny", seed=4)
    deploy = reparameterize(model, imgsz=imgsz)
    assert verify_equivalence(model, deploy, imgsz, samples=2).passed
    _assert_deploy_form(model, deploy)
    s = deploy.reparam_summary
    assert s.folded["attn_scale->q"] == 5 and s.folded["sr_norm->attn.kv"] == 4  # stages 1-3 reduce, stage 4 not
    assert set(s.attention_order.values()) == {"qk_first"}
    if imgsz == 64:
        assert s.folded["identity_pos_resize_removed"] == 3
    else:
        assert s.folded["pos_resize->constant"] == 4 and deploy.pos_embed1.shape == (1, 576, 16)
    with pytest.raises(VitedgeError, match=f"{imgsz}x{imgsz}"):
        deploy(torch.zeros(1, 3, 160, 160, dtype=torch.float64))


def test_slab_at_another_size_resamples_its_sla_encodings():
    model = _trained_like("slab_pvt_tiny")
    deploy = reparameterize(model, imgsz=96)  # a copy: its SLA positional encodings resampled to the 96-px grids
    assert verify_equivalence(model, deploy, 96, samples=2).passed
    assert model.block1[0].attn.positional_encoding.shape[1] == 256  # the caller's model keeps its 16x16 tables
    with pytest.raises(VitedgeError, match="divisible by 32"):
        reparameterize(model, imgsz=100)


@pytest.mark.parametrize("name", ["slab_pvt_small", "prepbn_pvt_tiny"])
def test_released_deploy_structure(name):
    # The plan on a full variant (meta tensors: structure and counts, no numerics).
    with torch.device("meta"):
        model = create_model(name).eval()
        ctx = FoldContext(imgsz=224)
        deploy = plan_pvt(model, ctx)
    deploy.reparam_summary = ctx.summary
    assert isinstance(deploy, PVTDeploy)
    _assert_deploy_form(model, deploy)
    if name.startswith("slab"):  # N = 3136, 784, 196, 49 against d = 64: kv_first except the 7x7 stage
        assert ctx.summary.attention_order["block3.5.attn"] == "kv_first"
        assert ctx.summary.attention_order["block4.0.attn"] == "qk_first"


def test_gate_names_first_diverging_block():
    model = _trained_like("slab_pvt_tiny", seed=5)
    deploy = reparameterize(model, rewrites=False)
    with torch.no_grad():  # a broken fold: block 2.1's norm1 shift (W b) dropped from q's bias
        deploy.block2[1].attn.q.bias.copy_(model.block2[1].attn.q.bias)
    res = verify_equivalence(model, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "block2.1"
    with pytest.raises(EquivalenceError, match="block2.1"):
        verify_equivalence(model, deploy, samples=2)


# --- ONNX -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [f"{kind}_pvt_{size}" for kind in ("slab", "prepbn") for size in DEPTHS])
def test_every_name_gate_and_onnx_parity(name):
    # each name's registered defaults (attention type, sr ratios, norms) on the reduced widths and depths;
    # prepbn_pvt_tiny at 96 px: the pos-embed resizes become constants and still export without Resize
    imgsz = 96 if name == "prepbn_pvt_tiny" else 64
    model = make_trained_like(create_model(name, **REDUCED), seed=6).double().eval()
    deploy = reparameterize(model, imgsz=imgsz)
    assert verify_equivalence(model, deploy, imgsz, samples=2).passed
    metrics, ops = onnx_parity(model, deploy, imgsz)
    assert DEFAULT_TOLERANCES["fp32"].violations(metrics) == [], metrics
    assert "Resize" not in ops and not any(op in ops for op in NORM_OPS), ops
    assert "Einsum" not in ops
