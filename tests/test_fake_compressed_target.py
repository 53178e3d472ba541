"""A new target with a compressed precision moves in through its row and the hooks of targets/base.py alone. A fake
target declared in this file only (its Target, its weights reader, its app bundle and its TargetRow, registered
with `register`) gets `export` and `parity` of its int8 artifacts with the weights check, `bench`, `bench
--artifact`, `package` and a matrix cell, with no other file changed.

Its int8 artifact is the pipeline's QDQ graph saved under its own suffix and run on ONNX Runtime; it reads its
stored weights itself (Target.read_weights) and its bundle is a zip with golden vectors checked by its own runner
(Target.bundle_runner): real artifacts judged by the real ladder."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from vitedge import cli
from vitedge.targets import Option, TargetRow, register, unregister
from vitedge.targets.base import Artifact, LowerSpec, StoredWeights, Target
from vitedge.targets.graph.metadata import read_metadata, set_metadata
from vitedge.targets.graph.runtime import OnnxRuntimeRunner
from vitedge.targets.graph.weights import onnx_stored_weights

TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10", "--imgsz", "32"]
READS = []   # the artifacts the fake's own weights reader read


class FakeQTarget(Target):
    """Saves the verified fp32 ONNX, or the pipeline's int8 QDQ graph, as NAME[.int8].fakeq; runs it on ORT."""
    qdq_encoding = "onnxruntime"   # int8: the pipeline writes the QDQ graph in this encoding (spec.qdq_path)

    def lower(self, deploy_model, spec: LowerSpec) -> Artifact:
        model = onnx.load(str(spec.qdq_path if spec.precision == "int8" else spec.onnx_path))
        set_metadata(model, {**read_metadata(model), **spec.metadata, "precision": spec.precision})
        stem = spec.name if spec.precision == "fp32" else f"{spec.name}.{spec.precision}"
        path = Path(spec.out_dir) / f"{stem}{self.suffix}"
        onnx.save(model, str(path))
        return Artifact(self.name, path, spec.precision)

    def runner(self, artifact: Artifact, mode: str | None = None):
        runner = OnnxRuntimeRunner(str(artifact.path))
        runner.backend = "fakeq (onnxruntime)"
        return runner

    def read_metadata(self, path) -> dict:
        return read_metadata(onnx.load(str(path)))

    def read_weights(self, path) -> StoredWeights:
        READS.append(Path(path).name)
        model = onnx.load(str(path))
        return StoredWeights(onnx_stored_weights(model), graph=model)

    def bundle_runner(self, path):
        return self.runner(Artifact(self.name, Path(path), "fp32"))


def package_fakeq(s, out, *, progress=None):
    """The fake's app bundle: its artifact and golden vectors its own runner reproduces, in a deterministic zip."""
    from vitedge.exporter.flow.pipeline import export
    from vitedge.exporter.packaging.bundle import (_npy_bytes, build_bundle, check_bundle_out, finish_bundle,
                                                   golden_vectors, golden_verdict, normalize_pixels)
    from vitedge.exporter.reparam.build_forms import DEMO_SEED, build_train_form
    from vitedge.exporter.verdict.parity import DEFAULT_TOLERANCES, profile_for, run_batched
    from vitedge.models.registry import input_stats, recipe_of

    out = check_bundle_out(out, s.force)
    target = FakeQTarget()
    precision, seed = s.precision, DEMO_SEED if s.seed is None else s.seed
    hop = target.hop_name(precision)

    def run(folder):
        return export(s.replace(out=folder, force=False, seed=seed), progress=progress)

    def assemble(report, folder):
        artifact = folder / report.artifacts[hop].path
        loaded = build_train_form(report.model, s.checkpoint, s.overrides, seed)
        recipe = recipe_of(loaded.model)
        pixels, logits = golden_vectors(loaded.model, report.imgsz, *input_stats(loaded.model),
                                        natural=precision != "fp32", recipe=recipe)
        with target.bundle_runner(artifact) as runner:
            y = run_batched(runner, normalize_pixels(pixels.transpose(0, 3, 1, 2), recipe.mean, recipe.std))
            check = golden_verdict(runner, y, logits, DEFAULT_TOLERANCES[profile_for(precision)])
        files = {f"{report.model}/{artifact.name}": artifact.read_bytes(),
                 f"{report.model}/golden/inputs.npy": _npy_bytes(pixels),
                 f"{report.model}/golden/outputs.npy": _npy_bytes(logits)}
        return finish_bundle(out, report, report.model, files, {"format": "fakeq-bundle/1", "model": report.model,
                                                                       "imgsz": report.imgsz,
                                                                       "weights": report.weights}, check)

    return build_bundle(out, run, hop, assemble)


ROW = TargetRow(
    "fakeq", FakeQTarget, suffixes=(".fakeq",), precisions=("fp32", "int8"), default_precision="fp32",
    options=(Option("--fakeq-note", "unused"),), bench="fakeq-rt", packages=("onnxruntime",),
    bundle=f"{__name__}:package_fakeq")


@pytest.fixture
def fakeq():
    register(ROW)
    READS.clear()
    yield ROW
    unregister(ROW.name)


def _flip_a_channel(src: Path, dst: Path) -> None:
    """`src` (an int8 QDQ graph) saved as `dst` with one output channel of a mid-network weight sign-flipped (its
    per-channel DequantizeLinear scale negated): within what the outputs of a compressed artifact show, not the
    weights'."""
    model = onnx.load(str(src))
    inits = {i.name: i for i in model.graph.initializer}
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits
          and len(inits[n.input[0]].dims) >= 2 and n.input[1] in inits and len(inits[n.input[1]].dims) == 1]
    scale = inits[dq[len(dq) // 2].input[1]]
    v = numpy_helper.to_array(scale).copy()
    v[0] = -v[0]
    scale.CopyFrom(numpy_helper.from_array(v, scale.name))
    onnx.save(model, str(dst))


def test_export_and_parity_of_its_int8_artifact_with_its_weights_read_by_it(fakeq, tmp_path):
    out = tmp_path / "run"
    assert cli.main(["export", *TINY, "--target", "fakeq", "--precision", "int8", "--samples", "16",
                     "--out", str(out), "-q"]) == 0
    report = json.loads((out / "report.json").read_text())
    hop = next(h for h in report["parity"] if h["hop"] == "fakeq")
    assert hop["status"] == "passed" and hop["tolerance"]["profile"] == "int8", hop
    assert hop["weights"]["status"] == "passed" and hop["weights"]["checked"] >= 8, hop["weights"]
    artifact = out / "swiftformer_xs.int8.fakeq"
    assert READS == [artifact.name]

    assert cli.main(["parity", "--artifact", str(artifact), "--samples", "16", "--report",
                     str(tmp_path / "p.json"), "-q"]) == 0  # its suffix names the target, its metadata the precision
    checked = {h["hop"]: h for h in json.loads((tmp_path / "p.json").read_text())["parity"]}
    assert checked["fakeq"]["status"] == "passed" and checked["fakeq"]["weights"]["status"] == "passed"

    planted = tmp_path / "planted.int8.fakeq"
    _flip_a_channel(artifact, planted)
    assert cli.main(["parity", "--artifact", str(planted), "--samples", "16", "--report",
                     str(tmp_path / "bad.json"), "-q"]) == 1
    bad = next(h for h in json.loads((tmp_path / "bad.json").read_text())["parity"] if h["hop"] == "fakeq")
    assert bad["status"] == "failed" and bad["weights"]["status"] == "failed", bad
    assert "weights check" in bad["reason"] and READS[-1] == planted.name


def test_bench_and_bench_artifact(fakeq, tmp_path):
    timing = ["--min-iters", "2", "--max-s", "0.05", "--warmup-s", "0"]
    assert cli.main(["bench", *TINY, "--backends", "torch-deploy,fakeq-rt", "--report", str(tmp_path / "b.json"),
                     *timing, "-q"]) == 0
    timed = {r["backend"]: r for r in json.loads((tmp_path / "b.json").read_text())["results"]}
    assert timed["fakeq-rt"]["status"] == "ok" and timed["fakeq-rt"]["valid"]

    out = tmp_path / "run"
    assert cli.main(["export", *TINY, "--target", "fakeq", "--precision", "int8", "--samples", "16",
                     "--out", str(out), "-q"]) == 0
    assert cli.main(["bench", "--artifact", str(out / "swiftformer_xs.int8.fakeq"), "--report",
                     str(tmp_path / "a.json"), *timing, "-q"]) == 0
    art = json.loads((tmp_path / "a.json").read_text())
    assert art["artifact"]["format"] == "fakeq" and "natural samples" in art["artifact"]["compressed_inputs"]
    assert [(r["backend"], r["status"], r["precision"]) for r in art["results"]] == [("fakeq", "ok", "int8")]
    assert art["results"][0]["valid"]


def test_package_builds_its_own_bundle(fakeq, tmp_path, capsys):
    assert "fakeq" in next(a for a in cli._subparsers(cli.build_parser())["package"]._actions
                           if a.dest == "target").choices
    out = tmp_path / "fake.zip"
    assert cli.main(["package", *TINY, "--target", "fakeq", "--precision", "int8", "--samples", "16",
                     "--out", str(out), "-q"]) == 0
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        manifest = json.loads(z.read("swiftformer_xs/manifest.json"))
    assert {"swiftformer_xs/swiftformer_xs.int8.fakeq", "swiftformer_xs/golden/inputs.npy"} <= names
    assert manifest["format"] == "fakeq-bundle/1" and manifest["golden"]["verified"]["passed"] is True
    assert cli.main(["package", *TINY, "--target", "fakeq", "--ios", "17", "--out", str(tmp_path / "x.zip"),
                     "-q"]) == 2   # --ios is CoreML's: its bundle maker takes none
    assert "--ios applies to --target coreml only" in capsys.readouterr().err


def test_a_matrix_cell_of_its_int8_artifact(fakeq, tmp_path):
    from vitedge.exporter.matrix.cell import run_cell
    from vitedge.exporter.matrix.resolve import resolve_plan

    doc = {"models": [{"name": "swiftformer_xs", "imgsz": 32, "set": {"layers": [1, 1, 1, 1],
                                                                      "embed_dims": [8, 8, 16, 16],
                                                                      "num_classes": 10}}],
           "targets": ["fakeq"], "precisions": ["int8"], "defaults": {"samples": 16}}
    [cell] = resolve_plan(doc, tmp_path).cells
    assert cell.id == "swiftformer_xs/32/fakeq-int8"
    result = run_cell(cell.to_dict(), str(tmp_path / "cell"))
    assert result["status"] == "passed", result["reason"]
    hop = next(h for h in result["report"]["parity"] if h["hop"] == "fakeq")
    assert hop["weights"]["status"] == "passed"
    assert np.isfinite(hop["metrics"]["cosine"])
