"""The trained reference models (tests/fixtures/trained/) and their labelled data: scikit-learn's bundled digits.

Quantization cannot be judged on demo weights (no task, no decision margins), so `scripts/train_reference.py`
trains reduced configs of the families in their official layouts on digits, and this module is what the
script, the tests and the benchmarks (the verdict studies) share. The fixtures live in a source checkout's tests/
(not in an installed package), and scikit-learn is a test extra: both are named when missing.

- `digits(imgsz, mean, std)`: the 1797 8x8 digit images (0-16 ink) -> [0, 1] -> bilinear upsampling to
  `imgsz` (torch `F.interpolate`, align_corners=False) -> grey replicated to RGB -> normalized with the
  model's mean/std: float32 NCHW, and the labels.
- `split()`: the deterministic held-out split, stratified: per class, every 5th image in index order is
  held out (364 of 1797; one image is 0.27 points). The manifest stores the rule, a sha256 of the held-out
  indices and a sha256 of the raw data, so a changed scikit-learn data file or rule fails loudly instead of
  moving the accuracy.
- `load_reference(name)`: the train-form model (eval) built with `vitedge.create_model` from the manifest's
  overrides and loaded strictly from the committed `{'model': state_dict}` checkpoint.
- `wilson(correct, n)`: the 95 % Wilson score interval of an accuracy.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "trained"  # (the package root is the checkout)
MANIFEST = FIXTURES / "manifest.json"
HOLDOUT_EVERY = 5  # per class, every 5th image (in index order) is held out


def _raw_digits() -> tuple[np.ndarray, np.ndarray]:
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # a test dependency: .[test] installs it
        raise ImportError(f"scikit-learn is needed for the trained reference fixtures ({e}); "
                          "pip install -e '.[test]'") from e
    d = load_digits()
    return np.asarray(d.images, np.float64), np.asarray(d.target, np.int64)


def data_sha256() -> str:
    """sha256 of the raw digits (images as float64 bytes, then labels as int64 bytes)."""
    images, labels = _raw_digits()
    h = hashlib.sha256(np.ascontiguousarray(images).tobytes())
    h.update(np.ascontiguousarray(labels).tobytes())
    return h.hexdigest()


def split(labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train indices, held-out indices), both sorted: per class every HOLDOUT_EVERY-th image is held out."""
    if labels is None:
        labels = _raw_digits()[1]
    held = np.concatenate([np.flatnonzero(labels == c)[::HOLDOUT_EVERY] for c in np.unique(labels)])
    held = np.sort(held)
    train = np.setdiff1d(np.arange(len(labels)), held)
    return train, held


def indices_sha256(indices: np.ndarray) -> str:
    return hashlib.sha256(np.asarray(indices, np.int64).tobytes()).hexdigest()


def digits(imgsz: int, mean, std) -> tuple[np.ndarray, np.ndarray]:
    """All images as float32 (N, 3, imgsz, imgsz), normalized with `mean`/`std`, and the int64 labels."""
    import torch
    import torch.nn.functional as F

    images, labels = _raw_digits()
    x = torch.from_numpy(images / 16.0).float()[:, None]
    x = F.interpolate(x, size=(imgsz, imgsz), mode="bilinear", align_corners=False).clamp(0, 1)
    x = x.repeat(1, 3, 1, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - m) / s).numpy(), labels


def manifest() -> dict:
    if not MANIFEST.is_file():
        raise FileNotFoundError(f"the trained reference fixtures are not here ({MANIFEST}): they are in a source "
                                "checkout of vitedge (tests/fixtures/trained), not in an installed package")
    return json.loads(MANIFEST.read_text())


def reference_names() -> list[str]:
    return sorted(manifest()["models"])


def heldout(name: str) -> tuple[np.ndarray, np.ndarray]:
    """The held-out images (preprocessed for model `name`) and labels, after checking the data hash."""
    from ...models.registry import get_spec

    man = manifest()
    entry = man["models"][name]
    sha = data_sha256()
    if sha != man["dataset"]["sha256"]:
        raise AssertionError(f"scikit-learn's digits changed (sha256 {sha[:12]}..., fixtures trained on "
                             f"{man['dataset']['sha256'][:12]}...): retrain with scripts/train_reference.py")
    spec = get_spec(entry["model"])
    x, y = digits(entry["imgsz"], spec.mean, spec.std)
    _, idx = split(y)
    if indices_sha256(idx) != man["dataset"]["heldout_sha256"]:
        raise AssertionError("the held-out split differs from the one the fixtures were trained with: "
                             "restore trained_reference.split() or retrain with scripts/train_reference.py")
    return x[idx], y[idx]


def calibration_images(name: str, n: int) -> tuple[np.ndarray, list[int]]:
    """`n` training-split images (never held-out ones) for calibration, and their digits indices."""
    from ...models.registry import get_spec

    entry = manifest()["models"][name]
    spec = get_spec(entry["model"])
    x, _ = digits(entry["imgsz"], spec.mean, spec.std)
    train, _ = split()
    pick = train[np.linspace(0, len(train) - 1, n).round().astype(int)]  # spread over the classes
    return x[pick], [int(i) for i in pick]


def build(name: str):
    """The train-form model of reference `name`, untrained (the manifest's registry name and overrides)."""
    from ...models.registry import create_model

    entry = manifest()["models"][name]
    return create_model(entry["model"], **entry["overrides"])


def load_reference(name: str):
    """The trained train-form model (eval mode), loaded strictly through vitedge.load_checkpoint."""
    from ...models.checkpoints import load_checkpoint

    model = build(name)
    load_checkpoint(model, FIXTURES / manifest()["models"][name]["checkpoint"], strict=True)
    return model.eval()


def wilson(correct: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion correct/n (the ladder's own: exporter/verdict/criteria.wilson)."""
    from .criteria import wilson as _wilson

    return _wilson(correct, n)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> dict:
    """{"correct", "n", "top1", "wilson95": [lo, hi]} of `logits` (N, classes) against `labels`."""
    correct = int((np.asarray(logits).argmax(1) == np.asarray(labels)).sum())
    n = len(labels)
    lo, hi = wilson(correct, n)
    return {"correct": correct, "n": n, "top1": correct / n, "wilson95": [round(lo, 4), round(hi, 4)]}


def describe(acc: dict) -> str:
    lo, hi = acc["wilson95"]
    return f"{100 * acc['top1']:.2f}% ({acc['correct']}/{acc['n']}, 95% CI {100 * lo:.1f}-{100 * hi:.1f})"


def torch_logits(model, x: np.ndarray, batch: int = 128) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch.cat([model(torch.from_numpy(x[i:i + batch])) for i in range(0, len(x), batch)]).numpy()


_CACHE: dict = {}


def deploy_form(name: str):
    """(train-form, deploy-form) of reference `name`, built once per test session."""
    key = ("deploy", name)
    if key not in _CACHE:
        from ..reparam import reparameterize

        train = load_reference(name)
        _CACHE[key] = train, reparameterize(train, imgsz=manifest()["models"][name]["imgsz"])
    return _CACHE[key]


def onnx_fp32(name: str):
    """The checked, simplified fp32 ONNX of the deploy-form (dynamic batch), as the pipeline builds its base graph."""
    key = ("onnx", name)
    if key not in _CACHE:
        from ..onnx.onnx_export import check_onnx, export_onnx, simplify_onnx

        _, deploy = deploy_form(name)
        _CACHE[key] = simplify_onnx(check_onnx(export_onnx(deploy, manifest()["models"][name]["imgsz"], batch=None)))
    return _CACHE[key]


def ort_logits(model, x: np.ndarray) -> np.ndarray:
    from ...targets.graph.runtime import OnnxRuntimeRunner
    from .parity import run_batched

    return run_batched(OnnxRuntimeRunner(model, threads=1), x, batch=128)


def decision_flips(reference: np.ndarray, candidate: np.ndarray, rel_margin: float) -> tuple[list[int], list[int]]:
    """(samples whose top-1 differs, those of them that are NOT near-ties). A near-tie is a sample whose
    reference top-1/top-2 gap is below `rel_margin` * max|reference|: a rounding-level change may flip it."""
    ref = np.asarray(reference, np.float64)
    flips = np.flatnonzero(ref.argmax(1) != np.asarray(candidate).argmax(1))
    top2 = np.sort(ref, axis=1)[:, -2:]
    gap = top2[:, 1] - top2[:, 0]
    scale = np.abs(ref).max()
    real = [int(i) for i in flips if gap[i] >= rel_margin * scale]
    return [int(i) for i in flips], real
