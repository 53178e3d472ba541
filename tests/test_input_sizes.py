"""--imgsz S or HxW for every family: the size reaches the ONNX input, the report and the parity ladder; a size off
the family's stride is exit 2 naming the nearest valid sizes; each family's resampling or padding is compared with an
independent computation of the same convention (timm's `resample_abs_pos_embed` for the position tables)."""
from __future__ import annotations

import json

import onnx
import pytest
import torch

from vitedge import cli
from vitedge.exporter.flow.pipeline import export
from vitedge.models.input_size import nearest_sizes
from vitedge.models.reduced import REDUCED, case
from vitedge.models.registry import create_model, set_input_size
from vitedge.tests._timm import import_timm

WIDE = (64, 96)  # a non-square size every reduced config takes (multiples of 32)


def _export(tmp_path, family: str, size=WIDE):
    name, overrides, _ = case(family)
    out = tmp_path / family
    report = export(name, targets="onnx", imgsz=size, overrides=overrides, out=out, samples=8)
    return report, out, name


@pytest.mark.parametrize("family", ["swiftformer", "slab_deit", "prepbn_deit"])
def test_a_non_square_size_runs_the_whole_ladder_and_is_recorded(tmp_path, family):
    report, out, name = _export(tmp_path, family)
    assert report.exit_code == 0 and [h.status for h in report.parity] == ["passed"] * 3
    assert report.reparam.equivalence["passed"]
    d = json.loads((out / "report.json").read_text())
    assert (d["imgsz"], d["input_size"]) == ("64x96", [64, 96])
    dims = [x.dim_value for x in onnx.load(str(out / f"{name}.onnx")).graph.input[0].type.tensor_type.shape.dim]
    assert dims[1:] == [3, 64, 96]
    tables = {r["tensor"] for r in d["resized"]}
    if family == "swiftformer":
        assert d["resized"] == []  # convolutions only: nothing is tied to the size
    else:
        assert "pos_embed" in tables
        assert all(r["to"][1:] == [4, 6] for r in d["resized"])  # the 64x96 input's patch grid


def test_a_square_size_keeps_the_int_imgsz(tmp_path):
    report, out, _ = _export(tmp_path, "swiftformer", 64)
    d = json.loads((out / "report.json").read_text())
    assert (d["imgsz"], d["input_size"], d["resized"]) == (64, [64, 64], [])


@pytest.mark.parametrize("size,stride,near", [("250x320", 16, ["256x320", "240x320"]), ("100", 32, ["96", "128"]),
                                              ("64x70", 32, ["64", "64x96"])])
def test_nearest_valid_sizes(size, stride, near):
    assert nearest_sizes(size, stride)[:2] == near


def test_a_size_off_the_stride_is_exit_2_naming_the_nearest_sizes(tmp_path, capsys):
    out = tmp_path / "out"
    name, _, _ = case("slab_deit")
    code = cli.main(["export", "--model", name, "--set", "embed_dim=64", "--set", "depth=1", "--set", "num_heads=2",
                     "--imgsz", "250x320", "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "divisible by 16" in err and "256x320" in err and "240x320" in err
    assert not out.exists()


@pytest.mark.parametrize("family", ["slab_deit", "prepbn_deit", "sima_deit"])
def test_position_tables_match_timm_resample_abs_pos_embed(family):
    timm = import_timm()
    from timm.layers import resample_abs_pos_embed

    name, overrides, _ = case(family)
    model = create_model(name, **overrides).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    native = model.img_size // model.patch_embed.proj.kernel_size[0]
    records = set_input_size(model, (256, 320) if model.img_size >= 224 else (48, 80))
    assert records and timm is not None
    for r in records:
        prefix = r["from"][0] - native * native
        want = resample_abs_pos_embed(before[r["tensor"]], new_size=r["to"][1:], old_size=[native, native],
                                      num_prefix_tokens=prefix)
        torch.testing.assert_close(dict(model.named_parameters())[r["tensor"]], want, rtol=0, atol=0)
    # and back at its own size: the pretrained tables, not a resampling of a resampling
    set_input_size(model, model.img_size)
    for r in records:
        assert torch.equal(dict(model.named_parameters())[r["tensor"]], before[r["tensor"]])
