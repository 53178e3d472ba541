"""Errors planted in a saved int8 ExecuTorch program (.int8.pte) fail its hop: the trained swiftformer_digits is
lowered ONCE (PT2E symmetric int8, per-channel weights, XNNPACK), then one mid-network weight's per-channel scales
are changed in the program's bytes and the program is judged by the product's compressed rule on the 364 held-out
digits. The correct program's test is also the int8 accuracy check of this fixture (the other trained fixture's
is in tests/test_executorch_delegation.py): one lowering serves both."""
import dataclasses

import pytest

from vitedge.targets.calibration import Calibration
from vitedge.targets import get_target
from vitedge.targets.base import LowerSpec
from vitedge.tests._plant import int8_pte_scales, plant_pte_int8_data, plant_pte_int8_scale

NAME = "swiftformer_digits"


@pytest.fixture(scope="module")
def lowered(tmp_path_factory):
    from vitedge.exporter.quantize.compressed import Judged
    from vitedge.exporter.verdict.parity import ground_truth
    from vitedge.tests import trained_fixtures as tf

    tmp = tmp_path_factory.mktemp("int8pte")
    train, deploy = tf.deploy_form(NAME)
    imgsz = tf.manifest()["models"][NAME]["imgsz"]
    xc, ids = tf.calibration_images(NAME, 64)
    target = get_target("executorch")
    art = target.lower(deploy, LowerSpec(NAME, imgsz, 1, "int8", tmp, None, metadata={"mean": [0.5] * 3},
                                         calibration=Calibration(xc, tuple(str(i) for i in ids), "images")))
    x, y = tf.heldout(NAME)
    judged = Judged(train, x, ground_truth(train, x, ("user",) * len(x), y), tuple(f"digit:{i}" for i in range(len(x))))
    raw = open(art.path, "rb").read()
    found = [(n, p.detach().numpy()) for n, p in deploy.named_parameters()
             if p.ndim >= 2 and p.shape[0] > 1 and raw.count(int8_pte_scales(p.detach().numpy()).tobytes()) == 1]
    return target, art, judged, found, tmp, (train, x, y)


def _judge(target, art, judged):
    from vitedge.exporter.quantize.compressed import judge_compressed
    from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES

    with target.runner(art) as runner:
        return judge_compressed("executorch-int8", runner, judged, FLOAT64_TOLERANCES["int8"], "int8")


def test_correct_int8_program_passes_and_keeps_the_accuracy(lowered):
    from vitedge.tests import trained_fixtures as tf

    target, art, judged, found, _, (train, x, y) = lowered
    assert len(found) > 0  # the scales of stored weights are found byte-exact in the program
    assert art.info["outside_delegate"] == {} and art.info["calibration"]["samples"] == 64
    hop = _judge(target, art, judged)
    assert hop.status == "passed", hop.reason
    with target.runner(art) as runner:
        acc = tf.accuracy(runner.run(x), y)
    assert acc["correct"] >= tf.accuracy(tf.torch_logits(train, x), y)["correct"] - 2  # at most 2 of 364 lost


def _planted(lowered, plant, where=plant_pte_int8_scale):
    target, art, judged, found, tmp, _ = lowered
    name, w = found[0]  # the stem convolution (patch_embed.0)
    dst = tmp / f"{plant}-{where.__name__}.int8.pte"
    where(art.path, dst, w, plant)
    assert open(dst, "rb").read() != open(art.path, "rb").read()
    return target, dataclasses.replace(art, path=dst), judged


def test_x10_on_one_channel_scale_fails(lowered):
    hop = _judge(*_planted(lowered, "x10"))
    assert hop.status == "failed" and "noise_ratio" in hop.reason, hop.reason


@pytest.mark.parametrize("plant", ["zero_layer", "sign_flip"])
def test_non_positive_scales_are_refused_by_xnnpack_at_load(lowered, plant):
    """Measured: XNNPACK refuses a zero or negative per-channel scale when the program loads, so a zeroed layer or a
    sign flip cannot be planted through the scales; it needs the int8 data itself (not done here)."""
    with pytest.raises(RuntimeError, match="Failed to load method"):
        _judge(*_planted(lowered, plant))


@pytest.mark.parametrize("plant", ["zero_layer", "sign_flip"])
def test_zeroed_layer_and_sign_flip_in_the_int8_data_fail(lowered, plant):
    hop = _judge(*_planted(lowered, plant, plant_pte_int8_data))
    assert hop.status == "failed" and "noise_ratio" in hop.reason, hop.reason
