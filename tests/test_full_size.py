"""One full-size model per family exports to ONNX with its seeded demo weights at its default size and passes the
parity ladder against float64 ground truth (`vitedge export --target onnx`, exit 0). Kept cheap: the smallest
model of each family and 4 parity inputs (3 natural, 1 stress); benchmarks/all_models.py runs all 35 with the
default settings."""
from __future__ import annotations

import pytest

from vitedge.exporter.flow.pipeline import export
from vitedge.models import get_spec, list_models

ONE_PER_FAMILY = ("swiftformer_xs", "slab_deit_tiny", "prepbn_deit_tiny", "slab_swin_tiny", "prepbn_swin_tiny",
                  "slab_pvt_tiny", "prepbn_pvt_tiny", "slab_cswin_tiny", "sima_nano_12_p16", "sima_deit_tiny")
SAMPLES = 4


def _family(name: str) -> str:
    """slab_deit_tiny -> slab_deit, prepbn_pvt_medium -> prepbn_pvt, sima_deit_small -> sima_deit, sima_* -> sima."""
    parts = name.split("_")
    return "_".join(parts[:2]) if parts[0] in ("slab", "prepbn") or name.startswith("sima_deit_") else parts[0]


def test_one_model_of_every_family():
    assert sorted(map(_family, ONE_PER_FAMILY)) == sorted({_family(n) for n in list_models()}), \
        "every registered family needs its full-size test"


@pytest.mark.parametrize("name", ONE_PER_FAMILY)
def test_full_size_default_export_passes(name, tmp_path):
    report = export(name, "onnx", out=tmp_path / "run", samples=SAMPLES)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    assert report.imgsz == get_spec(name).default_imgsz and report.weights == "untrained"
    assert [h.hop for h in report.parity] == ["deploy-form", "onnx", "onnx-simplified"]
    for h in report.parity:
        assert h.status == "passed" and set(h.sets) == {"natural", "stress"}
        assert all(s["noise_ratio"] <= 1 for s in h.sets.values())
    assert set(report.reference["sets"]) == {"natural", "stress"} and report.reference["float32_threads"] == 2
