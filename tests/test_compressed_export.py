"""--precision int8 | w8 | palette4 | palette6 | w8a8 through `vitedge.export` / `vitedge.parity` on the trained
reference fixtures (tests/fixtures/trained/), both families: the artifact's ops, the float islands kept, the
emulated CoreML hop executing the compressed program, calibration kept apart from the judged samples, the kind's
profile against float64 on natural images, corruption failing with the module named, and --tol both ways.

One export per (family, precision), sharing the verified base (export(base_store=...)), 64 parity samples at 32 px.
Accuracy against the digits labels with Wilson CIs: tests/test_qdq.py, tests/test_coreml_compress.py (364
held-out images), and the labelled-folder test below (accuracy delta through the hop).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vitedge import precisions
from vitedge.exporter.quantize import calibrate
from vitedge.exporter.quantize.compressed import QDQ_HOP, JudgedSamples, compressed_hop, write_qdq
from vitedge.exporter.verdict.inputs import parity_set, user_set
from vitedge.exporter.verdict.parity import COMPRESSED_TOLERANCES, profile_for, tolerances
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.core.progress import QUIET
from vitedge.exporter.flow.verify import parity
from vitedge.models.registry import input_stats
from vitedge.targets import get_target
from vitedge.targets.base import Artifact
from vitedge.targets.coreml.mil_interpreter import load_program
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import corrupt_package
from vitedge.tests.test_interfaces import _MemoryBaseStore  # one verified base per family, reused by every precision

NAMES = ("swiftformer_digits", "slab_deit_digits")
PRECISIONS = ("int8", "w8", "palette4", "palette6", "w8a8")
SAMPLES = 64
COMPRESSION_OPS = {  # iOS 16 (w8 / palette) and 17 (w8a8, raised from the default 16)
    "w8": {"constexpr_affine_dequantize"}, "palette4": {"constexpr_lut_to_dense"},
    "palette6": {"constexpr_lut_to_dense"}, "w8a8": {"constexpr_affine_dequantize", "quantize", "dequantize"},
}
_RUNS: dict = {}
_BASES: dict = {}


def fixture_args(name: str) -> dict:
    entry = tf.manifest()["models"][name]
    return {"checkpoint": tf.FIXTURES / entry["checkpoint"], "overrides": entry["overrides"], "imgsz": entry["imgsz"]}


def model_of(name: str) -> str:
    return tf.manifest()["models"][name]["model"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compressed")


def exported(work: Path, name: str, precision: str):
    key = (name, precision)
    if key not in _RUNS:
        store = _BASES.setdefault(name, _MemoryBaseStore(work / f"base-{name}"))
        targets = "onnx,tensorrt" if precision == "int8" else "coreml"
        out = work / f"{name}-{precision}"
        report = export(model_of(name), targets, precision=precision, out=out, samples=SAMPLES, base_store=store,
                        **fixture_args(name))
        _RUNS[key] = report, out
    return _RUNS[key]


def hop_of(precision: str) -> str:
    return "onnx-int8" if precision == "int8" else "coreml"


# ------------------------------------------------------------------------------------------------ the exports

@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", NAMES)
def test_export_is_judged_by_the_kinds_profile_on_natural_images(work, name, precision):
    report, out = exported(work, name, precision)
    hop = report.hop(hop_of(precision))
    assert report.exit_code == 0 and hop.status == "passed", [(h.hop, h.reason) for h in report.parity]
    assert hop.tolerance.profile == profile_for(precision) and hop.tolerance.noise_k is None
    assert set(hop.sets) == {"natural"} and 0 < hop.samples <= hop.sets["natural"]["samples"]  # no stress sample
    assert "natural samples" in report.compressed_inputs
    print(f"{name} {precision}: {hop.hop} cosine {hop.metrics.cosine:.5f} PSNR {hop.metrics.psnr_db:.1f} dB "
          f"top-1 {hop.metrics.top1_agreement:.3f} ({hop.samples} natural samples, {hop.mode})")
    if precision in precisions.calibrated():
        rec = report.calibration
        assert rec["samples"] == calibrate.CALIB_DEFAULT and rec["source"] == "natural" and len(rec["sha256"]) == 64
        assert set(rec["excluded_from_evaluation"]["photos"]) == set(calibrate.calibration_photos())
    else:
        assert report.calibration is None


@pytest.mark.parametrize("name", NAMES)
def test_int8_graphs_ops_islands_and_the_tensorrt_source(work, name):
    report, out = exported(work, name, "int8")
    model = tf.manifest()["models"][name]["model"]
    graph = onnx.load(str(out / f"{model}.int8.onnx"))
    types = {n.op_type for n in graph.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= types
    info = report.artifacts["onnx-int8"].info
    assert info["encoding"] == "onnxruntime" and info["quantized"].get("Conv", 0) > 0
    assert info["calibration"]["ids"] == report.calibration["ids"]
    if name == "slab_deit_digits":  # SLA's token-sum MatMuls are policy islands: excluded from quantization
        assert info["float_islands"]["excluded_quantizable"]
    meta = {p.key: p.value for p in graph.metadata_props}
    assert meta["vitedge.precision"] == '"int8"' or meta["vitedge.precision"] == "int8"
    # the tensorrt engine's source: written and judged on ONNX Runtime CPU even though the engine is unverified
    trt_graph = onnx.load(str(out / f"{model}.int8.tensorrt.onnx"))
    zero_points = [i for i in trt_graph.graph.initializer if i.name.endswith("_zero_point")]
    assert zero_points and all(i.data_type == onnx.TensorProto.INT8 and not numpy_helper.to_array(i).any()
                               for i in zero_points)
    assert report.hop(QDQ_HOP).status == "passed" and report.artifacts[QDQ_HOP].info["encoding"] == "tensorrt"
    assert report.hop("tensorrt").status == "unverified"  # no GPU here


@pytest.mark.parametrize("precision", ("w8", "palette4", "palette6", "w8a8"))
@pytest.mark.parametrize("name", NAMES)
def test_coreml_package_holds_and_emulates_the_compressed_program(work, name, precision):
    report, out = exported(work, name, precision)
    entry = report.artifacts["coreml"]
    program = load_program(out / entry.path)
    assert program.unknown_ops() == [] and COMPRESSION_OPS[precision] <= set(program.op_counts())
    comp = entry.info["compression"]
    assert comp["kind"] == precision and comp["fp32_ops"] == comp["source_fp32_ops"]  # the islands stay fp32
    assert comp["weights_compressed"] > 0
    meta = dict(program.spec.description.metadata.userDefined)
    assert meta["precision"] == precision and f'"kind": "{precision}"' in meta["compression"]
    hop = report.hop("coreml")
    assert hop.mode == "emulated" and hop.runner["mode"] == "emulated"  # executed by the interpreter, not skipped
    if precision == "w8a8":  # no --ios given: raised to 17 and recorded
        assert entry.info["ios"] == 17 and "raised" in entry.info["ios_raised"]
        assert comp["calibration"]["ids"] == report.calibration["ids"]
    else:
        assert entry.info["ios"] == 16 and "ios_raised" not in entry.info


def test_calibration_samples_are_never_judged():
    mean, std = input_stats(tf.load_reference("swiftformer_digits"))
    calib = calibrate.natural_calibration(16, 32, mean, std)
    pset = parity_set(SAMPLES, 32, 0, mean, std)
    idx = calibrate.evaluation_indices(pset.names, pset.sets, calib.ids)
    judged = {pset.names[i] for i in idx}
    photos = set(calibrate.calibration_photos())
    assert judged and not judged & set(calib.ids)
    assert all(n.startswith("natural:") and n.split(":")[1].split("/")[0] not in photos for n in judged)
    assert {i.split(":")[1].split("/")[0] for i in calib.ids} == photos  # views of the calibration photos only
    again = calibrate.natural_calibration(16, 32, mean, std)
    assert again.ids == calib.ids and np.array_equal(again.x, calib.x)  # deterministic


# ------------------------------------------------------------------------------------------------ corruption

def _parity(name: str, artifact: Path, tol=None):
    return parity(model_of(name), artifact, samples=SAMPLES, tolerances=tol, **fixture_args(name))


def _torch_name(mil_weight: str) -> str:
    return mil_weight.split("_weight")[0]


@pytest.mark.parametrize("precision,op_type,param,change", [
    ("palette4", "constexpr_lut_to_dense", "lut", lambda v: v[::-1]),      # a lookup table reversed
    ("w8", "constexpr_affine_dequantize", "scale", lambda v: -v),           # per-channel scales sign-flipped
])
def test_a_corrupted_package_fails_and_names_the_module(work, precision, op_type, param, change):
    name = "swiftformer_digits"
    report, out = exported(work, name, precision)
    good = out / report.artifacts["coreml"].path
    bad = work / f"corrupt-{precision}" / good.name
    bad.parent.mkdir()
    corrupt_package(good, bad, op_type, param, change)
    assert _parity(name, good).hop("coreml").status == "passed"
    hop = _parity(name, bad).hop("coreml")
    first = next(o for o in load_program(bad).ops if o.type == op_type)  # the op _corrupt changed
    assert hop.status == "failed" and hop.mode == "emulated", hop.reason
    assert hop.diverging_module and _torch_name(first.outputs[0][0]) == hop.diverging_module.replace(".", "_")


def test_a_corrupted_int8_scale_fails_and_names_the_module(work):
    name = "swiftformer_digits"
    report, out = exported(work, name, "int8")
    good = out / report.artifacts["onnx-int8"].path
    graph = onnx.load(str(good))
    inits = {i.name: i for i in graph.graph.initializer}
    consumers = {i: n for n in graph.graph.node for i in n.input}
    # the first int8 conv's weights (patch_embed.2: the stem before it stays float, qdq.IMAGE_CONV_RULE; every
    # later module sees its output)
    dq = next(n for n in graph.graph.node if n.op_type == "DequantizeLinear"
              and n.input[0] == "patch_embed.2.weight_quantized" and consumers[n.output[0]].op_type == "Conv")
    scale = inits[dq.input[1]]
    scale.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(scale), scale.name))
    bad = work / "corrupt-int8.onnx"
    onnx.save(graph, str(bad))
    hop = _parity(name, bad).hop("onnx-int8")
    assert hop.status == "failed" and hop.diverging_module == dq.input[0].removesuffix(".weight_quantized"), hop.reason


def test_tolerance_overrides_bite_both_ways(work):
    name = "swiftformer_digits"
    report, out = exported(work, name, "int8")
    art = out / report.artifacts["onnx-int8"].path
    assert _parity(name, art).hop("onnx-int8").status == "passed"
    strict = _parity(name, art, ["int8.cosine=0.99999"]).hop("onnx-int8")
    assert strict.status == "failed" and "cosine" in strict.reason and strict.tolerance.cosine == 0.99999
    assert tolerances(["palette.psnr_db=20", "w8a8.accuracy_drop=none"])["palette"].psnr_db == 20
    assert set(COMPRESSED_TOLERANCES) == {"int8", "w8", "palette", "w8a8"}


# ------------------------------------------------------------------------------------------------ labelled images

def _digits_folder(root: Path, per_class: int) -> tuple[Path, Path]:
    """Held-out digits as 32x32 PNGs (ink / 16 upsampled as the fixtures were trained) in ImageFolder layout, and a
    labels file (class names in index order)."""
    import torch
    import torch.nn.functional as F
    from PIL import Image
    from sklearn.datasets import load_digits

    images, labels = load_digits(return_X_y=True)
    _, held = tf.split(labels)
    folder = root / "digits"
    for c in range(10):
        (folder / f"d{c}").mkdir(parents=True)
        for i in [j for j in held if labels[j] == c][:per_class]:
            ink = torch.from_numpy(np.asarray(images[i], np.float32).reshape(1, 1, 8, 8) / 16.0)
            up = F.interpolate(ink, size=(32, 32), mode="bilinear", align_corners=False).clamp(0, 1)[0, 0].numpy()
            Image.fromarray(np.round(255 * up).astype(np.uint8)).convert("RGB").save(folder / f"d{c}" / f"{i:04d}.png")
    labels_file = root / "labels.txt"
    labels_file.write_text("\n".join(f"d{c}" for c in range(10)) + "\n")
    return folder, labels_file


def test_labelled_images_split_calibration_and_give_the_accuracy_delta(work):
    """A labelled folder: split deterministically (calibration never judged), the hop reports top-1 accuracy with
    its Wilson interval and the drop against float64, and a miscalibrated graph fails on that drop."""
    name = "swiftformer_digits"
    train, deploy = tf.deploy_form(name)
    mean, std = input_stats(train)
    folder, labels = _digits_folder(work / "labelled", 12)
    calib = calibrate.images_calibration(folder, 32, 32, mean, std, labels)
    assert calibrate.images_calibration(folder, 32, 32, mean, std, labels).ids == calib.ids
    pset = user_set(folder, 32, mean, std, labels_file=labels)
    judged = JudgedSamples.build(train, pset, calib.ids)
    assert len(calib.ids) == 32 and not set(judged.names) & set(calib.ids) and len(judged.x) == 120 - 32
    ratio = f"{(judged.truth.y64.argmax(1) == judged.truth.labels).mean():.3f}"
    print(f"float64 accuracy on the judged digits: {ratio}")

    graph = work / "labelled" / "base.onnx"
    onnx.save(tf.onnx_fp32(name), str(graph))
    onnx_t = get_target("onnx")
    tol = COMPRESSED_TOLERANCES["int8"]
    for calibration, ok in ((calib, True), (dataclasses.replace(calib, x=np.zeros_like(calib.x)), False)):
        folder_out = work / "labelled" / ("good" if ok else "blank")
        folder_out.mkdir()
        path, _ = write_qdq(graph, calibration, "onnxruntime", folder_out, name)
        hop = compressed_hop("onnx-int8", onnx_t, Artifact("onnx", path, "int8"), tol, judged, deploy, QUIET)
        user = hop.sets["user"]
        lo, hi = user["top1_accuracy_ci95"]
        assert lo <= user["top1_accuracy"] <= hi and user["labelled"] == len(judged.x)
        assert user["accuracy_drop"] == pytest.approx(user["reference_top1_accuracy"] - user["top1_accuracy"])
        if ok:
            assert hop.status == "passed", hop.reason
        else:  # blank calibration images collapse the activations' ranges: the drop (and the metrics) fail it
            assert hop.status == "failed" and "accuracy_drop" in hop.reason, hop.reason


# ------------------------------------------------------------------------------------------------ package

def test_package_records_the_compression_and_its_parity(work):
    """`vitedge package --precision w8a8` (no --ios: raised to 17): the manifest records the compression, the
    calibration and the coreml hop judged by the w8a8 profile; the golden vectors are natural photos that did not
    calibrate, and the bundle's package passes them."""
    import json
    import zipfile

    from vitedge.errors import VitedgeError
    from vitedge.exporter.packaging.package import package

    name = "swiftformer_digits"
    res = package(model_of(name), work / "bundle.zip", samples=SAMPLES, precision="w8a8", **fixture_args(name))
    assert res.exit_code == 0, [(h.hop, h.reason) for h in res.report.parity]
    with zipfile.ZipFile(res.path) as zf:
        m = json.loads(zf.read(f"{model_of(name)}/manifest.json"))
        golden = json.loads(zf.read(f"{model_of(name)}/golden/golden.json"))
    assert m["precision"] == "w8a8" and m["ios"] == 17 and "raised" in m["ios_raised"]
    comp = m["compression"]
    assert comp["kind"] == "w8a8" and {"quantize", "dequantize"} <= set(comp["compression_ops"])
    assert comp["bytes"]["weights_ratio"] > 1 and m["calibration"]["samples"] == calibrate.CALIB_DEFAULT
    hop = next(h for h in m["parity"] if h["hop"] == "coreml")
    assert hop["status"] == "passed" and hop["tolerance"]["profile"] == "w8a8" and hop["mode"] == "emulated"
    assert "natural" in golden["inputs"]["source"] and golden["verified"]["passed"]
    assert golden["tolerance"]["profile"] == "w8a8"
    with pytest.raises(VitedgeError, match="--precision"):
        package(model_of(name), work / "x.zip", precision="int8", **fixture_args(name))
    with pytest.raises(VitedgeError, match="iOS 17"):
        package(model_of(name), work / "y.zip", precision="w8a8", ios=16, **fixture_args(name))
    assert not (work / "x.zip").exists() and not (work / "y.zip").exists()
