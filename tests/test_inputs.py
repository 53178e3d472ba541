"""The parity sets: shipped photos, the eval transform, natural/stress interleaving, and user folders."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitedge.exporter.verdict import images, inputs
from vitedge.models import VitedgeError

from vitedge.tests.conftest import REPO

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


def test_shipped_photos_are_varied_rgb_and_documented():
    names = images.photo_names()
    assert 8 <= len(names) <= 16
    total = sum((images.PHOTOS_DIR / f"{n}.jpg").stat().st_size for n in names)
    assert total <= 1_100_000
    sources = (images.PHOTOS_DIR / "SOURCES.md").read_text()
    for n in names:
        assert f"| {n}.jpg |" in sources, f"{n}.jpg has no source/licence line"
        img = images.photo(n)
        assert img.mode == "RGB" and min(img.size) >= 256
    means = [np.asarray(images.photo(n)).mean(axis=(0, 1)) for n in names]
    assert np.ptp([m.mean() for m in means]) > 40  # dark (hubble) and bright (retina background) photos


def test_eval_transform_matches_resize_then_center_crop():
    img = images.photo("chelsea")  # 451 x 300: landscape
    x = images.eval_transform(img, 64, MEAN, STD)
    assert x.shape == (3, 64, 64) and x.dtype == np.float64
    size = math.floor(64 / 0.875)  # 73
    r = img.resize((int(size * 451 / 300), size), Image.Resampling.BICUBIC)
    left, top = int(round((r.size[0] - 64) / 2)), int(round((r.size[1] - 64) / 2))
    ref = np.asarray(r)[top:top + 64, left:left + 64].astype(np.float64) / 255
    ref = (ref - np.array(MEAN)) / np.array(STD)
    np.testing.assert_allclose(x, ref.transpose(2, 0, 1), rtol=0, atol=1e-12)


def test_parity_set_interleaves_three_natural_to_one_stress_and_is_deterministic():
    s = inputs.parity_set(12, 32, seed=3)
    assert s.sets == ("natural", "natural", "natural", "stress") * 3
    assert s.present() == ("natural", "stress")
    assert s.x.shape == (12, 3, 32, 32) and s.x.dtype == torch.float32
    assert all(n.startswith(f"{t}:") for n, t in zip(s.names, s.sets))
    again = inputs.parity_set(12, 32, seed=3)
    assert torch.equal(s.x, again.x) and s.names == again.names
    longer = inputs.parity_set(20, 32, seed=3)  # prefix-stable: a longer set starts with the shorter one
    assert torch.equal(longer.x[:12], s.x) and longer.names[:12] == s.names
    other = inputs.parity_set(12, 32, seed=4)
    assert not torch.equal(other.x, s.x)
    # the stress samples are the synthetic set, in order
    np.testing.assert_array_equal(s.x[s.indices("stress")].numpy(), inputs.parity_inputs(3, 32, seed=3).numpy())
    assert len(set(s.names)) == len(s.names)
    for i in range(1, 12):  # no two samples alike
        assert not torch.equal(s.x[i], s.x[i - 1])


def test_natural_rounds_cover_every_photo_then_crop_and_flip():
    p = len(images.photo_names())
    x, names = inputs.natural_inputs(2 * p + 1, 32, seed=0)
    assert sorted(n.split(":")[1] for n in names[:p]) == sorted(images.photo_names())  # round 0: each photo once
    assert all("/crop1/flip" in n for n in names[p:2 * p])
    assert "/crop2" in names[2 * p] and "flip" not in names[2 * p]
    assert torch.isfinite(x).all()
    # round 0 is exactly the eval transform of the photo
    name = names[0].split(":")[1]
    ref = images.eval_transform(images.photo(name), 32, inputs.IMAGENET_MEAN, inputs.IMAGENET_STD)
    np.testing.assert_allclose(x[0].numpy(), ref.astype(np.float32))


def test_mean_std_are_applied():
    a = inputs.parity_set(4, 32, mean=(0, 0, 0), std=(1, 1, 1)).x
    b = inputs.parity_set(4, 32, mean=MEAN, std=STD).x
    nat = 0  # natural sample: pixels in [0, 1] before normalization
    assert 0 <= float(a[nat].min()) and float(a[nat].max()) <= 1
    np.testing.assert_allclose(b[nat].numpy(), ((a[nat].double() - torch.tensor(MEAN).view(3, 1, 1).double())
                                                  / torch.tensor(STD).view(3, 1, 1).double()).float().numpy(),
                               rtol=1e-6, atol=1e-6)


# ---- user folders -----------------------------------------------------------------------------------

def _save(path: Path, photo: str, size=(96, 80), fmt=None, mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    images.photo(photo).resize(size).convert(mode).save(path, format=fmt)
    return path


def test_user_flat_folder(tmp_path):
    _save(tmp_path / "b.png", "coffee")
    _save(tmp_path / "a.jpg", "chelsea", mode="L")  # grey JPEG becomes RGB
    _save(tmp_path / "c.JPEG", "rocket", fmt="JPEG")
    (tmp_path / "notes.txt").write_text("ignored")
    (tmp_path / ".hidden.jpg").write_bytes(b"")  # hidden: ignored
    s = inputs.user_set(tmp_path, 32, MEAN, STD)
    assert s.names[:3] == ("user:a.jpg", "user:b.png", "user:c.JPEG")
    assert s.sets == ("user",) * 3 + ("stress",) * inputs.USER_STRESS
    assert s.labels is None and s.classes is None
    ref = images.eval_transform(images.load_image(tmp_path / "b.png"), 32, MEAN, STD)
    np.testing.assert_allclose(s.x[1].numpy(), ref.astype(np.float32))
    np.testing.assert_array_equal(s.x[3:].numpy(), inputs.parity_inputs(16, 32, 0, MEAN, STD).numpy())
    assert len(inputs.user_set(tmp_path, 32, stress=20)) == 23


def test_user_imagefolder_labels_sorted_and_from_file(tmp_path):
    _save(tmp_path / "dog" / "1.jpg", "chelsea")
    _save(tmp_path / "cat" / "x.png", "coffee")
    _save(tmp_path / "cat" / "y.png", "astronaut")
    s = inputs.user_set(tmp_path, 32)
    assert s.classes == ("cat", "dog")
    assert s.names[:3] == ("user:cat/x.png", "user:cat/y.png", "user:dog/1.jpg")
    assert s.labels == (0, 0, 1) + (-1,) * 16
    labels = tmp_path.parent / f"{tmp_path.name}_labels.txt"
    labels.write_text("tench\ndog\ncat\n\n")
    s = inputs.user_set(tmp_path, 32, labels_file=labels)
    assert s.classes == ("tench", "dog", "cat") and s.labels[:3] == (2, 2, 1)
    np.testing.assert_array_equal(s.labels_array()[3:], -1)


@pytest.mark.parametrize("case", ["empty_file", "corrupt", "empty_folder", "empty_class", "unknown_class",
                                  "mixed", "not_a_folder", "empty_labels", "duplicate_label"])
def test_user_folder_errors_name_the_culprit(tmp_path, case):
    root = tmp_path / "imgs"
    root.mkdir()
    labels = None
    if case == "empty_file":
        _save(root / "ok.jpg", "coffee")
        (root / "bad.jpg").write_bytes(b"")
        culprit = "bad.jpg"
    elif case == "corrupt":
        p = _save(root / "cls" / "bad.png", "coffee")
        p.write_bytes(p.read_bytes()[:60])
        culprit = "bad.png"
    elif case == "empty_folder":
        (root / "readme.txt").write_text("no images")
        culprit = str(root)
    elif case == "empty_class":
        _save(root / "a" / "1.jpg", "coffee")
        (root / "b").mkdir()
        culprit = str(root / "b")
    elif case == "unknown_class":
        _save(root / "cat" / "1.jpg", "coffee")
        _save(root / "zebra" / "1.jpg", "coffee")
        labels = tmp_path / "labels.txt"
        labels.write_text("cat\ndog\n")
        culprit = "zebra"
    elif case == "mixed":
        _save(root / "a" / "1.jpg", "coffee")
        _save(root / "2.jpg", "coffee")
        culprit = "2.jpg"
    elif case == "not_a_folder":
        root = _save(tmp_path / "one.jpg", "coffee")
        culprit = "one.jpg"
    elif case == "empty_labels":
        _save(root / "a" / "1.jpg", "coffee")
        labels = tmp_path / "labels.txt"
        labels.write_text("\n\n")
        culprit = "labels.txt"
    else:
        _save(root / "crane" / "1.jpg", "coffee")
        labels = tmp_path / "labels.txt"
        labels.write_text("crane\nbird\ncrane\n")
        culprit = "crane"
    with pytest.raises(VitedgeError) as e:
        inputs.user_set(root, 32, labels_file=labels)
    assert culprit in str(e.value) and "\n" not in str(e.value)


def test_photos_ship_in_the_wheel(tmp_path):
    """A non-editable build carries the photos and their SOURCES.md as package data."""
    pytest.importorskip("setuptools")
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", "runs", "__pycache__", "tests", "benchmarks",
                                                             "docs", "examples", "*.egg-info", "build"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    wheel = next((tmp_path / "dist").glob("vitedge-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for n in images.photo_names():
        assert f"vitedge/exporter/verdict/photos/{n}.jpg" in names
    assert "vitedge/exporter/verdict/photos/SOURCES.md" in names
