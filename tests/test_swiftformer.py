"""SwiftFormer: official layout and golden parity, timm parity, and the BatchNorm-free deploy-form."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.equivalence import EquivalenceError, verify_equivalence
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.reparam.swiftformer import AdditiveAttention2d, EncoderBlock, SwiftFormerDeploy
from vitedge.models import VitedgeError, create_model, make_trained_like
from vitedge.models.layers import EfficientAdditiveAttention
from vitedge.models.reduced import reduced
from vitedge.models.swiftformer import ConvEncoder, SwiftFormerEncoder
from vitedge.tests._timm import import_timm
from vitedge.tests.conftest import assert_close_rel, load_golden

# MODELS.md §1.1: depths, widths and measured parameter counts (including dist_head) of the released variants.
VARIANTS = {
    "swiftformer_xs": ([3, 3, 6, 4], [48, 56, 112, 220], 3_475_360),
    "swiftformer_s": ([3, 3, 9, 6], [48, 64, 168, 224], 6_092_128),
    "swiftformer_l1": ([4, 3, 10, 5], [48, 96, 192, 384], 12_057_920),
    "swiftformer_l3": ([4, 4, 12, 6], [64, 128, 320, 512], 28_494_736),
}
TINY = reduced("swiftformer")  # the golden fixture's config


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    # Tiny float64 convs are dominated by OpenMP hand-offs; one thread is several times faster on a busy machine.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


_TRAINED: dict = {}


def trained(name: str, **overrides) -> nn.Module:
    """A float64 trained-like train-form model, cached per (name, overrides)."""
    key = (name, tuple(sorted((k, str(v)) for k, v in overrides.items())))
    if key not in _TRAINED:
        _TRAINED[key] = make_trained_like(create_model(name, **overrides), seed=7).double().eval()
    return _TRAINED[key]


def deploy_params(depths, widths, num_classes=1000) -> int:
    """Parameter count of the folded architecture, from the block structure alone (no BN, no layer scales,
    one head, w_g kept as a C->1 projection)."""
    c0 = widths[0]
    n = 3 * (c0 // 2) * 9 + c0 // 2 + (c0 // 2) * c0 * 9 + c0  # two stem convs
    for i, (d, c) in enumerate(zip(depths, widths)):
        if i:
            n += widths[i - 1] * c * 9 + c  # Embedding conv
        dw = c * 9 + c
        mlp = c * 4 * c + 4 * c + 4 * c * c + c
        n += (d - 1) * (dw + mlp)  # ConvEncoders
        n += dw + 2 * (c * c + c)  # local representation
        n += 4 * (c * c + c) + c  # to_query, to_key, Proj, final, w_g
        n += mlp  # Mlp (fc1, fc2)
    return n + widths[-1] * num_classes + num_classes


def train_extras(depths, widths, num_classes=1000) -> int:
    """What the fold removes: BN weight+bias, layer scales, the distillation head."""
    bn = widths[0] // 2 + widths[0] + sum(widths[1:]) + sum(d * c for d, c in zip(depths, widths))
    bn += sum(widths) + widths[-1]  # Mlp norm1 per encoder, final norm
    ls = sum((d - 1) * c + 3 * c for d, c in zip(depths, widths))
    return 2 * bn + ls + widths[-1] * num_classes + num_classes


# ---------------------------------------------------------------- train-form: official layout and outputs

def _golden_model():
    io = load_golden("swiftformer_tiny_io.pt")
    ck = load_golden("swiftformer_tiny.pth")
    model = create_model("swiftformer_xs", **io["overrides"])
    model.load_state_dict(ck["model"], strict=True)
    return model, io


def test_golden_eval_output():
    model, io = _golden_model()
    with torch.no_grad():
        y = model.eval()(io["input"])
    assert_close_rel(y, io["output"], 1e-5)


def test_golden_train_mode_returns_both_heads():
    model, io = _golden_model()
    model.train()
    for m in model.modules():  # running statistics, as the fixture's heads were computed
        if isinstance(m, nn.BatchNorm2d):
            m.eval()
    with torch.no_grad():
        out = model(io["input"])
    assert isinstance(out, tuple) and len(out) == 2
    assert_close_rel(out[0], io["output_head"], 1e-5)
    assert_close_rel(out[1], io["output_dist_head"], 1e-5)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_param_counts_match_models_md(name):
    depths, widths, count = VARIANTS[name]
    model = create_model(name)
    assert sum(p.numel() for p in model.parameters()) == count
    # The structure the deploy count relies on accounts for every official parameter.
    assert deploy_params(depths, widths) + train_extras(depths, widths) == count


def test_param_count_without_distillation():
    depths, widths, count = VARIANTS["swiftformer_xs"]
    model = create_model("swiftformer_xs", distillation=False)
    assert not hasattr(model, "dist_head")
    assert sum(p.numel() for p in model.parameters()) == count - (widths[-1] * 1000 + 1000)


def test_official_key_layout():
    model = create_model("swiftformer_xs")
    sd = model.state_dict()
    assert len(model.network) == 7
    for path in ("network.0.2", "network.2.2", "network.4.5", "network.6.3"):
        assert isinstance(model.get_submodule(path), SwiftFormerEncoder), path
    assert isinstance(model.get_submodule("network.4.4"), ConvEncoder)
    for key in ("patch_embed.0.bias", "patch_embed.1.running_var", "patch_embed.4.num_batches_tracked",
                "network.1.proj.weight", "network.5.norm.running_mean", "network.0.0.layer_scale",
                "network.0.2.layer_scale_1", "network.0.2.local_representation.layer_scale",
                "network.0.2.attn.w_g", "network.0.2.attn.Proj.weight", "network.0.2.attn.final.bias",
                "network.6.3.linear.norm1.running_mean", "network.6.3.linear.fc1.weight",
                "norm.running_var", "head.weight", "dist_head.bias"):
        assert key in sd, key
    assert sd["network.0.2.attn.w_g"].shape == (48, 1)
    assert sd["network.0.2.layer_scale_1"].shape == (48, 1, 1)
    assert sd["network.2.0.pwconv1.weight"].shape == (224, 56, 1, 1)
    assert not any("scale_factor" in k or "attn.proj." in k for k in sd)
    # Default init as the official code: layer scales 1 (conv branches) and 1e-5 (encoder), w_g not zero.
    assert torch.all(sd["network.0.0.layer_scale"] == 1.0)
    assert torch.allclose(sd["network.0.2.layer_scale_2"], torch.full((48, 1, 1), 1e-5))


def test_distillation_false_returns_head_only():
    model = make_trained_like(create_model("swiftformer_xs", distillation=False, **TINY), seed=1)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model.head(model.eval().forward_features(x).mean(dim=(2, 3)))
        assert torch.allclose(model(x), ref, atol=1e-6)
        assert isinstance(model.train()(x), torch.Tensor)


def _timm_to_official(key: str) -> str:
    """Reverse of timm's `checkpoint_filter_fn` (MODELS.md §1.1)."""
    key = re.sub(r"\.(layer_scale(?:_1|_2)?)\.gamma$", r".\1", key)
    key = key.replace("attn.proj.", "attn.Proj.")
    key = re.sub(r"^stem\.", "patch_embed.", key)
    key = re.sub(r"^head_dist\.", "dist_head.", key)
    m = re.match(r"^stages\.(\d+)\.(blocks|downsample)\.(.*)$", key)
    if m:
        i, kind, rest = int(m.group(1)), m.group(2), m.group(3)
        key = f"network.{2 * i if kind == 'blocks' else 2 * i - 1}.{rest}"
    return key


def test_matches_timm_swiftformer_xs():
    timm = import_timm()
    from timm.models.swiftformer import checkpoint_filter_fn

    ref = make_trained_like(timm.create_model("swiftformer_xs"), seed=3).eval()
    ref_sd = ref.state_dict()
    ours = create_model("swiftformer_xs").eval()
    mapped = {_timm_to_official(k): v for k, v in ref_sd.items()}
    ours.load_state_dict(mapped, strict=True)
    # The forward map of timm itself sends our keys back to exactly timm's.
    assert checkpoint_filter_fn(ours.state_dict(), ref).keys() == ref_sd.keys()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y_ref, y = ref(x), ours(x)
    assert float(y_ref.abs().max()) > 0.1  # a non-degenerate comparison
    assert float((y - y_ref).abs().max()) <= 1e-5


# ---------------------------------------------------------------- deploy-form

def _fold_count(depths) -> dict:
    blocks, encoders = sum(depths), len(depths)
    return {"conv+bn": 2 + (len(depths) - 1) + blocks, "bn->conv1x1": encoders,
            "layer_scale": (blocks - encoders) + 3 * encoders, "attn_scale->w_g": encoders,
            "bn+gap+head->linear": 1, "dist_head averaged into head": 1}


def _check_deploy(name, train, deploy, imgsz, rewrites):
    res = verify_equivalence(train, deploy, imgsz, samples=6 if name == "swiftformer_xs" else 2)
    depths, widths, _ = VARIANTS[name]
    assert res.passed and len(res.blocks) == 1 + 3 + sum(depths) + len(depths)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in deploy.modules())
    assert not any("layer_scale" in n for n, _ in deploy.named_parameters())
    assert sum(p.numel() for p in deploy.parameters()) == deploy_params(depths, widths)
    assert dict(deploy.reparam_summary.folded) == _fold_count(depths)
    assert deploy.reparam_summary.unfolded == []
    encoders = [m for m in deploy.modules() if isinstance(m, EncoderBlock)]
    assert len(encoders) == len(depths)
    attn_type = AdditiveAttention2d if rewrites else EfficientAdditiveAttention
    assert all(isinstance(e.attn, attn_type) and e.channels_first == rewrites for e in encoders)
    assert bool(deploy.reparam_summary.rewrites) == rewrites


REPARAM_CASES = [(name, 64, rw) for name in VARIANTS for rw in (True, False)]
REPARAM_CASES += [("swiftformer_xs", 224, True), ("swiftformer_xs", 224, False), ("swiftformer_xs", 160, True)]


@pytest.mark.parametrize("name,imgsz,rewrites", REPARAM_CASES,
                         ids=[f"{n}-{s}-{'rewrites' if r else 'folds_only'}" for n, s, r in REPARAM_CASES])
def test_reparam_equivalence(name, imgsz, rewrites):
    train = trained(name)
    deploy = reparameterize(train, imgsz, rewrites=rewrites)
    assert isinstance(deploy, SwiftFormerDeploy)
    _check_deploy(name, train, deploy, imgsz, rewrites)


def test_rewritten_graph_has_no_token_reshapes():
    deploy = reparameterize(trained("swiftformer_xs", **TINY), 64)
    gm = torch.fx.symbolic_trace(deploy)
    ops = {str(n.target) for n in gm.graph.nodes if n.op in ("call_method", "call_function")}
    assert not ops & {"permute", "reshape", "view", "flatten", "expand", "repeat", "transpose"}, ops
    assert not any("normalize" in o or "batch_norm" in o for o in ops), ops
    assert not any(isinstance(m, nn.Linear) for n, m in deploy.named_modules() if n != "head")


def test_fp32_deploy_matches_fp32_train():
    train = make_trained_like(create_model("swiftformer_xs"), seed=5).eval()
    deploy = reparameterize(train, 64)  # folded in fp32: rounding only
    x = torch.randn(4, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close_rel(deploy(x), train(x), 1e-5)


def test_reparam_of_official_checkpoint_matches_official_fp64_output():
    model, io = _golden_model()
    deploy = reparameterize(model.double(), 64)
    with torch.no_grad():
        y = deploy(io["input"].double())
    assert_close_rel(y, io["output_fp64"], 1e-9)


@pytest.mark.parametrize("overrides", [dict(distillation=False), dict(use_layer_scale=False),
                                       dict(num_classes=0)], ids=["no_dist", "no_layer_scale", "no_head"])
def test_reparam_variant_options(overrides):
    train = trained("swiftformer_xs", **{**TINY, **overrides})
    deploy = reparameterize(train, 64)
    verify_equivalence(train, deploy, 64, samples=4)
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in deploy.modules())
    folded = deploy.reparam_summary.folded
    if overrides.get("distillation") is False:
        assert "dist_head averaged into head" not in folded
    if overrides.get("use_layer_scale") is False:
        assert folded["layer_scale"] == sum(TINY["layers"])  # only the conv branches keep theirs
    if overrides.get("num_classes") == 0:
        assert [u["module"] for u in deploy.reparam_summary.unfolded] == ["norm"]
        assert deploy(torch.randn(1, 3, 64, 64).double()).shape == (1, TINY["embed_dims"][-1])
    else:
        expect = deploy_params(TINY["layers"], TINY["embed_dims"], 10)
        assert sum(p.numel() for p in deploy.parameters()) == expect


@pytest.mark.parametrize("path,expected", [
    ("network.4.1.linear.fc1", "network.4.1"),  # Mlp norm1 fold
    ("network.6.0.local_representation.dwconv", "network.6.0.local_representation"),  # dwconv+BN fold
    ("network.3", "network.3"),  # Embedding conv+BN fold
    ("head", "(logits)"),  # BN+GAP+heads fold
])
def test_gate_names_first_broken_block(path, expected):
    train = trained("swiftformer_xs", **TINY)
    deploy = reparameterize(train, 64)
    with torch.no_grad():
        deploy.get_submodule(path).bias[0] += 1e-4
    with pytest.raises(EquivalenceError) as err:
        verify_equivalence(train, deploy, 64, samples=2)
    assert err.value.diverging_module == expected
    assert expected in str(err.value)


def test_rejects_size_not_divisible_by_stride():
    with pytest.raises(VitedgeError, match="divisible by 32"):
        reparameterize(create_model("swiftformer_xs", **TINY), 100)
