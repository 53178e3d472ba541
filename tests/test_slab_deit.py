"""SLAB-DeiT and PRepBN-DeiT: official golden outputs, key layouts and counts, and the fold plan's exactness."""
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.engine import FoldContext
from vitedge.exporter.reparam.primitives import ChannelAffine
from vitedge.exporter.reparam.slab_deit import plan_slab_deit
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.layers import LinearNorm, RepBN
from vitedge.models.reduced import reduced
from vitedge.models.slab_deit import slab_norm_layer
from vitedge.tests.conftest import assert_close_rel

REDUCED = reduced("slab_deit")
NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, RepBN, LinearNorm, nn.Dropout, ChannelAffine)


def _trained_like(name: str, seed: int = 0, **overrides) -> nn.Module:
    # fp64 before folding: the gate compares at 1e-9, below fp32 weight rounding
    return make_trained_like(create_model(name, **overrides), seed=seed).double().eval()


# --- official golden fixtures -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fixture,name", [("slab_deit_mini", "slab_deit_tiny"),
                                          ("prepbn_deit_mini", "prepbn_deit_tiny")])
def test_golden_eval(golden, fixture, name):
    io, ck = golden(f"{fixture}_io.pt"), golden(f"{fixture}.pth")
    model = create_model(name, **io["overrides"])
    model.load_state_dict(ck["model"], strict=True)
    assert list(model.state_dict()) == list(ck["model"])  # same key order as the official module
    assert sum(p.numel() for p in model.parameters()) == io["num_params"]
    with torch.no_grad():
        y = model.eval()(io["input"])
    assert_close_rel(y, io["output"], 1e-5)


def test_golden_train_mid_schedule(golden):
    io, ck = golden("slab_deit_mini_train_mid_io.pt"), golden("slab_deit_mini.pth")
    model = create_model("slab_deit_tiny", **io["overrides"])
    model.load_state_dict(ck["model"], strict=True)
    norms = [m for m in model.modules() if isinstance(m, LinearNorm)]
    assert len(norms) == 5
    for m in norms:
        for k, v in io["buffers_before"].items():
            getattr(m, k).fill_(v)
    with torch.no_grad():
        y = model.train()(io["input"])
    assert_close_rel(y, io["output"], 1e-5)
    state = model.state_dict()
    for key, ref in io["state_after_buffers"].items():
        if ref.is_floating_point():
            assert_close_rel(state[key], ref, 1e-5)
        else:
            assert torch.equal(state[key], ref), key
    assert {int(m.iter) for m in norms} == set(io["buffers_after_iter"]) == {29999}


# --- released variants: keys, shapes, counts (meta device: no allocation) ------------------------------------------

@pytest.mark.parametrize("name,millions,keys", [
    ("slab_deit_tiny", 6.20, {"blocks.0.norm1.norm2.bn.running_mean": (192,), "blocks.0.attn.dwc.weight": (64, 1, 5, 5),
                              "blocks.0.attn.positional_encoding": (1, 196, 192), "pos_embed": (1, 196, 192),
                              "cls_token": (1, 1, 192)}),
    ("slab_deit_small", 22.99, {"blocks.0.attn.dwc.weight": (64, 1, 5, 5), "pos_embed": (1, 196, 384)}),
    ("prepbn_deit_tiny", 5.72, {"blocks.0.norm1.alpha": (1,), "pos_embed": (1, 197, 192)}),
    ("prepbn_deit_small", None, {"blocks.0.norm1.norm2.alpha": (1,), "pos_embed": (1, 197, 384)}),
])
def test_released_variants(name, millions, keys):
    with torch.device("meta"):
        model = create_model(name)
    state = model.state_dict()
    for key, shape in keys.items():
        assert tuple(state[key].shape) == shape, key
    if millions is not None:
        assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == millions
    norm = slab_norm_layer(model.vitedge_spec.default_kwargs["norm_layer"])
    step = norm.keywords["step"] if isinstance(model.norm, LinearNorm) else None  # meta buffers hold no value
    assert step == {"slab_deit_tiny": 60000, "slab_deit_small": 60000, "prepbn_deit_tiny": None,
                    "prepbn_deit_small": 300000}[name]
    assert (model.vitedge_spec.fixed_imgsz, model.vitedge_spec.stride, model.vitedge_spec.default_imgsz) == (None, 16, 224)


def test_norm_layer_strings():
    ln = slab_norm_layer("LinearNorm(norm1=LayerNorm(eps=1e-6), norm2=RepBN, step=60000)")(8)
    assert isinstance(ln, LinearNorm) and int(ln.total_step) == 60000
    assert isinstance(ln.norm1, nn.LayerNorm) and ln.norm1.eps == 1e-6 and isinstance(ln.norm2, RepBN)
    assert isinstance(slab_norm_layer("RepBN")(8), RepBN)
    assert slab_norm_layer("LinearNorm(norm1=LayerNorm, norm2=RepBN, step=5)")(8).norm1.eps == 1e-5
    assert int(slab_norm_layer("linear_repbn")(8).total_step) == 60000
    with pytest.raises(VitedgeError):
        slab_norm_layer("GroupNorm")
    with pytest.raises(VitedgeError):
        create_model("slab_deit_tiny", norm_layer="LinearNorm(bogus=1)")


@pytest.mark.filterwarnings("ignore:checkpoint taken before the LN->RepBN schedule")  # (fresh LinearNorms)
def test_runs_at_the_size_it_is_set_for():
    model = create_model("slab_deit_tiny", **REDUCED)
    with pytest.raises(VitedgeError, match="set_input_size"):
        model(torch.zeros(1, 3, 256, 256))  # its tables are for 224 until set_input_size resamples them
    with pytest.raises(VitedgeError, match="divisible by 16"):
        reparameterize(model, imgsz=250)
    deploy = reparameterize(model, imgsz=256)  # a copy set to 256 (the caller's model is untouched)
    assert deploy(torch.zeros(1, 3, 256, 256)).shape == (1, 10) and model.pos_embed.shape[1] == 196


# --- re-parameterization --------------------------------------------------------------------------------------------

def _analytic_deploy_params(c, depth, heads, classes, sla, n=196, patch=16, mlp_ratio=4, pos_planes=False,
                            tiled_dwc=False):
    hidden, d = mlp_ratio * c, c // heads
    block = (3 * c * c + 3 * c) + (c * c + c) + (c * hidden + hidden) + (hidden * c + c)
    if sla:  # shared dwc (qkv_as_three_projections, channel-first: repeated per head) + positional_encoding
        block += (c if tiled_dwc else d) * 26 + n * c
    tokens = n * c + (0 if sla else c)  # pos_embed (+ the CLS token, pos folded in)
    if pos_planes:  # pos_embed_in_patch_conv: ceil(n / patch^2) more input channels of the patch conv instead
        tokens = -(-n // (patch * patch)) * patch * patch * c
    return 3 * patch * patch * c + c + tokens + depth * block + c * classes + classes


def _assert_deploy_form(deploy, depth, sla):
    bad = [n for n, m in deploy.named_modules() if isinstance(m, NORM_TYPES)]
    assert not bad, f"norm/dropout/affine modules left in the deploy-form: {bad}"
    s = deploy.reparam_summary
    assert s.unfolded == []
    assert list(s.attention_order) == [f"blocks.{i}.attn" for i in range(depth)]
    assert s.folded["norm->qkv"] == s.folded["norm->fc1"] == depth and s.folded["norm->head"] == 1
    if sla:
        assert s.folded["unused cls_token dropped"] == 1
        assert all("FLOP rule" in r or "forced" in r for r in s.attention_reason.values())


@pytest.mark.parametrize("rewrites", [True, False])
@pytest.mark.parametrize("order", ["auto", "qk_first", "kv_first"])
def test_slab_reparam_exact(order, rewrites):
    model = _trained_like("slab_deit_tiny", seed=1, **REDUCED)
    deploy = reparameterize(model, attn_order=order, rewrites=rewrites)
    res = verify_equivalence(model, deploy, samples=2)
    assert res.passed and len(res.blocks) == 3
    _assert_deploy_form(deploy, depth=2, sla=True)
    expected = "kv_first" if order == "auto" else order  # N=196 > d=32: the FLOP rule picks K^T V first
    assert set(deploy.reparam_summary.attention_order.values()) == {expected}
    assert ("tokens_channels_first" in deploy.reparam_summary.rewrites) == rewrites
    assert ("pos_embed_in_patch_conv" in deploy.reparam_summary.rewrites) == rewrites
    assert ("qkv_as_three_projections" in deploy.reparam_summary.rewrites) == rewrites
    assert sum(p.numel() for p in deploy.parameters()) == _analytic_deploy_params(64, 2, 2, 10, sla=True,
                                                                                  pos_planes=rewrites,
                                                                                  tiled_dwc=rewrites)


@pytest.mark.parametrize("name", ["prepbn_deit_tiny", "prepbn_deit_small"])  # RepBN / LinearNorm layouts
@pytest.mark.parametrize("rewrites", [True, False])
def test_prepbn_reparam_exact(name, rewrites):
    model = _trained_like(name, seed=2, **REDUCED)
    deploy = reparameterize(model, rewrites=rewrites)
    assert verify_equivalence(model, deploy, samples=2).passed
    _assert_deploy_form(deploy, depth=2, sla=False)
    assert deploy.reparam_summary.folded["attn_scale->q"] == 2
    assert sum(p.numel() for p in deploy.parameters()) == _analytic_deploy_params(64, 2, 2, 10, sla=False)


def test_slab_full_width_at_224():
    # The released width (head_dim 64, N=196) with two blocks: full numerics stay fast.
    model = _trained_like("slab_deit_tiny", seed=3, depth=2)
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    reason = deploy.reparam_summary.attention_reason["blocks.0.attn"]
    assert reason.startswith("kv_first") and "d_qk=64" in reason


@pytest.mark.parametrize("name", ["slab_deit_tiny", "slab_deit_small", "prepbn_deit_tiny", "prepbn_deit_small"])
def test_released_deploy_structure(name):
    # The plan on the full variants (meta tensors: structure and counts, no numerics).
    with torch.device("meta"):
        model = create_model(name).eval()
        ctx = FoldContext(imgsz=224)
        deploy = plan_slab_deit(model, ctx)
    deploy.reparam_summary = ctx.summary
    sla = name.startswith("slab")
    c, heads = (192, 3) if "tiny" in name else (384, 6)
    _assert_deploy_form(deploy, depth=12, sla=sla)
    assert sum(p.numel() for p in deploy.parameters()) == _analytic_deploy_params(c, 12, heads, 1000, sla=sla,
                                                                                  pos_planes=sla, tiled_dwc=sla)


def test_gate_names_first_diverging_block():
    model = _trained_like("slab_deit_tiny", seed=4, **REDUCED)
    deploy = reparameterize(model)
    with torch.no_grad():  # a broken fold: block 1's norm2 shift (W b) dropped from fc1's bias
        deploy.blocks[1].mlp.fc1.bias.copy_(model.blocks[1].mlp.fc1.bias)
    res = verify_equivalence(model, deploy, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "blocks.1"
    assert [b["passed"] for b in res.blocks] == [True, True, False]
    with pytest.raises(EquivalenceError) as err:
        verify_equivalence(model, deploy, samples=2)
    assert err.value.diverging_module == "blocks.1"


def test_layernorm_config_is_kept_and_listed_unfolded():
    model = _trained_like("slab_deit_tiny", seed=5, norm_layer="layernorm", **REDUCED)
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    unfolded = [u["module"] for u in deploy.reparam_summary.unfolded]
    assert unfolded == ["blocks.0.norm1", "blocks.0.norm2", "blocks.1.norm1", "blocks.1.norm2", "norm"]
    assert sum(isinstance(m, nn.LayerNorm) for m in deploy.modules()) == 5


class _OpRecorder(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _op_names(deploy) -> list[str]:
    with torch.no_grad(), _OpRecorder() as rec:
        deploy(torch.zeros(1, 3, 224, 224))
    return rec.names


def test_deploy_sla_graph_has_no_einsum_and_fewer_transposes_with_rewrites():
    model = make_trained_like(create_model("slab_deit_tiny", embed_dim=64, depth=1, num_heads=2), seed=6).eval()
    counts = {}
    for rewrites in (True, False):
        ops = _op_names(reparameterize(model, rewrites=rewrites))
        assert "matmul" in ops and "einsum" not in ops
        counts[rewrites] = sum(op in ("transpose", "permute") for op in ops)
    # channel-first tokens end to end: only k's transpose (one MatMul operand) vs the official layout's round trips
    assert counts[True] == 1 and counts[False] > counts[True]


def _ort_layout_ops(deploy) -> dict:
    """Reorders between ONNX Runtime's blocked NCHWc layout and NCHW, and Adds, in its optimized CPU graph."""
    import onnx
    import onnxruntime as ort

    from vitedge.exporter.onnx.onnx_export import export_onnx

    with tempfile.TemporaryDirectory() as tmp:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads, opts.log_severity_level = 1, 3
        opts.optimized_model_filepath = str(Path(tmp) / "opt.onnx")
        ort.InferenceSession(export_onnx(deploy, 224).SerializeToString(), opts, providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node]
    return {"reorders": sum(op.startswith("Reorder") for op in ops), "adds": ops.count("Add"),
            "reorder_inputs": ops.count("ReorderInput"), "splits": ops.count("Split")}


def test_pos_embed_in_patch_conv_keeps_the_residual_stream_blocked():
    # The conv starts the residual stream (no Add of the positional embedding, no Reshape after it), so ONNX
    # Runtime's NCHWc pass keeps the stream blocked: each block's residual Adds fold into its convs (Sum) and
    # the reorders left are the attention's (in and out of its head reshapes, the dwc on v).
    model = make_trained_like(create_model("slab_deit_tiny", **reduced("slab_deit", num_classes=1000)), seed=6).eval()
    base = ["tokens_channels_first", "erf_gelu_fusable"]
    old = _ort_layout_ops(reparameterize(model, rewrites=base))
    new = _ort_layout_ops(reparameterize(model, rewrites=base + ["pos_embed_in_patch_conv"]))
    assert new["adds"] <= old["adds"] - 2 * 2  # the two residual Adds of each of the 2 blocks
    assert new["reorders"] <= old["reorders"] - 4 * 2, (old, new)  # 4 reorders fewer per block


def test_qkv_as_three_projections_runs_the_dwc_blocked_without_a_split():
    # q, k, v from convs of their own: no Split in ONNX Runtime's graph, and the dwc reads v's conv output in the
    # blocked layout (no reorder into it: one ReorderInput fewer per block; each of q, k, v is reordered out once
    # for the head MatMuls instead of qkv once and the dwc's output: the speed is benchmarks/rewrite_ablation.py's)
    model = make_trained_like(create_model("slab_deit_tiny", **reduced("slab_deit", num_classes=1000)), seed=6).eval()
    base = ["tokens_channels_first", "erf_gelu_fusable", "pos_embed_in_patch_conv"]
    old = _ort_layout_ops(reparameterize(model, rewrites=base))
    new = _ort_layout_ops(reparameterize(model, rewrites=base + ["qkv_as_three_projections"]))
    assert old["splits"] == 2 and new["splits"] == 0
    assert new["reorder_inputs"] <= old["reorder_inputs"] - 2, (old, new)
    deploy = reparameterize(model, rewrites=base + ["qkv_as_three_projections"])
    dwc = deploy.blocks[0].attn.dwc
    assert dwc.groups == dwc.in_channels == 64  # the per-head dwc (32 channels) repeated for both heads
    assert torch.equal(dwc.weight[:32], dwc.weight[32:]) and torch.equal(dwc.weight[:32], model.blocks[0].attn.dwc.weight)


def test_headless_model_keeps_final_norm_as_listed_affine():
    model = _trained_like("prepbn_deit_tiny", seed=7, embed_dim=64, depth=1, num_heads=2, num_classes=0)
    deploy = reparameterize(model)
    assert verify_equivalence(model, deploy, samples=2).passed
    assert isinstance(deploy.norm, ChannelAffine)
    assert deploy.reparam_summary.unfolded == [{"module": "norm", "why": "no classifier head to fold into (num_classes=0)"}]
