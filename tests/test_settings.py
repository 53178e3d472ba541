"""One typed settings object (exporter/core/settings.py): built once from the command line (and its --config), the
Python keyword call or a matrix cell, and handed whole to export, parity, bench and package; sizes as (H, W)
pairs, with what the pipeline does not run yet refused in one place (exit 2, nothing written)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from vitedge import cli
from vitedge.errors import VitedgeError
from vitedge.exporter.core.settings import ExportSettings, parse_sizes
from vitedge.exporter.flow import pipeline

SWIFT = dict(layers=[1, 1, 1, 1], embed_dims=[8, 8, 16, 16], num_classes=10)
TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=10", "--imgsz", "32"]


class _Called(Exception):
    pass


def _handler_call(monkeypatch, module, name: str, argv: list[str]):
    """(args, kwargs) the CLI handler of `argv` passes to `module.name`, stopped there before any work."""
    seen = []

    def fake(*args, **kwargs):
        seen.append((args, kwargs))
        raise _Called

    monkeypatch.setattr(module, name, fake)
    parser = cli.build_parser()
    cli.apply_config(parser, argv)
    args = parser.parse_args(argv)
    args.progress = None
    with pytest.raises(_Called):
        args.func(args)
    return seen[0]


# ---- sizes ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,sizes", [
    (224, ((224, 224),)), ("224", ((224, 224),)), ("256x320", ((256, 320),)), ((256, 320), ((256, 320),)),
    ("224, 256x320,224", ((224, 224), (256, 320))), ([224, (256, 320), "64x64"], ((224, 224), (256, 320), (64, 64))),
    ([224, 256], ((224, 224), (256, 256))), (np.int64(96), ((96, 96),)), (None, None)])
def test_sizes_are_height_width_pairs(value, sizes):
    assert parse_sizes(value) == sizes
    assert ExportSettings(imgsz=value).imgsz == sizes


@pytest.mark.parametrize("value", [0, -3, "0", "abc", "2x", "1x2x3", "", True, 22.5, [(1, 2, 3)]])
def test_bad_sizes_name_the_flag(value):
    with pytest.raises(VitedgeError, match="--imgsz takes sizes S or HxW"):
        parse_sizes(value)


def test_sizes_are_read_in_one_place():
    assert ExportSettings(imgsz=64).one_size() == 64 and ExportSettings().one_size() is None
    assert ExportSettings(imgsz="256x320").one_size() == (256, 320)  # a non-square size runs
    assert ExportSettings(imgsz="64,256x320").sizes() == [64, (256, 320)] and ExportSettings().sizes() is None
    assert ExportSettings(imgsz=64).square_size() == 64  # (the older readers, kept for the Python API)
    assert ExportSettings(imgsz="64,96").square_sizes() == [64, 96]
    with pytest.raises(VitedgeError, match="a non-square size has no side length"):
        ExportSettings(imgsz="256x320").square_sizes()
    with pytest.raises(VitedgeError, match="this command takes one size"):
        ExportSettings(imgsz="64,96").one_size()
    several = ExportSettings(model="m", imgsz="64,96")
    assert several.several_sizes() and not ExportSettings(imgsz=64).several_sizes()
    assert [s.imgsz for s in several.per_size()] == [((64, 64),), ((96, 96),)]
    assert all(s.model == "m" and s.one_size() in (64, 96) for s in several.per_size())


def test_a_one_size_command_refuses_several_sizes_with_exit_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "deploy.pth"
    assert cli.main(["reparam", *TINY[:-2], "--imgsz", "32,64", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and all(w in err for w in ["32,64", "takes one size"]), err
    assert not out.exists()


# ---- the object ---------------------------------------------------------------------------------------------

def test_settings_are_frozen_and_changed_by_copy():
    s = ExportSettings(model="swiftformer_xs", imgsz=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.imgsz = 32
    t = s.replace(imgsz=32, targets="coreml")
    assert (s.imgsz, t.imgsz, t.targets, t.model) == (((64, 64),), ((32, 32),), "coreml", "swiftformer_xs")
    with pytest.raises(TypeError, match="no field 'batch_size'"):
        s.replace(batch_size=2)


def test_a_keyword_call_builds_the_settings_and_refuses_unknown_keywords():
    s = ExportSettings.build("swiftformer_xs", {"target": "onnx,coreml", "imgsz": 32, "overrides": SWIFT}, "export")
    assert (s.model, s.targets, s.imgsz, s.overrides) == ("swiftformer_xs", "onnx,coreml", ((32, 32),), SWIFT)
    assert ExportSettings.build(None, {"model_or_name": "x"}).model == "x"  # the older spelling of `model`
    with pytest.raises(TypeError, match=r"export\(\) got an unexpected keyword argument 'imgsize'"):
        pipeline.export("swiftformer_xs", imgsize=32)
    with pytest.raises(TypeError, match="another spelling"):
        ExportSettings.build(None, {"target": "onnx", "targets": "coreml"}, "export")
    given = ExportSettings(model="m", imgsz=32)
    assert ExportSettings.build(given, {"samples": 4}).samples == 4 and given.samples is None


def test_a_command_that_reads_a_subset_refuses_the_rest():
    from vitedge.exporter.flow.verify import parity
    from vitedge.exporter.packaging.package import package
    from vitedge.exporter.timing.bench_api import bench

    with pytest.raises(VitedgeError, match="parity does not take batch, opset"):
        parity("swiftformer_xs", "m.onnx", batch=2, opset=17)
    with pytest.raises(VitedgeError, match="bench does not take precision"):
        bench("swiftformer_xs", precision="fp16")
    with pytest.raises(VitedgeError, match="package does not take dynamic_batch"):
        package("swiftformer_xs", "b.zip", dynamic_batch=True)


# ---- export takes one settings object; the keyword API builds it --------------------------------------------

def test_export_takes_one_settings_object_and_the_keyword_call_builds_the_same(tmp_path):
    s = ExportSettings(model="swiftformer_xs", targets="onnx", imgsz=32, samples=2, overrides=SWIFT,
                       out=tmp_path / "a")
    a = pipeline.export(s)
    b = pipeline.export(model="swiftformer_xs", target="onnx", imgsz=32, samples=2, overrides=SWIFT,
                        out=tmp_path / "b")  # today's keywords
    for r in (a, b):
        assert r.exit_code == 0 and (r.model, r.imgsz, r.samples, r.targets) == ("swiftformer_xs", 32, 2, ["onnx"])
    assert a.artifacts["onnx"].sha256 == b.artifacts["onnx"].sha256
    assert json.loads((tmp_path / "a" / "report.json").read_text())["imgsz"] == 32


def test_the_export_handler_passes_one_settings_object(monkeypatch):
    args, kwargs = _handler_call(monkeypatch, pipeline, "export",
                                 ["export", *TINY, "--target", "onnx,coreml", "--samples", "4", "--tol",
                                  "fp32.max_rel=1e-3", "--ios", "17", "--no-truth-cache", "--no-reparam",
                                  "--rewrites", "none", "--mean", "0.5,0.5,0.5"])
    assert len(args) == 1 and isinstance(args[0], ExportSettings) and set(kwargs) == {"progress"}
    s = args[0]
    assert (s.model, s.targets, s.imgsz, s.samples, s.tolerances) == \
        ("swiftformer_xs", "onnx,coreml", ((32, 32),), 4, ["fp32.max_rel=1e-3"])
    assert s.overrides == SWIFT and s.options["ios"] == 17 and s.preprocess == {"mean": (0.5, 0.5, 0.5)}
    assert (s.truth_cache, s.reparam, s.rewrites, s.exporter, s.attn_order) == (False, False, False, None, None)


def test_a_config_file_builds_the_same_settings_as_the_flags(monkeypatch, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: swiftformer_xs\nset: {layers: [1, 1, 1, 1], embed_dims: [8, 8, 16, 16], num_classes: 10}\n"
                   "imgsz: 32\ntargets: [onnx, coreml]\nsamples: 4\n")
    from_file = _handler_call(monkeypatch, pipeline, "export", ["export", "--config", str(cfg)])[0][0]
    from_flags = _handler_call(monkeypatch, pipeline, "export",
                               ["export", *TINY, "--target", "onnx,coreml", "--samples", "4"])[0][0]
    assert from_file == from_flags


def test_parity_bench_and_package_handlers_pass_the_settings_whole(monkeypatch):
    from vitedge.exporter.flow import verify
    from vitedge.exporter.packaging import package
    from vitedge.exporter.timing import bench_api

    args, kwargs = _handler_call(monkeypatch, verify, "parity", ["parity", *TINY, "--artifact", "m.onnx",
                                                                 "--report", "r.json"])
    assert isinstance(args[0], ExportSettings) and args[1] == "m.onnx" and kwargs["report_path"] == "r.json"
    assert args[0].imgsz == ((32, 32),) and args[0].overrides == SWIFT
    args, kwargs = _handler_call(monkeypatch, bench_api, "bench", ["bench", "--model", "swiftformer_xs", "--imgsz",
                                                                   "32,64", "--threads", "2", "--input", "image"])
    assert isinstance(args[0], ExportSettings) and args[0].imgsz == ((32, 32), (64, 64)) and args[0].options is None
    assert (kwargs["threads"], kwargs["input"]) == (2, "image")
    args, kwargs = _handler_call(monkeypatch, package, "package", [
        "package", "--model", "swiftformer_xs", "--imgsz", "32", "--out", "b.zip", "--ios", "17"])
    s = args[0]
    assert isinstance(s, ExportSettings) and args[1] == "b.zip" and kwargs["ios"] == 17
    assert (s.out, s.options, s.imgsz) == (None, None, ((32, 32),))  # --out is the bundle, --ios the bundle's


def test_a_matrix_cell_builds_its_settings_once():
    from vitedge.exporter.matrix.cell import cell_settings
    from vitedge.exporter.matrix.plan import Cell

    c = Cell(model="swiftformer_xs", label="xs", imgsz=32, target="onnx", precision="fp16", hop="onnx-fp16",
             overrides=SWIFT, samples=4, tolerances={"fp16": {"psnr_db": 30}}, exporter="dynamo")
    s = cell_settings(c, "out/xs")
    assert (s.model, s.targets, s.precision, s.imgsz, s.out, s.force) == \
        ("swiftformer_xs", "onnx", "fp16", ((32, 32),), "out/xs", True)
    assert (s.samples, s.tolerances, s.exporter, s.overrides) == (4, {"fp16": {"psnr_db": 30}}, "dynamo", SWIFT)


# ---- the size is an argument, never an attribute on a model -------------------------------------------------

def test_the_size_travels_as_an_argument_not_on_the_model(tmp_path):
    from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, save_deploy_checkpoint
    from vitedge.exporter.reparam.build_forms import Loaded, build_deploy_form, build_train_form
    from vitedge.exporter.verdict.equivalence import verify_equivalence

    loaded = build_train_form("swiftformer_xs", overrides=SWIFT)
    deploy, deploy64 = build_deploy_form(loaded.model, 32)
    as_is, _ = build_deploy_form(loaded.model, 32, reparam=False)
    for m in (loaded.model, deploy, deploy64, as_is):
        assert [a for a in vars(m) if "imgsz" in a] == []
    assert verify_equivalence(loaded.model, deploy64, 32, samples=2).passed  # told the size it was folded for
    path = save_deploy_checkpoint(deploy, tmp_path / "d.pth", imgsz=32)  # the file records the size it is given
    assert load_deploy_checkpoint(path).deploy_checkpoint_meta["imgsz"] == 32
    # a checkpoint's own size (a transformers preprocessor's crop) is the default, carried beside the model
    recorded = Loaded(loaded.model, "swiftformer_xs", "checkpoint", None, SWIFT, checkpoint_imgsz=64)
    assert (recorded.resolve_imgsz(), recorded.resolve_imgsz(32), loaded.resolve_imgsz()) == (64, 32, 224)


def test_the_reparam_handler_passes_the_settings_whole(monkeypatch):
    from vitedge.exporter.flow import deploy_checkpoint

    real = deploy_checkpoint.reparam_checkpoint
    args, kwargs = _handler_call(monkeypatch, deploy_checkpoint, "reparam_checkpoint",
                                 ["reparam", *TINY, "--out", "d.pth", "--rewrites", "none"])
    assert isinstance(args[0], ExportSettings) and args[1] == "d.pth" and set(kwargs) == {"progress"}
    assert (args[0].imgsz, args[0].overrides, args[0].rewrites, args[0].out) == (((32, 32),), SWIFT, False, None)
    with pytest.raises(VitedgeError, match="reparam does not take samples"):
        real("swiftformer_xs", "d.pth", samples=4)


def test_a_deploy_checkpoint_saved_without_its_size_records_the_default_with_a_deprecation_warning(tmp_path):
    from vitedge.exporter.flow.deploy_checkpoint import load_deploy_checkpoint, save_deploy_checkpoint
    from vitedge.exporter.reparam import reparameterize
    from vitedge.models import create_model

    deploy = reparameterize(create_model("swiftformer_xs", **SWIFT).eval())  # folded for its default size, 224
    with pytest.warns(DeprecationWarning, match="pass imgsz="):
        path = save_deploy_checkpoint(deploy, tmp_path / "d.pth")
    assert load_deploy_checkpoint(path).deploy_checkpoint_meta["imgsz"] == 224
