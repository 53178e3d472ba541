"""Static int8 QDQ ONNX (targets/graph/qdq.py) on the trained reference models: the ops it writes, the float
islands it keeps, the samples it records, and accuracy against the held-out labels.

Graded by the product's own judge, as `vitedge export --precision int8` grades its int8 hop
(exporter.quantize.compressed.judge_compressed: the int8 profile with the one-sample resolution bounds and the compressed
rule, against the train-form in float64), on the 364 held-out digits with their labels (calibrated on 64
training digits): a correct graph passes, a graph calibrated on blank images fails.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vitedge.errors import VitedgeError
from vitedge.exporter.quantize.compressed import JudgedSamples, judge_compressed
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, ground_truth
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.targets.calibration import calibration_overlap, calibration_record
from vitedge.targets.graph import qdq
from vitedge.exporter.verdict import trained_reference as tf

NAMES = ("swiftformer_digits", "slab_deit_digits")
CALIB = 64
SIGMOID_COST = 1.5  # the sigmoid GELU's 1 - mean cosine over the exact GELU's, at most (int8 both)
_CACHE: dict = {}


def quantized(name: str) -> qdq.QdqModel:
    if name not in _CACHE:
        x, ids = tf.calibration_images(name, CALIB)
        _CACHE[name] = qdq.quantize_qdq(tf.onnx_fp32(name), x, calibration_ids=ids)
    return _CACHE[name]


def cosines(ref: np.ndarray, out: np.ndarray) -> np.ndarray:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return (ref * out).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(out, axis=1))


def judged(name: str) -> JudgedSamples:
    """The held-out digits with their labels and the train-form's float64 ground truth on them, once."""
    key = ("judged", name)
    if key not in _CACHE:
        x, y = tf.heldout(name)
        train, deploy = tf.deploy_form(name)
        truth = ground_truth(train, x, ("user",) * len(x), y)
        _CACHE[key] = JudgedSamples(train, x, truth, tuple(str(i) for i in range(len(x))), deploy)
    return _CACHE[key]


def product_verdict(name: str, model: onnx.ModelProto):
    """The int8 hop `vitedge export` would report for this graph on the held-out digits."""
    with OnnxRuntimeRunner(model, threads=1) as runner:
        return judge_compressed("onnx-int8", runner, judged(name), FLOAT64_TOLERANCES["int8"], "int8")


def mean_cosine_gap(name: str, model: onnx.ModelProto) -> float:
    """1 - mean cosine of the graph's logits against the float64 train-form's on the held-out digits."""
    j = judged(name)
    return 1.0 - float(cosines(j.truth.y64, tf.ort_logits(model, j.x)).mean())


def _consumers(model: onnx.ModelProto) -> dict[str, list]:
    out: dict = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def test_module_is_graph_level_only():
    tree = ast.parse(Path(qdq.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert "torch" not in imported


@pytest.mark.parametrize("name", NAMES)
def test_qdq_ops_sit_around_the_quantized_op_types_only(name):
    """Conv/Gemm/MatMul, and Add/Mul/Sigmoid where all inputs and the output are int8 (qdq.ELEMENTWISE_OP_TYPES)."""
    q = quantized(name)
    model, fp32 = q.model, tf.onnx_fp32(name)
    types = {n.op_type for n in model.graph.node}
    assert q.info["gelu"]["mode"] == "sigmoid" and q.info["gelu"]["as_sigmoid"] == q.info["gelu_fused"] > 0
    # each erf-GELU as x * sigmoid(1.702 x) (sigmoid_gelu): Sigmoid is new, Mul the fp32 graphs have already
    assert types - {n.op_type for n in fp32.graph.node} == {"QuantizeLinear", "DequantizeLinear", "Sigmoid"}
    assert not {t for t in types if t.startswith("QLinear") or t.endswith("Integer")}  # QDQ format, not QOperator
    qnodes = {n for names in qdq.quantized_nodes(model).values() for n in names}
    assert q.info["quantized"].get("Conv", 0) > 0 and sum(q.info["quantized"].values()) == len(qnodes)
    cons, prod = _consumers(model), {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear":
            assert {c.op_type for c in cons[n.output[0]]} == {"DequantizeLinear"}
            zp = numpy_helper.to_array(inits[n.input[2]])
            assert zp.dtype == np.uint8  # activations: uint8 (U8S8)
        if n.op_type != "DequantizeLinear":
            continue
        if n.input[0] in inits:  # a weight (int8, per output channel) or a bias (int32), read by an int8 node;
            users = cons[n.output[0]]  # a constant an int8 Add/Mul reads is quantized as an activation (uint8)
            assert all(u.name in qnodes for u in users)
            slot = list(users[0].input).index(n.output[0])
            expected = onnx.TensorProto.INT32 if slot == 2 else onnx.TensorProto.INT8
            if users[0].op_type in qdq.ELEMENTWISE_OP_TYPES:
                expected = onnx.TensorProto.UINT8
            assert inits[n.input[0]].data_type == expected
            if users[0].op_type == "Conv" and slot == 1:
                w = numpy_helper.to_array(inits[n.input[0]])
                assert numpy_helper.to_array(inits[n.input[1]]).shape == (w.shape[0],)
        else:  # an activation pair: the input or the output of a quantized node
            q_in = prod[n.input[0]].input[0]
            assert (any(u.name in qnodes for u in cons.get(n.output[0], []))
                    or (q_in in prod and prod[q_in].name in qnodes)), f"Q/DQ pair {n.name} touches no int8 node"


@pytest.mark.parametrize("name", NAMES)
def test_int8_graph_runs_every_gelu_in_int8_or_as_one_fused_kernel(name):
    """ONNX Runtime encoding: by default every GELU of the fp32 graph runs int8, as QLinearSigmoid + QLinearMul
    (x * sigmoid(1.702 x), the gain folded into the Sigmoid's input scale: no float Gelu, no Mul by 1.702 left);
    with gelu="exact" each runs as one fused float Gelu kernel. The TensorRT encoding keeps standard ONNX ops."""
    from vitedge.targets.graph.fusions import fused_op_counts

    fp32_gelus = fused_op_counts(tf.onnx_fp32(name)).get("Gelu", 0)
    q = quantized(name)
    assert fp32_gelus > 0 and q.info["gelu_fused"] == q.info["gelu"]["gain_folded"] == fp32_gelus
    ops = fused_op_counts(q.model)
    assert ops.get("QLinearSigmoid", 0) == fp32_gelus and ops.get("Gelu", 0) == 0, ops
    assert not [n for n in q.model.graph.node if n.name.endswith("_kx")]
    x, ids = tf.calibration_images(name, 8)
    exact = qdq.quantize_qdq(tf.onnx_fp32(name), x, calibration_ids=ids, gelu="exact")
    assert exact.info["gelu"]["as_sigmoid"] == 0 and fused_op_counts(exact.model).get("Gelu", 0) == fp32_gelus
    trt = qdq.quantize_qdq(tf.onnx_fp32(name), x, calibration_ids=ids, encoding="tensorrt")
    assert trt.info["gelu_fused"] == 0 and all(n.domain in ("", "ai.onnx") for n in trt.model.graph.node)
    with pytest.raises(VitedgeError, match="GELU mode"):
        qdq.quantize_qdq(tf.onnx_fp32(name), x, encoding="tensorrt", gelu="sigmoid")


@pytest.mark.parametrize("name", NAMES)
def test_float_islands_stay_float(name):
    q = quantized(name)
    islands = q.info["float_islands"]["nodes"]
    assert islands and set(q.info["float_islands"]["by_rule"]) == set(islands.values())
    assert all(r["why"] for r in q.info["float_islands"]["by_rule"].values())
    model = q.model
    names = {n.name for n in model.graph.node}
    assert set(islands) <= names  # every island node is still there, under its name
    qnodes = {n for v in qdq.quantized_nodes(model).values() for n in v}
    assert not set(islands) & qnodes
    # no Q/DQ pair between two island nodes: an island computes in float from its entry to its rescale
    prod, cons = {o: n for n in model.graph.node for o in n.output}, _consumers(model)
    for n in model.graph.node:
        if n.op_type == "DequantizeLinear" and n.input[0] in prod:
            src = prod[prod[n.input[0]].input[0]] if prod[n.input[0]].input[0] in prod else None
            inside = [c.name for c in cons.get(n.output[0], []) if c.name in islands]
            assert not (src is not None and src.name in islands and inside), f"Q/DQ inside island at {n.name}"
    if name.startswith("slab"):
        # SLA: the k^T v, q (k^T v) and q . sum k MatMuls (two activations each) are islands, all 3 per block
        excluded = q.info["float_islands"]["excluded_quantizable"]
        blocks = tf.manifest()["models"][name]["overrides"]["depth"]
        ops = {n.name: n.op_type for n in model.graph.node}
        assert len([e for e in excluded if "attn" in e and ops[e] == "MatMul"]) == 3 * blocks


@pytest.mark.parametrize("name", NAMES)
def test_the_conv_reading_the_image_stays_float_and_only_it(name):
    """IMAGE_CONV_RULE: each group-1 Conv whose weight reads <= 4 channels (the stem) stays float, with its reason;
    every other Conv outside the policy's islands (those reading feature maps, depthwise ones too) runs int8."""
    q = quantized(name)
    fp32 = tf.onnx_fp32(name)
    inits = {i.name: i for i in fp32.graph.initializer}
    stems = [n.name for n in fp32.graph.node if n.op_type == "Conv" and inits[n.input[1]].dims[1] <= 4
             and next((a.i for a in n.attribute if a.name == "group"), 1) == 1]
    islands = q.info["float_islands"]["nodes"]
    assert stems and all(islands.get(s) == qdq.IMAGE_CONV_RULE for s in stems), (stems, islands)
    assert "image" in q.info["float_islands"]["by_rule"][qdq.IMAGE_CONV_RULE]["why"]
    assert [n for n, r in islands.items() if r == qdq.IMAGE_CONV_RULE] == stems
    qconv = set(qdq.quantized_nodes(q.model)["Conv"])
    assert not qconv & set(stems)
    convs = [n.name for n in q.model.graph.node if n.op_type == "Conv" and n.name not in islands]
    assert convs and set(convs) <= qconv


@pytest.mark.parametrize("name", NAMES)
def test_the_int8_graph_passes_the_products_judge_on_the_held_out_digits(name):
    hop = product_verdict(name, quantized(name).model)
    (d,) = hop.sets.values()
    print(f"{name} int8 QDQ: top-1 {d['correct']}/{d['labelled']} vs float64 {d['reference_correct']}/"
          f"{d['labelled']}; agreement {hop.metrics.top1_agreement:.4f}, cosine min {hop.metrics.cosine:.4f}, "
          f"compressed rule {d['noise_ratio']:.3g}")
    assert hop.status == "passed", hop.reason
    assert hop.samples == 364 and d["labelled"] == 364 and d["noise_ratio"] <= 1  # every image, every gate


def test_calibration_on_blank_images_fails_the_products_judge():
    name = NAMES[0]
    calib, _ = tf.calibration_images(name, 8)
    bad = qdq.quantize_qdq(tf.onnx_fp32(name), np.zeros_like(calib))
    hop = product_verdict(name, bad.model)
    assert hop.status == "failed" and "top1_agreement" in hop.reason and "accuracy_drop" in hop.reason, hop.reason


def test_calibration_on_one_image_fails_beyond_the_fixed_bounds():
    """A graph calibrated on a single digit: its typical error is many times its emulation's (the median rule), not
    only below the fixed cosine / PSNR, which a model whose own emulation misses them may loosen."""
    name = NAMES[0]
    calib, _ = tf.calibration_images(name, 1)
    hop = product_verdict(name, qdq.quantize_qdq(tf.onnx_fp32(name), calib).model)
    assert hop.status == "failed" and "compressed median ratio" in hop.reason, hop.reason
    assert "metric_bounds" not in hop.sets["user"]  # this model's emulation meets the fixed bounds: they stand


@pytest.mark.parametrize("name,plant", [("swiftformer_digits", "sign_flip"), ("swiftformer_digits", "x1.1"),
                                        ("slab_deit_digits", "x10"), ("slab_deit_digits", "zero_layer")])
def test_planted_errors_in_the_saved_int8_scales_fail_the_products_hop(name, plant, tmp_path):
    """One output channel's weight scale (or a whole layer's) changed in the saved int8 graph fails the hop
    `vitedge export` / `vitedge parity` reports (compressed_hop: outputs, then the stored weights), naming it."""
    from vitedge.exporter.quantize.compressed import compressed_hop
    from vitedge.exporter.core.progress import QUIET
    from vitedge.exporter.verdict.weight_check import _key
    from vitedge.targets import get_target
    from vitedge.targets.base import Artifact
    from vitedge.targets.plants import plant_int8_scale

    good, bad = tmp_path / "good.int8.onnx", tmp_path / "planted.int8.onnx"
    onnx.save(quantized(name).model, str(good))
    weight = plant_int8_scale(good, bad, plant, 0.5)
    j = judged(name)

    def hop(path):
        return compressed_hop("onnx-int8", get_target("onnx"), Artifact(name, path, "int8"),
                              FLOAT64_TOLERANCES["int8"], j, j.deploy, QUIET)

    assert hop(good).status == "passed"
    h = hop(bad)
    assert h.status == "failed" and h.weights["status"] == "failed", (weight, h.reason)
    assert _key(h.weights["worst"]["weight"]) == _key(weight), h.weights


def test_calibration_samples_are_recorded_and_kept_apart():
    name = NAMES[0]
    q = quantized(name)
    calib, ids = tf.calibration_images(name, CALIB)
    rec = q.info["calibration"]
    assert rec["samples"] == CALIB and rec["ids"] == [str(i) for i in ids] and rec["method"] == qdq.CALIBRATION
    assert rec["sha256"] == calibration_record(calib, ids, "minmax")["sha256"]
    _, held = tf.split()
    assert calibration_overlap(q.info, held) == []          # the evaluation never saw a calibration image
    assert calibration_overlap(q.info, ids[:3] + [held[0]]) == sorted(str(i) for i in ids[:3])
    meta = {p.key: p.value for p in q.model.metadata_props}
    assert "vitedge.int8" in meta


def test_bad_calibration_is_a_clear_error():
    fp32 = tf.onnx_fp32(NAMES[0])
    with pytest.raises(VitedgeError, match="at least 1"):
        qdq.quantize_qdq(fp32, np.zeros((0, 3, 32, 32), np.float32))
    with pytest.raises(VitedgeError, match="shape"):
        qdq.quantize_qdq(fp32, np.zeros((2, 3, 64, 64), np.float32))
    with pytest.raises(VitedgeError, match="method"):
        qdq.quantize_qdq(fp32, np.zeros((2, 3, 32, 32), np.float32), method="mse")


@pytest.mark.parametrize("name", NAMES)
def test_the_sigmoid_gelu_costs_no_accuracy_against_the_exact_one_and_a_missing_gain_would(name):
    """x * sigmoid(1.702 x) in int8 stays as close to fp32 as the int8 graph with the exact float GELU (1 - mean
    cosine within SIGMOID_COST x; measured 1.06-1.1x), while the same graph with the Sigmoid's input scale left at
    x's (x * sigmoid(x), a SiLU: the fold's gain missing) is 3x farther or more (measured 16x on SwiftFormer,
    whose accuracy gates alone would not see it: top-1 agreement 1.0, mean cosine 0.998)."""
    from vitedge.targets.graph.sigmoid_gelu import K

    x, ids = tf.calibration_images(name, CALIB)
    exact = qdq.quantize_qdq(tf.onnx_fp32(name), x, calibration_ids=ids, gelu="exact").model
    shipped = quantized(name).model
    broken = onnx.ModelProto()
    broken.CopyFrom(shipped)
    scales = [i for i in broken.graph.initializer if i.name.endswith("_sig_input_scale")]
    assert len(scales) == quantized(name).info["gelu"]["gain_folded"] > 0
    for init in scales:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) / np.float32(K), init.name))
    gap = {k: mean_cosine_gap(name, m) for k, m in (("exact", exact), ("shipped", shipped), ("broken", broken))}
    print(name, {k: f"{v:.2e}" for k, v in gap.items()})
    assert gap["shipped"] <= SIGMOID_COST * gap["exact"], gap
    assert gap["broken"] >= 3 * SIGMOID_COST * gap["exact"], gap


@pytest.mark.parametrize("name", NAMES)
def test_a_planted_bias_scale_in_the_saved_int8_graph_fails_the_products_hop(name, tmp_path):
    """Biases are weights: the head's int32 bias scale x10 on one class, in the saved int8 graph. ONNX Runtime's
    fused kernels ignore a bias's DequantizeLinear scale (the outputs do not move), another runtime reads it: the
    weights check judges the bias's stored value at the step its layer's input and weight scales give it, and fails
    the hop, naming the bias."""
    from vitedge.exporter.quantize.compressed import compressed_hop
    from vitedge.exporter.core.progress import QUIET
    from vitedge.exporter.verdict.weight_check import _key
    from vitedge.targets import get_target
    from vitedge.targets.base import Artifact
    from vitedge.targets.plants import plant_int8_bias_scale

    good, bad = tmp_path / "good.int8.onnx", tmp_path / "planted.int8.onnx"
    onnx.save(quantized(name).model, str(good))
    plant_int8_bias_scale(good, bad, "head.bias", "x10")
    j = judged(name)

    def hop(path):
        return compressed_hop("onnx-int8", get_target("onnx"), Artifact(name, path, "int8"),
                              FLOAT64_TOLERANCES["int8"], j, j.deploy, QUIET)

    ok = hop(good)
    assert ok.status == "passed" and ok.weights["status"] == "passed"
    assert ok.weights["checked"] > len([p for p in j.deploy.parameters() if p.dim() >= 2])  # the biases are judged
    h = hop(bad)
    assert h.status == "failed" and h.weights["status"] == "failed", h.reason
    assert _key(h.weights["worst"]["weight"]) == _key("head.bias"), h.weights
