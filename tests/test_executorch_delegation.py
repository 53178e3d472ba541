"""Every family's deploy-form is delegated to XNNPACK whole (the delegable rewrites, gated in float64), and
int8 programs of the trained reference models keep their accuracy, judged by the product's compressed rule.

fp32, live: SLAB DeiT here and SwiftFormer by its export in tests/test_executorch.py; every family in
benchmarks/results/executorch_delegation.json (checked here) and live under `python -m pytest -m benchmarks` (each
lowering is ExecuTorch's own passes, 12-42 s a family here). int8 delegation on the two trained references here, and
for every family (reduced configs and the three real-size models) in that file and executorch_speed.json."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vitedge.exporter.reparam.build_forms import build_deploy_form, build_train_form
from vitedge.targets import get_target
from vitedge.targets.base import LowerSpec
from vitedge.targets.calibration import Calibration
from vitedge.tests._families import CASES


EVIDENCE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "executorch_delegation.json"
LIVE = ("slab_deit",)  # beside SwiftFormer's (tests/test_executorch.py): a transformer family's ops in every run
FP32_REL_ERR = 1e-4


# swiftformer: tests/test_executorch.py's export of the same config checks it (fully delegated, the rewrites applied,
# the program's hop passed), so its lowering is not made twice
@pytest.mark.parametrize("family", [f if f in LIVE else pytest.param(f, marks=pytest.mark.benchmarks)
                                    for f in sorted(set(CASES) - {"swiftformer"})])
def test_every_family_is_delegated_whole(family, tmp_path):
    """No op outside XNNPACK for any family's fp32 deploy-form, and the program computes its function."""
    name, overrides, imgsz = CASES[family]
    deploy, _ = build_deploy_form(build_train_form(name, overrides=overrides).model, imgsz)
    target = get_target("executorch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, imgsz, imgsz)).astype(np.float32)
    with torch.no_grad():
        ref = deploy(torch.from_numpy(x)).numpy()
    art = target.lower(deploy, LowerSpec(name, imgsz, 1, "fp32", tmp_path, None, metadata={"mean": [0.5] * 3}))
    assert art.info["outside_delegate"] == {}, (family, art.info["outside_delegate"])
    assert art.info["fully_delegated"] and not art.info["rewrites"].get("refused")
    assert art.info["rewrites"]["applied"]  # each family has ops XNNPACK would not take as written
    with target.runner(art) as r:
        y = r.run(x)
    assert np.abs(y - ref).max() <= FP32_REL_ERR * np.abs(ref).max()


def test_the_committed_evidence_has_every_family_delegated_whole_and_computing_its_function():
    """benchmarks/results/executorch_delegation.json, for the families not lowered live in the default run: each
    family's fp32 program with the rewrites, of the config the suite uses, left no op outside XNNPACK and computed
    the deploy-form's function."""
    data = json.loads(EVIDENCE.read_text())
    assert data["quick"] is False and data["settings"]["fp32_rel_err_at_most"] == FP32_REL_ERR
    rows = {r["family"]: r for r in data["rows"] if r["precision"] == "fp32" and r["rewrites"] == "on"}
    assert set(rows) == set(CASES), "re-run benchmarks/executorch_delegation.py: a family is missing from its JSON"
    for family, row in rows.items():
        name, overrides, imgsz = CASES[family]
        assert (row["model"], row["overrides"], row["imgsz"]) == (name, overrides, imgsz), (
            f"{family}: the JSON is of another config than the suite's: re-run benchmarks/executorch_delegation.py")
        assert row["outside_delegate"] == {} and row["fully_delegated"] and row["delegate_calls"] == 1, row
        assert row["rewrite_record"]["applied"] and not row["rewrite_record"].get("refused"), row
        assert row["max_rel_err"] <= FP32_REL_ERR, row


@pytest.mark.parametrize("name", ["slab_deit_digits"])  # swiftformer_digits: tests/test_executorch_int8_plants.py
def test_int8_on_trained_weights_keeps_the_accuracy(name, tmp_path):
    """PT2E int8 of the trained reference models, calibrated on 64 training images, judged on the 364 held-out
    digits by the product's compressed rule (int8 profile: accuracy drop, agreement, cosine, PSNR)."""
    from vitedge.exporter.quantize.compressed import JudgedSamples, judge_compressed
    from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, ground_truth
    from vitedge.exporter.verdict import trained_reference as tf

    train, deploy = tf.deploy_form(name)
    imgsz = tf.manifest()["models"][name]["imgsz"]
    xc, ids = tf.calibration_images(name, 64)
    calib = Calibration(xc, tuple(str(i) for i in ids), "images")
    target = get_target("executorch")
    art = target.lower(deploy, LowerSpec(name, imgsz, 1, "int8", tmp_path, None, metadata={"mean": [0.5] * 3},
                                         calibration=calib))
    assert art.info["outside_delegate"] == {} and art.info["calibration"]["samples"] == 64
    x, y = tf.heldout(name)
    sets = ("user",) * len(x)  # labelled images of the user's task, as --images gives them
    judged = JudgedSamples(train, x, ground_truth(train, x, sets, y), tuple(f"digit:{i}" for i in range(len(x))))
    with target.runner(art) as runner:
        hop = judge_compressed("executorch-int8", runner, judged, FLOAT64_TOLERANCES["int8"], "int8")
        acc = tf.accuracy(runner.run(x), y)
    acc32 = tf.accuracy(tf.torch_logits(train, x), y)
    assert hop.status == "passed", hop.reason
    assert acc["correct"] >= acc32["correct"] - 2  # at most 2 of 364 (0.55 points) lost
