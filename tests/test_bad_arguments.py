"""Bad arguments to `vitedge export` (issue 8): each exits 2 with a one-line error that names the problem (and,
where there is one, the fix), prints nothing to stdout and writes nothing: --out points one level below a folder
that does not exist yet, and afterwards neither exists (no output folder, no parent made, no temporary sibling).

The whole table runs through `vitedge.cli.main` in-process (same code path, milliseconds a case); one case of
each kind also runs as a real `python cli.py ...` process from the repo root (concurrently: each mostly pays
the interpreter and torch import), and one through the installed `vitedge` console script.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from vitedge.tests._ci import unavailable

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TIMEOUT = 300
# A tiny SwiftFormer: if a bad argument slipped through, the export would still finish quickly (and fail here).
SWIFT = ("--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]", "--imgsz", "32")
SLAB_TINY = ("--set", "embed_dim=16", "--set", "depth=1", "--set", "num_heads=1")


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    expect: tuple[str, ...]  # each must appear in the error line (case-insensitive)


CASES = [
    # models and sizes
    Case("unknown-model", ("--model", "swiftformer_xz"), ("swiftformer_xz", "did you mean", "swiftformer_xs")),
    Case("model-name-case", ("--model", "SwiftFormer_XS"), ("SwiftFormer_XS", "did you mean 'swiftformer_xs'")),
    Case("argparse-error-is-one-line", ("--model", "swiftformer_xs", "--imgsz", "abc", "--bogus"), ("--help",)),
    # deploy-form rewrites
    Case("unknown-rewrite", (*SWIFT, "--rewrites", "sla_everything"), ("sla_everything", "tokens_channels_first")),
    Case("rewrites-with-no-reparam", (*SWIFT, "--rewrites", "none", "--no-reparam"), ("--rewrites", "--no-reparam")),
    Case("empty-rewrites", (*SWIFT, "--rewrites", ","), ("--rewrites", "comma list")),
    Case("size-not-multiple-of-stride", (*SWIFT, "--imgsz", "100"), ("100", "32", "--imgsz 96 or 128")),
    Case("sima-size-not-multiple-of-patch", ("--model", "sima_nano_12_p16", "--set", "depth=1", "--imgsz", "40"),
         ("40", "16")),
    Case("slab-deit-size-not-multiple-of-patch", ("--model", "slab_deit_tiny", *SLAB_TINY, "--imgsz", "250"),
         ("250", "16", "--imgsz 256 or 240")),
    Case("imgsz-zero", (*SWIFT, "--imgsz", "0"), ("--imgsz", "0")),
    Case("bad-override", (*SWIFT, "--set", "bogus_width=3"), ("bogus_width",)),
    # overrides with valid names whose values no model can be built from: usage errors too, not internal errors
    Case("override-heads-not-dividing", ("--model", "slab_deit_tiny", "--set", "embed_dim=30", "--set", "num_heads=4"),
         ("embed_dim", "num_heads")),
    Case("override-sima-stem-too-narrow", ("--model", "sima_nano_12_p16", "--set", "embed_dim=4", "--set",
                                           "num_heads=1", "--set", "depth=1"), ("embed_dim",)),
    Case("override-swiftformer-stage-lists", ("--model", "swiftformer_xs", "--set", "layers=[1,1]", "--imgsz", "32"),
         ("layers", "embed_dims")),
    Case("override-swin-heads-not-dividing", ("--model", "slab_swin_tiny", "--set", "embed_dim=16", "--set",
                                              "depths=[1,1,1,1]", "--set", "num_heads=[3,3,3,3]"), ("num_heads",)),
    Case("override-swin-window-not-dividing", ("--model", "prepbn_swin_tiny", "--set", "embed_dim=16", "--set",
                                               "depths=[1,1,1,1]", "--set", "num_heads=[1,1,1,1]", "--set",
                                               "window_size=5"), ("window",)),
    # batch
    Case("batch-zero", (*SWIFT, "--batch", "0"), ("--batch", "0")),
    Case("batch-negative", (*SWIFT, "--batch", "-2"), ("--batch", "-2")),
    Case("batch-with-dynamic-batch", (*SWIFT, "--batch", "2", "--dynamic-batch"), ("--batch", "--dynamic-batch")),
    # targets and flags that do not apply to them
    Case("unknown-target", (*SWIFT, "--target", "onxx"), ("onxx", "onnx")),
    Case("unknown-target-in-list", (*SWIFT, "--target", "onnx,tensorrtt"), ("tensorrtt", "tensorrt")),
    Case("dynamic-batch-with-coreml", (*SWIFT, "--target", "coreml", "--dynamic-batch"), ("--dynamic-batch", "coreml")),
    Case("dynamic-batch-with-onnx-and-coreml", (*SWIFT, "--target", "onnx,coreml", "--dynamic-batch"),
         ("--dynamic-batch", "coreml")),
    Case("coreml-flag-with-onnx", (*SWIFT, "--target", "onnx", "--ios", "17"), ("--ios", "coreml")),
    # --labels (every target) and --images: the file or folder named, before any export work
    Case("labels-file-missing-with-onnx", (*SWIFT, "--target", "onnx", "--labels", "{inputs}/labels_y.txt"),
         ("--labels", "labels_y.txt", "not found")),
    Case("labels-count-not-the-models", (*SWIFT, "--target", "onnx", "--labels", "{inputs}/labels_3.txt"),
         ("labels_3.txt", "3 labels", "1000 classes")),
    Case("images-not-a-folder", (*SWIFT, "--images", "{inputs}/weights_b.pth"), ("--images", "not a folder")),
    Case("images-without-images", (*SWIFT, "--images", "{inputs}/weights_a"), ("weights_a", "no images")),
    Case("images-unreadable-file", (*SWIFT, "--images", "{inputs}/imgs_bad"), ("broken.jpg", "empty")),
    Case("images-class-not-in-labels", (*SWIFT, "--set", "num_classes=2", "--images", "{inputs}/imgs_cls",
                                        "--labels", "{inputs}/labels_2.txt"), ("zebra", "labels_2.txt")),
    # a bad value for an option of a requested target: rejected before any work (no model built, no folder made)
    Case("coreml-labels-file-missing", (*SWIFT, "--target", "onnx,coreml", "--labels", "{inputs}/labels_x.txt"),
         ("--labels", "labels_x.txt")),
    Case("tensorrt-flag-with-onnx", (*SWIFT, "--target", "onnx", "--workspace", "2"), ("--workspace", "tensorrt")),
    Case("tensorrt-max-batch-with-coreml", (*SWIFT, "--target", "coreml", "--max-batch", "4"),
         ("--max-batch", "tensorrt")),
    # checkpoints
    Case("missing-checkpoint", (*SWIFT, "--checkpoint", "{inputs}/weights_c.pth"), ("weights_c.pth", "not found")),
    Case("directory-as-checkpoint", (*SWIFT, "--checkpoint", "{inputs}/weights_a"), ("weights_a", "director")),
    Case("empty-checkpoint", (*SWIFT, "--checkpoint", "{inputs}/weights_b.pth"), ("weights_b.pth", "empty")),
    # opset, precision, parity flags
    Case("opset-too-old", (*SWIFT, "--opset", "5"), ("--opset", "5")),
    Case("opset-too-new", (*SWIFT, "--opset", "99"), ("--opset", "99")),
    Case("opset-not-a-number", (*SWIFT, "--opset", "seventeen"), ("--opset", "seventeen")),
    Case("precision-unknown", (*SWIFT, "--precision", "fp8"), ("--precision", "fp8")),
    # compressed precisions: only where a target supports them, with the flags that apply to them
    Case("int8-with-coreml", (*SWIFT, "--target", "coreml", "--precision", "int8"), ("--precision int8", "coreml",
                                                                                      "onnx", "tensorrt")),
    Case("w8-with-onnx", (*SWIFT, "--target", "onnx", "--precision", "w8"), ("--precision w8", "coreml")),
    Case("w8a8-with-ios16", (*SWIFT, "--target", "coreml", "--precision", "w8a8", "--ios", "16"),
         ("w8a8", "ios 17", "--ios 16")),
    Case("calib-zero", (*SWIFT, "--precision", "int8", "--calib", "0"), ("--calib", "0")),
    Case("calib-negative", (*SWIFT, "--precision", "int8", "--calib", "-3"), ("--calib", "-3")),
    Case("calib-with-w8", (*SWIFT, "--target", "coreml", "--precision", "w8", "--calib", "16"),
         ("--calib", "w8", "int8 and w8a8")),
    Case("calib-images-with-palette4", (*SWIFT, "--target", "coreml", "--precision", "palette4", "--calib-images",
                                        "{inputs}"), ("--calib-images", "palette4")),
    Case("calib-with-fp16", (*SWIFT, "--precision", "fp16", "--calib", "8"), ("--calib", "int8 and w8a8")),
    Case("calib-images-missing", (*SWIFT, "--precision", "int8", "--calib-images", "{inputs}/no_such_dir"),
         ("--calib-images", "no_such_dir", "not a folder")),
    Case("attn-order-unknown", (*SWIFT, "--attn-order", "sideways"), ("--attn-order", "sideways")),
    Case("samples-zero", (*SWIFT, "--samples", "0"), ("--samples", "0")),
    Case("tolerance-unknown-key", (*SWIFT, "--tol", "fp32.closeness=1"), ("--tol", "closeness")),
]


def make_inputs(folder: Path) -> Path:
    """The files the checkpoint cases point at: a directory and an empty file (neutral names, so an expected
    word such as "empty" cannot be matched by the path itself)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "weights_a").mkdir(exist_ok=True)
    (folder / "weights_b.pth").touch()
    (folder / "labels_3.txt").write_text("cat\ndog\ncrane\n")
    (folder / "labels_2.txt").write_text("cat\ndog\n")
    (folder / "imgs_bad").mkdir(exist_ok=True)
    (folder / "imgs_bad" / "broken.jpg").touch()  # an empty image file
    from PIL import Image
    for cls in ("cat", "zebra"):  # ImageFolder layout; "zebra" is not a line of labels_2.txt
        (folder / "imgs_cls" / cls).mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8), (10, 20, 30)).save(folder / "imgs_cls" / cls / "a.png")
    return folder


def case_argv(case: Case, root: Path) -> list[str]:
    inputs = make_inputs(root / "inputs")
    args = [a.replace("{inputs}", str(inputs)) for a in case.args]
    samples = [] if "--samples" in args else ["--samples", "2"]
    # --out one level below a folder that does not exist yet: creating it would already be writing output.
    return ["-q", "export", *args, *samples, "--out", str(root / "nested" / "out")]


def run(argv: list[str], exe: list[str] | None = None) -> subprocess.CompletedProcess:
    """`python cli.py ARGV` (or `exe ARGV`) from the repo root, as a user runs it."""
    return subprocess.run([*(exe or [sys.executable, "cli.py"]), *argv], cwd=REPO, env=ENV, capture_output=True,
                          text=True, timeout=TIMEOUT)


def run_in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    """`vitedge.cli.main(ARGV)` with its output captured: the same code path without an interpreter start."""
    from vitedge.cli import main

    try:
        rc = main(argv)
    except SystemExit as e:  # argparse rejects bad usage by exiting
        rc = e.code
    cap = capsys.readouterr()
    return subprocess.CompletedProcess(argv, rc, cap.out, cap.err)


def assert_usage_error(r: subprocess.CompletedProcess, root: Path, expect: tuple[str, ...]) -> None:
    assert r.returncode == 2, f"exit {r.returncode}, expected 2; stderr: {r.stderr[-1500:]}"
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stdout.strip() == "", f"nothing belongs on stdout for a usage error: {r.stdout[-500:]}"
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    error = lines[-1] if lines else ""
    assert error.startswith(("vitedge: error: ", "vitedge export: error: ")), f"no error line: {r.stderr[-1500:]}"
    # One line of error, argparse's own errors too (no usage block: they point at --help instead)
    assert len(lines) == 1, f"more than the one error line: {r.stderr[-1500:]}"
    message = error.replace(str(root), "<root>")  # expected words must come from the message, not the path
    missing = [e for e in expect if e.lower() not in message.lower()]
    assert not missing, f"error line lacks {missing}: {error!r}"
    out = root / "nested" / "out"
    assert not out.exists(), f"{out} was created by a rejected command"
    leftovers = sorted(p.name for p in root.iterdir() if p.name != "inputs")
    assert leftovers == [], f"a rejected command left {leftovers} in {root}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_argument(case, tmp_path, capsys):
    r = run_in_process(case_argv(case, tmp_path), capsys)
    assert_usage_error(r, tmp_path, case.expect)


# One case per kind of check (argparse, before any model is built, after it is built, checkpoint, target
# flags), as real processes: the exit status and stderr of `python cli.py` itself.
PROCESS_CASES = ["unknown-model", "batch-zero", "slab-deit-size-not-multiple-of-patch", "directory-as-checkpoint",
                 "dynamic-batch-with-coreml"]


@pytest.fixture(scope="module")
def process_results(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Run PROCESS_CASES once, concurrently: each mostly pays the interpreter and torch import."""
    base = tmp_path_factory.mktemp("bad_args")
    by_id = {c.id: c for c in CASES}

    def one(i_name):
        i, name = i_name
        root = base / f"p{i:02d}"  # neutral folder names: see make_inputs
        root.mkdir()
        return name, (run(case_argv(by_id[name], root)), root)

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(pool.map(one, enumerate(PROCESS_CASES)))


@pytest.mark.parametrize("name", PROCESS_CASES)
def test_bad_argument_as_a_process(name, process_results):
    r, root = process_results[name]
    assert_usage_error(r, root, next(c for c in CASES if c.id == name).expect)


def test_console_script_same_error(tmp_path):
    """The installed `vitedge` entry point behaves as `python cli.py` for the same bad input."""
    exe = shutil.which("vitedge")
    if exe is None:
        unavailable("the `vitedge` console script is not on PATH (pip install -e . installs it)")
    case = CASES[0]
    r = run(case_argv(case, tmp_path), exe=[exe])
    assert_usage_error(r, tmp_path, case.expect)


def test_existing_out_file_is_refused_untouched(tmp_path, capsys):
    """--out naming an existing file: exit 2, the file is left as it was and nothing appears beside it."""
    target = tmp_path / "out"
    target.write_text("not a folder\n")
    r = run_in_process(["-q", "export", *SWIFT, "--samples", "2", "--out", str(target)], capsys)
    assert r.returncode == 2, r.stderr[-1500:]
    error = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(error) == 1 and "is a file" in error[0].replace(str(tmp_path), "<root>"), r.stderr
    assert target.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
