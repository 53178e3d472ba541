"""The default parity sample count scales with the model's cost by a fixed rule on GMACs (issue 17), never by
wall time: 64 samples up to 8 GMACs, fewer above, at least 8, always a multiple of 4 (3 natural : 1 stress)."""
import json

import pytest

from vitedge import export
from vitedge.exporter.verdict import inputs, parity_cost
from vitedge.exporter.verdict.parity_cost import (DEFAULT_SAMPLES, MIN_SAMPLES, SAMPLES_RULE, choose_samples,
                                                  default_samples, samples_for_gmacs)
from vitedge.models.catalog import model_table

from ._matrix import TINY


def test_the_rule_keeps_small_models_whole_and_bounds_the_work_of_large_ones():
    assert DEFAULT_SAMPLES == inputs.DEFAULT_SAMPLES
    assert samples_for_gmacs(0.6) == samples_for_gmacs(8.0) == 64
    assert samples_for_gmacs(8.73) == 56 and samples_for_gmacs(141.88) == MIN_SAMPLES == 8
    grid = [0.01 * 1.1 ** k for k in range(120)]
    counts = [samples_for_gmacs(g) for g in grid]
    assert all(a >= b for a, b in zip(counts, counts[1:])), "more work must never get more samples"
    assert all(n % 4 == 0 and MIN_SAMPLES <= n <= DEFAULT_SAMPLES for n in counts)
    # within the budget wherever the floor does not bind
    assert all(n * g <= parity_cost.PARITY_BUDGET_GMACS + 1e-9 for n, g in zip(counts, grid) if n > MIN_SAMPLES)
    assert samples_for_gmacs(0.0) == samples_for_gmacs(float("nan")) == DEFAULT_SAMPLES


def test_registered_models_at_their_default_size_read_gmacs_from_the_catalog(monkeypatch):
    import vitedge.models.flops as flops

    monkeypatch.setattr(flops, "model_macs", lambda *a, **k: pytest.fail("counted although the catalog has it"))
    rows = {r["name"]: r for r in model_table()}
    for name in ("swiftformer_xs", "slab_swin_tiny", "sima_large_24_p8"):
        n, rule = default_samples(name, rows[name]["default_imgsz"])
        assert n == samples_for_gmacs(rows[name]["gmacs"]) and rule.startswith(SAMPLES_RULE), rule
    assert default_samples("sima_large_24_p8", 224)[0] == 8 and default_samples("swiftformer_xs", 224)[0] == 64


def test_other_sizes_and_overrides_are_counted():
    n, rule = default_samples("swiftformer_xs", 64, TINY)
    assert n == 64 and "at 64px" in rule
    g_small = parity_cost.model_gmacs("swiftformer_xs", 64, TINY)
    assert 0 < g_small < parity_cost.model_gmacs("swiftformer_xs", 128, TINY)


def test_given_counts_win_and_bad_ones_fail_early():
    assert choose_samples(12, "sima_large_24_p8", 224, None, None) == (12, None)
    with pytest.raises(Exception, match="--samples must be positive"):
        choose_samples(0, "swiftformer_xs", 224, None, None)


def test_an_export_without_samples_uses_and_reports_the_rule(tmp_path, monkeypatch):
    # a budget this small gives the tiny model the floor: the rule, not the default 64, sized the parity set
    monkeypatch.setattr(parity_cost, "PARITY_BUDGET_GMACS", 1e-6)
    report = export("swiftformer_xs", "onnx", out=tmp_path / "r", imgsz=32, overrides=TINY)
    assert report.exit_code == 0 and report.samples == MIN_SAMPLES
    assert report.samples_rule.startswith(SAMPLES_RULE) and f"= {MIN_SAMPLES}" in report.samples_rule
    saved = json.loads((tmp_path / "r" / "report.json").read_text())
    assert saved["samples"] == MIN_SAMPLES and saved["samples_rule"] == report.samples_rule
    assert all(h["samples"] == MIN_SAMPLES for h in saved["parity"] if h["status"] == "passed")
    given = export("swiftformer_xs", "onnx", out=tmp_path / "g", imgsz=32, overrides=TINY, samples=4)
    assert given.samples == 4 and given.samples_rule is None


@pytest.mark.parametrize("name", ["slab_deit_tiny", "sima_deit_tiny", "prepbn_deit_tiny", "slab_pvt_tiny",
                                  "slab_swin_tiny", "slab_cswin_tiny"])
def test_models_tied_to_their_size_are_counted_at_the_export_size(name):
    """An export at another size without --samples counts the model as the export runs it: position tables
    resampled, windows padded (a model left at its pretraining grid refused the other size: exit 2)."""
    at_default, n = parity_cost.model_gmacs(name, 224), 256 * 320 / 224 ** 2
    other = parity_cost.model_gmacs(name, (256, 320))
    assert other >= 0.95 * n * at_default  # the work grows at least with the pixels (windows pad: more)
    count, rule = parity_cost.default_samples(name, (256, 320))
    assert MIN_SAMPLES <= count <= DEFAULT_SAMPLES and "256x320" in rule
