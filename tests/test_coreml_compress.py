"""CoreML compression (targets/coreml/compress.py) on the trained reference models, run by the MIL interpreter.

Packages are converted once per module (fp16 with the precision policy's fp32 islands, batch 52: the 364 held-out
images in 7 runs) and compressed once per kind. Gates against the fp32 train-form on the held-out digits, from
measurements on these fixtures (docs/quantization_spike.md, iOS 18; SwiftFormer / SLAB-DeiT):

| kind | accuracy | top-1 agreement | mean cosine (measured) | gate |
|---|---|---|---|---|
| w8 | within 0.5 pt (the issue's target) | >= 0.99 | 1.00000 / 0.99997 | >= 0.999 |
| w8a8 | within 0.5 pt (the issue's target) | >= 0.99 | 0.99988 / 0.99954 | >= 0.995 |
| palette6 | within 2 pt (the issue only reports it) | >= 0.99 | - / 0.99974 | >= 0.995 |
| palette4 | within 2 pt (the issue only reports it) | >= 0.99 | 0.99899 / 0.99411 | >= 0.99 |

Measured accuracy and top-1 agreement: every kind within one image of fp32 and >= 0.997 agreement.

The corruption tests show the other side: a reversed lookup table or a sign-flipped scale of one weight, written
into the saved package's weight.bin, fails these gates.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from vitedge.errors import VitedgeError
from vitedge.targets.coreml import compress as cc
from vitedge.targets.base import LowerSpec
from vitedge.targets.calibration import calibration_overlap
from vitedge.targets.coreml import CoreMLTarget, EmulatedCoreMLRunner
from vitedge.targets.coreml.mil_interpreter import load_program
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import corrupt_package

BATCH = 52
CALIB = 52
GATES = {  # kind: (max accuracy drop, min top-1 agreement, min mean cosine)
    "w8": (0.005, 0.99, 0.999), "w8a8": (0.005, 0.99, 0.995),
    "palette6": (0.02, 0.99, 0.995), "palette4": (0.02, 0.99, 0.99),
}
OPS = {  # (ios, kind): the compression ops the program must hold
    (16, "w8"): {"constexpr_affine_dequantize"}, (16, "palette4"): {"constexpr_lut_to_dense"},
    (18, "w8"): {"constexpr_blockwise_shift_scale"}, (18, "palette4"): {"constexpr_lut_to_dense"},
    (18, "palette6"): {"constexpr_lut_to_dense"},
    (18, "w8a8"): {"constexpr_blockwise_shift_scale", "quantize", "dequantize"},
}
CASES = [("swiftformer_digits", 16, "w8"), ("swiftformer_digits", 16, "palette4"),
         ("swiftformer_digits", 18, "w8"), ("swiftformer_digits", 18, "palette4"),
         ("swiftformer_digits", 18, "w8a8"),
         ("slab_deit_digits", 18, "w8"), ("slab_deit_digits", 18, "palette4"),
         ("slab_deit_digits", 18, "palette6"), ("slab_deit_digits", 18, "w8a8")]
_CACHE: dict = {}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("compress")


def source(workdir: Path, name: str, ios: int) -> Path:
    key = ("src", name, ios)
    if key not in _CACHE:
        _, deploy = tf.deploy_form(name)
        out = workdir / f"{name}-ios{ios}"
        out.mkdir()
        spec = LowerSpec(name=name, imgsz=tf.manifest()["models"][name]["imgsz"], batch=BATCH, precision="fp16",
                         out_dir=out, onnx_path=None, options={"ios": ios})
        _CACHE[key] = CoreMLTarget().lower(deploy, spec).path
    return _CACHE[key]


def compressed(workdir: Path, name: str, ios: int, kind: str) -> cc.Compressed:
    key = ("cmp", name, ios, kind)
    if key not in _CACHE:
        calib, ids = tf.calibration_images(name, CALIB) if kind == "w8a8" else (None, None)
        _CACHE[key] = cc.compress_package(source(workdir, name, ios), workdir / f"{name}-ios{ios}-{kind}.mlpackage",
                                          kind, calibration=calib, calibration_ids=ids)
    return _CACHE[key]


def emulated(path: Path, name: str) -> np.ndarray:
    key = ("emu", str(path))
    if key not in _CACHE:
        x, _ = tf.heldout(name)
        _CACHE[key] = EmulatedCoreMLRunner(path, max_samples=None).run(x)
    return _CACHE[key]


def verdict(name: str, kind: str, out: np.ndarray) -> dict:
    x, y = tf.heldout(name)
    train, _ = tf.deploy_form(name)
    ref = tf.torch_logits(train, x)
    r, o = ref.astype(np.float64), out.astype(np.float64)
    cos = (r * o).sum(1) / (np.linalg.norm(r, axis=1) * np.linalg.norm(o, axis=1))
    acc, acc32 = tf.accuracy(out, y), tf.accuracy(ref, y)
    drop, agree, mean_cos = GATES[kind]
    v = {"acc": acc, "acc32": acc32, "agreement": float((ref.argmax(1) == out.argmax(1)).mean()),
         "cos_mean": float(np.nan_to_num(cos, nan=-1).mean()), "cos_min": float(np.nan_to_num(cos, nan=-1).min())}
    v["ok"] = acc["top1"] >= acc32["top1"] - drop and v["agreement"] >= agree and v["cos_mean"] >= mean_cos
    return v


# ------------------------------------------------------------------------------------------------ artifacts

@pytest.mark.parametrize("name,ios,kind", CASES)
def test_compressed_program_ops_islands_and_record(workdir, name, ios, kind):
    c = compressed(workdir, name, ios, kind)
    program = load_program(c.path)
    assert program.unknown_ops() == []                   # the emulated hop can run every op
    assert set(c.info["compression_ops"]) == OPS[(ios, kind)]
    assert c.info["weights_compressed"] > 0 and c.info["ios"] == ios
    kept = c.info["weights_kept_float"].values()
    assert kept and all("< weight_threshold" in r for r in kept)  # only small tensors stay fp16 (no silent skips)
    assert c.info["fp32_ops"] == c.info["source_fp32_ops"]  # the policy's fp32 islands survive compression
    if kind.startswith("palette") and ios == 16:          # iOS 16 form: one LUT, bit-packed indices, a shape
        op = next(o for o in program.ops if o.type == "constexpr_lut_to_dense")
        assert {"indices", "lut", "shape"} <= set(op.inputs)
    if kind.startswith("palette") and ios >= 18:          # iOS 18 form: grouped LUTs [groups..., palette, 1]
        assert set(c.info["lut_group_sizes"]) <= {str(2 ** k) for k in range(5)}
        op = next(o for o in program.ops if o.type == "constexpr_lut_to_dense")
        lut = program.consts.get(op.inputs["lut"][1]) if op.inputs["lut"][0] == "var" else op.inputs["lut"][1]
        assert np.asarray(lut).shape[-2] == 2 ** cc.PALETTE_BITS[kind]
    if kind == "w8a8":
        dtypes = {n: dt for o in program.ops for n, dt in o.outputs}
        qs = [o for o in program.ops if o.type == "quantize"]
        assert qs and all(dtypes.get(o.inputs["input"][1], "fp16") == "fp16" for o in qs)  # never inside an fp32 island
        # adds are not activation-quantized (ACTIVATION_FLOAT_OPS), so coremltools' scale normalization of
        # quantized adds never rescales an input to scale 1 (that overflowed fp16 residuals, see the spike)
        scales = [np.asarray(program.consts[o.inputs["scale"][1]] if o.inputs["scale"][0] == "var"
                             else o.inputs["scale"][1]) for o in program.ops if o.type == "dequantize"]
        assert scales and not any(np.all(s == 1.0) for s in scales)
        assert c.info["calibration"]["samples"] == CALIB
    meta = dict(program.spec.description.metadata.userDefined)
    assert '"kind": "%s"' % kind in meta["compression"] and meta["model"] == name  # source metadata kept


@pytest.mark.parametrize("name,ios,kind", CASES)
def test_emulated_accuracy_close_to_fp32(workdir, name, ios, kind):
    c = compressed(workdir, name, ios, kind)
    v = verdict(name, kind, emulated(c.path, name))
    print(f"{name} iOS{ios} {kind}: {tf.describe(v['acc'])} vs fp32 {tf.describe(v['acc32'])}; agreement "
          f"{v['agreement']:.4f}, cosine mean {v['cos_mean']:.5f} min {v['cos_min']:.4f}; weights "
          f"{c.info['bytes']['source_weights']} -> {c.info['bytes']['weights']} bytes")
    assert v["ok"], v


def test_w8a8_calibration_is_recorded_kept_apart_and_uses_every_sample(workdir):
    name = "swiftformer_digits"
    c = compressed(workdir, name, 18, "w8a8")
    _, ids = tf.calibration_images(name, CALIB)
    _, held = tf.split()
    assert c.info["calibration"]["ids"] == [str(i) for i in ids] and calibration_overlap(c.info, held) == []
    # ranges are the min/max over all samples (coremltools 9's own calibration keeps the last sample's only)
    calib, _ = tf.calibration_images(name, 2 * BATCH)
    src = source(workdir, name, 18)
    both = cc.activation_ranges(src, [calib[:BATCH], calib[BATCH:]])
    first = cc.activation_ranges(src, [calib[:BATCH]])
    last = cc.activation_ranges(src, [calib[BATCH:]])
    for t in both:
        assert both[t]["rmin"] == min(first[t]["rmin"], last[t]["rmin"])
        assert both[t]["rmax"] == max(first[t]["rmax"], last[t]["rmax"])
    assert any(both[t]["rmax"] > last[t]["rmax"] for t in both)  # the first batch matters


# ------------------------------------------------------------------------------------------------ corruption

@pytest.mark.parametrize("ios,kind,op_type,param,change", [
    (18, "palette4", "constexpr_lut_to_dense", "lut", lambda v: v[::-1]),          # LUT entries reversed
    (16, "palette4", "constexpr_lut_to_dense", "lut", lambda v: v[::-1]),
    (18, "w8", "constexpr_blockwise_shift_scale", "scale", lambda v: -v),          # scales sign-flipped
    (16, "w8", "constexpr_affine_dequantize", "scale", lambda v: -v),
])
def test_corrupted_lut_or_scale_in_the_package_fails(workdir, ios, kind, op_type, param, change):
    name = "swiftformer_digits"
    good = compressed(workdir, name, ios, kind)
    bad = workdir / f"corrupt-ios{ios}-{kind}.mlpackage"
    corrupt_package(good.path, bad, op_type, param, change)
    clean, broken = emulated(good.path, name), emulated(bad, name)
    assert not np.array_equal(clean, broken)  # the emulator reads the compressed bytes, not a cached weight
    v = verdict(name, kind, broken)
    assert verdict(name, kind, clean)["ok"] and not v["ok"], v


PLANTED = [(16, "w8", "sign_flip"), (16, "w8", "x1.1"), (18, "w8", "x10"), (18, "w8a8", "zero_layer"),
           (18, "w8a8", "sign_flip"), (18, "w8a8", "x1.1"), (16, "palette4", "sign_flip"), (18, "palette4", "x10")]


def product_hop(workdir: Path, name: str, kind: str, path: Path):
    """The compressed hop `vitedge export` / `vitedge parity` would report for the package at `path` (the product's
    compressed_hop: the emulated CoreML runner on the held-out digits, the kind's profile and compressed rule, then
    the weights check)."""
    from vitedge.exporter.quantize.compressed import JudgedSamples, compressed_hop
    from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, ground_truth, profile_for
    from vitedge.exporter.core.progress import QUIET
    from vitedge.targets.base import Artifact

    if ("judged", name) not in _CACHE:
        x, y = tf.heldout(name)
        train, deploy = tf.deploy_form(name)
        _CACHE[("judged", name)] = JudgedSamples(train, x, ground_truth(train, x, ("user",) * len(x), y),
                                          tuple(map(str, range(len(x)))), deploy)
    judged = _CACHE[("judged", name)]
    return compressed_hop("coreml", CoreMLTarget(), Artifact(name, path, kind), FLOAT64_TOLERANCES[profile_for(kind)],
                          judged, judged.deploy, QUIET)


@pytest.mark.parametrize("ios,kind,plant", PLANTED)
def test_planted_channel_errors_in_the_saved_package_fail_the_products_hop(workdir, ios, kind, plant):
    """A channel's scale (w8, w8a8) or a lookup table (palette: the whole tensor on iOS 16, 16 channels on iOS 18)
    changed in weight.bin fails the product's own compressed hop; the correct package passes it."""
    from vitedge.targets.plants import plant_package_compression

    name = "swiftformer_digits"
    good = compressed(workdir, name, ios, kind)
    assert product_hop(workdir, name, kind, good.path).status == "passed"
    bad = workdir / f"planted-ios{ios}-{kind}-{plant}.mlpackage"
    weight = plant_package_compression(good.path, bad, plant, 0.5)
    hop = product_hop(workdir, name, kind, bad)
    assert hop.status == "failed", (weight, hop.reason)
    assert hop.weights["status"] == "failed" and _key(hop.weights["worst"]["weight"]) == _key(weight), hop.weights


def _key(name: str) -> str:
    from vitedge.exporter.verdict.weight_check import _key as key

    return key(name)


# ------------------------------------------------------------------------------------------------ requests, sizes

def test_bad_requests_are_clear_errors(workdir):
    src16 = source(workdir, "swiftformer_digits", 16)
    calib, _ = tf.calibration_images("swiftformer_digits", 4)
    with pytest.raises(VitedgeError, match="iOS 17"):
        cc.compress_package(src16, workdir / "x.mlpackage", "w8a8", calibration=calib)
    with pytest.raises(VitedgeError, match="calibration"):
        cc.compress_package(src16, workdir / "x.mlpackage", "w8", calibration=calib)
    with pytest.raises(VitedgeError, match="calibration"):
        cc.compress_package(source(workdir, "swiftformer_digits", 18), workdir / "x.mlpackage", "w8a8")
    with pytest.raises(VitedgeError, match="one of"):
        cc.compress_package(src16, workdir / "x.mlpackage", "int8")
    with pytest.raises(VitedgeError, match="already exists"):
        cc.compress_package(src16, src16, "w8")
    assert not (workdir / "x.mlpackage").exists()


def test_palettization_without_scikit_learn_names_the_extra(workdir, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn.cluster` raises ImportError
    monkeypatch.setitem(sys.modules, "sklearn.cluster", None)
    with pytest.raises(VitedgeError, match=r"scikit-learn .*vitedge\[compress\]"):
        cc.compress_package(source(workdir, "swiftformer_digits", 16), workdir / "y.mlpackage", "palette4")
    assert not (workdir / "y.mlpackage").exists()
    cc.require_kmeans("w8")  # weight-only linear quantization needs no k-means


def test_sizes_where_weights_dominate(tmp_path):
    """SwiftFormer-L3's widths (64/128/320/512, one block per stage: 8.4 M parameters, demo weights; the size does
    not depend on the values): the issue's targets w8 >= 1.8x and palette4 >= 3.5x smaller than fp16. (The trained
    fixtures are too small: per-channel scales, LUTs and fp16 weights under the 2048-element threshold weigh more.)"""
    from vitedge import create_model, reparameterize

    model = create_model("swiftformer_l3", layers=[1, 1, 1, 1]).eval()
    spec = LowerSpec(name="l3w", imgsz=32, batch=1, precision="fp16", out_dir=tmp_path, onnx_path=None,
                     options={"ios": 16})
    src = CoreMLTarget().lower(reparameterize(model, imgsz=32), spec).path
    ratios = {k: cc.compress_package(src, tmp_path / f"{k}.mlpackage", k).info["bytes"]["package_ratio"]
              for k in ("w8", "palette4")}
    print(f"L3-width package size ratios vs fp16: {ratios}")
    assert ratios["w8"] >= 1.8 and ratios["palette4"] >= 3.5
    assert math.isfinite(ratios["w8"])


def test_sima_packages_compress_where_coremltools_weights_listing_raises(tmp_path):
    """A SimA program feeds constants into ops that take a list of inputs (concat); coremltools'
    get_weights_metadata raises on them ('list' object has no attribute 'val'), which made every compressed kind of
    SimA fail to build. The weights are listed from the decoded program instead (compress.float_weights); each kind
    builds and compresses every conv / linear weight (iOS 18's per-group palettes read the same listing)."""
    from vitedge import create_model, reparameterize

    model = create_model("sima_nano_12_p16", depth=2).eval()
    spec = LowerSpec(name="sima", imgsz=64, batch=1, precision="fp16", out_dir=tmp_path, onnx_path=None,
                     options={"ios": 18})
    src = CoreMLTarget().lower(reparameterize(model, imgsz=64), spec).path
    listed = cc.float_weights(load_program(src), cc.WEIGHT_THRESHOLD)
    assert listed and all(int(np.prod(s)) >= cc.WEIGHT_THRESHOLD for s in listed.values())
    info = cc.compress_package(src, tmp_path / "palette6.mlpackage", "palette6").info
    left = {n for n, why in info["weights_kept_float"].items() if "left it" in why}
    # the positional table is added to the tokens, not a conv / linear weight: coremltools keeps it fp16
    assert left == {"pos_embed_to_fp16"}, left
    assert info["weights_compressed"] == len(listed) - 1 and info["lut_group_sizes"]


@pytest.mark.parametrize("ios,kind", [(18, "w8"), (18, "w8a8")])
def test_a_planted_bias_in_the_saved_package_fails_the_weights_check(workdir, ios, kind):
    """Biases are weights: a mid-network bias (kept float16, below the compression threshold) sign-flipped on one
    channel in weight.bin fails the product's weights check, which names it; the correct package's biases pass."""
    from vitedge.targets.plants import plant_package_bias

    name = "swiftformer_digits"
    _, deploy = tf.deploy_form(name)
    biases = [n for n, p in deploy.named_parameters()  # live ones: the trained model has near-dead biases of 3e-7
              if n.endswith(".bias") and p.dim() == 1 and p.shape[0] > 1 and p.abs().median() > 1e-3]
    bias = biases[len(biases) // 2]
    good = compressed(workdir, name, ios, kind)
    ok = product_hop(workdir, name, kind, good.path)
    assert ok.status == "passed" and ok.weights["status"] == "passed"
    bad = workdir / f"planted-bias-ios{ios}-{kind}.mlpackage"
    plant_package_bias(good.path, bad, bias, "sign_flip")
    hop = product_hop(workdir, name, kind, bad)
    assert hop.status == "failed" and hop.weights["status"] == "failed", (bias, hop.weights)
    assert _key(hop.weights["worst"]["weight"]) == _key(bias), hop.weights
