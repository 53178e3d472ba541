"""The executorch target: `.pte` programs lowered from the deploy-form, run here by ExecuTorch's own runtime
(a real "device" hop), judged by the same rules as every artifact; planted errors in a saved program fail;
the Android bundle; `.pte` in bench; the refusal without the package. (Delegation per family and int8 on
trained weights: test_executorch_delegation.py.)"""
from __future__ import annotations

import json
import sys

import pytest

import executorch  # noqa: F401 - a missing package fails here, loudly (CI installs it)

from vitedge import cli
from vitedge.exporter.reparam.build_forms import build_deploy_form, build_train_form
from vitedge.exporter.flow.pipeline import export
from vitedge.targets import get_target
from vitedge.targets.base import LowerSpec
from vitedge.targets.executorch.target import read_metadata
from vitedge.tests._families import CASES
from vitedge.targets.plants import plant_pte_weight

SMALL = CASES["swiftformer"]
SMALL_FLAGS = ["--model", SMALL[0], "--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
               "--set", "num_classes=10", "--imgsz", str(SMALL[2])]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """One fp32 export of the small SwiftFormer with labels, through the CLI."""
    root = tmp_path_factory.mktemp("et")
    labels = root / "labels.txt"
    labels.write_text("\n".join(f"class{i}" for i in range(10)) + "\n")
    out = root / "out"
    code = cli.main(["export", *SMALL_FLAGS, "--target", "executorch", "--labels", str(labels), "--out", str(out),
                     "--samples", "16"])
    return code, out, json.loads((out / "report.json").read_text())


def test_fp32_export_runs_on_executorch_and_passes_as_a_device_hop(exported):
    code, out, rep = exported
    hop = next(h for h in rep["parity"] if h["hop"] == "executorch")
    assert code == 0 and hop["status"] == "passed" and hop["mode"] == "device"
    assert hop["backend"].startswith("executorch ") and "xnnpack" in hop["backend"]
    art = rep["artifacts"]["executorch"]
    assert art["path"] == f"{SMALL[0]}.pte" and (out / art["path"]).is_file()
    # (this family's check of tests/test_executorch_delegation.py: no op outside XNNPACK, the rewrites applied)
    assert art["info"]["fully_delegated"] is True and art["info"]["outside_delegate"] == {}
    rewrites = art["info"]["rewrites"]
    assert rewrites["applied"] and not rewrites.get("refused")
    assert rewrites["float64_rel_err"] <= rewrites["gate"]


def test_the_host_run_is_labelled_as_a_host_run_not_a_phone_run(exported, capsys):
    """ExecuTorch's runtime here runs on this machine's CPU: report.json keeps `mode: "device"` (users' scripts
    read it) and adds `runner.host`; the summary shows "device (x86 host)" on an x86 machine, so no reader takes
    the hop for a phone run."""
    import platform

    from vitedge.exporter.command_line.summary import format_summary
    from vitedge.exporter.core.report import Report
    from vitedge.targets.executorch.target import host_cpu

    code, out, rep = exported
    hop = next(h for h in rep["parity"] if h["hop"] == "executorch")
    assert hop["mode"] == "device" and hop["runner"]["host"] == host_cpu()
    assert host_cpu("x86_64") == host_cpu("AMD64") == "x86" and host_cpu("aarch64") == host_cpu("arm64") == "arm64"
    expected = f"device ({host_cpu()} host)"
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert expected == "device (x86 host)"
    table = format_summary(Report.from_dict(rep))
    row = next(line for line in table.splitlines() if line.lstrip().startswith("executorch "))
    assert expected in row
    # a hop whose runner names no host (ONNX Runtime here, CoreML on a Mac) keeps its plain mode
    onnx_row = next(line for line in table.splitlines() if line.lstrip().startswith("onnx "))
    assert "host)" not in onnx_row


def test_the_android_runtime_is_the_exporting_release():
    from vitedge.exporter.packaging.package_android import android_runtime

    r = android_runtime("1.5.1+cpu")
    assert r["maven"] == "org.pytorch:executorch-android:1.5.1" and r["version"] == "1.5.1"
    assert r["gradle"] == 'implementation("org.pytorch:executorch-android:1.5.1")'


def test_the_program_carries_its_metadata(exported):
    _, out, rep = exported
    meta = read_metadata(out / f"{SMALL[0]}.pte")
    assert meta["model"] == SMALL[0] and meta["imgsz"] == SMALL[2] and meta["precision"] == "fp32"
    assert meta["labels"] == [f"class{i}" for i in range(10)]
    assert meta["num_classes"] == 10  # checked against a --checkpoint's before any work
    assert meta["preprocess"] == rep["preprocess"] and meta["executorch_backend"] == "xnnpack"


def test_the_programs_stored_weights_read_back_exactly(exported):
    """targets/executorch/weights.py reads every XNNPACK filter back from the program's bytes: in an fp32 program
    each Conv/Linear weight is its deploy-form parameter exactly, in the parameter's layout, paired by its values;
    the channel sums the rewrites add (1x1 convolutions with ones) pair with nothing."""
    import numpy as np
    from vitedge.exporter.verdict.weight_check import by_nearest
    from vitedge.targets.executorch.weights import read_weights

    _, out, _ = exported
    deploy, _ = build_deploy_form(build_train_form(SMALL[0], overrides=SMALL[1]).model, SMALL[2])
    params = {n: p.detach().numpy() for n, p in deploy.named_parameters() if p.ndim >= 2}
    stored = read_weights(out / f"{SMALL[0]}.pte")
    named = by_nearest({w.name: w.value for w in stored}, {n: p.astype(np.float64) for n, p in params.items()})
    assert {w.dtype for w in stored} == {"fp32"} and set(params) <= set(named)
    assert all(np.array_equal(named[n].reshape(p.shape), p) for n, p in params.items())
    rest = [v for n, v in named.items() if n not in params]
    assert len(rest) == len(stored) - len(params) and all(np.all(v == 1.0) for v in rest)


@pytest.mark.parametrize("plant", ["zero_layer", "sign_flip", "x1.01"])
def test_errors_planted_in_the_saved_program_fail_parity(exported, tmp_path, plant):
    """A zeroed layer, a sign-flipped and a 1 % output channel of one mid-network weight, in the .pte's bytes:
    `vitedge parity --artifact` exits 1 and says why (the untouched program passes: the test below)."""
    _, out, _ = exported
    src = out / f"{SMALL[0]}.pte"
    train = build_train_form(SMALL[0], overrides=SMALL[1]).model
    deploy, _ = build_deploy_form(train, SMALL[2])
    weights = [p for n, p in deploy.named_parameters() if p.ndim >= 2 and "pwconv1" in n]
    dst = tmp_path / src.name
    plant_pte_weight(src, dst, weights[len(weights) // 2].detach().numpy(), plant)
    bad = cli.main(["parity", *SMALL_FLAGS, "--samples", "16", "--artifact", str(dst), "--report",
                    str(tmp_path / "bad.json")])
    hop = json.loads((tmp_path / "bad.json").read_text())["parity"][-1]
    assert bad == 1 and hop["status"] == "failed" and "not localized" in hop["reason"]


def test_the_untouched_program_passes_the_same_parity_check(exported, tmp_path):
    _, out, _ = exported
    good = cli.main(["parity", *SMALL_FLAGS, "--samples", "16", "--artifact", str(out / f"{SMALL[0]}.pte"),
                     "--report", str(tmp_path / "good.json")])
    hop = json.loads((tmp_path / "good.json").read_text())["parity"][-1]
    assert good == 0 and hop["hop"] == "executorch" and hop["status"] == "passed" and hop["mode"] == "device"


def test_rewrites_off_leaves_the_ops_outside_and_says_which(tmp_path):
    name, overrides, imgsz = SMALL
    deploy, _ = build_deploy_form(build_train_form(name, overrides=overrides).model, imgsz)
    art = get_target("executorch").lower(deploy, LowerSpec(name, imgsz, 1, "fp32", tmp_path, None,
                                                          metadata={"mean": [0.5] * 3},
                                                          options={"executorch_rewrites": "off"}))
    assert art.info["fully_delegated"] is False and "rewrites" not in art.info
    assert {"sum.dim_IntList"} <= set(art.info["outside_delegate"])  # SwiftFormer's l2 normalization


def test_without_the_package_the_target_is_refused_with_the_pip_hint(tmp_path, monkeypatch, capsys):
    for mod in [m for m in sys.modules if m == "executorch" or m.startswith("executorch.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "executorch", None)  # import executorch -> ImportError
    out = tmp_path / "never"
    assert cli.main(["export", *SMALL_FLAGS, "--target", "onnx,executorch", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'vitedge[executorch]'" in err[0]
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_portable_backend_refuses_int8_before_any_work(tmp_path, capsys):
    out = tmp_path / "never"
    code = cli.main(["export", *SMALL_FLAGS, "--target", "executorch", "--executorch-backend", "portable",
                     "--precision", "int8", "--out", str(out)])
    assert code == 2 and "xnnpack" in capsys.readouterr().err and not out.exists()


def test_portable_backend_runs_without_a_delegate(tmp_path):
    rep = export(SMALL[0], "executorch", overrides=SMALL[1], imgsz=SMALL[2], samples=8, out=tmp_path / "p",
                 options={"executorch_backend": "portable"})
    hop = rep.hop("executorch")
    info = rep.artifacts["executorch"].info
    assert rep.exit_code == 0 and hop.status == "passed" and hop.mode == "device"
    assert info["delegate_calls"] == 0 and info["fully_delegated"] is False and info["outside_delegate"]


def test_android_bundle_is_deterministic_on_any_thread_count_and_checks_its_golden_vectors(tmp_path, monkeypatch,
                                                                                           capsys):
    import hashlib
    import os
    import zipfile

    import torch

    from vitedge.exporter.packaging.package_android import package_executorch
    from vitedge.targets.executorch.target import default_pool_threads, set_threads

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"c{i}" for i in range(10)) + "\n")
    kw = dict(overrides=SMALL[1], imgsz=SMALL[2], samples=8, labels=labels)
    # one bundle by the command line (the suite's torch: 1 thread), the other by the API on 2 threads
    out = tmp_path / "a.zip"
    code = cli.main(["package", *SMALL_FLAGS, "--target", "executorch", "--ios", "17", "--out", str(out)])
    assert code == 2 and "--ios applies to --target coreml only" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [labels]
    code = cli.main(["package", *SMALL_FLAGS, "--target", "executorch", "--samples", "8", "--labels", str(labels),
                     "--out", str(out)])
    assert code == 0 and "executorch hop passed (device" in capsys.readouterr().out
    threads = torch.get_num_threads()
    monkeypatch.setenv("VITEDGE_THREADS", "2")  # ONNX Runtime's and XNNPACK's pools
    set_threads(2)
    torch.set_num_threads(2)
    try:
        b = package_executorch(SMALL[0], tmp_path / "b.zip", **kw)
        from executorch.extension.pybindings import portable_lib

        # (what the package pinned to one thread is given back)
        assert torch.get_num_threads() == 2 and os.environ["VITEDGE_THREADS"] == "2"
        assert portable_lib._threadpool_get_thread_count() == 2
    finally:
        torch.set_num_threads(threads)
        set_threads(default_pool_threads())
    assert b.exit_code == 0
    root = SMALL[0]
    assert zipfile.ZipFile(out).read(f"{root}/manifest.json") == zipfile.ZipFile(b.path).read(f"{root}/manifest.json")
    assert out.read_bytes() == b.path.read_bytes()
    names = set(zipfile.ZipFile(out).namelist())
    assert {f"{root}/{f}" for f in ("swiftformer_xs.pte", "labels.txt", "golden/inputs.npy", "golden/outputs.npy",
                                    "golden/golden.json", "README.md", "manifest.json")} == names
    m = b.manifest
    assert m["golden"]["verified"]["passed"] is True and m["golden"]["verified"]["mode"] == "device"
    assert m["delegation"]["fully_delegated"] is True and m["labels"]["count"] == 10
    readme = zipfile.ZipFile(out).read(f"{root}/README.md").decode()
    assert "org.pytorch.executorch.Module" in readme and "Module.load" in readme
    # the runtime's real Maven coordinates (group org.pytorch), pinned to the release that wrote the program
    import importlib.metadata
    version = importlib.metadata.version("executorch").split("+")[0]
    assert m["android_runtime"]["maven"] == f"org.pytorch:executorch-android:{version}"
    assert f'implementation("org.pytorch:executorch-android:{version}")' in readme
    assert "org.pytorch.executorch:executorch-android" not in readme
    pte = zipfile.ZipFile(out).read(f"{root}/swiftformer_xs.pte")
    assert m["files"]["swiftformer_xs.pte"] == hashlib.sha256(pte).hexdigest()


def test_bench_artifact_times_a_pte(exported):
    from vitedge.exporter.timing.bench_artifact import bench_artifact

    _, out, _ = exported
    rep = bench_artifact(out / f"{SMALL[0]}.pte", min_iters=3, max_s=0.2, warmup_s=0.01)
    res = next(r for r in rep.results if r.backend == "executorch")
    assert rep.artifact["format"] == "pte" and rep.artifact["parity"] == "run"
    assert res.status == "ok" and res.mode == "device" and res.valid and res.latency["p50_ms"] > 0


def test_bench_lowers_and_times_executorch_beside_onnx_runtime(tmp_path):
    from vitedge.exporter.timing.bench import run_bench

    rep = run_bench(SMALL[0], backends="onnxruntime,executorch", imgsz=SMALL[2], overrides=SMALL[1], threads=1,
                    warmup_s=0.01, min_iters=3, max_s=0.2, tmp_dir=tmp_path)
    res = {r.backend: r for r in rep.results}
    assert res["executorch"].status == "ok" and res["executorch"].mode == "device" and res["executorch"].valid
    assert res["executorch"].precision == "fp32" and res["executorch"].latency["p50_ms"] > 0
    assert res["onnxruntime"].valid
