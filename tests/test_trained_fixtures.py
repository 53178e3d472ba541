"""The trained reference models: committed, loadable, accurate, and as accurate after every float hop.

Accuracy is measured here on the held-out digits split (exporter/verdict/trained_reference.py) and printed with its
95 % Wilson interval; the only recorded figure compared against is the train-form accuracy that
scripts/train_reference.py measured when it wrote the checkpoint.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vitedge.exporter.verdict import trained_reference as tf

NAMES = ("swiftformer_digits", "slab_deit_digits")
# One image (0.27 pt): a different BLAS or thread count may move a logit by ~1e-6 and flip a near-tie.
RECORDED_MARGIN = 1
# fp32 hops (deploy-form, ONNX Runtime) may flip only near-ties: a top-1/top-2 gap under the fp32 parity
# tolerance (max_rel 1e-4 of max|logit|). fp16 (10-bit mantissa, ~1e-3 relative per op): 2e-2.
FP32_TIE = 1e-4
FP16_TIE = 2e-2
MIN_ACCURACY = 0.90  # "real accuracy": chance is 0.10


def test_reference_names_are_the_committed_fixtures():
    assert set(NAMES) <= set(tf.reference_names())
    for name in NAMES:
        assert (tf.FIXTURES / tf.manifest()["models"][name]["checkpoint"]).is_file()


def test_without_the_fixtures_the_module_says_where_they_are(monkeypatch, tmp_path):
    monkeypatch.setattr(tf, "MANIFEST", tmp_path / "manifest.json")  # an installed package: no tests/ beside it
    with pytest.raises(FileNotFoundError, match="source checkout"):
        tf.reference_names()


def test_split_is_deterministic_stratified_and_matches_the_fixtures():
    _, labels = tf._raw_digits()
    train, held = tf.split(labels)
    assert len(np.intersect1d(train, held)) == 0 and len(train) + len(held) == len(labels)
    man = tf.manifest()["dataset"]
    assert tf.data_sha256() == man["sha256"], "scikit-learn's digits data changed: retrain the fixtures"
    assert len(held) == man["heldout"] and tf.indices_sha256(held) == man["heldout_sha256"]
    per_class = np.bincount(labels[held], minlength=10)
    expected = np.ceil(np.bincount(labels, minlength=10) / tf.HOLDOUT_EVERY)
    assert (per_class == expected).all()


@pytest.mark.parametrize("name", NAMES)
def test_checkpoint_is_an_official_container_and_loads_strictly(name):
    path = tf.FIXTURES / tf.manifest()["models"][name]["checkpoint"]
    obj = torch.load(path, weights_only=True)
    assert set(obj) == {"model"}
    from vitedge import load_checkpoint

    result = load_checkpoint(tf.build(name), path, strict=True)
    assert result.ok and result.source_key == "model" and not result.remaps


def test_slab_fixture_finished_its_linearnorm_schedule():
    from vitedge.models.layers import LinearNorm

    model = tf.load_reference("slab_deit_digits")
    norms = [m for m in model.modules() if isinstance(m, LinearNorm)]
    assert norms and all(int(m.iter) == 0 and int(m.warm) == 0 for m in norms)
    trained = tf.manifest()["models"]["slab_deit_digits"]["train"]["linearnorm"]
    assert all(int(m.total_step) == trained["step"] for m in norms)


@pytest.mark.parametrize("name", NAMES)
def test_train_form_accuracy_meets_the_recorded_value(name):
    x, y = tf.heldout(name)
    train, _ = tf.deploy_form(name)
    acc = tf.accuracy(tf.torch_logits(train, x), y)
    recorded = tf.manifest()["models"][name]["accuracy"]["fp32_train_form"]
    print(f"{name} fp32 train-form: {tf.describe(acc)} (recorded {recorded['correct']}/{recorded['n']})")
    assert acc["n"] == recorded["n"]
    assert acc["correct"] >= recorded["correct"] - RECORDED_MARGIN
    assert acc["top1"] >= MIN_ACCURACY


@pytest.mark.parametrize("name", NAMES)
def test_deploy_form_and_onnx_keep_every_decision(name):
    x, y = tf.heldout(name)
    train, deploy = tf.deploy_form(name)
    ref = tf.torch_logits(train, x)
    for hop, out in (("deploy-form", tf.torch_logits(deploy, x)), ("onnx fp32", tf.ort_logits(tf.onnx_fp32(name), x))):
        flips, real = tf.decision_flips(ref, out, FP32_TIE)
        acc = tf.accuracy(out, y)
        print(f"{name} {hop}: {tf.describe(acc)}, {len(flips)} flipped decision(s)")
        assert not real, f"{hop} changed {len(real)} clear decision(s), e.g. sample {real[0]}"
        assert abs(acc["correct"] - tf.accuracy(ref, y)["correct"]) <= len(flips)


@pytest.mark.parametrize("name", NAMES)
def test_fp16_onnx_accuracy(name):
    from vitedge.targets.graph.onnx_fp16 import convert_onnx_fp16

    x, y = tf.heldout(name)
    train, _ = tf.deploy_form(name)
    ref = tf.torch_logits(train, x)
    out = tf.ort_logits(convert_onnx_fp16(tf.onnx_fp32(name)), x)
    flips, real = tf.decision_flips(ref, out, FP16_TIE)
    acc, acc32 = tf.accuracy(out, y), tf.accuracy(ref, y)
    print(f"{name} onnx fp16: {tf.describe(acc)} vs fp32 {tf.describe(acc32)}, {len(flips)} flipped decision(s)")
    assert not real, f"fp16 changed {len(real)} clear decision(s), e.g. sample {real[0]}"
    assert acc["correct"] >= acc32["correct"] - RECORDED_MARGIN


def test_wilson_interval_against_hand_values():
    # 95 % Wilson score interval of 9/10, the usual worked example: (0.596, 0.982)
    lo, hi = tf.wilson(9, 10)
    assert lo == pytest.approx(0.5958, abs=1e-4) and hi == pytest.approx(0.9821, abs=1e-4)
    lo, hi = tf.wilson(364, 364)
    assert hi == 1.0 and 0.98 < lo < 0.99  # all correct still leaves ~1 % of doubt
