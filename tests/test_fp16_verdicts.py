"""fp16 verdicts right both ways: correct fp16 artifacts (CoreML, ONNX fp16) of trained models pass the fp16 rule,
and errors planted in the SAVED artifact fail it: a zeroed layer, a sign-flipped channel, a channel x10 (the per-sample
fp16 rule on the outputs), a channel x1.1 (the weights check: its effect on the outputs can stay within fp16's own).
Before the fp16 rule (fixed cosine / PSNR / agreement bounds alone) every one of these plants in an .mlpackage
passed.

Families: SwiftFormer and SLAB-DeiT trained on scikit-learn's digits (tests/fixtures/trained/), SimA and SLAB-Swin
at small demo configs. The plants sit in the middle of the network (weight.bin of the package, a float16 initializer
of the ONNX graph)."""
from __future__ import annotations

import copy

import pytest

import vitedge
from vitedge.models import make_trained_like
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import plant_fp16_initializer, plant_package_weights

SAMPLES = 12
PLANTS = ("sign_flip", "x10", "zero_layer")   # caught on the outputs alone


def _trained(name):
    entry = tf.manifest()["models"][name]
    return tf.load_reference(name), entry["imgsz"]


def _demo(name, **overrides):
    return make_trained_like(vitedge.create_model(name, **overrides), seed=0).eval(), overrides["img_size"]


MODELS = {
    "swiftformer_digits": lambda: _trained("swiftformer_digits"),
    "slab_deit_digits": lambda: _trained("slab_deit_digits"),
    "sima": lambda: _demo("sima_nano_12_p16", depth=2, img_size=32, num_classes=10),
    "slab_swin": lambda: _demo("slab_swin_tiny", depths=[1, 1, 1, 1], img_size=64, window_size=2, num_classes=10),
}


_EXPORTS: dict = {}


def _export(name: str, tmp_path_factory):
    """The fp16 export of model `name` (CoreML; SwiftFormer also ONNX fp16), once per module."""
    if name not in _EXPORTS:
        model, imgsz = MODELS[name]()
        out = tmp_path_factory.mktemp(name) / "run"
        targets = "onnx,coreml" if name == "swiftformer_digits" else "coreml"
        rep = vitedge.export(copy.deepcopy(model), targets=targets, precision="fp16", imgsz=imgsz, samples=SAMPLES,
                             out=out)
        _EXPORTS[name] = (name, model, imgsz, rep, out)
    return _EXPORTS[name]


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory):
    return _export(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def swiftformer(tmp_path_factory):
    return _export("swiftformer_digits", tmp_path_factory)


def _parity(model, artifact, imgsz):
    return vitedge.parity(copy.deepcopy(model), artifact=artifact, imgsz=imgsz, samples=SAMPLES)


def test_correct_fp16_artifacts_pass_the_fp16_rule(exported):
    name, _, _, rep, _ = exported
    fp16 = [h for h in rep.parity if h.hop in ("coreml", "onnx-fp16")]
    assert fp16 and all(h.status == "passed" for h in fp16), [(h.hop, h.reason) for h in fp16]
    assert all(h.weights["status"] == "passed" and h.weights["checked"] > 0 for h in fp16), [h.weights for h in fp16]
    for h in fp16:  # judged by the per-sample fp16 rule, with room to spare
        assert h.tolerance.fp16_k and all(d["noise_ratio"] <= 1 for d in h.sets.values()), (name, h.sets)
        assert all(d["reference_fp16_error"] > 0 for d in h.sets.values())


@pytest.mark.parametrize("plant", PLANTS)
def test_planted_errors_in_the_saved_package_fail(exported, plant, tmp_path):
    name, model, imgsz, _, out = exported
    bad = tmp_path / "planted.mlpackage"
    plant_package_weights(next(out.glob("*.mlpackage")), bad, plant, 0.5)
    rep = _parity(model, bad, imgsz)
    hop = rep.hop("coreml")
    assert hop.status == "failed" and rep.exit_code == 1, (name, plant, hop.reason)
    assert "noise_ratio" in hop.reason or "non-finite" in hop.reason, hop.reason  # the outputs alone fail it
    assert hop.weights["status"] == "failed", hop.weights


def test_a_channel_x1_1_in_the_saved_package_fails_the_weights_check(exported, tmp_path):
    name, model, imgsz, _, out = exported
    bad = tmp_path / "planted.mlpackage"
    plant_package_weights(next(out.glob("*.mlpackage")), bad, "x1.1", 0.5)
    hop = _parity(model, bad, imgsz).hop("coreml")
    assert hop.status == "failed" and "weights check" in hop.reason, (name, hop.reason)
    assert hop.weights["worst"]["ratio"] > 1 and hop.weights["worst"]["deviation"] > 0.02, hop.weights


@pytest.mark.parametrize("plant", PLANTS + ("x1.1",))
def test_planted_errors_in_the_saved_fp16_onnx_fail(swiftformer, plant, tmp_path):
    # one family: the fp16 rule is the same for every fp16 artifact
    name, model, imgsz, _, out = swiftformer
    bad = tmp_path / "planted.fp16.onnx"
    plant_fp16_initializer(next(out.glob("*.fp16.onnx")), bad, plant, 0.5)
    rep = _parity(model, bad, imgsz)
    hop = next(h for h in rep.parity if h.hop.startswith("onnx"))
    assert hop.status == "failed" and rep.exit_code == 1, (plant, hop.reason)
    assert ("noise_ratio" in hop.reason if plant in PLANTS else "weights check" in hop.reason), hop.reason
