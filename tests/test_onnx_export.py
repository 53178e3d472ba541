"""ONNX export of every family: ORT vs train-form within the fp32 tolerance, report.json checked against
independently recomputed facts (sha256, size, node counts, attention order from the model itself),
metadata_props, zero normalization nodes for SwiftFormer / SLAB, and the dynamic batch axis."""
from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnx import numpy_helper

from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.verdict.localize import localize_onnx
from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.flow.pipeline import export
from vitedge.exporter.core.report import Report
from vitedge.models import create_model, make_trained_like
from vitedge.models.checkpoints import load_checkpoint

from vitedge.models.reduced import reduced
from vitedge.tests.conftest import golden_path, load_golden

# Reduced-size configs (the golden fixtures' shapes) at the default input size, plus a second size where the
# family allows one: SwiftFormer is fully convolutional; SimA at 80 px has N=25 < head_dim 32, which flips
# the attention order to qk_first (kv_first at 224, N=196).
SWIFT = reduced("swiftformer")
DEIT = reduced("slab_deit")
SIMA = reduced("sima")
SWIN = reduced("slab_swin")
# name, overrides (or "golden:<fixture>" for its overrides), imgsz, checkpoint (None: trained-like weights)
CASES = {
    "swiftformer-224": ("swiftformer_xs", SWIFT, 224, None),
    "swiftformer-64": ("swiftformer_xs", SWIFT, 64, None),
    # through --checkpoint: the official fixture's weights in their official layout (fails without shared/golden)
    "swiftformer-64-checkpoint": ("swiftformer_xs", "golden:swiftformer_tiny", 64, "swiftformer_tiny.pth"),
    "slab_deit-224": ("slab_deit_tiny", DEIT, 224, None),
    "slab_swin-224": ("slab_swin_tiny", SWIN, 224, None),
    "sima-224": ("sima_nano_12_p16", SIMA, 224, None),
    "sima-80": ("sima_nano_12_p16", SIMA, 80, None),
}
SAMPLES = 6
NORM_OPS = {"BatchNormalization", "LayerNormalization", "InstanceNormalization"}


def _overrides(spec):
    return load_golden(spec.split(":", 1)[1] + "_io.pt")["overrides"] if isinstance(spec, str) else spec


def _train_form(name, overrides, ckpt):
    model = create_model(name, **overrides)
    if ckpt:
        load_checkpoint(model, golden_path(ckpt))
    else:
        make_trained_like(model, 0)
    return model.eval()


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    name, spec, imgsz, ckpt = CASES[request.param]
    overrides = _overrides(spec)
    out = tmp_path_factory.mktemp(request.param) / "run"
    report = export(name, "onnx", imgsz=imgsz, out=out, samples=SAMPLES, overrides=overrides,
                    checkpoint=golden_path(ckpt) if ckpt else None)
    return request.param, name, overrides, imgsz, ckpt, out, report


def test_exit_code_and_every_hop_passed(exported):
    case, *_, out, report = exported
    assert report.exit_code == 0, [(h.hop, h.status, h.reason) for h in report.parity]
    assert [h.hop for h in report.parity] == ["deploy-form", "onnx", "onnx-simplified"]
    assert all(h.status == "passed" and h.samples == SAMPLES for h in report.parity)
    assert [h.mode for h in report.parity] == ["reference", "device", "device"]
    assert report.reparam.equivalence["passed"]
    assert sorted(p.name for p in out.iterdir()) == sorted([".vitedge-files.json", "report.json", f"{report.model}.onnx"])


def test_ort_matches_train_form_within_fp32_tolerance(exported):
    # Recomputed here, on inputs the pipeline did not use: train-form in PyTorch vs the artifact in ORT.
    _, name, overrides, imgsz, ckpt, out, report = exported
    model = _train_form(name, overrides, ckpt)
    x = parity_inputs(4, imgsz, seed=99)
    with torch.no_grad():
        ref = model(x).double().numpy()
    sess = ort.InferenceSession(str(out / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    y = np.concatenate([sess.run(["logits"], {"image": x[i:i + 1].numpy()})[0] for i in range(len(x))]).astype(float)
    assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()
    cos = (y * ref).sum(1) / np.linalg.norm(y, axis=1) / np.linalg.norm(ref, axis=1)
    assert cos.min() >= 0.99999


def test_report_json_is_truthful(exported):
    _, name, overrides, imgsz, ckpt, out, report = exported
    data = json.loads((out / "report.json").read_text())
    assert Report.from_dict(data).to_dict() == data  # the schema round-trips
    for key in ("model", "imgsz", "batch", "weights", "checkpoint_sha256", "reparam", "artifacts", "parity", "versions"):
        assert key in data
    assert (data["model"], data["imgsz"], data["batch"]) == (name, imgsz, 1)
    path = out / f"{name}.onnx"
    art = data["artifacts"]["onnx"]
    assert art["path"] == path.name and art["precision"] == "fp32"
    assert art["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert art["bytes"] == path.stat().st_size
    assert art["nodes"] == dict(Counter(n.op_type for n in onnx.load(str(path)).graph.node))
    if ckpt:
        assert data["weights"] == "checkpoint"
        assert data["checkpoint_sha256"] == hashlib.sha256(golden_path(ckpt).read_bytes()).hexdigest()
    else:
        assert (data["weights"], data["checkpoint_sha256"]) == ("untrained", None)
    for hop in data["parity"]:
        assert set(hop) >= {"hop", "backend", "status", "mode", "reason", "samples", "metrics", "tolerance",
                            "diverging_module"}
        assert set(hop["metrics"]) >= {"max_abs", "max_rel", "cosine", "psnr_db", "top1_agreement", "top5_agreement"}
        # the fp32 default: the noise rule against float64 ground truth, per input set
        assert hop["tolerance"]["noise_floor"] is not None and hop["tolerance"]["noise_k"] is not None
        assert hop["tolerance"]["max_rel"] is None and hop["tolerance"]["cosine"] is None
        assert set(hop["sets"]) == {"natural", "stress"} and all(s["noise_ratio"] <= 1 for s in hop["sets"].values())
        assert hop["metrics"]["max_rel"] <= 1e-4
    assert set(data["reference"]["sets"]) == {"natural", "stress"} and data["reference"]["float32_threads"] == 2
    assert data["inputs"].startswith("vitedge.exporter.verdict.inputs.parity_set(") and data["samples"] == report.samples
    assert data["versions"]["torch"] == torch.__version__ and data["versions"]["onnx"] == onnx.__version__


def test_attention_order_matches_the_model(exported):
    # Each SLA/SimA block's order, asked from the model itself for the token count it really sees.
    _, name, overrides, imgsz, ckpt, out, report = exported
    model = _train_form(name, overrides, ckpt)
    seen = {}

    def ask(module, args, path):
        seen[path] = module.order_for(args[0].shape[1])  # (B, N, C) tokens in

    hooks = [m.register_forward_pre_hook(lambda m, a, p=p: ask(m, a, p))
             for p, m in model.named_modules() if hasattr(m, "order_for")]
    with torch.no_grad():
        model(torch.zeros(1, 3, imgsz, imgsz))
    for h in hooks:
        h.remove()
    assert report.reparam.attention_order == seen
    meta = {p.key: p.value for p in onnx.load(str(out / f"{name}.onnx")).metadata_props}
    assert json.loads(meta["vitedge.reparam"])["attention_order"] == seen
    if name.startswith("sima"):  # the order flips with the size: N=196 > d=32 at 224, N=25 < 32 at 80
        assert set(seen.values()) == {"kv_first" if imgsz == 224 else "qk_first"}


def test_metadata_props(exported):
    _, name, overrides, imgsz, ckpt, out, report = exported
    model = onnx.load(str(out / f"{name}.onnx"))
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["vitedge.model"] == name and json.loads(meta["vitedge.imgsz"]) == imgsz
    assert json.loads(meta["vitedge.mean"]) == pytest.approx([0.485, 0.456, 0.406])
    assert json.loads(meta["vitedge.std"]) == pytest.approx([0.229, 0.224, 0.225])
    # strings are stored as they are, everything else as JSON
    assert meta["vitedge.checkpoint_sha256"] == (report.checkpoint_sha256 or "null")
    assert meta["vitedge.weights"] == report.weights
    assert json.loads(meta["vitedge.versions"])["torch"] == torch.__version__
    assert json.loads(meta["vitedge.reparam"])["folded"] == report.reparam.folded
    assert json.loads(meta["vitedge.num_classes"]) == model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    assert [i.name for i in model.graph.input] == ["image"] and [o.name for o in model.graph.output] == ["logits"]
    onnx.checker.check_model(model, full_check=True)


def test_normalization_nodes(exported):
    # SwiftFormer and SLAB fold every norm away; SimA keeps its per-token LayerNorms (nothing to fold them into).
    _, name, *_, out, report = exported
    ops = Counter(n.op_type for n in onnx.load(str(out / f"{name}.onnx")).graph.node)
    norms = sum(ops[o] for o in NORM_OPS)
    assert report.artifacts["onnx"].nodes == dict(ops) and sum(ops.values()) > 0
    if name.startswith("sima"):
        assert norms > 0
    else:
        assert norms == 0


def test_dynamic_batch_runs_at_batch_1_and_3(tmp_path):
    report = export("swiftformer_xs", "onnx", imgsz=64, dynamic_batch=True, out=tmp_path / "dyn", samples=5,
                    overrides=SWIFT)
    assert report.exit_code == 0 and report.batch is None
    path = tmp_path / "dyn" / "swiftformer_xs.onnx"
    dim = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.HasField("dim_value")
    model = _train_form("swiftformer_xs", SWIFT, None)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = parity_inputs(n, 64, seed=n)
        y = sess.run(["logits"], {"image": x.numpy()})[0]
        with torch.no_grad():
            ref = model(x).numpy()
        assert y.shape == (n, 10)
        assert np.abs(y - ref).max() <= 1e-4 * np.abs(ref).max()


def test_static_batch_3_with_samples_not_a_multiple(tmp_path):
    # 5 parity samples through a batch-3 graph: the last chunk is padded, not dropped.
    report = export("swiftformer_xs", "onnx", imgsz=64, batch=3, out=tmp_path / "b3", samples=5, overrides=SWIFT)
    assert report.exit_code == 0 and report.batch == 3
    assert all(h.samples == 5 for h in report.parity)
    dims = onnx.load(str(tmp_path / "b3" / "swiftformer_xs.onnx")).graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_value for d in dims] == [3, 3, 64, 64]


# One case per family at its cheaper size (localization runs the deploy-form in float64 too).
@pytest.mark.parametrize("exported", ["swiftformer-64", "slab_deit-224", "slab_swin-224", "sima-80"], indirect=True)
def test_localization_finds_nothing_in_a_healthy_graph_and_names_a_corrupted_weight(exported):
    _, name, overrides, imgsz, ckpt, out, report = exported
    deploy, _ = build_deploy_form(_train_form(name, overrides, ckpt), imgsz, attn_order="auto")
    model = onnx.load(str(out / f"{name}.onnx"))
    x = parity_inputs(1, imgsz, seed=5).numpy()
    tol = DEFAULT_TOLERANCES["fp32"]
    assert localize_onnx(model, deploy, x, tol) is None
    # corrupt a conv/linear weight that kept its torch name, in the middle of the graph
    state = deploy.state_dict()
    named = [i for i in model.graph.initializer if i.name in state and i.name.endswith(".weight") and len(i.dims) >= 2]
    init = named[len(named) // 2]
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    div = localize_onnx(model, deploy, x, tol)
    assert div is not None and div.module == init.name.rpartition(".")[0]
