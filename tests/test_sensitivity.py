"""Both directions of the parity verdict, end to end through the CLI, for every family (small configs): a correct
export passes (`vitedge export`, exit 0, every hop well inside its allowance); the same ONNX with one output
channel of one mid-network weight scaled by 1.01 (and by 1.001 where that stands clear of the allowance on every
CPU measured) fails `vitedge parity` (exit 1) and the report names the module holding that weight. Also: localization of a torch deploy-form by the same noise rule, and a
deliberately ill-conditioned but correct model that must pass (better demo weights must not hide the rule)."""
from __future__ import annotations

import copy
import json

import numpy as np
import onnx
import pytest
import torch

from vitedge.cli import main
from vitedge.exporter.verdict.criteria import NoiseRule
from vitedge.exporter.reparam.build_forms import build_deploy_form, build_train_form
from vitedge.exporter.verdict.inputs import parity_set
from vitedge.exporter.verdict.localize import localize_torch
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES, FLOAT64_TOLERANCES
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.core.report import Report
from vitedge.models.reduced import reduced
from vitedge.targets.plants import plant_channel_scale, planted_module

# family: (model, overrides, imgsz): the golden-fixture sized configs (benchmarks/parity_noise.py measures the same)
FAMILIES = {
    "swiftformer": ("swiftformer_xs", reduced("swiftformer"), 64),
    "slab_deit": ("slab_deit_tiny", reduced("slab_deit"), 224),
    "prepbn_deit": ("prepbn_deit_tiny", reduced("prepbn_deit"), 224),
    "slab_swin": ("slab_swin_tiny", reduced("slab_swin"), 224),
    "prepbn_swin": ("prepbn_swin_tiny", reduced("prepbn_swin"), 224),
    "slab_pvt": ("slab_pvt_tiny", reduced("slab_pvt"), 64),
    "prepbn_pvt": ("prepbn_pvt_tiny", reduced("prepbn_pvt"), 64),
    "slab_cswin": ("slab_cswin_tiny", reduced("slab_cswin"), 64),
    "sima": ("sima_nano_12_p16", reduced("sima"), 64),
    "sima_deit": ("sima_deit_tiny", reduced("sima_deit"), 64),
}
SAMPLES = "12"  # 9 natural + 3 stress
# x1.01 (the 1 % channel every verdict must catch) stands 6x (swiftformer) to 990x above its allowance here.
# x1.001 stands near the allowance in four families: its worst ratio on these 12 samples read 0.59 (swiftformer),
# 1.74 (prepbn_deit), 0.83 (slab_pvt) and 0.84 (sima_deit) on an Intel Xeon (2026-12-06), 1.1-2.3 on an AMD EPYC
# (parity_noise.json's 24 samples): whether it is caught there depends on the CPU's float32 rounding. It is planted
# in the six where it read >= 3.1x on both (docs/parity.md "Parity sensitivity").
FACTORS = (1.01,)
FINER = {"slab_deit", "slab_swin", "prepbn_swin", "prepbn_pvt", "slab_cswin", "sima"}  # also x1.001
# A correct export's worst ratio to its allowance: the kernels' rounding differs by CPU (slab_swin's onnx hop read
# 0.503 on natural images on an AMD EPYC, under 0.5 on an Intel Xeon); the verdict's own bound is 1.
MARGIN = 0.75


def _set_args(overrides: dict) -> list[str]:
    return [a for k, v in overrides.items() for a in ("--set", f"{k}={v!r}".replace(" ", ""))]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_cli_passes_the_correct_export_and_fails_a_planted_channel_naming_its_module(family, tmp_path, capsys):
    name, overrides, imgsz = FAMILIES[family]
    out = tmp_path / "run"
    rc = main(["-q", "export", "--model", name, *_set_args(overrides), "--imgsz", str(imgsz), "--samples", SAMPLES,
               "--out", str(out)])
    assert rc == 0, capsys.readouterr().out[-3000:]
    report = Report.read(out / "report.json")
    assert [h.hop for h in report.parity] == ["deploy-form", "onnx", "onnx-simplified"]
    for h in report.parity:  # passed with margin, on both sets, against float64
        assert set(h.sets) == {"natural", "stress"} and all(0 < s["noise_ratio"] <= MARGIN for s in h.sets.values()), \
            (h.hop, h.sets)
    for h in report.parity[1:]:  # the ONNX hops' feature probe ran on the final feature map and passed
        assert h.probe["status"] == "passed" and h.probe["module"] and h.probe["noise_ratio"] <= 1, (h.hop, h.probe)
    graph = onnx.load(str(out / f"{name}.onnx"))
    deploy, _ = build_deploy_form(build_train_form(name, overrides=overrides).model, imgsz)
    capsys.readouterr()
    for factor in FACTORS + ((1.001,) if family in FINER else ()):
        bad, where = plant_channel_scale(graph, factor)
        path = tmp_path / f"planted{factor}.onnx"
        onnx.save(bad, str(path))
        rep_path = tmp_path / f"parity{factor}.json"
        rc = main(["-q", "parity", "--model", name, "--artifact", str(path), "--samples", SAMPLES, "--report",
                   str(rep_path)])
        printed = capsys.readouterr().out
        rep = json.loads(rep_path.read_text())
        hop = rep["parity"][1]
        assert rc == 1 and hop["hop"] == "onnx" and hop["status"] == "failed", (factor, hop)
        assert rep["parity"][0]["status"] == "passed"  # the deploy-form is fine: only the artifact is wrong
        assert max(s["noise_ratio"] for s in hop["sets"].values()) > 1
        module = hop["diverging_module"]  # exactly the module whose weight was changed, not an enclosing one
        assert module == planted_module(graph, where, deploy), (factor, module, where)
        assert f"diverging module: {module}" in printed


def test_torch_localization_with_the_rule_names_a_corrupted_deploy_module():
    name, overrides, imgsz = FAMILIES["swiftformer"]
    deploy, _ = build_deploy_form(build_train_form(name, overrides=overrides).model, imgsz)
    x = parity_set(4, imgsz).numpy()
    tol = FLOAT64_TOLERANCES["fp32"]
    rule = NoiseRule(tol.noise_floor, tol.noise_k)
    assert localize_torch(deploy, copy.deepcopy(deploy), x, tol, rule=rule) is None
    bad = copy.deepcopy(deploy)
    target = next(n for n, m in bad.named_modules() if n.startswith("network.4") and isinstance(m, torch.nn.Conv2d)
                  and m.weight.shape[0] > 1)
    with torch.no_grad():
        bad.get_submodule(target).weight[0].mul_(1.01)
    div = localize_torch(deploy, bad, x, tol, rule=rule)
    assert div is not None and div.module == target, div


def test_ill_conditioned_but_correct_export_passes(tmp_path):
    """A deliberately ill-conditioned PRepBN-DeiT (12 blocks, growing residual stream, sharp softmax): its float32
    train-form is chaotic (float32 vs float64 up to ~0.4 of max|y|), so the old rule (max_rel 1e-4 against the
    float32 train-form) fails its correct export; against float64, each sample's allowance follows that sample's
    own noise and the export passes."""
    from vitedge.models.trained_like import ill_conditioned_prepbn_deit

    report = export(ill_conditioned_prepbn_deit(), "onnx", out=tmp_path / "run", samples=8)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    ref = report.reference["sets"]
    assert max(s["reference_noise"] for s in ref.values()) > 1e-3  # well-conditioned models: ~5e-7
    assert all(s["reference_noise_median"] > 1e-5 for s in ref.values())
    # the float32 train-form itself is farther from float64 than the old fixed tolerance allowed an artifact
    assert max(s["reference_noise"] for s in ref.values()) > DEFAULT_TOLERANCES["fp32"].max_rel
    assert all(h.status == "passed" and all(s["noise_ratio"] <= 1 for s in h.sets.values()) for h in report.parity)
    # the feature probe follows each sample's own noise too: it ran on the chaotic model and passed
    assert all(h.probe["status"] == "passed" for h in report.parity[1:]), [h.probe for h in report.parity]
    assert np.isfinite(report.hop("onnx-simplified").metrics.max_rel)
