"""A model's eval preprocessing (its "recipe"): mean, std, crop_pct, interpolation and crop mode.

Every registered model module carries the recipe its official evaluation used
(`registry.register_model_module(recipe=...)`); a Hugging Face transformers folder's `preprocessor_config.json`
replaces it (`from_preprocessor_config`), and the user's `--crop-pct`, `--interpolation`, `--mean`, `--std`
replace single fields of either (`Recipe.replace`).

The transform a recipe stands for (exporter/verdict/images.py `eval_transform`), on 8-bit RGB pixels p:
- crop_mode "center" (timm, torchvision): the shorter side resized to floor(imgsz / crop_pct), the aspect ratio
  kept, then a centre crop of imgsz x imgsz. crop_pct 1.0 resizes the shorter side to imgsz (resize-only for a
  square image);
- crop_mode "squash" (transformers' ViTImageProcessor, `size: {height, width}`): both sides resized to
  floor(imgsz / crop_pct), the aspect ratio not kept, then the centre crop (none at crop_pct 1.0);
- a non-square size H x W (either mode): both sides resized to floor(H / crop_pct) x floor(W / crop_pct), then the
  centre H x W crop, as timm's `transforms_imagenet_eval` does for a tuple input size;
then x_c = (p_c / 255 - mean_c) / std_c.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace as _replace

from ..errors import VitedgeError
from .input_size import as_hw

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Pillow's resampling filters by name; transformers' preprocessor_config.json `resample` stores their numbers.
INTERPOLATIONS = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
CROP_MODES = ("center", "squash")
RECIPE_FLAGS = ("crop_pct", "interpolation", "mean", "std")  # the fields a user may replace (--crop-pct, ...)


@dataclass(frozen=True)
class Recipe:
    """How an image becomes the model's input (see the module docstring); `source` says where it came from."""

    mean: tuple = IMAGENET_MEAN
    std: tuple = IMAGENET_STD
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    crop_mode: str = "center"
    source: str = "ImageNet defaults"

    def __post_init__(self):
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        object.__setattr__(self, "crop_pct", float(self.crop_pct))
        check(self)

    def replace(self, source: str, **fields) -> "Recipe":
        """This recipe with `fields` replaced (None values ignored), its source extended with `source`."""
        given = {k: v for k, v in fields.items() if v is not None}
        if not given:
            return self
        return _replace(self, **given, source=f"{self.source}; {source}: {', '.join(sorted(given))}")

    def resize_to(self, imgsz) -> int | tuple[int, int]:
        """The size the resize step makes: an int (the shorter side, or both sides when squashing) for a square
        size; for a non-square H x W, (floor(H / crop_pct), floor(W / crop_pct)), both sides, the aspect ratio
        not kept, as timm's eval transform does for a (H, W) input size."""
        h, w = as_hw(imgsz)
        if h != w:
            return int(math.floor(h / self.crop_pct)), int(math.floor(w / self.crop_pct))
        return int(math.floor(h / self.crop_pct))

    def describe(self, imgsz) -> str:
        """How a photo becomes the model's input, in words (for an app developer)."""
        size, (h, w) = self.resize_to(imgsz), as_hw(imgsz)
        crop = f", the centre {h}x{w} cropped"
        if isinstance(size, tuple):
            return f"resized to {size[0]}x{size[1]} (height x width; {self.interpolation}){crop}"
        how = (f"resized to {size}x{size}" if self.crop_mode == "squash" else
               f"its shorter side resized to {size}")
        crop = crop if size != h or self.crop_mode != "squash" else ""
        return f"{how} ({self.interpolation}){crop}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(mean=list(self.mean), std=list(self.std))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Recipe":
        known = {k: d[k] for k in ("mean", "std", "crop_pct", "interpolation", "crop_mode", "source") if k in d}
        return cls(**known)


def check(r: Recipe) -> None:
    """One-line VitedgeError for a recipe no transform can follow."""
    for name, v in (("mean", r.mean), ("std", r.std)):
        if len(v) != 3 or not all(math.isfinite(x) for x in v):
            raise VitedgeError(f"--{name} takes three finite numbers, one per RGB channel (e.g. 0.485,0.456,0.406); "
                               f"got {list(v)}")
    if any(s <= 0 for s in r.std):
        raise VitedgeError(f"--std values must be positive; got {list(r.std)}")
    if not (math.isfinite(r.crop_pct) and 0 < r.crop_pct <= 1):
        raise VitedgeError(f"--crop-pct must be in (0, 1] (1.0: resize only, no crop); got {r.crop_pct}")
    if r.interpolation not in INTERPOLATIONS:
        raise VitedgeError(f"--interpolation {r.interpolation!r} is not one of {', '.join(INTERPOLATIONS)}")
    if r.crop_mode not in CROP_MODES:
        raise VitedgeError(f"crop mode {r.crop_mode!r} is not one of {', '.join(CROP_MODES)}")


def three(text: str | list | tuple, flag: str) -> tuple:
    """`0.5,0.5,0.5` (or a list of three numbers) -> a 3-tuple of floats; VitedgeError naming `flag` otherwise."""
    items = text.split(",") if isinstance(text, str) else list(text)
    try:
        values = tuple(float(v) for v in items)
    except (TypeError, ValueError):
        values = ()
    if len(values) != 3:
        raise VitedgeError(f"{flag} takes three numbers, one per RGB channel (e.g. {flag} 0.5,0.5,0.5); got {text!r}")
    return values


def _size_of(size) -> tuple[int | None, int | None, int | None]:
    """(height, width, shortest_edge) of a transformers `size` / `crop_size` entry (an int means a square)."""
    if isinstance(size, (int, float)) and not isinstance(size, bool):
        return int(size), int(size), None
    if isinstance(size, dict):
        h, w, s = size.get("height"), size.get("width"), size.get("shortest_edge")
        return (int(h) if h else None), (int(w) if w else None), (int(s) if s else None)
    return None, None, None


def from_preprocessor_config(pp: dict, where: str) -> tuple[Recipe, int | None]:
    """The recipe a transformers image processor config describes, and the input size it crops to (None when it
    does not say). ViTImageProcessor-style (`size: {height, width}`, no centre crop) squashes to that size;
    `crop_pct` with `size: {shortest_edge}` (ConvNeXt style) resizes the shorter side to shortest_edge / crop_pct
    and crops; `do_center_crop` with `crop_size` crops crop_size out of `size`."""
    if not isinstance(pp, dict):
        raise VitedgeError(f"{where} is not a JSON object; re-save it with the image processor's save_pretrained")
    normalize, rescale = pp.get("do_normalize", True), pp.get("do_rescale", True)
    factor = float(pp.get("rescale_factor", 1 / 255)) if rescale else 1.0
    mean = pp.get("image_mean", IMAGENET_MEAN) if normalize else (0.0, 0.0, 0.0)
    std = pp.get("image_std", IMAGENET_STD) if normalize else (1.0, 1.0, 1.0)
    mean, std = three(mean, f"{where} image_mean"), three(std, f"{where} image_std")
    # x = (p * factor - mean) / std, written as the recipe's (p / 255 - mean') / std'
    k = 1.0 / (255.0 * factor)
    mean, std = tuple(m * k for m in mean), tuple(s * k for s in std)
    names = {v: n for n, v in INTERPOLATIONS.items()}
    resample = pp.get("resample", INTERPOLATIONS["bilinear"])
    interpolation = names.get(resample, resample if resample in INTERPOLATIONS else None)
    if interpolation is None:
        raise VitedgeError(f"{where}: resample {resample!r} is not a Pillow filter vitedge knows "
                           f"({', '.join(f'{v} {n}' for n, v in INTERPOLATIONS.items())})")
    h, w, shortest = _size_of(pp.get("size"))
    ch, cw, _ = _size_of(pp.get("crop_size"))
    if h and w and h != w or ch and cw and ch != cw:
        raise VitedgeError(f"{where}: a non-square input ({pp.get('crop_size') or pp.get('size')}) is not supported; "
                           "vitedge exports square inputs")
    source = f"{where}"
    if pp.get("do_resize", True) is False:
        raise VitedgeError(f"{where}: do_resize false (images fed at their own size) is not supported; export at a "
                           "fixed --imgsz with a resize")
    if pp.get("do_center_crop") and ch:
        base = shortest or h
        crop_pct = ch / base if base else 1.0
        mode = "center" if shortest else "squash"
        return Recipe(mean, std, min(crop_pct, 1.0), interpolation, mode, source), ch
    if shortest:
        crop_pct = float(pp.get("crop_pct") or 1.0)
        return Recipe(mean, std, crop_pct, interpolation, "center", source), shortest
    return Recipe(mean, std, 1.0, interpolation, "squash", source), h


# The official evaluations' preprocessing (each model module registers its own: registry.register_model_module).
SWIFTFORMER_RECIPE = Recipe(crop_pct=0.95, interpolation="bicubic",
                            source="timm's swiftformer pretrained_cfg (crop_pct 0.95, bicubic, ImageNet mean/std)")
SLAB_RECIPE = Recipe(crop_pct=0.875, interpolation="bicubic",
                     source="SLAB classification/data/build.py (resize to 256/224 of the size, bicubic, centre crop, "
                            "ImageNet mean/std)")
SIMA_RECIPE = Recipe(crop_pct=0.875, interpolation="bicubic",
                     source="SimA main.py (DeiT/XCiT eval: crop ratio 0.875 unless --full_crop, bicubic, ImageNet "
                            "mean/std)")
