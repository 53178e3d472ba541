"""CoreML input problems vitedge can know are usage errors (exit 2) before any conversion, not coremltools' errors.

coremltools takes an RGB ImageType only as (1, 3, H, W) (`_validate_image_input_output_shapes`), its classify op
needs as many probabilities as labels (so a classifier labels one image per call), and vitedge's packages are
static; the package's input is declared with 3 channels.
"""
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from vitedge.errors import VitedgeError
from vitedge.exporter.flow import pipeline
from vitedge.targets import LowerSpec, get_target
from vitedge.targets.coreml.convert import input_channels

TINY = ["--set", "layers=[1,1,1,1]", "--set", "embed_dims=[16,24,32,48]", "--set", "num_classes=10"]


def _spec(tmp_path, batch, **options):
    return LowerSpec(name="m", imgsz=16, batch=batch, precision="fp16", out_dir=tmp_path, onnx_path=None,
                     options=options)


@pytest.mark.parametrize("batch, options, match", [
    (2, {"input": "image"}, r"--input image makes CoreML's RGB image input.*got --batch 2: drop --batch"),
    (4, {"labels": "LABELS"}, r"--labels makes a CoreML classifier.*got --batch 4: drop --batch"),
    (None, {}, r"--dynamic-batch is not supported by coreml")])
def test_known_input_problems_fail_before_the_model_is_touched(tmp_path, batch, options, match):
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"c{i}" for i in range(10)))
    options = {k: (str(labels) if v == "LABELS" else v) for k, v in options.items()}
    target = get_target("coreml")
    with pytest.raises(VitedgeError, match=match):
        target.validate_input(batch, options)  # the pipeline's check, before any work
    with pytest.raises(VitedgeError, match=match):
        target.lower(None, _spec(tmp_path, batch, **options))  # lower's own, before it reads the model
    target.validate_input(1, options)  # batch 1 is fine
    target.validate_input(8, {})  # and so is a batched tensor package of logits
    assert not list(tmp_path.glob("*.mlpackage"))


def test_export_exits_2_before_building_anything(tmp_path, monkeypatch):
    monkeypatch.setattr(pipeline, "build_train_form", lambda *a, **k: pytest.fail("work started"))
    with pytest.raises(VitedgeError, match="--input image"):
        pipeline.export("swiftformer_xs", "coreml", batch=3, options={"input": "image"}, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    r = subprocess.run([sys.executable, "-m", "vitedge.cli", "export", "--model", "swiftformer_xs", *TINY,
                        "--target", "onnx,coreml", "--input", "image", "--batch", "2", "--out", str(tmp_path / "cli")],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "--input image" in lines[0] and "drop --batch" in lines[0], r.stderr
    assert not (tmp_path / "cli").exists()


class _PlanesFirst(nn.Module):
    """Like SLAB-DeiT's deploy-form: position planes concatenated to the image before the patch conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 4, 4)

    def forward(self, x):
        return self.conv(torch.cat([x, x[:, :1]], dim=1))


def test_a_model_that_does_not_read_3_channels_is_refused_before_conversion(tmp_path):
    gray = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.LazyLinear(10))
    rgb = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    assert input_channels(gray, 16) == 1 and input_channels(rgb, 16) == 3
    assert input_channels(nn.Sequential(nn.Flatten(), nn.Linear(768, 10)), 16) is None  # no conv: not judged here
    assert input_channels(_PlanesFirst(), 16) is None  # the first conv reads the input with extra planes
    with pytest.raises(VitedgeError, match=r"3 channels .* this model's first layer reads 1"):
        get_target("coreml").lower(gray, _spec(tmp_path, 1))
    assert not list(tmp_path.glob("*.mlpackage"))
