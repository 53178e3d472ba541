"""One small config per family, shared by the exporter tests (tests/test_exporters.py, test_exporter_choice.py),
taken from the one table of reduced configs (models/reduced.py): the entry each family's tests use, at a size each
accepts."""
from __future__ import annotations

from vitedge.models.reduced import case

# family: (model, reduced overrides, imgsz)
CASES = {
    "swiftformer": case("swiftformer"),
    "slab_deit": case("slab_deit"),
    "slab_swin": case("slab_swin"),
    "sima": case("sima", imgsz=80),
    "slab_pvt": case("slab_pvt"),
    "slab_cswin": case("slab_cswin_two_branch"),
    "sima_deit": case("sima_deit"),
}
