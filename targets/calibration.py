"""Which samples calibrated a quantized artifact: the record every quantizer writes, and the overlap check.

Calibration samples must never be the samples an artifact is evaluated on (a model calibrated on its test images
looks better than it is). The caller chooses both sets; quantizers record the calibration set here (the ids the
caller gave: file names, dataset indices; and a sha256 of the exact array), and `calibration_overlap` tells a
caller which of its evaluation ids calibrated.
"""
from __future__ import annotations

import hashlib
from typing import Iterable

import numpy as np


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
