"""Property-based checks (hypothesis): over small random configs of SwiftFormer, SLAB/PRepBN-DeiT,
SLAB/PRepBN-Swin and SimA (XCiT), random trained-like weights and BN statistics, random valid sizes and
attention orders,
(a) re-parameterization is exact: the float64 equivalence gate passes at its default 1e-9 tolerance;
(b) ONNX is faithful: export -> check -> onnxsim, run in ONNX Runtime, matches the float32 train-form
    within the fp32 profile (max|diff| <= 1e-4 * max|y|, cosine >= 0.99999 per sample).

Each family draws only what its official constructor accepts (MODELS.md): SwiftFormer/SimA sizes are multiples
of their stride; the SLAB models are locked to 224, so their widths, depths, heads and windows vary instead.
Runs are derandomized (same examples every CI run); VITEDGE_PROPERTY_EXAMPLES raises the count for a soak run.
A failure prints the drawn `Case`, which rebuilds the model exactly.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from vitedge.exporter.verdict.equivalence import verify_equivalence
from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.targets.onnx.target import OnnxRuntimeRunner

EXAMPLES = int(os.environ.get("VITEDGE_PROPERTY_EXAMPLES", "5"))  # drawn per family, plus the explicit edges
# No shrinking: one example costs seconds, and the falsifying Case is printed as drawn anyway.
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.too_slow])
FP32_MAX_REL, FP32_COSINE = 1e-4, 0.99999  # the documented fp32 parity profile
PARITY_SAMPLES = 3

seeds = st.integers(0, 2 ** 31 - 1)
attn_orders = st.sampled_from(["auto", "qk_first", "kv_first"])


@dataclass(frozen=True)
class Case:
    name: str
    imgsz: int
    overrides: dict = field(default_factory=dict)
    seed: int = 0
    attn_order: str = "auto"
    dynamic_batch: bool = False


# ---- the checks -------------------------------------------------------------------------------------

def check_reparam_and_onnx(case: Case) -> None:
    model = make_trained_like(create_model(case.name, **case.overrides), case.seed).eval()
    deploy = reparameterize(model, case.imgsz, attn_order=case.attn_order)
    # Raises EquivalenceError naming the first diverging block.
    verify_equivalence(model, deploy, case.imgsz, samples=2)
    check_onnx_parity(model, deploy, case)


def check_onnx_parity(model: torch.nn.Module, deploy: torch.nn.Module, case: Case) -> None:
    graph = simplify_onnx(check_onnx(export_onnx(deploy, case.imgsz, batch=None if case.dynamic_batch else 1)))
    runner = OnnxRuntimeRunner(graph)
    x = parity_inputs(PARITY_SAMPLES, case.imgsz, seed=case.seed % 10_000)
    with torch.no_grad():
        ref = model.float()(x).numpy().astype(np.float64)
    xs = x.numpy()
    if case.dynamic_batch:
        got = runner.run(xs)
    else:  # a static batch-1 graph: one sample at a time
        got = np.concatenate([runner.run(xs[i:i + 1]) for i in range(len(xs))])
    got = got.astype(np.float64)
    assert got.shape == ref.shape, f"ONNX output {got.shape} vs train-form {ref.shape}"
    assert np.isfinite(got).all(), "ONNX Runtime produced non-finite logits"
    err, scale = float(np.abs(got - ref).max()), float(np.abs(ref).max())
    assert err <= FP32_MAX_REL * scale, f"ONNX max|diff| {err:.3e} > {FP32_MAX_REL:.0e} * max|y| ({scale:.3e})"
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1) + 1e-300)
    assert cos.min() >= FP32_COSINE, f"ONNX per-sample cosine {cos.min():.7f} < {FP32_COSINE}"


# ---- per-family strategies: only configurations the official constructors accept ----------------

def _heads_for(dim: int, max_heads: int = 4, min_head_dim: int = 4) -> list[int]:
    return [h for h in (1, 2, 4, 8) if h <= max_heads and dim % h == 0 and dim // h >= min_head_dim]


@st.composite
def swiftformer_cases(draw) -> Case:
    overrides = dict(
        layers=draw(st.lists(st.integers(1, 2), min_size=4, max_size=4)),
        embed_dims=draw(st.lists(st.sampled_from([8, 16, 24, 32]), min_size=4, max_size=4)),
        vit_num=draw(st.integers(1, 2)),
        distillation=draw(st.booleans()),
        num_classes=draw(st.integers(2, 12)),
    )
    return Case("swiftformer_xs", 32 * draw(st.integers(1, 3)), overrides, draw(seeds), draw(attn_orders),
                draw(st.booleans()))


@st.composite
def slab_deit_cases(draw) -> Case:
    # slab_deit: SLA + progressive LinearNorm; prepbn tiny: softmax + RepBN; prepbn small: LinearNorm(300000).
    name = draw(st.sampled_from(["slab_deit_tiny", "prepbn_deit_tiny", "prepbn_deit_small"]))
    embed = draw(st.sampled_from([16, 32, 48]))
    overrides = dict(embed_dim=embed, depth=draw(st.integers(1, 2)), num_heads=draw(st.sampled_from(_heads_for(embed))),
                     mlp_ratio=draw(st.sampled_from([1.0, 2.0])), num_classes=draw(st.integers(2, 12)))
    if name == "slab_deit_tiny":
        overrides["kernel_size"] = draw(st.sampled_from([3, 5]))
    return Case(name, 224, overrides, draw(seeds), draw(attn_orders), draw(st.booleans()))


@st.composite
def slab_swin_cases(draw) -> Case:
    name = draw(st.sampled_from(["slab_swin_tiny", "prepbn_swin_tiny"]))
    embed = draw(st.sampled_from([8, 16]))
    heads = [draw(st.sampled_from(_heads_for(embed * 2 ** i))) for i in range(4)]
    overrides = dict(embed_dim=embed, depths=draw(st.lists(st.integers(1, 2), min_size=4, max_size=4)),
                     num_heads=heads, mlp_ratio=draw(st.sampled_from([1.0, 2.0])), num_classes=draw(st.integers(2, 12)),
                     drop_path_rate=0.0, ape=draw(st.booleans()), patch_norm=draw(st.booleans()))
    if name == "slab_swin_tiny":
        # L-stage windows divide every stage resolution (56, 28, 14, 7) or cover it; S stages use window 7.
        overrides["window_size"] = draw(st.sampled_from([7, 14, 28, 56]))
        overrides["attn_type"] = draw(st.sampled_from(["LLSS", "LLLL", "LSLS", "SSSS", "LMSS1"]))
        overrides["kernel_size"] = draw(st.sampled_from([3, 5]))
    else:
        overrides["window_size"] = draw(st.sampled_from([7, 14]))
    return Case(name, 224, overrides, draw(seeds), draw(attn_orders), draw(st.booleans()))


@st.composite
def sima_cases(draw) -> Case:
    patch = draw(st.sampled_from([16, 8]))
    # (heads, head_dim) with embed_dim >= 8: the p16 conv stem's first width is embed_dim // 8.
    heads, head_dim = draw(st.sampled_from([(h, d) for h in (1, 2, 4) for d in (4, 8, 16) if h * d >= 8]))
    overrides = dict(embed_dim=heads * head_dim, num_heads=heads,
                     depth=draw(st.integers(1, 2)), cls_attn_layers=draw(st.integers(1, 2)),
                     eta=draw(st.sampled_from([1.0, 1e-5])), tokens_norm=draw(st.booleans()),
                     mlp_ratio=draw(st.sampled_from([1.0, 2.0])), num_classes=draw(st.integers(2, 12)))
    # Grids from 1x1 to 6x6 (p16) / 8x8 (p8) tokens: the official order rule (QK^T)V iff N < head_dim flips here.
    imgsz = patch * draw(st.integers(1, 6 if patch == 16 else 8))
    return Case(f"sima_nano_12_p{patch}", imgsz, overrides, draw(seeds), draw(attn_orders), draw(st.booleans()))


# ---- the properties (each with explicit edge cases that random draws may miss) ----------------------

@PROPERTY
@given(case=swiftformer_cases())
@example(case=Case("swiftformer_xs", 32, dict(layers=[1, 1, 1, 1], embed_dims=[8, 16, 24, 32], num_classes=5),
                   seed=11, dynamic_batch=True))  # 1x1 final map: attention over a single token
def test_swiftformer_reparam_and_onnx(case):
    check_reparam_and_onnx(case)


@PROPERTY
@given(case=slab_deit_cases())
@example(case=Case("slab_deit_tiny", 224, dict(embed_dim=32, depth=2, num_heads=2, num_classes=5), seed=12,
                   attn_order="qk_first"))  # the order the FLOP rule never picks at 224 (N=196 > d=16)
def test_slab_deit_reparam_and_onnx(case):
    check_reparam_and_onnx(case)


@PROPERTY
@given(case=slab_swin_cases())
@example(case=Case("slab_swin_tiny", 224, dict(embed_dim=8, depths=[2, 2, 2, 1], num_heads=[1, 2, 4, 8], mlp_ratio=1.0,
                                               num_classes=5, drop_path_rate=0.0, window_size=7, attn_type="LMSS1",
                                               ape=True), seed=13, dynamic_batch=True))  # shifted SLA, mixed stage
def test_slab_swin_reparam_and_onnx(case):
    check_reparam_and_onnx(case)


@PROPERTY
@given(case=sima_cases())
@example(case=Case("sima_nano_12_p16", 16, dict(embed_dim=16, num_heads=2, depth=1, num_classes=5), seed=14))  # N=1
@example(case=Case("sima_nano_12_p8", 64, dict(embed_dim=32, num_heads=2, depth=2, tokens_norm=True, num_classes=5),
                   seed=15, dynamic_batch=True))  # N=64 > head_dim=16: the auto rule picks Q(K^T V)
def test_sima_reparam_and_onnx(case):
    check_reparam_and_onnx(case)
