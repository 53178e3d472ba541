"""Real images: the photos shipped with vitedge, a user's image folder, and the eval transform.

The eval transform is the model's own (its recipe, models/preprocess.py: the official evaluation's, a transformers
folder's preprocessor_config.json, or the user's --crop-pct / --interpolation / --mean / --std): resize the
shorter side to floor(imgsz / crop_pct) (or both sides, "squash"), centre-crop imgsz x imgsz, scale to [0, 1],
normalize with the recipe's mean/std. Computed in float64 from the uint8 pixels Pillow produces.

A user folder is either flat (image files) or in ImageFolder layout (DIR/<class>/<image>), which also gives
labels: the class index is the class name's line in a labels file when one is given (one name per line, in
index order), else the position of the folder in sorted order, as torchvision's ImageFolder numbers classes.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ...models.preprocess import INTERPOLATIONS, Recipe
from ...models.input_size import as_hw
from ...targets.labels import read_labels

PHOTOS_DIR = Path(__file__).resolve().parent / "photos"
CROP_PCT = 0.875
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


def _pil():
    try:
        from PIL import Image, ImageOps
    except ImportError:  # a runtime dependency; a broken install is the only way here
        raise VitedgeError("Pillow is needed to read images; pip install pillow") from None
    return Image, ImageOps


def load_image(path: str | Path):
    """The image at `path` as an RGB PIL image (EXIF orientation applied); VitedgeError naming the file if it
    is empty or cannot be decoded."""
    Image, ImageOps = _pil()
    path = Path(path)
    try:
        if path.stat().st_size == 0:
            raise VitedgeError(f"image {path} is empty (0 bytes); remove it or replace it with a real image")
        with Image.open(path) as im:
            im.load()
            im = ImageOps.exif_transpose(im)
            if im.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16/32-bit grey: scale by the bit depth to 8 bits
                a = np.asarray(im, dtype=np.float64)  # (never by the image's own maximum: a dark image stays dark)
                full = 65535.0 if im.mode != "I" or a.max() <= 65535 else 4294967295.0  # PNG "I": 16-bit samples
                im = Image.fromarray(np.clip(np.rint(a / full * 255.0), 0, 255).astype(np.uint8))
            return im.convert("RGB")
    except VitedgeError:
        raise
    except Exception as e:  # PIL raises many types (UnidentifiedImageError, OSError, SyntaxError, ...)
        raise VitedgeError(f"cannot read image {path}: {type(e).__name__}: {e}; remove or replace the file") from None


def eval_transform(img, imgsz, mean, std, crop_pct: float = CROP_PCT, recipe: Recipe | None = None) -> np.ndarray:
    """(3, H, W) float64 by `recipe` (models/preprocess.py; its mean/std replace `mean`/`std`), else
    the shorter side resized to floor(imgsz / crop_pct) (bicubic), centre crop, normalized with mean/std.
    `imgsz`: S or (H, W) (a non-square size resizes both sides, `Recipe.resize_to`)."""
    r = recipe or Recipe(mean, std, crop_pct)
    Image, _ = _pil()
    w, h = img.size
    ch, cw = as_hw(imgsz)
    size = r.resize_to(imgsz)
    if isinstance(size, tuple):  # non-square: both sides, as timm's eval transform for a (H, W) size
        nh, nw = size
    elif r.crop_mode == "squash":  # both sides to `size`, the aspect ratio not kept
        nw = nh = size
    elif w <= h:  # torchvision Resize(int): the shorter side becomes `size`, the other keeps the aspect ratio
        nw, nh = size, int(size * h / w)
    else:
        nw, nh = int(size * w / h), size
    img = img.resize((nw, nh), resampling(r.interpolation))
    top, left = int(round((nh - ch) / 2.0)), int(round((nw - cw) / 2.0))
    return normalize(np.asarray(img.crop((left, top, left + cw, top + ch))), r.mean, r.std)


def resampling(name: str):
    """Pillow's resampling filter called `name` (models/preprocess.INTERPOLATIONS)."""
    Image, _ = _pil()
    return Image.Resampling(INTERPOLATIONS[name])


def crop_transform(img, box: tuple[float, float, float, float], imgsz: int, flip: bool, mean, std,
                   interpolation: str = "bicubic") -> np.ndarray:
    """(3, H, W) float64: the `box` (left, top, right, bottom) region resized to imgsz (S or (H, W);
    `interpolation`), mirrored left-right if `flip`, normalized."""
    Image, _ = _pil()
    h, w = as_hw(imgsz)
    out = img.resize((w, h), resampling(interpolation), box=box)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return normalize(np.asarray(out), mean, std)


def normalize(pixels: np.ndarray, mean, std) -> np.ndarray:
    """uint8 (H, W, 3) -> float64 (3, H, W), (pixels / 255 - mean) / std."""
    x = pixels.astype(np.float64).transpose(2, 0, 1) / 255.0
    return (x - np.asarray(mean, np.float64).reshape(3, 1, 1)) / np.asarray(std, np.float64).reshape(3, 1, 1)


# ---- the shipped photos ---------------------------------------------------------------------------

def photo_names() -> tuple[str, ...]:
    """Names of the shipped photos (exporter/verdict/photos/*.jpg, sorted); sources and licences in SOURCES.md."""
    names = tuple(sorted(p.stem for p in PHOTOS_DIR.glob("*.jpg")))
    if not names:
        raise VitedgeError(f"no photos in {PHOTOS_DIR}: the vitedge install is incomplete; reinstall vitedge")
    return names


@lru_cache(maxsize=None)
def _photo_pixels(name: str) -> np.ndarray:
    a = np.asarray(load_image(PHOTOS_DIR / f"{name}.jpg"))
    a.setflags(write=False)
    return a


def photo(name: str):
    """The shipped photo `name` as an RGB PIL image (decoded once per process)."""
    Image, _ = _pil()
    return Image.fromarray(_photo_pixels(name))


# ---- a user's folder ------------------------------------------------------------------------------

@dataclass(frozen=True)
class UserImages:
    """The images of a user folder in a fixed order, with labels when the folder is in ImageFolder layout."""
    root: Path
    paths: tuple[Path, ...]
    labels: tuple[int, ...] | None   # class index per image (ImageFolder layout), else None
    classes: tuple[str, ...] | None  # class names in index order (labels file, else sorted folder names)


def _visible(p: Path) -> bool:
    return not p.name.startswith(".")


def _images_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if _visible(p) and p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)


def scan_folder(folder: str | Path, labels_file: str | Path | None = None) -> UserImages:
    """The images in `folder`: flat (image files) or ImageFolder layout (one subfolder per class). Files with
    other extensions and hidden entries are ignored, as torchvision's ImageFolder does; an empty folder, an
    empty class folder, loose images beside class folders, or a class folder missing from the labels file is a
    VitedgeError naming it."""
    root = Path(folder)
    if not root.is_dir():
        raise VitedgeError(f"--images {root} is not a folder; pass a folder of jpg/png images")
    classes = tuple(read_labels(labels_file)) if labels_file is not None else None
    subdirs = sorted(p for p in root.iterdir() if _visible(p) and p.is_dir())
    loose = _images_in(root)
    if not subdirs:
        if not loose:
            raise VitedgeError(f"--images {root} holds no images ({', '.join(IMAGE_EXTENSIONS)}); add some")
        return UserImages(root, tuple(loose), None, classes)
    if loose:
        raise VitedgeError(f"--images {root} mixes loose images ({loose[0].name}) and class folders "
                           f"({subdirs[0].name}); use one layout: flat, or DIR/<class>/<image>")
    if classes is None:
        index = {d.name: i for i, d in enumerate(subdirs)}
        classes = tuple(d.name for d in subdirs)
    else:
        index = {}
        for d in subdirs:
            hits = [i for i, c in enumerate(classes) if c == d.name]
            if not hits:
                raise VitedgeError(f"class folder {d} is not a line of the labels file {labels_file}; rename the "
                                   "folder to its class name or add the name to the labels file")
            if len(hits) > 1:
                raise VitedgeError(f"class folder {d.name!r} matches lines {hits[0] + 1} and {hits[1] + 1} of the "
                                   f"labels file {labels_file}; class names must be unique")
            index[d.name] = hits[0]
    paths, labels = [], []
    for d in subdirs:
        files = _images_in(d)
        if not files:
            raise VitedgeError(f"class folder {d} holds no images ({', '.join(IMAGE_EXTENSIONS)}); add some or "
                               "remove it")
        paths += files
        labels += [index[d.name]] * len(files)
    return UserImages(root, tuple(paths), tuple(labels), classes)
