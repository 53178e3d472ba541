"""Which models the benchmark scripts measure: the reduced configurations of --quick and time-short runs, and the
full-size trained corpus cached outside the repository by scripts/train_reference.py (with the bookkeeping that lets
a long study measure it model by model, across runs).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import torch.nn as nn

from vitedge.models.reduced import reduced

# Reduced configurations (the test suite's: golden-fixture sized) for --quick and for time-short runs.
REDUCED = {
    "swiftformer_xs": reduced("swiftformer"),
    "slab_deit_tiny": reduced("slab_deit"),
    "sima_nano_12_p16": reduced("sima_narrow"),
    "slab_swin_tiny": reduced("slab_swin"),
}

TRAINED_CACHE = Path.home() / ".cache" / "vitedge" / "trained"   # scripts/train_reference.py --out

# the full-size trained corpus (scripts/train_reference.py's full-size table), all on digits at 64 px: SwiftFormer-XS,
# SLAB-DeiT-T (default config), SLAB-DeiT (depth 6, patch 8), SimA-Nano (p16) and PRepBN-PVT-Tiny
TRAINED_FULL = ("swiftformer_xs_digits64", "slab_deit_tiny_digits64", "slab_deit_digits64", "sima_nano_digits64",
                "prepbn_pvt_digits64")


def cached_names() -> list[str]:
    """The corpus models cached here: a checkpoint and its manifest entry (the training script writes the manifest
    once it has trained every model it was asked for)."""
    path = TRAINED_CACHE / "manifest.json"
    listed = json.loads(path.read_text())["models"] if path.is_file() else {}
    return [n for n in TRAINED_FULL if n in listed and (TRAINED_CACHE / f"{n}.pth").is_file()]


def cached_trained(name: str) -> tuple[nn.Module, int] | None:
    """(the trained train-form model, its image size) of a full-size reference cached by scripts/train_reference.py,
    or None when it is not cached here."""
    import vitedge

    if not (TRAINED_CACHE / f"{name}.pth").is_file():
        return None
    man = json.loads((TRAINED_CACHE / "manifest.json").read_text())["models"][name]
    model = vitedge.create_model(man["model"], **man["overrides"])
    vitedge.load_checkpoint(model, TRAINED_CACHE / f"{name}.pth", strict=True)
    return model.eval(), man["imgsz"]


def measured_per_model(measures: dict[str, Callable[[], list]], partial: Path, only: str | None) -> tuple[list, list]:
    """(every model's rows, in model order; the models not measured yet). A model's rows come from
    `partial`/NAME.json where an earlier run (stopped, or given `--models`) measured it, else from its measure,
    called when `only` (comma-separated names) selects it or is None, and kept there at once. The caller removes
    `partial` once nothing is missing."""
    partial.mkdir(parents=True, exist_ok=True)
    rows, missing = [], []
    for name, measure in measures.items():
        done = partial / f"{name}.json"
        if not done.is_file() and (only is None or name in only.split(",")):
            done.write_text(json.dumps(measure()))
        if done.is_file():
            rows += json.loads(done.read_text())
        else:  # what these rows lack (another run may be measuring it now)
            missing.append(name)
    return rows, missing
