"""The disk cache of the float64 ground truth: a hit gives the very arrays the computation gave, anything the
truth depends on (weights, inputs, the model's code) is a new key, what the key cannot see is not cached, a
broken entry is recomputed, and the report says what happened."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from vitedge.exporter.verdict import truth_cache
from vitedge.exporter.verdict.hops import parity_set_for
from vitedge.exporter.flow.pipeline import build_train_form, export
from vitedge.models.reduced import reduced
from vitedge.models.swiftformer import SwiftFormerEncoder

SWIFT = reduced("swiftformer")
IMGSZ = 32
SETS = ("natural", "natural", "natural", "stress") * 2


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(truth_cache.DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(truth_cache.SWITCH_ENV, raising=False)
    return tmp_path / "cache" / "truth"


@pytest.fixture
def computed(monkeypatch):
    """Counts the ground-truth computations the cache lets through."""
    calls = []
    real = truth_cache.ground_truth
    monkeypatch.setattr(truth_cache, "ground_truth", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _model():
    return build_train_form("swiftformer_xs", overrides=SWIFT).model


def _x(model, n=8):
    return parity_set_for(model, n, IMGSZ)


def test_a_hit_returns_the_computed_arrays(cache, computed):
    m = _model()
    x = _x(m)
    first, how = truth_cache.cached_ground_truth(m, x, SETS)
    assert how["status"] == "stored" and len(list(cache.glob("*.npz"))) == 1
    again, how2 = truth_cache.cached_ground_truth(m, x, SETS, labels=np.arange(8))
    assert how2["status"] == "hit" and how2["key"] == how["key"] and computed == [1]
    assert np.array_equal(again.y64, first.y64) and np.array_equal(again.y32, first.y32)
    assert again.y64.dtype == np.float64 and again.float32_threads == first.float32_threads
    assert again.sets == SETS and list(again.labels) == list(range(8))  # sets and labels are the caller's


def test_what_the_truth_depends_on_is_in_the_key(cache, computed, monkeypatch):
    m = _model()
    x = _x(m)
    truth_cache.cached_ground_truth(m, x, SETS)
    x2 = x.copy()
    x2[3, 0, 0, 0] += 1e-3
    assert truth_cache.cached_ground_truth(m, x2, SETS)[1]["status"] == "stored"  # other inputs
    with torch.no_grad():
        next(m.parameters()).view(-1)[0] += 1e-6
    assert truth_cache.cached_ground_truth(m, x, SETS)[1]["status"] == "stored"  # other weights
    forward = SwiftFormerEncoder.forward
    monkeypatch.setattr(SwiftFormerEncoder, "forward", lambda self, t: forward(self, t) * 1.0)
    assert truth_cache.cached_ground_truth(m, x, SETS)[1]["status"] == "stored"  # other code, same weights
    assert computed == [1, 1, 1, 1]


def test_the_key_does_not_depend_on_where_vitedge_is_installed():
    """The same code loaded from two places (a checkout run as cli.py, an installed copy) gives one key: the key
    is written into bundles, whose bytes must not follow the install path."""
    src = ("import torch\nclass Block(torch.nn.Module):\n    def forward(self, x):\n"
           "        return sum(t for t in [x, x])\n")  # (the generator is nested code, with its own file name)
    digests = []
    for path in ("/checkout/vitedge/models/block.py", "/venv/site-packages/vitedge/models/block.py"):
        namespace = {"__name__": "block_under_test"}
        exec(compile(src, path, "exec"), namespace)
        digests.append(truth_cache._code_digest(namespace["Block"]()))
    assert digests[0] == digests[1]


def test_what_the_key_cannot_see_is_not_cached(cache, computed):
    m = _model()
    x = _x(m)
    m.head.register_forward_hook(lambda mod, i, o: o * 2)
    truth, how = truth_cache.cached_ground_truth(m, x, SETS)
    assert how["status"] == "uncacheable" and "forward hooks" in how["why"] and not cache.exists()
    m2 = _model()
    m2.norm.forward = lambda t: t
    assert truth_cache.cached_ground_truth(m2, x, SETS)[1]["status"] == "uncacheable"


def test_broken_entries_are_recomputed_and_replaced(cache, computed):
    m = _model()
    x = _x(m)
    how = truth_cache.cached_ground_truth(m, x, SETS)[1]
    path = next(cache.glob("*.npz"))
    path.write_bytes(path.read_bytes()[:100])  # truncated
    assert truth_cache.cached_ground_truth(m, x, SETS)[1]["status"] == "stored"
    good = path.read_bytes()
    with np.load(path) as z:  # an entry whose stored key is another's (a hash collision, a renamed file)
        key = json.loads(str(z["key"]))
        np.savez(path, key=np.array(json.dumps({**key, "inputs": "other"})), y64=z["y64"], y32=z["y32"])
    assert truth_cache.cached_ground_truth(m, x, SETS)[1]["status"] == "stored"
    assert path.read_bytes() == good and computed == [1, 1, 1] and how["key"] in path.name


def test_off_switches_and_an_unwritable_folder(cache, computed, monkeypatch, tmp_path):
    m = _model()
    x = _x(m)
    assert truth_cache.cached_ground_truth(m, x, SETS, use_cache=False)[1] == {"status": "off"}
    monkeypatch.setenv(truth_cache.SWITCH_ENV, "off")
    assert truth_cache.cached_ground_truth(m, x, SETS)[1] == {"status": "off"} and not cache.exists()
    monkeypatch.delenv(truth_cache.SWITCH_ENV)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(truth_cache.DIR_ENV, str(blocker))
    truth, how = truth_cache.cached_ground_truth(m, x, SETS)
    assert how["status"] == "not stored" and "Error" in how["why"] and np.isfinite(truth.y64).all()


def test_old_entries_are_pruned(cache, monkeypatch):
    monkeypatch.setattr(truth_cache, "MAX_ENTRIES", 2)
    m = _model()
    x = _x(m)
    for k in range(3):
        truth_cache.cached_ground_truth(m, x + k, SETS)
    assert len(list(cache.glob("*.npz"))) == 2 and not list(cache.glob("*.tmp"))


def test_export_reports_the_cache_and_judges_the_same(cache, tmp_path):
    kw = dict(imgsz=IMGSZ, samples=8, overrides=SWIFT)
    cold = export("swiftformer_xs", "onnx", out=tmp_path / "a", **kw)
    warm = export("swiftformer_xs", "onnx", out=tmp_path / "b", **kw)
    assert cold.reference["cache"]["status"] == "stored" and warm.reference["cache"]["status"] == "hit"
    assert cold.exit_code == warm.exit_code == 0
    assert [h.metrics for h in cold.parity] == [h.metrics for h in warm.parity]
    off = export("swiftformer_xs", "onnx", out=tmp_path / "c", truth_cache=False, **kw)
    assert off.reference["cache"] == {"status": "off"}
    saved = json.loads((tmp_path / "b" / "report.json").read_text())
    assert saved["reference"]["cache"]["status"] == "hit"


def test_cli_no_truth_cache(cache, tmp_path):
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "vitedge.cli", "export", "--model", "swiftformer_xs", "--imgsz",
                        str(IMGSZ), "--samples", "8", "--set", "layers=[1,1,2,1]", "--set",
                        "embed_dims=[16,24,32,48]", "--set", "num_classes=10", "--out", str(out), "--no-truth-cache"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((out / "report.json").read_text())["reference"]["cache"] == {"status": "off"}
    assert not cache.exists()


def test_an_entry_whose_arrays_were_changed_is_recomputed(cache, computed):
    """An entry whose outputs were edited after it was written (here every float64 output scaled by 1.01, the key
    untouched) is never trusted: its arrays no longer match the digest stored with them."""
    m = _model()
    x = _x(m)
    first = truth_cache.cached_ground_truth(m, x, SETS)[0]
    path = next(cache.glob("*.npz"))
    with np.load(path) as z:
        fields = {k: z[k] for k in z.files}
    np.savez(path, **{**fields, "y64": fields["y64"] * 1.01})
    again, how = truth_cache.cached_ground_truth(m, x, SETS)
    assert how["status"] == "stored" and computed == [1, 1]
    assert np.array_equal(again.y64, first.y64)
