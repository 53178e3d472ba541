"""`--images DIR` and `--labels FILE` on export, parity, bench and package: folders built here from the photos
vitedge ships, the per-set report fields, accuracy checked against an independent computation, the labels in
the ONNX graph's metadata, and bad folders (exit 2, the file or folder named)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest

from vitedge.cli import format_summary, main
from vitedge.exporter.verdict import images
from vitedge.exporter.timing.bench import run_bench
from vitedge.exporter.reparam.build_forms import build_train_form
from vitedge.exporter.verdict.inputs import USER_STRESS, user_set
from vitedge.exporter.verdict.parity import ground_truth, run_batched
from vitedge.exporter.core.report import Report
from vitedge.models import get_spec
from vitedge.models.reduced import reduced
from vitedge.targets.graph.metadata import read_metadata
from vitedge.targets.onnx.target import OnnxRuntimeRunner

NAME = "swiftformer_xs"
TINY = reduced("swiftformer", num_classes=3)
SETS = ["--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]", "--set", "num_classes=3"]
IMGSZ = 64
CLASSES = ("coffee", "rocket", "astronaut")  # labels file order != sorted folder order
FOLDERS = {"coffee": ["coffee", "chelsea", "flower"], "rocket": ["rocket", "camera"], "astronaut": ["astronaut"]}


def _photo(name: str, dst) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(images.PHOTOS_DIR / f"{name}.jpg", dst)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_images")
    for n in ("coffee", "rocket", "grace_hopper", "brick", "china"):
        _photo(n, root / "flat" / f"{n}.jpg")
    for cls, photos in FOLDERS.items():
        for p in photos:
            _photo(p, root / "classes" / cls / f"{p}.jpg")
    (root / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    return root


@pytest.fixture(scope="module")
def labelled(folders, tmp_path_factory):
    """`vitedge export --images DIR/<class>/... --labels FILE`: the report and the run folder."""
    out = tmp_path_factory.mktemp("labelled") / "run"
    rc = main(["-q", "export", "--model", NAME, *SETS, "--imgsz", str(IMGSZ), "--images", str(folders / "classes"),
               "--labels", str(folders / "labels.txt"), "--out", str(out)])
    assert rc == 0
    return Report.read(out / "report.json"), out


def _accuracy(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    top = np.argsort(-logits, axis=1)[:, :k]
    return float(np.mean([labels[i] in top[i] for i in range(len(labels))]))


def test_flat_folder_is_the_parity_set_beside_a_stress_set(folders, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["-q", "export", "--model", NAME, *SETS, "--imgsz", str(IMGSZ), "--images", str(folders / "flat"),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    r = Report.read(out / "report.json")
    assert r.samples == 5 + USER_STRESS and r.images == str(folders / "flat") and "5 user images" in r.inputs
    for h in r.parity:
        assert set(h.sets) == {"user", "stress"} and h.sets["user"]["samples"] == 5
        assert h.sets["user"]["top1_accuracy"] is None and h.sets["user"]["noise_ratio"] <= 1
        assert h.sets["user"]["worst_sample"]["name"].startswith("user:")
    assert set(r.reference["sets"]) == {"user", "stress"} and r.reference["top1_accuracy"] is None
    assert "ratio user" in printed and "ratio stress" in printed and "acc@1" not in printed
    # the same folder judges the artifact in `vitedge parity`
    rep = tmp_path / "parity.json"
    assert main(["-q", "parity", "--model", NAME, "--artifact", str(out / f"{NAME}.onnx"), "--images",
                 str(folders / "flat"), "--report", str(rep)]) == 0
    assert set(json.loads(rep.read_text())["parity"][1]["sets"]) == {"user", "stress"}


def test_imagefolder_with_labels_reports_accuracy_per_hop_and_for_the_train_form(labelled, folders):
    r, out = labelled
    n = sum(len(v) for v in FOLDERS.values())
    assert r.samples == n + USER_STRESS and r.labels == str(folders / "labels.txt")
    # independent check: labels by the file's lines, logits of the train-form (float64) and of the ONNX artifact
    ps = user_set(folders / "classes", IMGSZ, *_stats(), labels_file=folders / "labels.txt")
    y = np.asarray(ps.labels[:n])
    assert sorted(y.tolist()) == sorted(CLASSES.index(c) for c, ph in FOLDERS.items() for _ in ph)
    train = build_train_form(NAME, overrides=TINY).model
    truth = ground_truth(train, ps.numpy()[:n], ps.sets[:n])
    for k in (1, 5):
        assert r.reference[f"top{k}_accuracy"] == pytest.approx(_accuracy(truth.y64, y, k))
        assert r.reference["sets"]["user"][f"top{k}_accuracy"] == pytest.approx(_accuracy(truth.y64, y, k))
        assert r.reference["sets"]["stress"][f"top{k}_accuracy"] is None  # stress samples carry no labels
    onnx_logits = run_batched(OnnxRuntimeRunner(out / f"{NAME}.onnx"), ps.numpy()[:n])
    hop = r.hop("onnx-simplified")
    assert hop.sets["user"]["top1_accuracy"] == pytest.approx(_accuracy(onnx_logits, y, 1))
    assert all(h.sets["user"]["top5_accuracy"] is not None for h in r.parity)
    # every hop's accuracy stands beside the float64 train-form's on exactly the hop's images
    for h in r.parity:
        u = h.sets["user"]
        for k in (1, 5):
            want = r.reference["sets"]["user"][f"top{k}_accuracy"] if u["samples"] == n else None
            assert u[f"reference_top{k}_accuracy"] is not None, h.hop
            assert want is None or u[f"reference_top{k}_accuracy"] == pytest.approx(want), h.hop
        assert u["labelled"] == u["samples"] and 0 <= u["correct"] <= u["labelled"]
    table = format_summary(r)
    u = hop.sets["user"]
    assert "acc@1 hop / ref" in table and f"{u['top1_accuracy']:.1%} / {u['reference_top1_accuracy']:.1%}" in table


def _stats():
    spec = get_spec(NAME)
    return spec.mean, spec.std


def test_labels_travel_in_the_onnx_metadata_and_are_checked_by_parity(labelled, folders, tmp_path, capsys):
    _, out = labelled
    graph = out / f"{NAME}.onnx"
    assert read_metadata(onnx.load(str(graph)))["labels"] == list(CLASSES)
    props = {p.key: p.value for p in onnx.load(str(graph)).metadata_props}
    assert json.loads(props["vitedge.labels"]) == list(CLASSES)
    other = tmp_path / "other.txt"
    other.write_text("a\nb\nc\n")
    assert main(["-q", "parity", "--model", NAME, "--artifact", str(graph), "--labels", str(other), "--samples",
                 "4"]) == 2
    err = capsys.readouterr().err.strip()
    assert "other.txt" in err and "vitedge.labels" in err and len(err.splitlines()) == 1


def test_bench_judges_backends_on_the_users_images(folders):
    r = run_bench(NAME, overrides=TINY, imgsz=str(IMGSZ), backends="torch-deploy", min_iters=2, warmup_s=0.0,
                  max_s=0.0, images=folders / "classes", labels=folders / "labels.txt")
    res = r.results[0]
    assert res.status == "ok" and res.valid and set(res.parity_sets) == {"user", "stress"}
    assert res.parity_sets["user"]["top1_accuracy"] is not None and res.parity_sets["user"]["noise_ratio"] <= 1
    assert r.reference[0]["imgsz"] == IMGSZ and r.reference[0]["top1_accuracy"] is not None
    assert "user images" in r.settings["parity_inputs"]


@pytest.mark.parametrize("command", ["export", "parity", "bench", "package"])
def test_a_missing_images_folder_exits_2_naming_it_on_every_command(command, tmp_path, capsys):
    missing = tmp_path / "no_such_folder"
    extra = {"export": ["--out", str(tmp_path / "out")], "parity": ["--artifact", str(tmp_path / "x.onnx")],
             "bench": [], "package": ["--out", str(tmp_path / "b.zip")]}[command]
    if command == "parity":
        (tmp_path / "x.onnx").write_bytes(b"")
    rc = main(["-q", command, "--model", NAME, "--images", str(missing), *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "no_such_folder" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "b.zip").exists()


def test_carried_labels_compare_by_names_onnx_or_by_count_coreml():
    from vitedge.errors import VitedgeError
    from vitedge.exporter.flow.verify import _check_carried_labels

    names = ["a", "b", "c"]
    for carried in (None, ["a", "b", "c"], 3):  # nothing carried; ONNX's vitedge.labels; CoreML's label count
        _check_carried_labels(names, carried, "l.txt", "x")
    for carried in (["a", "c", "b"], 4):
        with pytest.raises(VitedgeError, match="l.txt"):
            _check_carried_labels(names, carried, "l.txt", "x")
    _check_carried_labels(None, ["z"], None, "x")  # no --labels: nothing to compare


def test_16_bit_images_are_scaled_by_their_bit_depth(tmp_path):
    """A dark 16-bit grey PNG stays dark: 16383 of 65535 reads as 64 of 255, not stretched to its own maximum."""
    from PIL import Image

    a = np.full((8, 8), 16383, dtype=np.uint16)
    a[0, 0] = 0
    path = tmp_path / "dark16.png"
    Image.fromarray(a).save(path)
    with Image.open(path) as im:
        assert im.mode.startswith("I")  # read as 16-bit samples
    rgb = np.asarray(images.load_image(path))
    assert rgb.shape == (8, 8, 3) and rgb[1, 1].tolist() == [64, 64, 64] and rgb[0, 0].tolist() == [0, 0, 0]


def test_calib_images_overlapping_images_is_refused_before_any_work(folders, tmp_path, capsys):
    import time

    t0 = time.perf_counter()
    rc = main(["-q", "export", "--model", NAME, *SETS, "--imgsz", str(IMGSZ), "--precision", "int8",
               "--images", str(folders / "classes"), "--calib-images", str(folders / "flat"), "--calib", "5",
               "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "is the same image as" in err and len(err.splitlines()) == 1, err
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "out").exists()
