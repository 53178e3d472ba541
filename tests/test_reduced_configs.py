"""The one table of reduced configs (models/reduced.py): every entry builds at its size, callers get their own copy,
and no test or benchmark types a config of the table out again."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from vitedge.models.flops import meta_model
from vitedge.models.reduced import REDUCED, case, reduced

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(REDUCED))
def test_every_entry_builds(name):
    model, overrides, imgsz = case(name)
    assert meta_model(model, **overrides) is not None and imgsz > 0


def test_callers_get_their_own_copy():
    mine = reduced("swiftformer")
    mine["layers"][0] = 99
    assert reduced("swiftformer")["layers"][0] == 1
    assert reduced("swiftformer", num_classes=3)["num_classes"] == 3


def test_the_two_sima_entries_stay_apart():
    assert (reduced("sima")["embed_dim"], reduced("sima_narrow")["embed_dim"]) == (64, 32)


def test_no_copy_of_a_reduced_config_is_typed_out():
    # a signature of each family's reduced config, as it was spelled in the copies the table replaced
    signatures = [r"layers=\[1, 1, 2, 1\], embed_dims=\[16, 24, 32, 48\]",
                  r'"layers": \[1, 1, 2, 1\], "embed_dims": \[16, 24, 32, 48\]',
                  r"img_size=64, embed_dims=\[16, 32, 48, 64\], num_heads=\[1, 2, 3, 4\]",
                  r"embed_dim=16, depths=\[1, 1, 2, 1\], num_heads=\[1, 2, 4, 8\], mlp_ratio=2\.0",
                  r"embed_dim=(32|64), depth=2, num_heads=[12], num_classes=10"]
    files = sorted((ROOT / "tests").glob("*.py")) + sorted((ROOT / "benchmarks").glob("*.py"))
    found = [f"{f.relative_to(ROOT)}: {s}" for f in files if f.name != Path(__file__).name
             for s in signatures if re.search(s, f.read_text())]
    assert found == [], "take the config from models/reduced.py (reduced(NAME))"
