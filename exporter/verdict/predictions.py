"""The top-1 predictions `vitedge parity` and `vitedge bench --artifact` print with the class names an artifact
carries (read by targets/labels.py, the one home of class names)."""
from __future__ import annotations

import numpy as np

from ...targets.base import Runner
from .parity import run_batched

PREDICTIONS = 4  # parity inputs whose top-1 class is reported


def _name(labels: list[str], i: int) -> str:
    return labels[i] if 0 <= i < len(labels) else f"#{i} (beyond the {len(labels)} labels)"


def top1(y: np.ndarray, reference: np.ndarray, labels: list[str]) -> list[dict]:
    """Per sample: the artifact's top-1 class and the train-form's, by index and name."""
    got, ref = np.asarray(y).argmax(-1), np.asarray(reference).argmax(-1)
    return [{"sample": i, "top1": int(g), "name": _name(labels, int(g)), "reference": int(r),
             "reference_name": _name(labels, int(r))} for i, (g, r) in enumerate(zip(got, ref))]


def predictions(runner: Runner, x: np.ndarray, reference: np.ndarray, labels: list[str],
                n: int = PREDICTIONS) -> list[dict]:
    """`top1` of `runner` on the first `n` inputs `x` (whose train-form logits are `reference`)."""
    n = min(n, len(x), len(reference))
    return top1(run_batched(runner, np.ascontiguousarray(x[:n])), reference[:n], labels)


def describe(preds: list[dict]) -> str:
    """`tabby cat, goldfish (train-form: tench), ...`: what is printed."""
    return ", ".join(p["name"] + ("" if p["top1"] == p["reference"] else f" (train-form: {p['reference_name']})")
                     for p in preds)
