"""A new target moves in through one room: its row. A fake target declared in this file alone (a Target subclass
and its TargetRow, registered with `register`) gets its flag in the CLI, `export`, `parity`, `bench`,
`bench --artifact`, `bench --device` on its own tethered device (its DeviceBench) and a matrix cell, with no other
file changed.

It "lowers" by saving the deploy-form's simplified ONNX (with vitedge's metadata and its one option) under its own
suffix, and runs it on ONNX Runtime: a real artifact judged by the real ladder."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from vitedge import cli
from vitedge.targets import TARGETS, TargetRow, Option, register, unregister
from vitedge.targets.base import Artifact, DeviceBench, LowerSpec, Target
from vitedge.targets.graph.metadata import read_metadata, set_metadata
from vitedge.targets.onnx.target import OnnxRuntimeRunner

TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10", "--imgsz", "32"]


class FakeRunner(OnnxRuntimeRunner):
    pass


class FakeTarget(Target):
    """Saves the verified ONNX as NAME.fake; its runner is ONNX Runtime on that file."""

    def lower(self, deploy_model, spec: LowerSpec) -> Artifact:
        model = onnx.load(str(spec.onnx_path))
        note = spec.options.get("fake_note")
        set_metadata(model, dict(spec.metadata, fake_note=note))
        path = Path(spec.out_dir) / f"{spec.name}{self.suffix}"
        onnx.save(model, str(path))
        return Artifact(self.name, path, spec.precision, info={"note": note})

    def runner(self, artifact: Artifact, mode: str | None = None):
        runner = FakeRunner(str(artifact.path))
        runner.backend = "fake (onnxruntime)"
        return runner

    def read_metadata(self, path) -> dict:
        return read_metadata(onnx.load(str(path)))

    def device_bench(self, kind):
        return FakePhoneBench() if kind == "fakephone" else None


class FakePhoneBench(DeviceBench):
    """A tethered "device" that is ONNX Runtime here: it times nothing real, it proves the bench's wiring."""
    kind, compute_units, parity_samples, precision = "fakephone", "CPU", 4, "fp32"
    connected: list = []

    def connect(self, spec):
        from types import SimpleNamespace

        self.connected.append(spec)
        return SimpleNamespace(name=spec.partition(":")[2] or "phone", os_version="1.0", os_build_number="1A")

    def run(self, path, device, feed, team_id, iterations, bundle_id=None):
        with FakeRunner(str(path)) as r:   # one sample at a time, as a device is sent them
            y = np.concatenate([r.run(x[None]) for x in feed])
        return {"load_ms": [1.0, 1.0], "predict_ms": [0.5] * iterations, "outputs": y}


ROW = TargetRow(
    "fake", FakeTarget, suffixes=(".fake",), precisions=("fp32",), default_precision="fp32",
    options=(Option("--fake-note", "a note the fake target stores in its artifact"),),
    bench="fake-rt", aliases=("fk",), packages=("onnxruntime",), ray_resources={"fakes": 1}, devices=("fakephone",))


@pytest.fixture
def fake():
    register(ROW)
    yield ROW
    unregister(ROW.name)


def test_the_row_gives_the_target_its_flag_and_its_facts(fake):
    parser = cli.build_parser()
    export = cli._subparsers(parser)["export"]
    group = next(g for g in export._action_groups if g.title == "fake")
    assert [a.option_strings for a in group._group_actions] == [["--fake-note"]]
    args = parser.parse_args(["export", "--target", "fk", "--fake-note", "hi"])
    assert args.fake_note == "hi" and "fake_note" in cli.target_options()
    assert "fake-rt" in cli.bench_backends()
    target = FakeTarget()
    assert (target.name, target.suffix, target.precisions, target.options) == ("fake", ".fake", ("fp32",),
                                                                              ("fake_note",))
    assert "fake" not in TARGETS or TARGETS["fake"] is ROW


def test_export_parity_bench_and_bench_artifact(fake, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["export", *TINY, "--target", "onnx,fake", "--fake-note", "from the flag", "--samples", "8",
                     "--out", str(out), "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    hop = next(h for h in report["parity"] if h["hop"] == "fake")
    assert hop["status"] == "passed" and hop["mode"] == "device"
    assert report["artifacts"]["fake"]["info"]["note"] == "from the flag"
    artifact = out / "swiftformer_xs.fake"
    assert read_metadata(onnx.load(str(artifact)))["fake_note"] == "from the flag"

    assert cli.main(["parity", "--artifact", str(artifact), "--samples", "8", "--report",
                     str(tmp_path / "p.json"), "-q"]) == 0  # its suffix names the target
    checked = json.loads((tmp_path / "p.json").read_text())
    assert [h["hop"] for h in checked["parity"]] == ["deploy-form", "fake"]
    assert all(h["status"] == "passed" for h in checked["parity"])

    bench = ["--min-iters", "2", "--max-s", "0.05", "--warmup-s", "0"]
    assert cli.main(["bench", *TINY[:-2], "--imgsz", "32", "--backends", "torch-deploy,fake-rt",
                     "--report", str(tmp_path / "b.json"), *bench, "-q"]) == 0
    timed = {r["backend"]: r for r in json.loads((tmp_path / "b.json").read_text())["results"]}
    assert timed["fake-rt"]["status"] == "ok" and timed["fake-rt"]["valid"] and timed["fake-rt"]["latency"]

    assert cli.main(["bench", "--artifact", str(artifact), "--report", str(tmp_path / "a.json"), *bench,
                     "-q"]) == 0
    art = json.loads((tmp_path / "a.json").read_text())
    assert art["artifact"]["format"] == "fake" and art["artifact"]["parity"] == "run"
    assert [(r["backend"], r["status"]) for r in art["results"]] == [("fake", "ok")]

    assert cli.main(["bench", "--artifact", str(artifact), "--device", "fakephone", "--report",
                     str(tmp_path / "d.json"), *bench, "-q"]) == 0   # on its own tethered device (DeviceBench)
    [on_device] = json.loads((tmp_path / "d.json").read_text())["device"]["results"]
    assert on_device["parity"]["status"] == "passed" and FakePhoneBench.connected[-1] == "fakephone"
    capsys.readouterr()
    assert cli.main(["bench", "--artifact", str(out / "swiftformer_xs.onnx"), "--device", "fakephone",
                     *bench, "-q"]) == 2   # an ONNX graph is not timed on the fake's device
    assert "--device fakephone times a fake artifact" in capsys.readouterr().err


def test_bench_on_its_own_tethered_device(fake, tmp_path):
    """`bench --device KIND` reaches a device through the target whose row lists KIND (its DeviceBench): the model
    bench lowers with that target (from the ONNX graph, as its row says) and judges the device's golden vectors."""
    timing = ["--min-iters", "3", "--max-s", "0.05", "--warmup-s", "0"]
    assert cli.main(["bench", *TINY, "--backends", "torch-deploy", "--device", "fakephone:desk",
                     "--report", str(tmp_path / "b.json"), *timing, "-q"]) == 0
    device = json.loads((tmp_path / "b.json").read_text())["device"]
    assert (device["name"], device["type"], device["compute_units"]) == ("desk", "fakephone", "CPU")
    [result] = device["results"]
    assert result["parity"]["status"] == "passed" and result["parity"]["samples"] == 4
    assert result["parity"]["tolerance"]["profile"] == "fp32" and result["predict_ms"]["iters"] == 3
    assert FakePhoneBench.connected[-1] == "fakephone:desk"


def test_several_sizes_make_one_file_per_size_of_a_target_without_entries(fake, tmp_path):
    """As a TensorRT engine is: a target whose row declares no functions / methods gets a file per size."""
    out = tmp_path / "sizes"
    args = [a for a in TINY if a not in ("--imgsz", "32")]
    assert cli.main(["export", *args, "--imgsz", "32,64", "--target", "fake", "--samples", "4", "--out", str(out),
                     "-q"]) == 0
    d = json.loads((out / "report.json").read_text())
    assert {k: a["path"] for k, a in d["artifacts"].items() if k.startswith("fake")} == {
        "fake@32x32": "swiftformer_xs_32x32.fake", "fake@64x64": "swiftformer_xs_64x64.fake"}
    assert {(h["size"], h["status"]) for h in d["parity"] if h["hop"] == "fake"} == {("32x32", "passed"),
                                                                                     ("64x64", "passed")}
    assert read_metadata(onnx.load(str(out / "swiftformer_xs_64x64.fake")))["imgsz"] == 64


def test_a_matrix_cell(fake, tmp_path):
    from vitedge.exporter.matrix.cache import Env, cell_key
    from vitedge.exporter.matrix.cell import run_cell
    from vitedge.exporter.matrix.ray_engine import resources_for
    from vitedge.exporter.matrix.resolve import resolve_plan

    doc = {"models": [{"name": "swiftformer_xs", "imgsz": 32, "set": {"layers": [1, 1, 1, 1],
                                                                      "embed_dims": [8, 8, 16, 16],
                                                                      "num_classes": 10}}],
           "targets": ["fake"], "defaults": {"samples": 8, "fake_note": "from the plan"}}
    plan = resolve_plan(doc, tmp_path)
    [cell] = plan.cells
    assert (cell.id, cell.options) == ("swiftformer_xs/32/fake-fp32", {"fake_note": "from the plan"})
    _, inputs, uncacheable = cell_key(cell, Env())
    assert "onnxruntime" in inputs["toolchain"] and uncacheable is None
    assert resources_for(cell) == {"CPU": 1.0, "fakes": 1.0}
    result = run_cell(cell.to_dict(), str(tmp_path / "cell"))
    assert result["status"] == "passed", result["reason"]
    assert result["report"]["artifacts"]["fake"]["info"]["note"] == "from the plan"
    shutil.rmtree(tmp_path / "cell")
