"""Each model's own eval preprocessing (models/preprocess.py): the official recipe of every family, a transformers
preprocessor_config.json over it, the user's flags over both, resize-only crops, where the recipe is used (parity
inputs, calibration) and recorded (CoreML's image scale/bias and description); and the class count read from the
classifier head in every family."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

from vitedge.errors import VitedgeError
from vitedge.exporter.quantize import calibrate
from vitedge.exporter.verdict import images, inputs
from vitedge.exporter.reparam.build_forms import build_train_form, preprocess_recipe
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.models import create_model
from vitedge.models.checkpoints.keys import head_classes
from vitedge.models.flops import meta_model
from vitedge.models.preprocess import IMAGENET_MEAN, IMAGENET_STD, Recipe, from_preprocessor_config
from vitedge.models.registry import get_spec, list_models, model_modules, recipe_of


def test_every_registered_model_carries_its_official_recipe():
    for name in list_models():
        r = get_spec(name).recipe
        crop = 0.95 if get_spec(name).family == "swiftformer" else 0.875  # timm's pretrained_cfg; SLAB, SimA code
        assert (r.mean, r.std, r.crop_pct, r.interpolation, r.crop_mode) == (
            IMAGENET_MEAN, IMAGENET_STD, crop, "bicubic", "center"), name
        assert r.source and recipe_of(create_model(name) if name == "swiftformer_xs" else get_spec(name)) == r


@pytest.mark.parametrize("pp, want, size", [
    # transformers' ViTImageProcessor (the SwiftFormer repos): both sides to `size`, no crop
    ({"size": {"height": 224, "width": 224}, "resample": 3, "image_mean": [0.5] * 3, "image_std": [0.5] * 3},
     dict(crop_pct=1.0, crop_mode="squash", interpolation="bicubic", mean=(0.5,) * 3), 224),
    # ConvNeXt style: shortest_edge / crop_pct, then the centre crop
    ({"size": {"shortest_edge": 224}, "crop_pct": 0.875, "resample": 2},
     dict(crop_pct=0.875, crop_mode="center", interpolation="bilinear", mean=IMAGENET_MEAN), 224),
    # CLIP style: shortest_edge 256 then crop_size 224
    ({"size": {"shortest_edge": 256}, "do_center_crop": True, "crop_size": {"height": 224, "width": 224}},
     dict(crop_pct=0.875, crop_mode="center", interpolation="bilinear"), 224),
    # no normalization, no rescale: the model reads 0-255 pixels
    ({"size": 32, "do_normalize": False, "do_rescale": False},
     dict(mean=(0.0,) * 3, std=(1 / 255,) * 3, crop_mode="squash"), 32)])
def test_preprocessor_config_forms(pp, want, size):
    r, got_size = from_preprocessor_config(pp, "preprocessor_config.json")
    assert got_size == size
    for k, v in want.items():
        assert getattr(r, k) == pytest.approx(v), k


def test_bad_preprocessor_configs_and_flags_are_one_line_errors():
    with pytest.raises(VitedgeError, match="non-square"):
        from_preprocessor_config({"size": {"height": 224, "width": 160}}, "p.json")
    with pytest.raises(VitedgeError, match="resample 9"):
        from_preprocessor_config({"size": 224, "resample": 9}, "p.json")
    model = create_model("swiftformer_xs")
    with pytest.raises(VitedgeError, match="--crop-pct must be in"):
        preprocess_recipe(model, None, {"crop_pct": 1.5})
    with pytest.raises(VitedgeError, match="--std values must be positive"):
        preprocess_recipe(model, None, {"std": (0.5, 0.0, 0.5)})


def test_user_flags_override_the_models_and_the_folders_recipe(tmp_path):
    from vitedge.cli import apply_config, build_parser

    model = create_model("swiftformer_xs")
    r = preprocess_recipe(model, None, {"crop_pct": 1.0, "interpolation": "bilinear"})
    assert (r.crop_pct, r.interpolation, r.mean) == (1.0, "bilinear", IMAGENET_MEAN)
    assert "crop_pct, interpolation" in r.source and "timm" in r.source
    parser = build_parser()
    args = parser.parse_args(["export", "--model", "swiftformer_xs", "--crop-pct", "0.9", "--mean", "0.5,0.5,0.5",
                              "--interpolation", "nearest", "--std", "0.2,0.2,0.2"])
    from vitedge.exporter.command_line.settings_args import settings_of
    assert settings_of(args).preprocess == {"crop_pct": 0.9, "interpolation": "nearest", "mean": (0.5,) * 3, "std": (0.2,) * 3}
    config = tmp_path / "c.yaml"
    config.write_text("model: swiftformer_xs\ncrop_pct: 1.0\nmean: [0.1, 0.2, 0.3]\n")
    parser = build_parser()
    argv = ["export", "--config", str(config), "--std", "0.5,0.5,0.5"]
    apply_config(parser, argv)
    assert settings_of(parser.parse_args(argv)).preprocess == {"crop_pct": 1.0, "mean": (0.1, 0.2, 0.3), "std": (0.5,) * 3}
    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--model", "swiftformer_xs", "--mean", "0.5,0.5"])


def test_resize_only_and_squash_crop_nothing_of_a_square_and_differ_on_a_wide_image():
    wide = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 80, 3), dtype=np.uint8))
    zero, one = (0.0,) * 3, (1.0,) * 3
    center = images.eval_transform(wide, 32, zero, one, recipe=Recipe(zero, one, 1.0, "bilinear"))
    ref = np.asarray(wide.resize((64, 32), Image.Resampling.BILINEAR).crop((16, 0, 48, 32)))
    assert np.array_equal(center, ref.transpose(2, 0, 1) / 255.0)
    squash = images.eval_transform(wide, 32, zero, one, recipe=Recipe(zero, one, 1.0, "bilinear", "squash"))
    ref = np.asarray(wide.resize((32, 32), Image.Resampling.BILINEAR))
    assert np.array_equal(squash, ref.transpose(2, 0, 1) / 255.0)
    square = wide.crop((0, 0, 40, 40))  # resize-only keeps a square image whole
    a = images.eval_transform(square, 32, zero, one, recipe=Recipe(zero, one, 1.0, "bicubic"))
    assert np.array_equal(a, np.asarray(square.resize((32, 32), Image.Resampling.BICUBIC)).transpose(2, 0, 1) / 255)


def test_the_recipe_feeds_the_parity_set_and_calibration():
    model = create_model("swiftformer_xs", layers=[1, 1, 1, 1], embed_dims=[16, 16, 16, 16], num_classes=3)
    model.vitedge_recipe = r = Recipe((0.5,) * 3, (0.25,) * 3, 1.0, "bilinear", "squash", "test")
    pset = parity_inputs_for(model, 32, 4)
    name = pset.names[0].split(":", 1)[1]
    want = images.eval_transform(images.photo(name), 32, None, None, recipe=r)
    assert np.allclose(pset.x[0].numpy(), want, atol=1e-6)
    default = images.eval_transform(images.photo(name), 32, IMAGENET_MEAN, IMAGENET_STD)
    assert not np.allclose(want, default, atol=1e-2)  # (the recipe changed what the model is fed)
    calib = calibrate.calibration_set(2, 32, r.mean, r.std, recipe=r)
    first = calib.ids[0].split(":", 1)[1]
    assert np.allclose(calib.x[0], images.eval_transform(images.photo(first), 32, None, None, recipe=r), atol=1e-6)
    stress = inputs.parity_set(4, 32, recipe=r).x[3]  # stress samples are normalized with the recipe's mean/std
    assert stress.shape == (3, 32, 32)


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=(2, 3)))


def test_coreml_image_input_applies_the_recipes_mean_and_std_and_describes_it(tmp_path):
    pytest.importorskip("coremltools")
    from vitedge.targets import LowerSpec
    from vitedge.targets.coreml import CoreMLTarget, EmulatedCoreMLRunner, load_program_spec

    torch.manual_seed(0)
    model = _Tiny().eval()
    r = Recipe((0.5, 0.4, 0.3), (0.25, 0.2, 0.3), 1.0, "bilinear", "squash", "preprocessor_config.json")
    meta = {"mean": list(r.mean), "std": list(r.std), "preprocess": r.to_dict()}
    art = CoreMLTarget().lower(model, LowerSpec(name="tiny", imgsz=16, batch=1, precision="fp32", out_dir=tmp_path,
                                                onnx_path=None, metadata=meta, options={"input": "image"}))
    assert art.info["input_spec"]["coreml_bias"] == [-0.5, -0.4, -0.3]
    spec = load_program_spec(art.path)
    assert json.loads(dict(spec.description.metadata.userDefined)["preprocess"])["crop_mode"] == "squash"
    assert "resized to 16x16 (bilinear)" in spec.description.input[0].shortDescription
    pixels = np.random.default_rng(1).integers(0, 256, (2, 3, 16, 16)).astype(np.float32)
    got = EmulatedCoreMLRunner(art.path).run_raw(pixels)
    m, s = np.reshape(r.mean, (1, 3, 1, 1)), np.reshape(r.std, (1, 3, 1, 1))
    with torch.no_grad():
        want = model(torch.from_numpy(((pixels / 255 - m) / s).astype(np.float32))).numpy()
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def _one_per_model_module() -> list[str]:
    modules = {f.module for f in model_modules()}
    pick = {}
    for name in list_models():
        module = get_spec(name).builder.__module__.rsplit(".", 1)[-1]
        if module in modules and module not in pick:
            pick[module] = name
    return sorted(pick.values())


@pytest.mark.parametrize("name", _one_per_model_module())
def test_the_class_count_is_read_from_the_head_in_every_family(name):
    ref = meta_model(name).state_dict()
    heads = [k for k in ref if k.split(".")[-2:-1] in (["head"], ["dist_head"], ["head_dist"])]
    assert heads, name
    sd = {k: torch.empty((10,) + tuple(v.shape[1:]), device="meta") if k in heads else v for k, v in ref.items()}
    assert head_classes(sd, ref) == 10
    other = next(k for k in ref if k not in heads and ref[k].dim() >= 1)
    sd[other] = torch.empty((ref[other].shape[0] + 1,) + tuple(ref[other].shape[1:]), device="meta")
    assert head_classes(sd, ref) is None  # another mis-shaped tensor: not a class count, the load names it


def test_a_ten_class_sima_checkpoint_builds_with_ten_classes(tmp_path):
    path = tmp_path / "ten.pth"
    torch.save({"model": create_model("sima_nano_12_p16", num_classes=10).state_dict()}, path)
    loaded = build_train_form("sima_nano_12_p16", path)
    assert loaded.overrides == {"num_classes": 10} and loaded.model.head.out_features == 10
