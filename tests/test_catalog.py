"""The model catalog: parameter and MAC counts against MODELS.md's measured figures, sizes per model."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vitedge.models import list_models
from vitedge.models import catalog
from vitedge.models.catalog import COLUMNS, model_table
from vitedge.models.flops import count_macs, meta_model

# MODELS.md "measured" GMACs @224 (official modules, flop counter on matmul and conv only).
MEASURED_GMACS = {
    "swiftformer_xs": 0.602, "swiftformer_s": 0.985, "swiftformer_l1": 1.596, "swiftformer_l3": 4.008,
    "slab_deit_tiny": 1.14, "slab_deit_small": 4.36, "prepbn_deit_tiny": 1.25,
    "slab_swin_tiny": 4.48, "slab_swin_small": 8.73, "prepbn_swin_tiny": 4.49,
    "sima_nano_12_p16": 0.56, "sima_tiny_12_p16": 1.25, "sima_small_12_p16": 4.85, "sima_tiny_24_p16": 2.34,
    "sima_small_24_p16": 9.12, "sima_medium_24_p16": 16.19, "sima_large_24_p16": 36.02,
    "slab_pvt_tiny": 2.04, "slab_pvt_small": 4.03, "slab_pvt_medium": 7.03, "prepbn_pvt_tiny": 1.93,
    "slab_cswin_tiny": 4.32, "slab_cswin_small": 6.78,
}
# MODELS.md measured parameter counts, as printed (exact for SwiftFormer, millions elsewhere).
MEASURED_PARAMS = {
    "swiftformer_xs": "3475360", "swiftformer_s": "6092128", "swiftformer_l1": "12057920", "swiftformer_l3": "28494736",
    "slab_deit_tiny": "6.20M", "slab_deit_small": "22.99M", "prepbn_deit_tiny": "5.72M",
    "slab_swin_tiny": "29.22M", "slab_swin_small": "50.55M", "prepbn_swin_tiny": "28.29M",
    "sima_nano_12_p16": "3.05M", "sima_tiny_12_p16": "6.72M", "sima_small_12_p16": "26.25M",
    "sima_tiny_24_p16": "12.12M", "sima_small_24_p16": "47.67M", "sima_medium_24_p16": "84.40M",
    "sima_large_24_p16": "189.1M", "slab_pvt_tiny": "12.16M", "slab_pvt_small": "21.68M", "slab_pvt_medium": "37.27M",
    "prepbn_pvt_tiny": "13.24M", "slab_cswin_tiny": "21.23M", "slab_cswin_small": "35.49M",
}


# Rows computed here: every measured variant plus two p8 twins (the big p8 ones only add run time).
NAMES = sorted(MEASURED_GMACS) + ["sima_nano_12_p8", "sima_tiny_12_p8"]


@pytest.fixture(scope="module")
def table() -> dict[str, dict]:
    # counted live: these tests check the counter itself, not the shipped table
    return {row["name"]: row for row in model_table(NAMES, live=True)}


def test_rows_have_all_columns(table):
    assert sorted(table) == sorted(NAMES)
    for row in table.values():
        assert tuple(row) == COLUMNS
        assert row["params"] > 0 and row["gmacs"] > 0 and row["default_imgsz"] == 224


def test_default_table_lists_every_registered_model(monkeypatch):
    monkeypatch.setattr(catalog, "_row", lambda name: (name, "f", 1, 1.0, 224, "any"))  # listing only, no counting
    assert [row["name"] for row in model_table(live=True)] == list_models()
    assert [row["name"] for row in model_table()] == list_models()  # the shipped table too


def test_shipped_table_is_current_and_equals_the_live_computation(table):
    """`vitedge models` reads models/catalog.json: it must be keyed to these sources and match a live count
    of every registered model (the speed of reading it is benchmarks' business, not a test's)."""
    stored = catalog.stored_table()
    assert stored is not None, ("models/catalog.json is missing or stale for these model sources: regenerate it "
                                "with `python -m vitedge.models.catalog --write` and commit it")
    assert sorted(stored) == list_models()
    for name in list_models():
        live = table[name] if name in table else dict(zip(COLUMNS, catalog._row(name)))
        assert stored[name] == live, name


def test_a_stale_table_is_never_used(monkeypatch, tmp_path):
    stale = tmp_path / "catalog.json"
    stale.write_text(catalog.TABLE_FILE.read_text().replace(catalog.table_key(), "0" * 64))
    monkeypatch.setattr(catalog, "TABLE_FILE", stale)
    catalog.stored_table.cache_clear()
    try:
        assert catalog.stored_table() is None
        monkeypatch.setattr(catalog, "_row", lambda name: (name, "live", 1, 1.0, 224, "any"))
        assert {r["family"] for r in model_table(["swiftformer_xs"])} == {"live"}
    finally:
        monkeypatch.undo()
        catalog.stored_table.cache_clear()


@pytest.mark.parametrize("name", sorted(MEASURED_GMACS))
def test_gmacs_match_the_measured_figures(name, table):
    assert table[name]["gmacs"] == pytest.approx(MEASURED_GMACS[name], rel=0.01)


@pytest.mark.parametrize("name", sorted(MEASURED_PARAMS))
def test_params_match_the_measured_figures(name, table):
    text = MEASURED_PARAMS[name]
    if text.endswith("M"):  # agree to the printed precision
        digits = len(text[:-1].split(".")[1])
        assert abs(table[name]["params"] / 1e6 - float(text[:-1])) <= 0.5 * 10 ** -digits + 1e-9
    else:
        assert table[name]["params"] == int(text)


def test_p8_variants_cost_about_four_times_their_p16_twins(table):
    # 4x the tokens: linear layers scale 4x, the patch embed (one conv fewer) a bit less.
    for name in NAMES:
        if name.endswith("_p8"):
            ratio = table[name]["gmacs"] / table[name.replace("_p8", "_p16")]["gmacs"]
            assert 3.6 < ratio < 4.0, (name, ratio)


def test_accepted_sizes_say_how_a_model_gets_there(table):
    for name in ("slab_deit_tiny", "slab_deit_small"):
        sizes = table[name]["accepted_sizes"]
        assert sizes.startswith("multiples of 16") and "14x14" in sizes and "resampled" in sizes
    assert not [n for n, row in table.items() if " only" in row["accepted_sizes"]]  # every model takes other sizes
    assert table["swiftformer_xs"]["accepted_sizes"] == "multiples of 32"
    assert table["sima_nano_12_p8"]["accepted_sizes"].startswith("multiples of 8")


def test_model_table_subset_is_sorted():
    rows = model_table(["swiftformer_s", "swiftformer_xs"])
    assert [r["name"] for r in rows] == ["swiftformer_s", "swiftformer_xs"]


class _Toy(nn.Module):
    """conv 3->8 k3 on 8x8, a token matmul, a linear; element-wise ops and norms in between."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x))) * 2 + 1  # not counted
        t = x.flatten(2).transpose(1, 2)  # (B, 64, 8)
        t = (t @ t.transpose(1, 2)).softmax(-1) @ t  # 64*64*8 + 64*64*8
        return self.fc(t.mean(1))  # 8*5


def test_count_macs_counts_exactly_conv_matmul_and_linear():
    expected = 8 * 3 * 9 * 64 + 2 * 64 * 64 * 8 + 8 * 5
    toy = _Toy()
    assert count_macs(toy, 8) == expected
    assert count_macs(toy, 8, batch=3) == 3 * expected
    meta = _Toy().to("meta")
    assert count_macs(meta, 8) == expected  # shapes alone give the same count


def test_meta_model_allocates_no_weights():
    model = meta_model("sima_large_24_p16")
    assert all(p.device.type == "meta" for p in model.parameters())
