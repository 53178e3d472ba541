"""SLAB-CSWin: official key layout and counts, the fold plan's exactness, the lepe+dwc merge, ONNX parity."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.onnx.onnx_export import NORM_OPS
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.engine import FoldContext
from vitedge.exporter.reparam.primitives import ChannelAffine
from vitedge.exporter.reparam.slab_cswin import CSWinDeploy, merge_depthwise, plan_cswin
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint
from vitedge.models.layers import LinearNorm, RepBN

from vitedge.models.reduced import reduced
from vitedge.tests.conftest import onnx_parity

# Reduced config (64 px: resolutions 16, 8, 4, 2). `la_split_size` 16-8-4-2 keeps the released structure (the L
# stages one global window); 8-4-4-2 with LLLS gives two-branch SLA stages as well.
REDUCED = reduced("slab_cswin")
TWO_BRANCH = dict(la_split_size="8-4-4-2", attn_type="LLLS")  # over REDUCED: models/reduced.py slab_cswin_two_branch
NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, RepBN, LinearNorm, nn.Dropout, ChannelAffine)
LINEARNORM = ("warm", "iter", "total_step", "norm1.weight", "norm1.bias", "norm2.alpha", "norm2.bn.weight",
              "norm2.bn.bias", "norm2.bn.running_mean", "norm2.bn.running_var", "norm2.bn.num_batches_tracked")
PARAMS = {"slab_cswin_tiny": 21.23, "slab_cswin_small": 35.49}  # MODELS.md §2.3, millions
DEPTHS = {"slab_cswin_tiny": (2, 4, 18, 1), "slab_cswin_small": (2, 4, 32, 2)}




def official_keys(depths, branches) -> list[str]:
    """The official CSWinTransformer state_dict keys, in order; `branches[i]` = 'L1', 'L2', 'S1' or 'S2'."""
    def norm(p):
        return [f"{p}.{k}" for k in LINEARNORM]

    def wb(p):
        return [f"{p}.weight", f"{p}.bias"]

    keys = wb("stage1_conv_embed.0") + norm("stage1_conv_embed.2")
    for i in range(4):
        if i:
            keys += wb(f"merge{i}.conv") + norm(f"merge{i}.norm")
        kind, count = branches[i][0], int(branches[i][1])
        for j in range(depths[i]):
            p = f"stage{i + 1}.{j}"
            keys += wb(f"{p}.qkv") + norm(f"{p}.norm1") + wb(f"{p}.proj")
            for b in range(count):
                a = f"{p}.attns.{b}"
                keys += ([f"{a}.scale", f"{a}.positional_encoding"] + wb(f"{a}.get_v") + wb(f"{a}.dwc")
                         if kind == "L" else wb(f"{a}.get_v"))
            keys += wb(f"{p}.mlp.fc1") + wb(f"{p}.mlp.fc2") + norm(f"{p}.norm2")
    return keys + norm("norm") + wb("head")


def _trained_like(seed: int = 0, **overrides) -> nn.Module:
    model = create_model("slab_cswin_tiny", **{**REDUCED, **overrides})
    return make_trained_like(model, seed=seed).double().eval()


# --- released variants ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PARAMS))
def test_released_layout_loads_and_counts(name):
    with torch.device("meta"):
        model = create_model(name)
        target = create_model(name)
    state = model.state_dict()
    assert list(state) == official_keys(DEPTHS[name], ("L1", "L1", "S2", "S1"))
    result = load_checkpoint(target, {"model": state})
    assert result.ok and result.loaded == len(state) and result.remaps == []
    shapes = {"stage1_conv_embed.0.weight": (64, 3, 7, 7), "stage1.0.attns.0.positional_encoding": (1, 3136, 64),
              "stage1.0.attns.0.scale": (1, 1, 64), "stage1.0.attns.0.dwc.weight": (32, 1, 5, 5),
              "stage1.0.attns.0.get_v.weight": (64, 1, 3, 3), "stage2.0.attns.0.positional_encoding": (1, 784, 128),
              "stage3.0.attns.1.get_v.weight": (128, 1, 3, 3), "stage4.0.attns.0.get_v.weight": (512, 1, 3, 3),
              "merge3.conv.weight": (512, 256, 3, 3), "head.weight": (1000, 512)}
    for key, shape in shapes.items():
        assert tuple(state[key].shape) == shape, key
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS[name]
    assert (model.vitedge_spec.fixed_imgsz, model.vitedge_spec.stride) == (None, 32)


def test_linear_norm_and_windows():
    model = create_model("slab_cswin_tiny", **{**REDUCED, **TWO_BRANCH})
    ln = model.stage1[0].norm1
    assert isinstance(ln, LinearNorm) and int(ln.total_step) == 120000 and ln.norm1.eps == 1e-5
    b0, b1 = model.stage1[0].attns  # two stripe orientations on half the channels
    assert (b0.H_sp, b0.W_sp, b1.H_sp, b1.W_sp, b0.dim, b0.num_heads) == (16, 8, 8, 16, 8, 1)
    assert b0.positional_encoding.shape == (1, 128, 8)
    assert len(model.stage4[0].attns) == 1  # the last stage is always one global window


def test_wrong_input_size_is_a_clear_error():
    with pytest.raises(VitedgeError, match="64x64"):
        create_model("slab_cswin_tiny", **REDUCED)(torch.zeros(1, 3, 96, 96))


# --- re-parameterization -------------------------------------------------------------------------------------------

def test_merge_depthwise_is_exact_at_the_borders():
    torch.manual_seed(0)
    heads, d = 3, 4
    get_v = nn.Conv2d(heads * d, heads * d, 3, padding=1, groups=heads * d).double()
    dwc = nn.Conv2d(d, d, 5, padding=2, groups=d).double()
    x = torch.randn(2, heads * d, 6, 5, dtype=torch.float64)
    with torch.no_grad():
        ref = get_v(x) + dwc(x.reshape(2 * heads, d, 6, 5)).reshape(2, heads * d, 6, 5)
        out = merge_depthwise(get_v, dwc, heads)(x)
    assert float((out - ref).abs().max()) <= 1e-13 * float(ref.abs().max())


def _assert_deploy_form(model, deploy):
    bad = [n for n, m in deploy.named_modules() if isinstance(m, NORM_TYPES)]
    assert not bad, f"norm/dropout/affine modules left in the deploy-form: {bad}"
    s = deploy.reparam_summary
    assert s.unfolded == []
    blocks = [m for i in range(4) for m in getattr(model, f"stage{i + 1}")]
    assert s.folded["norm->qkv"] == s.folded["norm->mlp.fc1"] == len(blocks)
    assert s.folded["norm->merge.conv"] == 3 and s.folded["norm->stage1_conv_embed.0"] == s.folded["norm->head"] == 1
    # analytic count: norms gone; each SLA branch loses `scale` and its dwc, get_v widened to the merged kernel
    sla = [br for blk in blocks for br in blk.attns if hasattr(br, "dwc")]
    norm_params = sum(p.numel() for m in model.modules() if isinstance(m, LinearNorm) for p in m.parameters())
    dropped = sum(br.scale.numel() + br.dwc.weight.numel() + br.dwc.bias.numel() + br.get_v.weight.numel()
                  - br.dim * br.dwc.kernel_size[0] ** 2 for br in sla)
    expected = sum(p.numel() for p in model.parameters()) - norm_params - dropped
    assert sum(p.numel() for p in deploy.parameters()) == expected


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("order", ["auto", "qk_first", "kv_first"])
def test_reparam_exact(order, rewrites):
    model = _trained_like(seed=1)
    deploy = reparameterize(model, attn_order=order, rewrites=rewrites)
    res = verify_equivalence(model, deploy, samples=2)
    assert res.passed and res.max_abs <= 1e-9 * res.scale
    assert [b["name"] for b in res.blocks][:4] == ["stage1_conv_embed", "stage1.0", "merge1", "stage2.0"]
    _assert_deploy_form(model, deploy)
    s = deploy.reparam_summary
    sla = ["stage1.0.attns.0", "stage2.0.attns.0", "stage2.1.attns.0"]
    if order == "auto":  # one window of 256 / 64 tokens vs head_dim 8: K^T V first
        assert [s.attention_order[p] for p in sla] == ["kv_first"] * 3
        assert "N=256, N'=256, d_qk=8" in s.attention_reason["stage1.0.attns.0"]
    else:
        assert [s.attention_order[p] for p in sla] == [order] * 3
    assert s.attention_order["stage3.0.attns.1"] == "qk_first"  # softmax
    assert s.folded["lepe+dwc->depthwise_conv"] == 3 and s.folded["attn_scale->q"] == 2
    assert ("single_window_without_partition" in s.rewrites) == rewrites
    assert deploy.stage1[0].attns[0].partition == (not rewrites)


def test_two_branch_linear_stages_exact():
    model = _trained_like(seed=2, **TWO_BRANCH)
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    _assert_deploy_form(model, deploy)
    s = deploy.reparam_summary
    assert {p for p in s.attention_order if p.startswith("stage1.")} == {"stage1.0.attns.0", "stage1.0.attns.1"}
    assert deploy.stage1[0].attns[1].window == (8, 16) and deploy.stage1[0].attns[1].partition


def test_released_deploy_structure():
    with torch.device("meta"):
        model = create_model("slab_cswin_tiny").eval()
        ctx = FoldContext(imgsz=224)
        deploy = plan_cswin(model, ctx)
    deploy.reparam_summary = ctx.summary
    assert isinstance(deploy, CSWinDeploy)
    _assert_deploy_form(model, deploy)
    assert ctx.summary.attention_order["stage1.0.attns.0"] == "kv_first"  # 3136 tokens vs d = 32
    assert deploy.stage1[0].attns[0].local.kernel_size == (5, 5)


def test_gate_names_first_diverging_block():
    model = _trained_like(seed=3)
    deploy = reparameterize(model)
    with torch.no_grad():  # a naive merge: dwc's kernel dropped from the merged lepe conv of stage 2.1
        local = deploy.stage2[1].attns[0].local
        local.weight.copy_(F.pad(model.stage2[1].attns[0].get_v.weight, (1, 1, 1, 1)))
    res = verify_equivalence(model, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "stage2.1"
    with pytest.raises(EquivalenceError, match="stage2.1"):
        verify_equivalence(model, deploy, samples=2)


# --- ONNX -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,extra", [("slab_cswin_tiny", {}), ("slab_cswin_small", {}),
                                        ("slab_cswin_tiny", TWO_BRANCH)], ids=["tiny", "small", "tiny_two_branch_sla"])
def test_every_name_gate_and_onnx_parity(name, extra):
    model = make_trained_like(create_model(name, **{**REDUCED, **extra}), seed=4).double().eval()
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    metrics, ops = onnx_parity(model, deploy, 64)
    assert DEFAULT_TOLERANCES["fp32"].violations(metrics) == [], metrics
    assert not any(op in ops for op in NORM_OPS) and "Einsum" not in ops, ops
