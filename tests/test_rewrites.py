"""Deploy-form rewrites are each exact and each switchable (issue 10): every family's rewrites alone and all but
one pass the float64 equivalence gate and, in float32, match the train-form; unknown names are clear errors; the
choice reaches the summary, report.json and the deploy checkpoint, and the CLI takes it as --rewrites."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, reparam_checkpoint
from vitedge.exporter.verdict.equivalence import verify_equivalence
from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.reparam import available_rewrites, reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.errors import VitedgeError
from vitedge.models.reduced import reduced

REPO = Path(__file__).resolve().parents[1]

# One small config per fold plan (the families' own test configs), and the rewrites each plan declares.
FAMILIES = {
    "swiftformer_xs": (reduced("swiftformer"), 64,
                       ("tokens_channels_first", "l2_normalize_rsqrt", "erf_gelu_fusable",
                        "l2_normalize_reduce_l2")),
    "slab_deit_tiny": (reduced("slab_deit"), 224,
                       ("tokens_channels_first", "erf_gelu_fusable", "pos_embed_in_patch_conv",
                        "qkv_as_three_projections")),
    "prepbn_deit_tiny": (reduced("prepbn_deit"), 224,
                         ("tokens_channels_first", "erf_gelu_fusable")),
    "sima_nano_12_p16": (reduced("sima_narrow"), 64,
                         ("l1_normalize_broadcast_div", "cls_only_last_class_attention")),
    "sima_deit_tiny": (reduced("sima_deit"), 64,
                       ("l1_normalize_broadcast_div", "final_norm_on_cls_only")),
    "prepbn_swin_tiny": (dict(embed_dim=16, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8], mlp_ratio=2.0,
                              num_classes=10, drop_path_rate=0.0), 224,
                         ("softmax_scale_into_qkv", "shift_mask_merged_with_bias", "single_window_without_partition",
                          "patch_merging_as_reshape")),
    "slab_pvt_tiny": (reduced("slab_pvt"), 64, ("pvt_q_kv_merged_into_qkv",)),
    "slab_cswin_tiny": (reduced("slab_cswin"), 64,
                        ("single_window_without_partition",)),
}


def _model(name: str) -> torch.nn.Module:
    overrides, _, _ = FAMILIES[name]
    return make_trained_like(create_model(name, **overrides), seed=3).eval()


def _cases():
    for name, (_, _, rewrites) in FAMILIES.items():
        for r in rewrites:
            yield pytest.param(name, [r], id=f"{name}-only-{r}")
            if len(rewrites) > 1:
                yield pytest.param(name, [x for x in rewrites if x != r], id=f"{name}-all-but-{r}")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_plan_declares_its_rewrites(name):
    assert available_rewrites(name) == FAMILIES[name][2]
    assert available_rewrites(_model(name)) == FAMILIES[name][2]


@pytest.mark.parametrize("name, chosen", list(_cases()))
def test_each_rewrite_alone_and_all_but_one_are_exact(name, chosen):
    model, imgsz = _model(name), FAMILIES[name][1]
    deploy = reparameterize(model, imgsz, rewrites=chosen)
    applied = set(deploy.reparam_summary.rewrites)
    assert applied == set(chosen), "every rewrite switched on applies to these configs, and nothing else"
    # float64: the gate, block by block (the fold itself); float32: the deploy-form as exported
    assert verify_equivalence(model, deploy.__dict__.get("reparam_fp64", deploy), imgsz, samples=2).passed
    x = parity_inputs(2, imgsz, seed=5)
    with torch.no_grad():
        ref, out = model(x), deploy(x)
    assert (out - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.parametrize("name", ["swiftformer_xs", "slab_pvt_tiny"])
def test_all_and_none_bracket_the_choices(name):
    model, imgsz = _model(name), FAMILIES[name][1]
    assert set(reparameterize(model, imgsz, rewrites=True).reparam_summary.rewrites) == set(FAMILIES[name][2])
    assert reparameterize(model, imgsz, rewrites=False).reparam_summary.rewrites == []
    assert reparameterize(model, imgsz, rewrites=[]).reparam_summary.rewrites == []


def test_unknown_rewrite_names_the_known_ones():
    model = _model("slab_pvt_tiny")
    with pytest.raises(VitedgeError, match="unknown rewrite 'tokens_channels_first'.*pvt_q_kv_merged_into_qkv"):
        reparameterize(model, 64, rewrites=["tokens_channels_first"])


def test_deploy_checkpoint_rebuilds_the_chosen_rewrites(tmp_path):
    overrides = FAMILIES["swiftformer_xs"][0]
    path = tmp_path / "d.pth"
    res = reparam_checkpoint("swiftformer_xs", path, imgsz=64, overrides=overrides, rewrites=["erf_gelu_fusable"])
    assert res.equivalence.passed and res.summary.rewrites == ["erf_gelu_fusable"]
    deploy = load_deploy_checkpoint(path)
    assert deploy.reparam_summary.rewrites == ["erf_gelu_fusable"]
    encoders = [m for m in deploy.modules() if type(m).__name__ == "EncoderBlock"]
    assert encoders and not any(e.channels_first for e in encoders)  # tokens_channels_first was not chosen
    payload = torch.load(path, weights_only=True)
    payload["rewrites"] = ["a_rewrite_from_the_future"]
    torch.save(payload, path)
    with pytest.raises(VitedgeError, match="a_rewrite_from_the_future.*vitedge reparam"):
        load_deploy_checkpoint(path)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "cli.py", *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def test_cli_rewrites_reach_the_report(tmp_path):
    # (bad --rewrites values are cases of tests/test_bad_arguments.py's table)
    base = ["-q", "export", "--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
            "--set", "num_classes=5", "--imgsz", "32", "--samples", "2"]
    r = _cli(*base, "--rewrites", "l2_normalize_rsqrt,erf_gelu_fusable", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert sorted(report["reparam"]["rewrites"]) == ["erf_gelu_fusable", "l2_normalize_rsqrt"]
    assert "rewrites: " in r.stdout and "l2_normalize_rsqrt" in r.stdout  # the summary names them too
    r = _cli(*base, "--rewrites", "none", "--out", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "b" / "report.json").read_text())["reparam"]["rewrites"] == []
    assert "rewrites: none" in r.stdout


# ---- the SLAB-DeiT rewrite's old name (tokens_channel_first -> tokens_channels_first) -----------------------

SLAB_TINY = dict(embed_dim=16, depth=1, num_heads=1, num_classes=5)


def test_old_rewrite_name_is_accepted_with_a_deprecation_warning():
    model = make_trained_like(create_model("slab_deit_tiny", **SLAB_TINY), seed=3).eval()
    with pytest.warns(FutureWarning, match="'tokens_channel_first' is deprecated; use 'tokens_channels_first'"):
        old = reparameterize(model, 224, rewrites=["tokens_channel_first"])
    new = reparameterize(model, 224, rewrites=["tokens_channels_first"])
    assert old.reparam_summary.rewrites == new.reparam_summary.rewrites == ["tokens_channels_first"]
    x = parity_inputs(2, 224, seed=1)
    with torch.no_grad():
        assert torch.equal(old(x), new(x))


def test_cli_accepts_the_old_name_and_warns(tmp_path):
    r = _cli("-q", "reparam", "--model", "slab_deit_tiny", *[f"--set={k}={v}" for k, v in SLAB_TINY.items()],
             "--rewrites", "tokens_channel_first", "--out", str(tmp_path / "d.pth"))
    assert r.returncode == 0, r.stderr
    assert "warning: rewrite name 'tokens_channel_first' is deprecated" in r.stderr
    assert load_deploy_checkpoint(tmp_path / "d.pth").reparam_summary.rewrites == ["tokens_channels_first"]


def test_deploy_checkpoint_that_recorded_the_old_name_still_loads(tmp_path, recwarn):
    path, old_path = tmp_path / "d.pth", tmp_path / "old.pth"
    res = reparam_checkpoint("slab_deit_tiny", path, overrides=SLAB_TINY)
    assert "tokens_channels_first" in res.summary.rewrites
    payload = torch.load(path, weights_only=True)
    payload["rewrites"] = ["tokens_channel_first" if r == "tokens_channels_first" else r for r in payload["rewrites"]]
    torch.save(payload, old_path)  # as vitedge 0.1.0 wrote it
    old, new = load_deploy_checkpoint(old_path), load_deploy_checkpoint(path)
    assert old.reparam_summary.rewrites == new.reparam_summary.rewrites == res.summary.rewrites
    assert old.deploy_checkpoint_meta["rewrites"] == res.summary.rewrites
    assert not [w for w in recwarn if issubclass(w.category, FutureWarning)]  # a file is not user input: no warning
    x = parity_inputs(2, 224, seed=1)
    with torch.no_grad():
        assert torch.equal(old(x), new(x))
