"""`vitedge bench --artifact PATH [--providers ...]` (issue 20): an .onnx written by plain torch.onnx.export (no vitedge
metadata: timed, parity not run and said why), execution providers this onnxruntime lacks listed unavailable with
the reason, a vitedge artifact checked for parity first (a corrupted one failed, never timed), its class names
printed, a TensorRT engine unavailable here with why, a CoreML package unavailable off macOS and timed on a
(faked) tethered iPhone with its golden vectors judged; `vitedge.bench` returns what the CLI writes, and `--plot`
without matplotlib fails before any work."""
from __future__ import annotations

import json
import sys

import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
from onnx import numpy_helper

import vitedge
from vitedge import cli
from vitedge.errors import VitedgeError
from vitedge.exporter.timing import bench_api
from vitedge.exporter.timing.bench_report import BenchReport
from vitedge.targets.graph.metadata import read_metadata, set_metadata

QUICK = ["--min-iters", "3", "--warmup-s", "0", "--max-s", "0"]
TINY = dict(layers=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], num_classes=10)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """An .onnx from outside vitedge: plain torch.onnx.export, its own input name, a dynamic batch."""
    path = tmp_path_factory.mktemp("plain") / "net.onnx"
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5)).eval()
    torch.onnx.export(net, (torch.zeros(1, 3, 40, 40),), str(path), dynamo=False, input_names=["pixels"],
                      dynamic_axes={"pixels": {0: "n"}})
    return path


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    out = tmp_path_factory.mktemp("ours")
    vitedge.export("swiftformer_xs", out=out / "xs", samples=2, imgsz=32, overrides=TINY)
    return out / "xs" / "swiftformer_xs.onnx"


def test_a_plain_onnx_is_timed_on_cpu_and_missing_providers_are_listed(plain, tmp_path, capsys):
    report = tmp_path / "b.json"
    code = cli.main(["bench", "--artifact", str(plain), "--providers", "cpu,cuda,TensorrtExecutionProvider",
                     "--batch", "2", "--report", str(report), "-q", *QUICK])
    out = capsys.readouterr().out
    assert code == 0
    d = json.loads(report.read_text())
    res = {r["backend"]: r for r in d["results"]}
    cpu = res["onnxruntime-cpu"]
    assert cpu["status"] == "ok" and cpu["valid"] and cpu["latency"]["iters"] >= 3 and cpu["imgsz"] == 40
    assert cpu["parity"] is None and cpu["reason"].startswith("parity not run: net.onnx carries no vitedge metadata")
    assert d["artifact"]["parity"] == "not run" and d["artifact"]["metadata"] is False and d["batch"] == 2
    # --fail-on-parity: an artifact whose parity could not run is not a pass
    assert cli.main(["bench", "--artifact", str(plain), "-q", *QUICK, "--fail-on-parity"]) == 1
    assert "FAILED (--fail-on-parity): parity not run" in capsys.readouterr().out
    available = ort.get_available_providers()
    for name, ep in (("onnxruntime-cuda", "CUDAExecutionProvider"), ("onnxruntime-tensorrt",
                                                                      "TensorrtExecutionProvider")):
        if ep in available:  # a GPU build: it must have run, not been dropped
            assert res[name]["status"] in ("ok", "unavailable")
        else:
            assert res[name]["status"] == "unavailable" and ep in res[name]["reason"]
            assert "not in this ONNX Runtime build" in res[name]["reason"]
    assert "parity NOT RUN" in out and "onnxruntime-cuda" in out


def test_unknown_providers_and_misplaced_flags_exit_2(plain, capsys):
    assert cli.main(["bench", "--artifact", str(plain), "--providers", "cuda,warp"]) == 2
    assert "unknown ONNX Runtime execution provider 'warp'" in capsys.readouterr().err
    assert cli.main(["bench", "--model", "swiftformer_xs", "--providers", "cpu"]) == 2
    assert "--providers" in capsys.readouterr().err
    assert cli.main(["bench", "--artifact", str(plain), "--backends", "torch"]) == 2
    assert "--backends" in capsys.readouterr().err
    assert cli.main(["bench", "--artifact", str(plain), "--model", "swiftformer_xs"]) == 2
    assert "no vitedge metadata" in capsys.readouterr().err
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err
    assert "--model NAME" in err and "--artifact PATH" in err


def test_a_vitedge_artifact_gets_parity_first_and_its_class_names(ours, tmp_path):
    labelled = tmp_path / "labelled.onnx"
    graph = onnx.load(str(ours))
    set_metadata(graph, {**read_metadata(graph), "labels": [f"class {i}" for i in range(10)]})
    onnx.save(graph, str(labelled))
    r = vitedge.bench(artifact=labelled, min_iters=3, warmup_s=0.0, max_s=0.0, report_path=tmp_path / "r.json")
    assert isinstance(r, BenchReport) and json.loads((tmp_path / "r.json").read_text()) == json.loads(
        json.dumps(r.to_dict()))
    res = r.results[0]
    assert r.artifact["parity"] == "run" and r.artifact["model"] == "swiftformer_xs" and r.artifact["labels"] == 10
    assert res.status == "ok" and res.valid and res.parity["max_rel"] <= 1e-4 and res.imgsz == 32
    assert [p["name"] for p in res.predictions] == [f"class {p['top1']}" for p in res.predictions]
    assert all(p["top1"] == p["reference"] for p in res.predictions)
    from vitedge.exporter.timing.bench_report import format_table
    assert f"top-1 on the first parity inputs: {res.predictions[0]['name']}" in format_table(r)

    # the same graph with one weight x1.5: parity fails, the latency is never measured as if it were right
    names = [i.name for i in graph.graph.initializer if i.name.endswith(".weight") and len(i.dims) >= 2]
    init = next(i for i in graph.graph.initializer if i.name == names[len(names) // 2])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(graph, str(tmp_path / "bad.onnx"))
    bad = vitedge.bench(artifact=tmp_path / "bad.onnx", min_iters=3, warmup_s=0.0, max_s=0.0).results[0]
    assert bad.status == "failed" and not bad.valid and bad.latency is None and "parity failed" in bad.reason
    # a CI gate: exit 0 by default (documented), 1 with --fail-on-parity
    args = ["-q", "bench", "--artifact", str(tmp_path / "bad.onnx"), *QUICK]
    assert cli.main(args) == 0 and cli.main([*args, "--fail-on-parity"]) == 1
    assert cli.main(["-q", "bench", "--artifact", str(labelled), *QUICK, "--fail-on-parity"]) == 0


def test_an_engine_is_unavailable_here_with_the_reason(tmp_path):
    engine = tmp_path / "net.engine"
    engine.write_bytes(b"not a real plan: TensorRT needs a GPU to read one anyway")
    r = vitedge.bench(artifact=engine, imgsz=32, min_iters=2, warmup_s=0.0, max_s=0.0)
    (res,) = r.results
    assert res.backend == "tensorrt" and res.status == "unavailable" and res.reason
    assert r.artifact["format"] == "engine" and r.artifact["parity"] == "not run"
    with pytest.raises(VitedgeError, match="--providers"):
        vitedge.bench(artifact=engine, providers="cuda")


def test_plot_without_matplotlib_fails_before_any_work(plain, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)

    def no_work(*a, **k):
        raise AssertionError("measured although --plot cannot be written")

    monkeypatch.setattr(bench_api, "run_bench", no_work)
    monkeypatch.setattr(bench_api, "bench_artifact", no_work)
    for kw in ({"model": "swiftformer_xs"}, {"artifact": plain}):
        with pytest.raises(VitedgeError, match=r"pip install 'vitedge\[plot\]'"):
            vitedge.bench(**kw, plot=tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("coreml") / "xs"
    r = vitedge.export("swiftformer_xs", "coreml", out=out, samples=2, imgsz=32, overrides=TINY)
    assert r.exit_code == 0
    return out / "swiftformer_xs.mlpackage"


def test_a_coreml_package_off_macos_and_on_a_tethered_iphone(package, monkeypatch):
    from types import SimpleNamespace

    from vitedge.targets.coreml import iphone
    from vitedge.targets.coreml import EmulatedCoreMLRunner

    r = vitedge.bench(artifact=package, min_iters=2, warmup_s=0.0, max_s=0.0)
    (host,) = r.results
    assert host.backend == "coreml" and host.status == "unavailable" and "macOS" in host.reason
    assert r.artifact["format"] == "mlpackage" and r.artifact["parity"] == "run"

    phone = SimpleNamespace(name="Test iPhone", os_version="18.5", os_build_number="22F76")
    monkeypatch.setattr(iphone, "check_device", lambda spec: phone)
    sent = []

    for wrong, status, code in ((0.0, "passed", 0), (0.5, "failed", 1)):
        def on_phone(path, device, feed, team_id, iterations, bundle_id=None, wrong=wrong):  # the phone: its own outputs
            sent.append((path, device, team_id, iterations))
            with EmulatedCoreMLRunner(path, max_samples=None) as emu:
                y = emu.run_raw(feed)
            return {"load_ms": [30.0, 31.0], "predict_ms": [2.0] * iterations, "outputs": y * (1.0 + wrong)}

        monkeypatch.setattr(iphone, "benchmark_on_device", on_phone)
        r = vitedge.bench(artifact=package, device="iphone", team_id="ABCDE12345", min_iters=3, warmup_s=0.0,
                          max_s=0.0)
        (res,) = r.device["results"]
        assert sent[-1] == (package, phone, "ABCDE12345", 3) and res["predict_ms"]["iters"] == 3
        assert res["parity"]["status"] == status and res["parity"]["mode"] == "device" and r.exit_code == code



def test_an_int8_artifact_is_judged_by_its_profile_on_natural_images_then_timed(tmp_path):
    """A compressed artifact is never judged by the float32 noise rule (quantization error is far above it) nor on
    stress samples: bench --artifact uses the kind's profile on the natural samples that did not calibrate it, as
    export and parity do, and times it once that passes; a corrupted scale still fails it."""
    from vitedge.exporter.verdict import trained_reference as tf

    entry = tf.manifest()["models"]["swiftformer_digits"]
    args = {"checkpoint": tf.FIXTURES / entry["checkpoint"], "overrides": entry["overrides"], "imgsz": entry["imgsz"]}
    report = vitedge.export(entry["model"], "onnx", precision="int8", out=tmp_path / "run", samples=8, **args)
    assert report.exit_code == 0, [(h.hop, h.reason) for h in report.parity]
    path = tmp_path / "run" / report.artifacts["onnx-int8"].path
    r = vitedge.bench(artifact=path, checkpoint=args["checkpoint"], min_iters=3, warmup_s=0.0, max_s=0.0)
    res = r.results[0]
    assert r.artifact["parity"] == "run" and "natural samples" in r.artifact["compressed_inputs"]
    assert res.status == "ok" and res.valid and res.latency is not None, res.reason
    assert set(res.parity_sets) == {"natural"}  # stress samples are not judged for a compressed artifact
    assert res.parity["cosine"] >= 0.95 and res.parity["max_rel"] > 1e-4  # int8 error, far above float32 noise

    graph = onnx.load(str(path))  # the stem conv's int8 weight scales x4: the profile fails it, it is not timed
    scales = [i for i in graph.graph.initializer if i.name.endswith("_scale") and len(i.dims) == 1 and i.dims[0] > 1]
    scale = scales[0]
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 4, scale.name))
    onnx.save(graph, str(tmp_path / "bad.int8.onnx"))
    bad = vitedge.bench(artifact=tmp_path / "bad.int8.onnx", checkpoint=args["checkpoint"], min_iters=3,
                        warmup_s=0.0, max_s=0.0).results[0]
    assert bad.status == "failed" and bad.latency is None and "parity failed" in bad.reason
