"""Which samples calibrated a quantized artifact: the calibration set every quantizer takes, its record, and the
overlap check.

Calibration samples must never be the samples an artifact is evaluated on (a model calibrated on its test images
looks better than it is). The pipeline chooses both sets (exporter/quantize/calibrate.py) and hands the quantizers a
`Calibration`; quantizers record it (the ids the caller gave: file names, photo views, dataset indices; and a
sha256 of the exact array), and `calibration_overlap` tells a caller which of its evaluation ids calibrated.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

CALIBRATION_METHOD = "minmax"  # per tensor, over every calibration sample (graph/qdq.py and coreml/compress.py)


@dataclass
class Calibration:
    """Calibration samples for an activation-quantized artifact (int8, w8a8): float32 NCHW, normalized like the
    parity set, with one id per sample and where they came from."""
    x: np.ndarray
    ids: tuple[str, ...]
    source: str                                  # "natural" (shipped photos), "images" (--images split), "calib-images"
    note: str = ""                               # how the set was chosen (report.json `calibration.note`)
    excluded: dict = field(default_factory=dict)  # what the evaluation leaves out because it calibrated

    def __post_init__(self):
        self.x = np.ascontiguousarray(self.x, np.float32)
        if self.x.ndim != 4 or len(self.x) == 0 or len(self.ids) != len(self.x):
            raise ValueError(f"calibration needs >= 1 NCHW sample with one id each; got {self.x.shape}, "
                             f"{len(self.ids)} ids")

    def record(self, method: str = CALIBRATION_METHOD) -> dict:
        return {**calibration_record(self.x, self.ids, method), "source": self.source, "note": self.note,
                "excluded_from_evaluation": self.excluded}


def calibration_record(samples: np.ndarray, ids: Iterable | None, method: str) -> dict:
    """{"method", "samples", "ids" (as strings, or None), "sha256" of the float32 array}."""
    x = np.ascontiguousarray(samples, np.float32)
    return {"method": method, "samples": int(len(x)), "ids": [str(i) for i in ids] if ids is not None else None,
            "sha256": hashlib.sha256(x.tobytes()).hexdigest()}


def calibration_overlap(info: dict, ids: Iterable) -> list[str]:
    """The ids among `ids` that calibrated the artifact whose `info` (or record) is given; empty for an honest
    evaluation."""
    record = info.get("calibration", info) or {}
    used = set(record.get("ids") or [])
    return sorted(str(i) for i in ids if str(i) in used)
