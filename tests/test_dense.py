"""Dense prediction (--features): a backbone's feature maps as the outputs, each judged by the noise rule, in
every hop and on ONNX, CoreML (the MIL interpreter) and ExecuTorch; cross-checked against timm's
forward_intermediates."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from vitedge.errors import VitedgeError
from vitedge.exporter.core.settings import parse_features
from vitedge.exporter.onnx.onnx_export import NORM_OPS, node_counts
from vitedge.exporter.reparam import reparameterize
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.verdict.equivalence import verify_equivalence
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, check_hop, ground_truth
from vitedge.models.features import FeatureMaps, make_trained_like_norms
from vitedge.models.outputs import output_columns
from vitedge.models.reduced import case
from vitedge.models.registry import create_model, sized
from vitedge.models.trained_like import make_trained_like
from vitedge.targets.graph.metadata import read_metadata
from vitedge.targets.pytorch import TorchRunner
from vitedge.tests._timm import import_timm

NAME, KW, IMGSZ = case("swiftformer")
STRIDES = (4, 8, 16, 32)
WIDTHS = KW["embed_dims"]


@pytest.fixture(scope="module")
def forms():
    """(train-form FeatureMaps with trained-like weights and detection norms, its deploy-form)."""
    backbone = make_trained_like(create_model(NAME, **copy.deepcopy(KW)), 0)
    train = make_trained_like_norms(FeatureMaps(backbone), 0, IMGSZ).eval()
    return train, reparameterize(train, IMGSZ)


def test_swiftformer_default_features_are_the_fork_feat_outputs(forms):
    train, deploy = forms
    assert train.names() == tuple(f"feat_s{s}" for s in STRIDES)
    assert [n for n, m in train.named_children() if n.startswith("norm")] == ["norm0", "norm2", "norm4", "norm6"]
    x = torch.randn(2, 3, IMGSZ, IMGSZ)
    with torch.no_grad():
        outs = train(x)
        feats = train.backbone.patch_embed(x)
        for i, block in enumerate(train.backbone.network):  # the official forward_tokens, written out
            feats = block(feats)
            if i in (0, 2, 4, 6):
                assert torch.equal(outs[i // 2], getattr(train, f"norm{i}")(feats))
    assert [tuple(o.shape[1:]) for o in outs] == [(c, IMGSZ // s, IMGSZ // s) for c, s in zip(WIDTHS, STRIDES)]
    assert [s.shape for s in train.specs((IMGSZ, IMGSZ))] == [tuple(o.shape[1:]) for o in outs]
    # the detection norms fold (no normalization module left), every output gated in float64
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in deploy.modules())
    res = verify_equivalence(train, deploy, IMGSZ, samples=2)
    assert res.passed and [b["name"] for b in res.blocks][-4:] == [f"(output feat_s{s})" for s in STRIDES]


def test_feature_indices_choose_maps_and_bad_ones_are_refused():
    backbone = create_model(NAME, **copy.deepcopy(KW))
    assert FeatureMaps(backbone, (1, 3)).names() == ("feat_s8", "feat_s32")
    with pytest.raises(VitedgeError, match="positions 0..3"):
        FeatureMaps(backbone, (4,))
    assert parse_features(True) == "default" and parse_features("3,1") == (1, 3) and parse_features(None) is None
    with pytest.raises(VitedgeError, match="--features"):
        parse_features("a,b")


def test_a_broken_detection_norm_fails_the_gate_at_that_output(forms):
    train, deploy = forms
    bad = copy.deepcopy(deploy)
    bad.reparam_fp64.norm2.shift[0] += 0.01
    res = verify_equivalence(train, bad, IMGSZ, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "norm2"


def _truth_and_x(train, n=8):
    x = torch.randn(n, 3, IMGSZ, IMGSZ, generator=torch.Generator().manual_seed(1)).numpy()
    truth = ground_truth(train, x, ("natural",) * n)
    return x, truth


def test_an_error_in_the_stride_4_map_alone_fails_the_hop(forms):
    """A 1 % error in one channel of the stride-4 map only: invisible against the packed outputs' largest value
    when the maps are judged together, caught when each output is its own set of rows."""
    train, deploy = forms
    x, truth = _truth_and_x(train)
    specs = train.specs((IMGSZ, IMGSZ))
    truth = GroundTruth(**{**truth.__dict__, "outputs": output_columns(specs)})
    planted = copy.deepcopy(deploy)
    planted.norm0.scale[3] *= 1.01  # the feat_s4 path only (after its last shared module)
    tol = FLOAT64_TOLERANCES["fp32"]
    good = check_hop("deploy-form", TorchRunner(deploy), x, None, tol, truth=truth)
    hop = check_hop("deploy-form", TorchRunner(planted), x, None, tol, truth=truth)
    assert good.status == "passed" and set(good.outputs) == {s.name for s in specs}
    assert hop.status == "failed" and "output feat_s4" in hop.reason
    assert hop.outputs["feat_s4"] > 1 and all(hop.outputs[f"feat_s{s}"] <= 1 for s in STRIDES[1:])
    assert hop.sets["natural"]["worst_sample"]["output"] == "feat_s4"


def test_an_error_in_one_stage_fails_the_hop(forms):
    train, deploy = forms
    x, truth = _truth_and_x(train)
    truth = GroundTruth(**{**truth.__dict__, "outputs": output_columns(train.specs((IMGSZ, IMGSZ)))})
    planted = copy.deepcopy(deploy)
    with torch.no_grad():
        planted.backbone.network[4][0].pwconv2.weight[0] *= 1.01  # stage 3: feeds feat_s16 and feat_s32
    hop = check_hop("deploy-form", TorchRunner(planted), x, None, FLOAT64_TOLERANCES["fp32"], truth=truth)
    assert hop.status == "failed"
    assert hop.outputs["feat_s4"] <= 1 and hop.outputs["feat_s8"] <= 1 and hop.outputs["feat_s16"] > 1


def test_swiftformer_feature_maps_equal_timm_forward_intermediates():
    timm = import_timm()
    from vitedge.tests.test_swiftformer import _timm_to_official

    ref = make_trained_like(timm.create_model("swiftformer_xs"), seed=3).eval()
    ours = create_model("swiftformer_xs").eval()
    ours.load_state_dict({_timm_to_official(k): v for k, v in ref.state_dict().items()}, strict=True)
    feats = FeatureMaps(ours)
    for t in feats.taps:  # timm's intermediates carry no detection norm: identity ones here
        torch.nn.init.zeros_(getattr(feats, f"norm{t.index}").running_mean)
    feats.eval()
    x = torch.randn(1, 3, 128, 96, generator=torch.Generator().manual_seed(0))  # the maps follow any input size
    with torch.no_grad():
        want = ref.forward_intermediates(x, indices=4, intermediates_only=True)
        got = feats(x)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert g.shape == w.shape and float((g - w).abs().max()) <= 1e-5 * max(1.0, float(w.abs().max()))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from vitedge import export

    out = tmp_path_factory.mktemp("dense") / "run"
    report = export(NAME, targets="onnx,coreml,executorch", overrides=copy.deepcopy(KW), imgsz=IMGSZ,
                    features=True, samples=8, out=out)
    return report, out


def test_export_features_every_target_judges_every_output(exported):
    report, out = exported
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    assert report.outputs == [{"name": f"feat_s{s}", "shape": [c, IMGSZ // s, IMGSZ // s], "stride": s}
                              for c, s in zip(WIDTHS, STRIDES)]
    names = [o["name"] for o in report.outputs]
    for hop in report.parity:
        assert hop.status == "passed" and list(hop.outputs) == names, hop.hop
    assert report.hop("onnx").probe["status"] == "not applicable"  # every output is a map, judged itself
    graph = onnx.load(str(out / f"{NAME}.onnx"))
    assert [o.name for o in graph.graph.output] == names
    assert sum(node_counts(graph).get(op, 0) for op in NORM_OPS) == 0
    meta = read_metadata(graph)
    assert meta["outputs"] == report.outputs and meta["output"] == "feature maps"


def test_export_features_coreml_and_executorch_carry_the_outputs(exported):
    from vitedge.targets import get_target
    from vitedge.targets.coreml.mlpackage import load_program_spec

    report, out = exported
    names = [o["name"] for o in report.outputs]
    spec = load_program_spec(out / f"{NAME}.mlpackage")
    assert [o.name for o in spec.description.output] == names
    assert json.loads(dict(spec.description.metadata.userDefined)["outputs"]) == report.outputs
    pte = get_target("executorch").read_metadata(out / f"{NAME}.pte")
    assert pte["outputs"] == report.outputs and pte["features"] == "default"
    assert get_target("coreml").read_metadata(out / f"{NAME}.mlpackage")["features"] == "default"


def test_features_with_labels_is_refused_before_work(tmp_path):
    from vitedge import export

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(map(str, range(10))))
    with pytest.raises(VitedgeError, match="--features"):
        export(NAME, overrides=copy.deepcopy(KW), imgsz=IMGSZ, features=True, labels=labels, out=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def _example():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "dense_head.py"
    spec = importlib.util.spec_from_file_location("dense_head_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_custom_head_example_runs_and_every_output_is_judged_and_parity_and_bench_take_it(tmp_path, capsys):
    """examples/dense_head.py: a user's FPN + segmentation head on a vitedge backbone, two outputs; the backbone
    is folded in place, the float64 gate covers the whole module, every hop judges both outputs."""
    example = _example()
    assert example.main(["--out", str(tmp_path / "run"), "--samples", "8"]) == 0
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert [o["name"] for o in report["outputs"]] == ["seg_logits", "fpn_s4"]
    assert report["reparam"]["folded"]["conv+bn"] > 0 and report["weights"] == "module"
    eq = report["reparam"]["equivalence"]
    assert eq["passed"] and {"(output seg_logits)", "(output fpn_s4)"} <= {b["name"] for b in eq["blocks"]}
    assert any(b["name"].startswith("backbone.") for b in eq["blocks"])
    for hop in report["parity"]:
        assert hop["status"] == "passed" and set(hop["outputs"]) == {"seg_logits", "fpn_s4"}, hop["hop"]
    graph = onnx.load(str(tmp_path / "run" / "segmentationmodel.onnx"))
    assert [o.name for o in graph.graph.output] == ["seg_logits", "fpn_s4"]
    assert "seg_logits" in capsys.readouterr().out
    _parity_and_bench_take_the_users_module(example, tmp_path)


def _parity_and_bench_take_the_users_module(example, tmp_path):
    """`vitedge.parity` and `vitedge.bench` from Python with the same user module (the example's, built again with
    its seed): the artifact judged output by output against that module's train-form, and each bench backend
    parity-checked per output before it is timed (few samples, short timing: plumbing)."""
    from vitedge import bench, parity

    model, imgsz = example.build()
    checked = parity(model=model, artifact=tmp_path / "run" / "segmentationmodel.onnx", samples=4,
                     report_path=tmp_path / "parity.json")
    assert checked.exit_code == 0 and checked.model == "segmentationmodel" and checked.weights == "module"
    assert [o["name"] for o in checked.outputs] == ["seg_logits", "fpn_s4"]
    for hop in checked.parity:
        assert hop.status == "passed" and set(hop.outputs) == {"seg_logits", "fpn_s4"}, hop.hop
    timed = bench(model=model, imgsz=imgsz, backends="torch-deploy,onnxruntime", min_iters=3, max_s=0.2,
                  warmup_s=0.02)
    assert timed.exit_code == 0 and [r.backend for r in timed.results] == ["torch-deploy", "onnxruntime"]
    for r in timed.results:
        assert r.status == "ok" and r.valid and r.latency["iters"] >= 3, r.backend
        assert all(set(d["outputs"]) == {"seg_logits", "fpn_s4"} for d in r.parity_sets.values()), r.backend


def test_the_summary_shows_each_hops_worst_output_for_feature_maps_not_top_1(exported):
    """top-1 / top-5 agreement of packed feature maps says nothing: the table shows each hop's worst output and
    its ratio instead (report.json keeps the fields); a classifier's table keeps its top-1 / top-5 columns."""
    from vitedge.exporter.command_line.summary import format_summary
    from vitedge.exporter.core.report import Report

    report, _ = exported
    text = format_summary(report)
    header = next(line for line in text.splitlines() if line.startswith("hop "))
    assert "worst output" in header and "top-1" not in header and "top-5" not in header
    onnx_row = next(line for line in text.splitlines() if line.startswith("onnx "))
    worst = max(report.hop("onnx").outputs, key=report.hop("onnx").outputs.get)
    assert f"{worst} {report.hop('onnx').outputs[worst]:.2f}" in onnx_row
    assert report.hop("onnx").metrics.top1_agreement is not None  # (the report.json field stays)
    one_map = Report.from_dict({**report.to_dict(), "outputs": report.outputs[2:3]})
    header = next(line for line in format_summary(one_map).splitlines() if line.startswith("hop "))
    assert "top-1" not in header and "worst output" not in header
    logits = Report.from_dict({**report.to_dict(), "outputs": [{"name": "logits", "shape": [10], "stride": None}]})
    header = next(line for line in format_summary(logits).splitlines() if line.startswith("hop "))
    assert "top-1" in header and "top-5" in header and "worst output" not in header


def test_a_module_embedding_no_backbone_is_refused():
    from vitedge.exporter.reparam import reparameterize as fold

    with pytest.raises(VitedgeError, match="embeds no vitedge backbone"):
        fold(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)), 32)


def test_compressed_kinds_judge_each_output_against_their_emulation(forms):
    """The compressed hops' samples keep the outputs' columns, the kind's emulation is packed alike, and a w8
    candidate (here: the emulation itself, perturbed in the stride-8 map) is judged output by output."""
    from vitedge.exporter.quantize.compressed import JudgedSamples, judge_compressed
    from vitedge.exporter.verdict.hops import parity_inputs_for
    from vitedge.exporter.verdict.parity import COMPRESSED_TOLERANCES
    from vitedge.targets.base import Runner

    train, deploy = forms
    pset = parity_inputs_for(train, IMGSZ, 8)
    judged = JudgedSamples.build(train, pset, deploy=deploy)
    assert [n for n, _ in judged.truth.outputs] == list(train.names())
    emulated = judged.with_emulation(judged.truth, judged.x, "w8").yq
    cols = judged.truth.columns("feat_s8")

    class Replay(Runner):  # the emulation as the artifact's output, one map perturbed
        backend, mode = "replay", "emulated"

        def __init__(self, bump):
            self.bump = bump

        def run(self, x):
            i = [int(np.flatnonzero((judged.x == s).all(axis=(1, 2, 3)))[0]) for s in x]
            y = emulated[i].astype(np.float32)
            y[:, cols] *= 1 + self.bump
            return y

    tol = COMPRESSED_TOLERANCES["w8"]
    good = judge_compressed("coreml", Replay(0.0), judged, tol, "w8")
    bad = judge_compressed("coreml", Replay(0.05), judged, tol, "w8")
    assert good.status == "passed" and list(good.outputs) == list(train.names())
    assert bad.status == "failed" and max(bad.outputs, key=bad.outputs.get) == "feat_s8"


def _mmdet_checkpoint(forms, path, drop=None):
    """An mmdet-style checkpoint of the official fork_feat backbone: backbone.* (no classifier), its norm{i},
    a neck and an RPN head."""
    train, _ = forms
    from vitedge.models.checkpoints.dense import classifier_keys

    skip = classifier_keys(train.backbone)
    sd = {f"backbone.{k}": v for k, v in train.backbone.state_dict().items() if k not in skip}
    sd.update({f"backbone.{k}": v for k, v in train.state_dict().items() if k.startswith("norm")})
    sd["neck.lateral_convs.0.conv.weight"] = torch.zeros(8, WIDTHS[0], 1, 1)
    sd["rpn_head.rpn_conv.weight"] = torch.zeros(8, 8, 3, 3)
    if drop:
        del sd[drop]
    torch.save({"meta": {"epoch": 12}, "state_dict": sd}, path)
    return path


def test_an_mmdet_checkpoint_loads_its_backbone_and_reports_the_rest(forms, tmp_path):
    from vitedge.exporter.reparam.build_forms import build_train_form

    train, _ = forms
    ck = _mmdet_checkpoint(forms, tmp_path / "mask_rcnn.pth")
    loaded = build_train_form(NAME, ck, copy.deepcopy(KW), features="default")
    assert loaded.weights == "checkpoint" and loaded.from_checkpoint["layout"].startswith("mmdet")
    assert loaded.from_checkpoint["ignored"] == ["neck.lateral_convs.0.conv.weight", "rpn_head.rpn_conv.weight"]
    x = torch.randn(1, 3, IMGSZ, IMGSZ)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(loaded.model(x), train(x)))


def test_an_mmdet_checkpoint_missing_a_backbone_key_is_exit_2_naming_it(forms, tmp_path, capsys):
    from vitedge.cli import main

    ck = _mmdet_checkpoint(forms, tmp_path / "bad.pth", drop="backbone.network.1.proj.weight")
    sets = [a for k, v in KW.items() if k != "num_classes" for a in ("--set", f"{k}={','.join(map(str, v))}")]
    code = main(["export", "--model", NAME, *sets, "--imgsz", str(IMGSZ), "--features", "--checkpoint", str(ck),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "network.1.proj.weight" in err and "missing" in err
    assert not (tmp_path / "out").exists()


def test_a_timm_features_only_state_dict_loads_as_timms_maps():
    timm = import_timm()
    from vitedge.exporter.reparam.build_forms import build_train_form

    ref = timm.create_model("swiftformer_xs", features_only=True, layers=KW["layers"], embed_dims=WIDTHS)
    ref = make_trained_like(ref, seed=5, imgsz=IMGSZ).eval()
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "features_only.pth"
        torch.save(ref.state_dict(), path)
        loaded = build_train_form(NAME, path, copy.deepcopy(KW), features="default")
    assert loaded.from_checkpoint["layout"] == "timm features_only"
    x = torch.randn(1, 3, 96, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want, got = ref(x), loaded.model(x)
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    assert all(float((g - w).abs().max()) <= 1e-5 * max(1.0, float(w.abs().max())) for g, w in zip(got, want))


def test_tensorrt_runner_reads_every_output_binding(forms, tmp_path, trt_fake):
    """TensorRT is unverified here: the fake built from the real API table proves the wiring only. The engine
    built from a feature-map graph has one output binding per map; the runner reads each, in order, and lays
    them side by side as the ladder judges them."""
    from vitedge.exporter.onnx.onnx_export import export_onnx, save_onnx
    from vitedge.targets import LowerSpec
    from vitedge.targets.tensorrt.target import TensorRTTarget

    _, deploy = forms
    fake = trt_fake.FakeTRT("10.13.0")
    gpu = {"gpu": "Fake GPU", "compute_capability": "9.0", "cuda_driver": "12.8", "devices": 1}
    target = TensorRTTarget(trt=fake.module, device=lambda: (gpu, None), memory=lambda: (fake.memory, None))
    path = save_onnx(export_onnx(copy.deepcopy(deploy), IMGSZ, batch=1), tmp_path / "feats.onnx")
    (tmp_path / "out").mkdir()
    art = target.lower(None, LowerSpec(name="feats", imgsz=IMGSZ, batch=1, precision="fp32",
                                       out_dir=tmp_path / "out", onnx_path=path, metadata={"model": "feats"}))
    side = json.loads((tmp_path / "out" / "feats.engine.json").read_text())
    assert [o["name"] for o in side["outputs"]] == [f"feat_s{s}" for s in STRIDES]
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    with target.runner(art) as r:
        assert r.outputs == [f"feat_s{s}" for s in STRIDES]
        y = r.run(x)
    one = trt_fake._linear(x, np.float32)  # the fake's output k is (k + 1) x this map
    assert np.allclose(y, np.concatenate([one * (k + 1) for k in range(4)], axis=1), atol=1e-5)


@pytest.mark.parametrize("family", ["slab_swin", "prepbn_swin"])
def test_swin_features_are_the_official_detection_outputs(family):
    """SLAB's Swin detection backbones (mmdet_custom): each stage before its patch merging, through an
    nn.LayerNorm norm{i}. A LayerNorm uses each position's statistics, so it stays in the graph (reported
    unfolded); everything else folds, and the gate and ONNX Runtime agree on every output."""
    from vitedge.exporter.onnx.onnx_export import export_onnx
    from vitedge.models.reduced import REDUCED
    from vitedge.targets.graph.runtime import OnnxRuntimeRunner

    name, kw, imgsz = case(family)
    embed = REDUCED[family].overrides["embed_dim"]
    train = make_trained_like_norms(FeatureMaps(make_trained_like(create_model(name, **kw), 0)), 0).eval()
    assert [(s.name, s.shape) for s in train.specs((imgsz, imgsz))] == [
        (f"feat_s{4 * 2 ** i}", (embed * 2 ** i, imgsz // (4 * 2 ** i), imgsz // (4 * 2 ** i))) for i in range(4)]
    deploy = reparameterize(train, imgsz)
    assert [u["module"] for u in deploy.reparam_summary.unfolded] == ["norm0", "norm1", "norm2", "norm3"]
    assert verify_equivalence(train, deploy, imgsz, samples=2).passed
    graph = export_onnx(copy.deepcopy(deploy), imgsz, batch=1)
    assert [o.name for o in graph.graph.output] == list(train.names())
    assert sum(node_counts(graph).get(op, 0) for op in NORM_OPS) <= 4  # the four detection LayerNorms at most
    x = torch.randn(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = np.concatenate([o.reshape(1, -1).numpy() for o in deploy(x)], axis=1)
    assert np.allclose(OnnxRuntimeRunner(graph).run(x.numpy()), want, atol=1e-4)


def test_bundles_carry_every_output_and_check_each(forms):
    """The bundles' golden vectors for several outputs: one file per output in its own shape, named with its
    stride in golden.json, and the self-check judges each output alone (an error in one map fails it)."""
    from vitedge.exporter.packaging.bundle import golden_outputs, golden_vectors, golden_verdict, outputs_readme
    from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES
    from vitedge.models.registry import input_stats

    train, _ = forms
    outputs = [s.as_dict() for s in train.specs((IMGSZ, IMGSZ))]
    pixels, expected = golden_vectors(train, IMGSZ, *input_stats(train), n=4)
    files, entries = golden_outputs(outputs, expected, "m")
    assert [e["name"] for e in entries] == list(train.names()) and [e["stride"] for e in entries] == list(STRIDES)
    assert sorted(files) == sorted(f"m/golden/outputs_{n}.npy" for n in train.names())
    assert [e["shape"] for e in entries] == [[4, *o["shape"]] for o in outputs]
    assert "feat_s16" in outputs_readme(outputs) and outputs_readme(outputs[:1]) == ""

    class Given:
        mode, backend = "emulated", "given"

    tol = DEFAULT_TOLERANCES["fp16"]
    assert golden_verdict(Given, expected.copy(), expected, tol, outputs)["passed"]
    bad = expected.copy()
    s4 = int(np.prod(outputs[0]["shape"]))
    bad[:, :s4] *= -1  # the stride-4 map inverted, the others exact
    verdict = golden_verdict(Given, bad, expected, tol, outputs)
    assert not verdict["passed"] and all(p.startswith("feat_s4:") for p in verdict["problems"])
    assert set(verdict["outputs"]) == set(train.names())


FIXTURES = Path(__file__).parent / "fixtures" / "dense"


@pytest.mark.parametrize("family,fixture", [("swiftformer", "swiftformer_fork_feat_tiny"),
                                            ("slab_swin", "slab_swin_det_tiny")])
def test_feature_maps_equal_the_official_dense_backbones(family, fixture):
    """fixtures/dense/: built with the official fork_feat and SLAB detection constructors (README there)."""
    from vitedge.exporter.reparam.build_forms import build_train_form

    name, kw, _ = case(family)
    io = torch.load(FIXTURES / f"{fixture}_io.pt", weights_only=True)
    loaded = build_train_form(name, FIXTURES / f"{fixture}.pth", kw, features="default")
    assert loaded.from_checkpoint["layout"] == "backbone"
    model = loaded.model.eval()
    with torch.no_grad():
        got32 = model(io["input"])
        got64 = copy.deepcopy(model).double()(io["input"].double())
    assert len(got32) == len(io["outputs"]) == 4
    for g32, g64, want in zip(got32, got64, io["outputs"]):
        assert g32.shape == want.shape
        own_noise = float((g32.double() - g64).abs().max())
        bound = max(1e-5 * float(want.abs().max()), 4 * own_noise)
        assert float((want.double() - g64).abs().max()) <= bound


@pytest.mark.parametrize("family", ["slab_deit", "prepbn_deit"])
def test_deit_features_are_the_last_blocks_stride_16_map(family):
    """No official dense-prediction code: the last block's patch tokens (the class token dropped), before the
    classifier's final norm, as timm's forward_intermediates gives a ViT's; both deploy layouts (token-first, the
    rewrites' channel-first) give the same map, 0 normalization nodes."""
    from vitedge.exporter.onnx.onnx_export import export_onnx
    from vitedge.targets.graph.runtime import OnnxRuntimeRunner

    name, kw, imgsz = case(family)
    train = FeatureMaps(make_trained_like(create_model(name, **kw), 0)).eval()
    x = torch.randn(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        (got,) = train(x)
        tokens = train.backbone.forward_features(x)
    grid = imgsz // 16
    assert train.names() == ("feat_s16",) and got.shape == (1, kw["embed_dim"], grid, grid)
    assert torch.equal(got.flatten(2).transpose(1, 2), tokens[:, -grid * grid:])
    for rewrites in (True, False):
        deploy = reparameterize(train, imgsz, rewrites=rewrites)
        assert verify_equivalence(train, deploy, imgsz, samples=2).passed
    graph = export_onnx(copy.deepcopy(deploy), imgsz, batch=1)
    assert [o.name for o in graph.graph.output] == ["feat_s16"]
    assert sum(node_counts(graph).get(op, 0) for op in NORM_OPS) == 0
    with torch.no_grad():
        want = deploy(x)[0].reshape(1, -1).numpy()  # (the ladder's rows: one per sample)
    assert np.allclose(OnnxRuntimeRunner(graph).run(x.numpy()), want, atol=1e-4)


def test_parity_of_a_feature_map_artifact_rebuilds_the_same_maps(exported, tmp_path):
    """`vitedge parity` reads the artifact's vitedge.features and judges each map against the train-form's."""
    from vitedge import parity

    report, out = exported
    checked = parity(artifact=out / f"{NAME}.onnx", samples=8, report_path=tmp_path / "parity.json")
    assert checked.exit_code == 0
    assert [list(h.outputs) for h in checked.parity] == [[o["name"] for o in report.outputs]] * len(checked.parity)
    assert checked.outputs == report.outputs and checked.features == "default"  # (report.json says what it judged)


def test_a_planted_error_in_one_stage_of_the_onnx_graph_fails_and_is_localized(forms):
    """An ONNX graph of the feature maps with one stage's weight channel scaled: its hop fails on the maps that
    stage feeds and localization names the module holding the weight, as for a classifier."""
    from vitedge.exporter.core.progress import QUIET
    from vitedge.exporter.onnx.onnx_export import export_onnx
    from vitedge.exporter.verdict.hops import Ladder, parity_inputs_for
    from vitedge.targets.plants import plant_channel_scale, planted_module

    train, deploy = forms
    graph = export_onnx(copy.deepcopy(deploy), IMGSZ, batch=None)
    planted, where = plant_channel_scale(graph, 1.5, position=0.5)
    ladder = Ladder.build(train, deploy, parity_inputs_for(train, IMGSZ, 8), QUIET, use_cache=False)
    good = ladder.onnx_hop("onnx", graph, FLOAT64_TOLERANCES["fp32"])
    hop = ladder.onnx_hop("onnx", planted, FLOAT64_TOLERANCES["fp32"])
    assert good.status == "passed" and hop.status == "failed"
    assert max(hop.outputs.values()) > 1 and hop.outputs["feat_s4"] <= 1  # (a mid-network weight: not stride 4)
    assert hop.diverging_module == planted_module(graph, where, deploy)


def test_a_backbone_without_feature_maps_is_refused_naming_the_reason():
    with pytest.raises(VitedgeError, match="does not give feature maps .* vitedge.create_model"):
        FeatureMaps(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)))


@pytest.mark.parametrize("family", ["swiftformer", "slab_swin", "prepbn_deit", "slab_pvt", "slab_cswin", "sima",
                                    "sima_deit"])
def test_features_at_a_non_square_size_pass_with_the_documented_outputs(tmp_path, family):
    """A non-square input through the whole ladder: the backbone inside the feature-map wrapper is resized by its
    family's convention (tables resampled, windows padded; report.json `resized` names each tensor by its path in
    the wrapper), every map has its stride's name and shape (ceil(H / stride)), and the graph keeps 0
    normalization nodes where the detection norms fold (Swin's LayerNorms stay, as the official backbone's)."""
    from vitedge import export

    name, kw, imgsz = case(family)
    h, w = imgsz, imgsz + 32
    report = export(name, targets="onnx", overrides=copy.deepcopy(kw), imgsz=f"{h}x{w}", features=True,
                    out=tmp_path / "o", samples=8)  # (plumbing: names, shapes, norms)
    assert report.exit_code == 0, [(p.hop, p.status, p.reason) for p in report.parity]
    assert report.input_size == [h, w]
    strides = [o["stride"] for o in report.outputs]
    assert [o["name"] for o in report.outputs] == [f"feat_s{s}" for s in strides]
    assert [o["shape"][1:] for o in report.outputs] == [[-(-h // s), -(-w // s)] for s in strides]
    graph = onnx.load(tmp_path / "o" / report.artifacts["onnx"].path)
    assert [o.name for o in graph.graph.output] == [o["name"] for o in report.outputs]
    counts = node_counts(graph)
    assert counts.get("BatchNormalization", 0) == 0  # every BatchNorm-type norm folds, the detection ones too
    # LayerNorms stay: the official Swin and CSWin detection norms (one per map), and SimA's block norms, which
    # the classifier's graph keeps too (a LayerNorm has no constant form)
    kept = len(strides) if family in ("slab_swin", "slab_cswin") else 0
    if family.startswith("sima"):
        kept = sum(isinstance(m, torch.nn.LayerNorm) for m in create_model(name, **kw).blocks.modules())
    assert sum(counts.get(op, 0) for op in NORM_OPS) == kept
    if family in ("slab_swin", "slab_cswin"):  # the detection LayerNorms are listed as unfolded
        assert sum(u["module"].startswith("norm") for u in report.reparam.unfolded) == len(strides)
    if family not in ("swiftformer", "sima"):  # convs only, or a Fourier encoding computed for the grid
        assert report.resized and all(r["tensor"].startswith("backbone.") for r in report.resized)


def _official_pvt(m, x):
    """whai362/PVT detection/pvt.py forward_features, written out on vitedge's modules (no per-output norm)."""
    outs = []
    for i in range(4):
        x, (h, w) = getattr(m, f"patch_embed{i + 1}")(x)
        x = x + m.stage_pos_embed(i, (h, w))  # the official _get_pos_embed
        for blk in getattr(m, f"block{i + 1}"):
            x = blk(x, (h, w))
        x = x.reshape(x.shape[0], h, w, -1).permute(0, 3, 1, 2)
        outs.append(x)
    return outs


def _official_cswin(m, norms, x):
    """microsoft/CSWin-Transformer segmentation/backbone/cswin_transformer.py forward_features: each stage
    through its norm{i} (save_out), then NCHW."""
    def save_out(t, norm, h, w):  # (the official norm is an nn.LayerNorm over the tokens' channels)
        t = torch.nn.functional.layer_norm(t, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
        return t.reshape(t.shape[0], h, w, -1).permute(0, 3, 1, 2)

    h, w = x.shape[2] // 4, x.shape[3] // 4
    x = m.stage1_conv_embed(x)
    for blk in m.stage1:
        x = blk(x)
    out = [save_out(x, norms[0], h, w)]
    for i in range(1, 4):
        x = getattr(m, f"merge{i}")(x)
        h, w = h // 2, w // 2
        for blk in getattr(m, f"stage{i + 1}"):
            x = blk(x)
        out.append(save_out(x, norms[i], h, w))
    return out


def _official_xcit(m, fpns, out_indices, x):
    """facebookresearch/xcit detection/backbone/xcit.py forward_features: the tokens after the blocks in
    out_indices as maps, each through fpn1..fpn4."""
    b = x.shape[0]
    x, (hp, wp) = m.patch_embed(x)
    x = x + m.pos_embeder(b, hp, wp).reshape(b, -1, x.shape[1]).permute(0, 2, 1)
    features = []
    for i, blk in enumerate(m.blocks):
        x = blk(x, hp, wp)
        if i in out_indices:
            features.append(x.permute(0, 2, 1).reshape(b, -1, hp, wp))
    return [op(f) for op, f in zip(fpns, features)]


@pytest.mark.parametrize("family", ["slab_pvt", "prepbn_pvt", "slab_cswin", "sima", "sima_p8", "sima_deit"])
def test_feature_maps_follow_the_official_dense_conventions(family):
    """Each family's maps against the official dense-prediction forward written out above (the SimA-DeiT map: the
    last block's patch tokens, timm's ViT convention); the detection norms and XCiT's fpn layers are perturbed so
    none is an identity; the deploy-form passes the float64 gate on every map."""
    xcit = family in ("sima", "sima_p8")  # (p8: its own fpn layers)
    name, kw, imgsz = case("sima" if xcit else family)
    if xcit:  # depth 6: four distinct tapped blocks (1, 2, 3, 5), by the official configs' rule
        kw["depth"] = 6
        name = name.replace("_p16", "_p8") if family == "sima_p8" else name
    train = make_trained_like_norms(FeatureMaps(make_trained_like(create_model(name, **kw), 0)), 0).eval()
    h, w = imgsz, imgsz + 32
    sized_train = sized(copy.deepcopy(train), (h, w))
    m = sized_train.backbone
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = sized_train(x)
        if family.endswith("pvt"):
            want = _official_pvt(m, x)
        elif family == "slab_cswin":
            want = _official_cswin(m, [getattr(sized_train, f"norm{i}") for i in range(1, 5)], x)
        elif xcit:
            from vitedge.models.sima_xcit import xcit_out_indices

            assert xcit_out_indices(12) == [3, 5, 7, 11] and xcit_out_indices(24) == [7, 11, 15, 23]  # the configs
            fpns = [getattr(sized_train, f"fpn{i}") for i in range(1, 5)]
            official = {16: ["ConvTranspose2d BatchNorm2d GELU ConvTranspose2d", "ConvTranspose2d", "Identity",
                             "MaxPool2d(2)"],
                        8: ["ConvTranspose2d", "Identity", "MaxPool2d(2)", "MaxPool2d(4)"]}[m.patch_size]
            assert [" ".join(type(l).__name__ + (f"({l.kernel_size})" if isinstance(l, torch.nn.MaxPool2d) else "")
                             for l in (f if isinstance(f, torch.nn.Sequential) else [f])) for f in fpns] == official
            want = _official_xcit(m, fpns, [1, 2, 3, 5], x)
        else:
            tokens = m.blocks(torch.cat((m.cls_token.expand(2, -1, -1), m.patch_embed(x)), 1) + m.pos_embed)
            want = [tokens[:, 1:].transpose(1, 2).reshape(2, -1, h // 16, w // 16)]
    assert len(got) == len(want) == len(train.names())
    for g, wnt, spec in zip(got, want, sized_train.specs((h, w))):
        assert tuple(g.shape[1:]) == spec.shape, spec.name
        assert float((g - wnt).abs().max()) <= 1e-6 * float(wnt.abs().max()), spec.name
    deploy = reparameterize(train, (h, w))
    assert verify_equivalence(train, deploy, (h, w), samples=2).passed


@pytest.mark.parametrize("family", ["slab_pvt", "slab_cswin", "sima"])
def test_an_mmdet_checkpoint_of_each_detection_layout_loads(family, tmp_path):
    """The official dense backbones' layouts under `backbone.`: PVT's last position embedding with its class-token
    slot (one more token, dropped as its forward does), CSWin's norm1..norm4, XCiT's fpn1..fpn4 (no class token,
    class-attention blocks, final norm or head); the neck's keys are reported as ignored, the maps are the same."""
    from vitedge.exporter.reparam.build_forms import build_train_form
    from vitedge.models.checkpoints.dense import classifier_keys

    name, kw, imgsz = case(family)
    train = make_trained_like_norms(FeatureMaps(make_trained_like(create_model(name, **kw), 0)), 0).eval()
    skip = classifier_keys(train.backbone)
    sd = {f"backbone.{k}": v for k, v in train.backbone.state_dict().items() if k not in skip}
    sd.update({f"backbone.{k}": v for k, v in train.state_dict().items() if not k.startswith("backbone.")})
    if family == "slab_pvt":
        pos = sd["backbone.pos_embed4"]
        sd["backbone.pos_embed4"] = torch.cat((torch.full_like(pos[:, :1], 7.0), pos), dim=1)
    assert family != "sima" or {"backbone.fpn1.0.weight", "backbone.fpn1.1.running_var"} <= set(sd)
    sd["neck.lateral_convs.0.conv.weight"] = torch.zeros(8, 4, 1, 1)
    torch.save({"state_dict": sd}, tmp_path / "det.pth")
    loaded = build_train_form(name, tmp_path / "det.pth", kw, features="default")
    assert loaded.from_checkpoint["ignored"] == ["neck.lateral_convs.0.conv.weight"]
    assert (family == "slab_pvt") == any("class-token slot" in r for r in loaded.from_checkpoint["remaps"])
    x = torch.randn(1, 3, imgsz, imgsz, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(loaded.model(x), train(x)))


def test_xcits_fpn_folds_its_batchnorm_and_a_broken_fold_fails_the_gate_there():
    """SimA-XCiT's fpn1 (p16): ConvTranspose2d, BatchNorm2d, GELU, ConvTranspose2d; the BatchNorm folds into the
    transposed conv before it (its output channels are the weight's dim 1), checked on its own by the gate."""
    name, kw, imgsz = case("sima")
    train = make_trained_like_norms(FeatureMaps(make_trained_like(create_model(name, **kw), 0)), 0).eval()
    deploy = reparameterize(train, imgsz)
    assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in deploy.fpn1.modules())
    bad = copy.deepcopy(deploy)
    with torch.no_grad():
        bad.reparam_fp64.fpn1[0].weight[:, 3] *= 1.01  # one output channel of the folded transposed conv
    res = verify_equivalence(train, bad, imgsz, samples=2, raise_on_fail=False)
    assert not res.passed and res.diverging_module == "fpn1"
