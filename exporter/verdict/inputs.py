"""The parity input sets: natural photos first, a synthetic stress set beside them, or the user's own images.

`parity_set(n, imgsz, seed)` is the default set: natural and stress samples interleaved 3 : 1 (every fourth
sample is a stress sample), so any prefix is mostly natural; each sample is tagged with its set.
- natural: the photos shipped in exporter/verdict/photos (SOURCES.md), the k-th natural sample being photo
  perm[k % P] (a seeded permutation of the P photos). The first round is the plain eval transform (shorter side
  to imgsz/0.875, bicubic, centre crop; exporter/verdict/images.py); later rounds take a seeded crop (area 30-100 % of
  the photo, aspect 3/4-4/3) resized to imgsz, mirrored on odd rounds.
- stress: the synthetic categories below (`parity_inputs`, the parity set before natural images existed).
- user: `user_set(folder)`: every image of a folder (flat or ImageFolder layout, with labels), eval transform,
  followed by a small stress set.

Stress categories, cycled in this order so any prefix of the set mixes all of them:
  0 noise      N(0, 1) in normalized space (the usual random check)
  1 gradient   linear ramps in a random direction, per-channel random endpoints in [0, 1] pixel space
  2 checker    checkerboards with periods 2..32 px and random colours
  3 smooth     natural-image-like noise: a 1/f spectrum (random phases), rescaled to [0, 1]
  4 blocks     piecewise-constant random rectangles (edges at every scale), in [0, 1]
  5 extreme    saturated pixels (all-0, all-1, single-channel) mixed with noise: range corners
Pixel-space images are normalized with the model's mean/std. Same seed, size and count give the same tensor,
and a longer set starts with the shorter one (every set is prefix-stable).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...models.preprocess import IMAGENET_MEAN, IMAGENET_STD, Recipe
from ...models.synthetic import synthetic_batch  # the pattern makers (shared with trained-like calibration)
from . import images
from ...models.input_size import as_hw

CATEGORIES = ("noise", "gradient", "checker", "smooth", "blocks", "extreme")
SETS = ("natural", "stress", "user")
DEFAULT_SAMPLES = 64
STRESS_EVERY = 4        # every 4th sample of the default set is a stress sample: 3 natural : 1 stress
USER_STRESS = 16        # stress samples that still run beside a user's images


def parity_inputs(n: int = DEFAULT_SAMPLES, imgsz: int = 224, seed: int = 0, mean=IMAGENET_MEAN,
                  std=IMAGENET_STD, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`n` synthetic stress inputs (n, 3, imgsz, imgsz), normalized, deterministic in (n, imgsz, seed)."""
    if n <= 0:
        raise ValueError("need at least one parity sample")
    return synthetic_batch([CATEGORIES[i % len(CATEGORIES)] for i in range(n)], imgsz, seed, mean, std, dtype)


stress_inputs = parity_inputs


def stress_names(n: int) -> tuple[str, ...]:
    return tuple(f"stress:{CATEGORIES[i % len(CATEGORIES)]}" for i in range(n))


def natural_view(k: int, photos: tuple[str, ...], perm: np.ndarray, imgsz: int, seed: int, mean, std,
                 recipe: Recipe | None = None):
    """The k-th natural sample: (float64 (3, imgsz, imgsz), name). `recipe`: the model's eval preprocessing
    (models/preprocess.py; its mean/std replace `mean`/`std`)."""
    recipe = recipe or Recipe(mean, std)
    name = photos[perm[k % len(photos)]]
    x, view = photo_view(images.photo(name), k // len(photos), k, imgsz, seed, recipe)
    return x, f"natural:{name}{view}"


def photo_view(img, rnd: int, k: int, imgsz: int, seed: int, recipe: Recipe) -> tuple[np.ndarray, str]:
    """View `rnd` of the PIL image `img` as the k-th sample of a set: round 0 its eval transform, later rounds a
    random crop (30-100 % of the area, aspect 3/4-4/3) drawn from the per-sample stream (seed, k), every other
    one flipped; (float64 (3, H, W), the view's name suffix)."""
    if rnd == 0:
        return images.eval_transform(img, imgsz, recipe.mean, recipe.std, recipe=recipe), ""
    rng = np.random.Generator(np.random.PCG64([seed, k]))  # per-sample stream: the set is prefix-stable
    w, h = img.size
    area = rng.uniform(0.3, 1.0) * w * h
    aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
    cw, ch = min(w, math.sqrt(area * aspect)), min(h, math.sqrt(area / aspect))
    left, top = rng.uniform(0, w - cw), rng.uniform(0, h - ch)
    flip = rnd % 2 == 1
    x = images.crop_transform(img, (left, top, left + cw, top + ch), imgsz, flip, recipe.mean, recipe.std,
                              recipe.interpolation)
    return x, f"/crop{rnd}{'/flip' if flip else ''}"


def natural_inputs(n: int, imgsz: int = 224, seed: int = 0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
                   dtype: torch.dtype = torch.float32,
                   recipe: Recipe | None = None) -> tuple[torch.Tensor, tuple[str, ...]]:
    """`n` natural samples from the shipped photos (see the module doc) and their names."""
    if n < 0:
        raise ValueError("n must be >= 0")
    photos = images.photo_names()
    perm = np.random.Generator(np.random.PCG64(seed)).permutation(len(photos))
    out = torch.empty(n, 3, *as_hw(imgsz), dtype=torch.float64)
    names = []
    for k in range(n):
        x, name = natural_view(k, photos, perm, imgsz, seed, mean, std, recipe)
        out[k] = torch.from_numpy(x)
        names.append(name)
    return out.to(dtype), tuple(names)


@dataclass(frozen=True)
class ParitySet:
    """Inputs with a set tag per sample (`natural` / `stress` / `user`), names, and labels where known."""
    x: torch.Tensor                       # (n, 3, H, W), normalized
    sets: tuple[str, ...]                 # per sample, one of SETS
    names: tuple[str, ...]                # per sample, e.g. "natural:chelsea/crop1/flip", "stress:checker"
    labels: tuple[int, ...] | None = None  # per sample class index (-1 where unknown), None without labels
    classes: tuple[str, ...] | None = None
    note: str = ""                        # how the set was made (for report.json's `inputs`)

    def __len__(self) -> int:
        return len(self.sets)

    def present(self) -> tuple[str, ...]:
        """The sets present, in SETS order."""
        return tuple(s for s in SETS if s in self.sets)

    def indices(self, name: str) -> np.ndarray:
        return np.array([i for i, s in enumerate(self.sets) if s == name], dtype=np.int64)

    def numpy(self) -> np.ndarray:
        return self.x.numpy()

    def labels_array(self) -> np.ndarray | None:
        return None if self.labels is None else np.asarray(self.labels, dtype=np.int64)


def parity_set(n: int = DEFAULT_SAMPLES, imgsz: int = 224, seed: int = 0, mean=IMAGENET_MEAN, std=IMAGENET_STD,
               dtype: torch.dtype = torch.float32, recipe: Recipe | None = None) -> ParitySet:
    """The default parity set: `n` samples, natural and stress interleaved 3 : 1 (sample i is a stress sample
    iff i % 4 == 3), deterministic in (n, imgsz, seed) and prefix-stable. `recipe`: the eval preprocessing of the
    natural samples (its mean/std normalize every sample)."""
    if n <= 0:
        raise ValueError("need at least one parity sample")
    if recipe is not None:
        mean, std = recipe.mean, recipe.std
    is_stress = [i % STRESS_EVERY == STRESS_EVERY - 1 for i in range(n)]
    n_stress = sum(is_stress)
    nat, nat_names = natural_inputs(n - n_stress, imgsz, seed, mean, std, dtype, recipe)
    st = parity_inputs(n_stress, imgsz, seed, mean, std, dtype) if n_stress else nat[:0]
    st_names = stress_names(n_stress)
    x = torch.empty(n, 3, *as_hw(imgsz), dtype=dtype)
    sets, names, a, b = [], [], 0, 0
    for i, s in enumerate(is_stress):
        if s:
            x[i], b = st[b], b + 1
            sets.append("stress")
            names.append(st_names[b - 1])
        else:
            x[i], a = nat[a], a + 1
            sets.append("natural")
            names.append(nat_names[a - 1])
    note = (f"vitedge.exporter.verdict.inputs.parity_set(n={n}, seed={seed}): {n - n_stress} natural (shipped photos, "
            f"eval transform, seeded crops/flips) and {n_stress} stress ({', '.join(CATEGORIES)}) interleaved 3:1")
    return ParitySet(x, tuple(sets), tuple(names), note=note)


def user_set(folder: str | Path, imgsz: int = 224, mean=IMAGENET_MEAN, std=IMAGENET_STD,
             labels_file: str | Path | None = None, stress: int = USER_STRESS, seed: int = 0,
             dtype: torch.dtype = torch.float32, recipe: Recipe | None = None) -> ParitySet:
    """Every image of `folder` (exporter/verdict/images.py: flat or ImageFolder layout), eval-transformed, in sorted
    order, followed by `stress` (>= USER_STRESS) stress samples. Labels (ImageFolder layout) are -1 on the
    stress samples. Unreadable or empty files raise VitedgeError naming the file."""
    stress = max(stress, USER_STRESS)
    if recipe is not None:
        mean, std = recipe.mean, recipe.std
    found = images.scan_folder(folder, labels_file)
    n_user = len(found.paths)
    x = torch.empty(n_user + stress, 3, *as_hw(imgsz), dtype=dtype)
    for i, p in enumerate(found.paths):
        x[i] = torch.from_numpy(images.eval_transform(images.load_image(p), imgsz, mean, std, recipe=recipe)).to(dtype)
    x[n_user:] = parity_inputs(stress, imgsz, seed, mean, std, dtype)
    names = tuple(f"user:{p.relative_to(found.root)}" for p in found.paths) + stress_names(stress)
    labels = None if found.labels is None else found.labels + (-1,) * stress
    note = (f"{n_user} user images from {found.root} ({'ImageFolder layout, labelled' if labels else 'flat'}; "
            f"eval transform) and {stress} stress samples (parity_inputs(n={stress}, seed={seed}))")
    return ParitySet(x, ("user",) * n_user + ("stress",) * stress, names, labels, found.classes, note)


def describe() -> str:
    return __doc__
