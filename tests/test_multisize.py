"""Several input sizes in one export: every size through the ladder, an ONNX file per size, one CoreML
multifunction package and one ExecuTorch program of every size, each function / method its own hop.

One export (module-scoped) carries two planted errors, one per one-file target, each in one size only: a CoreML
function's weight changed in the saved package's bytes (that function alone: targets/plants.py), and one method
of the ExecuTorch program lowered from a deploy-form with a changed channel. Each planted size's hop must fail and
the other size's hop of the same artifact must pass.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from vitedge import cli
from vitedge.exporter.core.report import Report
from vitedge.exporter.flow.pipeline import export

pytest.importorskip("coremltools")
pytest.importorskip("executorch")

SWIFT = dict(layers=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], num_classes=10)
TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10"]
PLANTED_COREML, PLANTED_PTE = "32x64", "32x32"  # the size whose function / method carries the planted error


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    from vitedge.targets import plants
    from vitedge.targets.coreml import target as coreml_target
    from vitedge.targets.executorch import target as et_target

    real_merge, real_exported = coreml_target.merge_functions, et_target._exported

    def merge_then_plant(parts, sizes, path):
        done = real_merge(parts, sizes, path)
        plants.plant_function_weights(path, f"size_{PLANTED_COREML}", "x10", 0.5)
        return done

    def exported_planted(model, spec, backend):
        if et_target.as_hw(spec.imgsz) == tuple(map(int, PLANTED_PTE.split("x"))):
            model = copy.deepcopy(model)
            conv = [m for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
            w = conv[len(conv) // 2].weight
            with torch.no_grad():
                w.copy_(torch.from_numpy(plants.change_weight(w.numpy(), "x10")))
        return real_exported(model, spec, backend)

    out = tmp_path_factory.mktemp("multisize") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(coreml_target, "merge_functions", merge_then_plant)
        mp.setattr(et_target, "_exported", exported_planted)
        report = export("swiftformer_xs", targets="onnx,coreml,executorch", imgsz="32,32x64", overrides=SWIFT,
                        out=out, samples=8)
    return report, out


def _hops(report, name):
    return {h.size: h for h in report.parity if h.hop == name}


def test_every_size_runs_the_ladder_and_onnx_is_one_file_per_size(planted):
    report, out = planted
    assert [s["size"] for s in report.sizes] == ["32x32", "32x64"]
    for hop in ("deploy-form", "onnx", "onnx-simplified"):
        hops = _hops(report, hop)
        assert set(hops) == {"32x32", "32x64"} and all(h.status == "passed" for h in hops.values()), hops
    for s in report.sizes:  # each size's own float64 gate
        assert s["reparam"]["equivalence"]["passed"] is True and s["entry"] == f"size_{s['size']}"
        assert s["files"]["onnx"].endswith(f"swiftformer_xs_{s['size']}.onnx")
    folder = out / report.quarantine  # (a planted hop failed: the artifacts are quarantined)
    assert sorted(p.name for p in folder.glob("*.onnx")) == [
        "swiftformer_xs_32x32.onnx", "swiftformer_xs_32x32.raw.onnx",  # (.raw: each size's graph before onnxsim)
        "swiftformer_xs_32x64.onnx", "swiftformer_xs_32x64.raw.onnx"]
    import onnx
    dims = [[d.dim_value for d in onnx.load(str(folder / f"swiftformer_xs_{s}.onnx")).graph.input[0].type
             .tensor_type.shape.dim] for s in ("32x32", "32x64")]
    assert dims == [[1, 3, 32, 32], [1, 3, 32, 64]]


def test_coreml_is_one_multifunction_package_with_shared_weights_and_a_hop_per_function(planted):
    from vitedge.targets.coreml.mil_interpreter import load_program
    from vitedge.targets.coreml.multifunction import function_names

    report, out = planted
    package = out / report.artifacts["coreml"].path
    assert function_names(package) == ["size_32x32", "size_32x64"]
    shapes = [load_program(package, f).inputs["image"][1] for f in ("size_32x32", "size_32x64")]
    assert [tuple(s[-2:]) for s in shapes] == [(32, 32), (32, 64)]
    info = report.artifacts["coreml"].info
    assert info["functions"] == {"size_32x32": [32, 32], "size_32x64": [32, 64]}
    assert info["ios"] == 18 and "iOS 18" in info["ios_raised"]
    # weights stored once: the package is not two packages' worth (measured before the plant appended one weight)
    assert info["weight_bytes"] < 0.6 * info["separate_weight_bytes"], info
    hops = _hops(report, "coreml")
    assert {s: h.entry for s, h in hops.items()} == {"32x32": "size_32x32", "32x64": "size_32x64"}
    assert hops["32x32"].status == "passed" and hops["32x32"].mode == "emulated", hops["32x32"].reason
    bad = hops[PLANTED_COREML]  # judged on its outputs (it loaded and ran), and its stored weights caught too
    assert bad.status == "failed" and bad.metrics is not None and bad.weights["status"] == "failed", bad
    assert hops["32x32"].runner["function"] == "size_32x32"


def test_executorch_is_one_program_with_a_method_per_size_each_judged(planted):
    from vitedge.targets.executorch.target import read_metadata

    report, out = planted
    pte = out / report.artifacts["executorch"].path
    assert read_metadata(pte)["methods"] == {"size_32x32": [32, 32], "size_32x64": [32, 64]}
    hops = _hops(report, "executorch")
    assert hops["32x64"].status == "passed" and hops["32x64"].runner["method"] == "size_32x64", hops["32x64"]
    bad = hops[PLANTED_PTE]
    assert bad.status == "failed" and bad.metrics is not None and bad.entry == "size_32x32", bad
    assert report.exit_code == 1


def test_report_json_keeps_every_field_and_adds_the_sizes(planted):
    report, out = planted
    d = json.loads((out / "report.json").read_text())
    assert d["imgsz"] == 32 and d["samples"] == report.sizes[0]["samples"]  # the single-size fields: the first size
    assert {h["size"] for h in d["parity"]} == {"32x32", "32x64"}
    assert Report.from_dict(d).sizes == d["sizes"]
    assert set(d["artifacts"]) == {"onnx@32x32", "onnx@32x64", "coreml", "executorch"}


def test_the_summary_names_each_hop_with_its_size(planted):
    from vitedge.exporter.command_line.summary import format_summary

    report, _ = planted
    failed_line = next(line for line in format_summary(report).splitlines() if line.startswith("FAILED"))
    assert f"coreml @{PLANTED_COREML}" in failed_line and f"executorch @{PLANTED_PTE}" in failed_line


# ---- `vitedge parity` on a multi-size artifact: every function / method / per-size file, each at its size -----

def _artifact(planted, key: str) -> Path:
    report, out = planted
    return out / report.artifacts[key].path


@pytest.fixture(scope="module")
def checked(planted):
    """`parity` run as a user would on the planted export's CoreML package and ExecuTorch program."""
    from vitedge.exporter.flow.verify import parity

    return {key: parity(artifact=_artifact(planted, key), samples=8) for key in ("coreml", "executorch")}


@pytest.mark.parametrize("key,bad,runs", [("coreml", PLANTED_COREML, "function"),
                                          ("executorch", PLANTED_PTE, "method")])
def test_parity_judges_every_function_and_method_at_its_own_size(checked, key, bad, runs):
    report = checked[key]
    good = next(s for s in ("32x32", "32x64") if s != bad)
    assert [(h.hop, h.size) for h in report.parity] == [("deploy-form", "32x32"), (key, "32x32"),
                                                         ("deploy-form", "32x64"), (key, "32x64")]
    hops = _hops(report, key)
    for size, h in hops.items():  # each entry ran itself, on its own size's parity set
        assert h.entry == f"size_{size}" and h.runner[runs] == h.entry and h.samples > 0, h
    assert hops[good].status == "passed", hops[good].reason
    assert hops[bad].status == "failed" and hops[bad].metrics is not None, hops[bad]
    if key == "coreml":  # the planted function's stored weights are the ones read
        assert hops[bad].weights["status"] == "failed" and hops[good].weights["status"] == "passed"
    assert report.exit_code == 1 and report.imgsz == 32 and list(report.artifacts) == [key]
    assert [(s["size"], s["entry"], s["imgsz"], s["samples"]) for s in report.sizes] == [
        ("32x32", "size_32x32", [32, 32], 8), ("32x64", "size_32x64", [32, 64], 8)]


def test_parity_imgsz_picks_the_sizes_it_checks_and_names_those_held(planted, tmp_path, capsys):
    pte, where = _artifact(planted, "executorch"), tmp_path / "report.json"
    assert cli.main(["parity", "--artifact", str(pte), "--imgsz", "32x64", "--samples", "8", "--report", str(where),
                     "-q"]) == 0
    d = json.loads(where.read_text())
    assert [(h["hop"], h["size"], h["entry"], h["status"]) for h in d["parity"]] == [
        ("deploy-form", "32x64", None, "passed"), ("executorch", "32x64", "size_32x64", "passed")]
    assert (d["imgsz"], d["input_size"], [s["size"] for s in d["sizes"]]) == ("32x64", [32, 64], ["32x64"])
    capsys.readouterr()
    assert cli.main(["parity", "--artifact", str(pte), "--imgsz", "64", "--report", str(tmp_path / "no.json"),
                     "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--imgsz 64" in err and "32, 32x64" in err, err
    assert not (tmp_path / "no.json").exists()


def test_parity_with_a_deploy_checkpoint_checks_the_size_it_was_folded_for(planted, tmp_path, capsys):
    """A deploy checkpoint holds one size: with a program of two, the other size is exit 2 before any work, naming
    the --imgsz that picks the checkpoint's."""
    pte, ckpt = _artifact(planted, "executorch"), tmp_path / "deploy.pth"
    assert cli.main(["reparam", *TINY, "--imgsz", "32", "--out", str(ckpt), "-q"]) == 0
    capsys.readouterr()
    assert cli.main(["parity", "--artifact", str(pte), "--deploy-checkpoint", str(ckpt), "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "folded for imgsz 32" in err and "--imgsz 32" in err, err
    where = tmp_path / "report.json"
    assert cli.main(["parity", "--artifact", str(pte), "--deploy-checkpoint", str(ckpt), "--imgsz", "32",
                     "--samples", "8", "--report", str(where), "-q"]) == 1  # (its 32x32 method is the planted one)
    d = json.loads(where.read_text())
    assert [(h["hop"], h["size"], h["status"]) for h in d["parity"]] == [("deploy-form", "32x32", "passed"),
                                                                        ("executorch", "32x32", "failed")]


def test_parity_takes_the_per_size_onnx_files_each_judged_at_its_size(planted, tmp_path):
    """Both per-size ONNX files in one run, one of them with a planted channel: that file's hop fails, the other
    passes, and the report keys each file by its size."""
    import onnx

    from vitedge.targets.plants import plant_channel_scale

    good = _artifact(planted, "onnx@32x32")
    bad = tmp_path / "swiftformer_xs_32x64.onnx"
    onnx.save(plant_channel_scale(onnx.load(str(_artifact(planted, "onnx@32x64"))), 4.0)[0], str(bad))
    where = tmp_path / "report.json"
    assert cli.main(["parity", "--artifact", str(good), "--artifact", str(bad), "--samples", "8", "--report",
                     str(where), "-q"]) == 1
    d = json.loads(where.read_text())
    assert [(h["hop"], h["size"], h["status"]) for h in d["parity"]] == [
        ("deploy-form", "32x32", "passed"), ("onnx", "32x32", "passed"),
        ("deploy-form", "32x64", "passed"), ("onnx", "32x64", "failed")]
    assert {k: Path(a["path"]).name for k, a in d["artifacts"].items()} == {
        "onnx@32x32": "swiftformer_xs_32x32.onnx", "onnx@32x64": "swiftformer_xs_32x64.onnx"}
    assert [s["files"] for s in d["sizes"]] == [{"onnx": str(good)}, {"onnx": str(bad)}]


def test_parity_refuses_files_of_different_exports_before_any_work(planted, tmp_path, capsys):
    import onnx

    from vitedge.targets.graph.metadata import read_metadata, set_metadata

    src = _artifact(planted, "onnx@32x64")
    other = onnx.load(str(src))
    set_metadata(other, {**read_metadata(other), "overrides": {**SWIFT, "num_classes": 5}})
    onnx.save(other, str(tmp_path / "other.onnx"))
    assert cli.main(["parity", "--artifact", str(_artifact(planted, "onnx@32x32")), "--artifact",
                     str(tmp_path / "other.onnx"), "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "another overrides" in err and "separate" in err, err


def test_one_non_square_size_runs_coreml_and_executorch_and_keeps_its_file_names(tmp_path):
    """A single size, not square: the CoreML package (through the MIL interpreter) and the ExecuTorch program
    (through XNNPACK) are made at H x W and judged there; the files keep their single-size names, and `parity`
    reads the size back from each artifact."""
    from vitedge.exporter.core.settings import written
    from vitedge.targets.coreml.mil_interpreter import load_program
    from vitedge.targets.executorch.target import read_metadata

    out = tmp_path / "wide"
    assert cli.main(["export", *TINY, "--imgsz", "32x64", "--target", "onnx,coreml,executorch", "--out", str(out),
                     "--samples", "8", "-q"]) == 0
    d = json.loads((out / "report.json").read_text())
    assert (d["imgsz"], d["input_size"], d["sizes"]) == ("32x64", [32, 64], None)
    assert all(h["size"] is None and h["entry"] is None and h["status"] == "passed" for h in d["parity"]), d["parity"]
    hops = {h["hop"]: h for h in d["parity"]}
    assert hops["coreml"]["mode"] == "emulated" and hops["executorch"]["mode"] == "device"
    assert "xnnpack" in hops["executorch"]["backend"] and d["artifacts"]["executorch"]["info"]["fully_delegated"]
    assert sorted(d["artifacts"]) == ["coreml", "executorch", "onnx"]
    assert {p.name for p in out.iterdir()} >= {"swiftformer_xs.onnx", "swiftformer_xs.mlpackage", "swiftformer_xs.pte"}
    assert tuple(load_program(out / "swiftformer_xs.mlpackage", "main").inputs["image"][1][-2:]) == (32, 64)
    assert written(read_metadata(out / "swiftformer_xs.pte")["imgsz"]) == "32x64"
    for name in ("swiftformer_xs.mlpackage", "swiftformer_xs.pte"):
        where = tmp_path / f"{name}.json"
        assert cli.main(["parity", "--artifact", str(out / name), "--samples", "8", "--report", str(where), "-q"]) == 0
        checked = json.loads(where.read_text())
        assert checked["input_size"] == [32, 64] and checked["sizes"] is None
        assert [h["status"] for h in checked["parity"]] == ["passed", "passed"]


@pytest.mark.parametrize("args,words", [
    (["--target", "coreml", "--ios", "17"], ["--ios 17", "iOS 18", "--ios 18"]),
    (["--target", "onnx", "--features"], ["--features", "several --imgsz sizes", "one size per run"]),
])
def test_what_one_artifact_of_several_sizes_cannot_take_is_exit_2_before_any_work(tmp_path, capsys, args, words):
    out = tmp_path / "out"
    assert cli.main(["export", *TINY, "--imgsz", "32,64", *args, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in words), err
    assert not out.exists()


def test_a_compressed_package_of_two_sizes_judges_each_function_against_its_own_emulation(tmp_path, monkeypatch):
    """w8a8 (calibrated weights and activations) at two sizes: each size calibrated and compressed on its own and
    each function judged by the compressed rule against its size's emulation of the kind, its weights check
    reading that function: a weight planted in one function fails that function's hop alone."""
    from vitedge.targets import plants
    from vitedge.targets.coreml import target as coreml_target

    real_merge = coreml_target.merge_functions

    def merge_then_plant(parts, sizes, path):
        done = real_merge(parts, sizes, path)
        plants.plant_function_weights(path, "size_32x64", "x10", 0.5)
        return done

    monkeypatch.setattr(coreml_target, "merge_functions", merge_then_plant)
    report = export("swiftformer_xs", targets="coreml", precision="w8a8", imgsz="32,32x64", overrides=SWIFT,
                    out=tmp_path / "out", samples=8, calib=4)
    hops = {h.size: h for h in report.parity if h.entry}
    assert {s: (h.entry, h.mode) for s, h in hops.items()} == {"32x32": ("size_32x32", "emulated"),
                                                              "32x64": ("size_32x64", "emulated")}
    for h in hops.values():  # the compressed rule: each sample's allowance from the kind's emulation at its size
        assert h.tolerance.compressed_rule() and h.sets["natural"]["reference_compressed_error"] > 0, h.sets
    assert hops["32x32"].status == "passed" and hops["32x32"].weights["status"] == "passed", hops["32x32"].reason
    assert hops["32x64"].status == "failed" and hops["32x64"].weights["status"] == "failed", hops["32x64"]
    info = report.artifacts["coreml"].info
    assert info["compression"]["kind"] == "w8a8" and set(info["function_info"]) == {"size_32x32", "size_32x64"}
    ids = [f["compression"]["calibration"]["ids"] for f in info["function_info"].values()]
    assert ids[0] == ids[1] and len(ids[0]) == 4  # the same images calibrated every size: the package records them


@pytest.mark.parametrize("target,precision,name", [("executorch", "int8", "m.int8.pte"), ("executorch", "fp32", "m.pte"),
                                                   ("coreml", "w8a8", "m.mlpackage")])
def test_the_one_file_of_every_size_is_named_as_one_size_names_it(target, precision, name):
    """A compressed ExecuTorch program of several sizes is NAME.int8.pte, as a single size's is (the multi-size
    export names its one file by the target's `file_name`)."""
    from vitedge.exporter.core.target_plans import resolve_targets

    plan = resolve_targets(target, precision)[0]
    assert plan.target.file_name("m", plan.precision) == name


def test_the_kinds_emulation_is_built_at_the_judged_samples_own_non_square_size(monkeypatch):
    """Where no deploy-form is handed over (`vitedge bench --artifact`), the emulation's deploy-form is folded at
    the samples' H x W, not at a square of their width."""
    import numpy as np

    from vitedge.exporter.quantize import compressed
    from vitedge.exporter.verdict.criteria import GroundTruth

    folded_at = []
    monkeypatch.setattr(compressed, "build_deploy_form", lambda model, imgsz: (folded_at.append(imgsz), None))
    monkeypatch.setattr(compressed, "compressed_reference", lambda deploy, x, kind: np.zeros((len(x), 2)))
    truth = GroundTruth(np.zeros((3, 2)), np.zeros((3, 2)), ("natural",) * 3)
    judged = compressed.JudgedSamples(torch.nn.Identity(), np.zeros((3, 3, 32, 64), np.float32), truth, ("a", "b", "c"))
    judged.with_emulation(truth, judged.x, "w8")
    assert folded_at == [(32, 64)]


# ---- the matrix and bench read sizes as HxW --------------------------------------------------------------------

def test_the_matrix_plans_sizes_as_hxw_and_square_cells_keep_their_folders_and_keys(tmp_path):
    from tests._matrix import TINY as MTINY, plan_of
    from vitedge.exporter.matrix.cache import Env, base_key, cell_key
    from vitedge.exporter.matrix.plan import Cell
    from vitedge.exporter.matrix.resolve import resolve_plan

    cells = resolve_plan(plan_of([{"name": "swiftformer_xs", "imgsz": [32, "64x64", "32x32"], "set": MTINY}]),
                         tmp_path).cells
    assert [c.imgsz for c in cells] == [(32, 32), (64, 64)]  # "32x32" is 32: one cell
    assert [c.id for c in cells] == ["swiftformer_xs/32/onnx-fp32", "swiftformer_xs/64/onnx-fp32"]
    # a square cell's cache keys hold the side length, as when Cell.imgsz was an int (the same digest as then)
    env = Env()
    assert cell_key(cells[0], env)[1]["imgsz"] == 32 and base_key(cells[0], env)[1]["imgsz"] == 32
    assert cells[0].to_dict()["imgsz"] == 32 and Cell.from_dict(cells[0].to_dict()).imgsz == (32, 32)
    wide = Cell(**{**cells[0].to_dict(), "imgsz": "32x64"})
    assert wide.id == "swiftformer_xs/32x64/onnx-fp32" and wide.to_dict()["imgsz"] == (32, 64)


@pytest.mark.parametrize("imgsz", ["abc", "32x", [0]])
def test_a_bad_matrix_size_names_its_key(tmp_path, imgsz):
    from tests._matrix import TINY as MTINY, plan_of
    from vitedge.exporter.matrix.plan import PlanError
    from vitedge.exporter.matrix.resolve import resolve_plan

    with pytest.raises(PlanError, match=r"models\[0\]\.imgsz"):
        resolve_plan(plan_of([{"name": "swiftformer_xs", "imgsz": imgsz, "set": MTINY}]), tmp_path)


def test_bench_takes_hxw_sizes_and_writes_them_as_given():
    from vitedge.exporter.timing.bench_report import BackendResult, BenchReport, format_table

    args = cli.build_parser().parse_args(["bench", "--model", "swiftformer_xs", "--imgsz", "224,256x256"])
    assert args.imgsz == ((224, 224), (256, 256))
    rows = [BackendResult("onnxruntime", size, "unavailable", reason="-") for size in (224, (256, 320), [256, 320])]
    assert [r.key for r in rows] == ["onnxruntime@224", "onnxruntime@256x320", "onnxruntime@256x320"]  # (a baseline)
    table = format_table(BenchReport("m", "untrained", 1, 1, [224, (256, 320)], results=rows[:2]))
    assert "256x320" in table and "(256, 320)" not in table


# ---- bundles carry every size ------------------------------------------------------------------------------

def test_a_coreml_bundle_of_two_sizes_carries_each_with_its_golden_vectors(tmp_path):
    import zipfile

    from vitedge.exporter.packaging.package import package

    out = tmp_path / "bundle.zip"
    result = package("swiftformer_xs", out, target="coreml", imgsz="32,32x64", overrides=SWIFT, samples=8)
    assert result.exit_code == 0, result.reason
    m = result.manifest
    assert [(e["size"], e["function"]) for e in m["sizes"]] == [("32x32", "size_32x32"), ("32x64", "size_32x64")]
    assert all(e["golden"]["verified"]["passed"] for e in m["sizes"]) and m["ios"] == 18
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        readme = z.read("swiftformer_xs/README.md").decode()
        shapes = [json.loads(z.read(f"swiftformer_xs/golden/{s}/golden.json"))["inputs"]["shape"]
                  for s in ("32x32", "32x64")]
    for size in ("32x32", "32x64"):
        assert {f"swiftformer_xs/golden/{size}/{f}" for f in ("inputs.npy", "outputs.npy", "golden.json")} <= names
        assert f"`size_{size}`" in readme
    assert [sh[1:3] for sh in shapes] == [[32, 32], [32, 64]]


def test_the_android_bundle_checks_each_method_on_its_own_golden_vectors(planted, tmp_path):
    """From the planted export's program: its clean method makes a bundle that lists it; with every size, the
    planted method fails its own golden vectors, named by its size."""
    import dataclasses
    import zipfile

    from vitedge.exporter.core.settings import ExportSettings
    from vitedge.exporter.packaging.bundle import GoldenMismatch
    from vitedge.exporter.packaging.package_android import _assemble

    report, out = planted
    s = ExportSettings(model="swiftformer_xs", targets="executorch", overrides=SWIFT, precision="fp32")
    clean = dataclasses.replace(report, sizes=[e for e in report.sizes if e["size"] != PLANTED_PTE])
    done = _assemble(clean, out, tmp_path / "android.zip", "executorch", s)
    assert [(e["size"], e["method"], e["golden"]["verified"]["passed"]) for e in done.manifest["sizes"]] == [
        ("32x64", "size_32x64", True)]
    with zipfile.ZipFile(done.path) as z:
        assert "swiftformer_xs/golden/32x64/outputs.npy" in z.namelist()
        assert "`size_32x64`" in z.read("swiftformer_xs/README.md").decode()
    with pytest.raises(GoldenMismatch, match=f"at {PLANTED_PTE}"):
        _assemble(report, out, tmp_path / "all.zip", "executorch", s)


def test_sizes_are_written_and_placed_on_a_size_axis_whatever_their_shape():
    from vitedge.exporter.core.settings import size_side, written

    assert [written(v) for v in (224, (224, 224), [256, 320], (320, 256), None)] == ["224", "224", "256x320",
                                                                                      "320x256", "-"]
    assert size_side(224) == 224 and 256 < size_side([256, 320]) < 320 and size_side((320, 256)) == size_side("256x320")


def test_the_resolution_scaling_plot_and_table_take_non_square_sizes(tmp_path, monkeypatch):
    import sys

    pytest.importorskip("matplotlib")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    rs = __import__("resolution_scaling")
    lat = {"p50_ms": 1.0, "p50_ci_ms": [0.9, 1.1]}
    model = {"best": "-", "rule": "-", "latency": {"-": lat}, "labels": ["-"]}
    sizes = [{"imgsz": imgsz, "models": {"swiftformer_xs": model}} for imgsz in (224, [256, 320], 320)]
    table = rs.markdown_table(sizes)
    assert [line.split(" | ")[0] for line in table.splitlines()[2:]] == ["| 224", "| 256x320", "| 320"]
    png = rs.plot(sizes, tmp_path / "plot.png")
    assert png.stat().st_size > 0
    sys.modules.pop("resolution_scaling", None)


def test_bench_of_a_multi_size_program_times_every_method_at_its_own_size(planted, tmp_path, capsys):
    """`vitedge bench --artifact` on a .pte of two methods: each method checked at its own size first (the planted
    one fails and is not timed), the other timed; `--imgsz` picks one size, as for `parity`."""
    pte, where = _artifact(planted, "executorch"), tmp_path / "bench.json"
    quick = ["--min-iters", "3", "--warmup-s", "0", "--max-s", "0"]
    assert cli.main(["bench", "--artifact", str(pte), *quick, "--report", str(where), "-q"]) == 0
    d = json.loads(where.read_text())
    rows = {tuple(r["imgsz"]) if isinstance(r["imgsz"], list) else (r["imgsz"], r["imgsz"]): r for r in d["results"]}
    assert sorted(rows) == [(32, 32), (32, 64)] and d["artifact"]["entries"] == {"size_32x32": [32, 32],
                                                                                 "size_32x64": [32, 64]}
    bad, good = rows[tuple(map(int, PLANTED_PTE.split("x")))], rows[(32, 64)]
    assert bad["status"] == "failed" and "parity failed" in bad["reason"] and not bad["valid"]
    assert good["status"] == "ok" and good["valid"] and good["latency"]["iters"] >= 3
    assert cli.main(["bench", "--artifact", str(pte), *quick, "--imgsz", "32x64", "--report", str(where), "-q"]) == 0
    d = json.loads(where.read_text())
    assert [r["status"] for r in d["results"]] == ["ok"] and list(d["artifact"]["entries"]) == ["size_32x64"]
    capsys.readouterr()
    assert cli.main(["bench", "--artifact", str(pte), *quick, "--imgsz", "64", "--report", str(tmp_path / "no.json"),
                     "-q"]) == 2  # a size the program does not hold: named with those it does, before any work
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--imgsz 64" in err and "32, 32x64" in err, err
    assert not (tmp_path / "no.json").exists()
