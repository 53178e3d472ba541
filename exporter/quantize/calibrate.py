"""Calibration sets for activation-quantized artifacts (--precision int8 | w8a8), kept apart from the samples their
hops are judged on, and the --calib / --calib-images checks.

Where the calibration samples come from (`calibration_set`):
- default: the shipped photos are split by name: every CALIBRATION_PHOTO_EVERY-th photo in sorted order
  calibrates (`calibration_photos()`), the others are the ones compressed hops are judged on. Calibration takes N
  views of the calibration photos (the eval transform first, then seeded crops and flips, seed CALIB_SEED: the
  parity set's recipe, exporter/verdict/inputs.py); the parity set's natural samples of those photos are left out of the
  evaluation. A split by photo, not by view: two crops of one photo share most of their content.
- `--images DIR`: the folder is split deterministically: images ordered by the sha256 of their path relative to
  DIR, the first min(N, half of them) calibrate, the rest are evaluated (labels, if any, stay with them).
- `--calib-images DIR`: N images of that folder calibrate (spread evenly over its sorted order), and evaluation
  keeps every image of --images (or every natural sample); an image file found in both (same bytes), or one of
  the shipped photos, is a VitedgeError.

The record (which ids calibrated, what the evaluation leaves out) goes into report.json `calibration` and the
artifact's info.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ...precisions import calibrated, row
from ...models.preprocess import Recipe
from ...targets.calibration import Calibration
from ..verdict import images
from ..verdict.inputs import natural_view
from ...models.input_size import as_hw

CALIB_DEFAULT = 64
CALIB_SEED = 1                 # the calibration views' seed (the parity set uses 0)
CALIBRATION_PHOTO_EVERY = 3    # every 3rd shipped photo (sorted) calibrates: 5 of 14; the other 9 are judged


def check_flags(precision: str | None, calib: int | None, calib_images: str | Path | None,
                images_dir: str | Path | None = None, labels_file: str | Path | None = None) -> int | None:
    """The number of calibration samples this run takes (None: its precision takes none), or a one-line
    VitedgeError for a combination that cannot work (before any work): calibration images that are also
    evaluated (--images, a shipped photo) included."""
    if calib is not None and (isinstance(calib, bool) or not isinstance(calib, int) or calib < 1):
        raise VitedgeError(f"--calib must be a whole number of calibration images >= 1; got {calib!r}")
    given = [f for f, v in (("--calib", calib), ("--calib-images", calib_images)) if v is not None]
    p = row(precision)   # the table as it is now: a registered precision included
    takes = " and ".join(calibrated())
    if p is not None and p.weight_only and given:
        raise VitedgeError(f"{given[0]} applies to --precision {takes} only: {precision} quantizes weights "
                           f"alone and takes no calibration images; drop {given[0]}")
    if p is None or not p.calibrates:
        if given:
            raise VitedgeError(f"{given[0]} applies to --precision {takes} only; got --precision "
                               f"{precision or 'default'}")
        return None
    n = calib or CALIB_DEFAULT
    if calib_images is not None:  # the folder's own problems first (VitedgeError naming it), then its overlap
        evaluated = list(images.scan_folder(images_dir, labels_file).paths) if images_dir is not None else None
        check_disjoint(_chosen(calib_images, n)[1], evaluated)
    return n


def _scan(folder, flag: str = "--calib-images", labels_file=None):
    """images.scan_folder with its messages naming `flag` (they say --images)."""
    try:
        return images.scan_folder(folder, labels_file)
    except VitedgeError as e:
        raise VitedgeError(str(e).replace("--images", flag, 1)) from None


def calibration_photos() -> tuple[str, ...]:
    return images.photo_names()[::CALIBRATION_PHOTO_EVERY]


def _photo_of(sample_name: str) -> str | None:
    """"natural:chelsea/crop1/flip" -> "chelsea"; None for other sets."""
    if not sample_name.startswith("natural:"):
        return None
    return sample_name.split(":", 1)[1].split("/", 1)[0]


def natural_calibration(n: int, imgsz: int, mean, std, recipe: Recipe | None = None) -> Calibration:
    """`n` views of the calibration photos (see the module doc)."""
    photos = calibration_photos()
    perm = np.arange(len(photos))
    x = np.empty((n, 3, *as_hw(imgsz)), np.float32)
    ids = []
    for k in range(n):
        view, name = natural_view(k, photos, perm, imgsz, CALIB_SEED, mean, std, recipe)
        x[k] = view
        ids.append(name)
    note = (f"{n} views of the shipped photos {', '.join(photos)} (one in {CALIBRATION_PHOTO_EVERY} in sorted order; eval "
            f"transform, then seeded crops/flips, seed {CALIB_SEED}); compressed hops are judged on the other photos")
    return Calibration(x, tuple(ids), "natural", note, {"photos": list(photos)})


def _load(paths, imgsz: int, mean, std, recipe: Recipe | None = None) -> np.ndarray:
    x = np.empty((len(paths), 3, *as_hw(imgsz)), np.float32)
    for i, p in enumerate(paths):
        x[i] = images.eval_transform(images.load_image(p), imgsz, mean, std, recipe=recipe)
    return x


def split_images(folder: str | Path, n: int, labels_file: str | Path | None = None) -> tuple[list[Path], list[Path]]:
    """(calibration paths, evaluation paths) of a --images folder: by sha256 of the relative path, the first
    min(n, len // 2) calibrate. Fewer than 2 images cannot be split."""
    found = images.scan_folder(folder, labels_file)
    paths = list(found.paths)
    if len(paths) < 2:
        raise VitedgeError(f"--images {found.root} holds {len(paths)} image: too few to split into calibration and "
                           "evaluation images; add images or give --calib-images DIR")
    key = {p: hashlib.sha256(p.relative_to(found.root).as_posix().encode()).hexdigest() for p in paths}
    ordered = sorted(paths, key=lambda p: key[p])
    k = min(n, len(paths) // 2)
    calib = sorted(ordered[:k])
    return calib, [p for p in paths if p not in set(calib)]


def user_name(root: Path, path: Path) -> str:
    """The parity set's name of a --images sample (exporter/verdict/inputs.user_set)."""
    return f"user:{path.relative_to(root)}"


def images_calibration(folder: str | Path, n: int, imgsz: int, mean, std,
                       labels_file: str | Path | None = None, recipe: Recipe | None = None) -> Calibration:
    root = images.scan_folder(folder, labels_file).root
    calib, rest = split_images(folder, n, labels_file)
    ids = tuple(user_name(root, p) for p in calib)
    note = (f"{len(calib)} of the {len(calib) + len(rest)} --images ({root}) calibrate: ordered by sha256 of the "
            f"relative path, the first min(--calib {n}, half); the other {len(rest)} are judged")
    return Calibration(_load(calib, imgsz, mean, std, recipe), ids, "images", note, {"images": list(ids)})


def _digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _chosen(folder: str | Path, n: int):
    """(the folder's scan, the `n` --calib-images it calibrates with: spread over its sorted order)."""
    found = _scan(folder)
    paths = list(found.paths)
    pick = sorted(set(np.linspace(0, len(paths) - 1, min(n, len(paths))).round().astype(int).tolist()))
    return found, [paths[i] for i in pick]


def check_disjoint(chosen: list[Path], evaluated: list[Path] | None) -> None:
    """VitedgeError when a calibration image's bytes equal an evaluated one (--images) or a shipped photo."""
    others = {_digest(p): p for p in (evaluated or [])}
    others.update({_digest(images.PHOTOS_DIR / f"{name}.jpg"): f"the shipped photo {name}.jpg"
                   for name in images.photo_names()})
    for p in chosen:
        twin = others.get(_digest(p))
        if twin is not None:
            raise VitedgeError(f"--calib-images {p} is the same image as {twin}, which is evaluated: calibration "
                               "images must not be judged; remove it from one folder")


def folder_calibration(folder: str | Path, n: int, imgsz: int, mean, std,
                       evaluated: list[Path] | None = None, recipe: Recipe | None = None) -> Calibration:
    """`n` images of --calib-images `folder` (spread over its sorted order; all when it holds fewer). An image
    whose bytes equal one of `evaluated` (--images) or a shipped photo is a VitedgeError."""
    found, chosen = _chosen(folder, n)
    paths = found.paths
    check_disjoint(chosen, evaluated)
    ids = tuple(f"calib:{p.relative_to(found.root)}" for p in chosen)
    note = f"{len(chosen)} of the {len(paths)} --calib-images ({found.root}), spread over its sorted order"
    return Calibration(_load(chosen, imgsz, mean, std, recipe), ids, "calib-images", note, {})


def calibration_set(n: int, imgsz: int, mean, std, images_dir: str | Path | None = None,
                    calib_images: str | Path | None = None, labels_file: str | Path | None = None,
                    recipe: Recipe | None = None) -> Calibration:
    """The run's calibration set (see the module doc), preprocessed by `recipe` (the model's eval preprocessing)."""
    if calib_images is not None:
        evaluated = list(images.scan_folder(images_dir, labels_file).paths) if images_dir is not None else None
        return folder_calibration(calib_images, n, imgsz, mean, std, evaluated, recipe)
    if images_dir is not None:
        return images_calibration(images_dir, n, imgsz, mean, std, labels_file, recipe)
    return natural_calibration(n, imgsz, mean, std, recipe)


def evaluation_indices(names: tuple[str, ...], sets: tuple[str, ...], used_ids=()) -> np.ndarray:
    """Indices of the parity-set samples a compressed hop is judged on: natural and user samples (stress samples
    lie outside any calibrated range, so quantized artifacts are not judged on them), without those that
    calibrated: a calibrating user image, and every view of a photo one of whose views calibrated. `used_ids`: the
    calibration ids (Calibration.ids, or what an artifact recorded)."""
    used = {str(i) for i in used_ids}
    photos = {_photo_of(i) for i in used} - {None}
    keep = [i for i, (n, s) in enumerate(zip(names, sets))
            if s in ("natural", "user") and n not in used and _photo_of(n) not in photos]
    return np.asarray(keep, dtype=np.int64)
