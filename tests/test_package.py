"""`vitedge package`: unpack the bundle, check every sha256, re-run the golden vectors through the emulated
CoreML hop, and get byte-identical bundles from two runs (API, then CLI)."""
from __future__ import annotations

import hashlib
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import vitedge
from vitedge.exporter.packaging.package import PackageResult, package
from vitedge.exporter.verdict.parity import compute_metrics
from vitedge.exporter.core.report import Tolerance
from vitedge.errors import VitedgeError
from vitedge.models.reduced import reduced
from vitedge.targets.coreml import EmulatedCoreMLRunner
from vitedge.targets.coreml.mil_interpreter import load_program

MODEL = "swiftformer_xs"
OVERRIDES = reduced("swiftformer")  # the golden fixture's size
LABELS = [f"class_{i}" for i in range(10)]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    root = tmp_path_factory.mktemp("package")
    labels = root / "labels.txt"
    labels.write_text("\n".join(LABELS) + "\n")
    res = vitedge.package(MODEL, root / "a.zip", labels=labels, samples=8, overrides=OVERRIDES, imgsz=64)
    assert isinstance(res, PackageResult) and res.exit_code == 0, [(h.hop, h.reason) for h in res.report.parity]
    unpacked = root / "unpacked"
    with zipfile.ZipFile(res.path) as zf:
        zf.extractall(unpacked)
    return res, root, labels, unpacked / MODEL


def test_every_file_is_listed_with_its_sha256(bundle):
    res, _, _, folder = bundle
    manifest = json.loads((folder / "manifest.json").read_text())
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    for rel, digest in manifest["files"].items():
        assert hashlib.sha256((folder / rel).read_bytes()).hexdigest() == digest, rel
    assert {"README.md", "labels.txt", "golden/inputs.npy", "golden/outputs.npy", "golden/golden.json",
            f"{MODEL}.mlpackage/Manifest.json"} <= on_disk


def test_manifest_says_what_was_packaged(bundle):
    _, _, _, folder = bundle
    m = json.loads((folder / "manifest.json").read_text())
    assert m["model"] == MODEL and m["imgsz"] == 64 and m["precision"] == "fp16" and m["ios"] == 16
    assert m["weights"] == "untrained" and "meaningless" in m["weights_note"]
    assert m["input"]["kind"] == "image" and m["input"]["pixel_range"] == [0, 255]
    assert m["labels"] == {"file": "labels.txt", "count": 10}
    assert m["outputs"] == ["classLabel", "classLabel_probs", "logits"]
    coreml = next(h for h in m["parity"] if h["hop"] == "coreml")
    assert coreml["status"] == "passed" and coreml["mode"] == "emulated"
    assert all(h["mode"] != "device" for h in m["parity"] if h["hop"] == "coreml")  # no macOS here
    assert m["versions"]["coremltools"] and m["precision_policy"]["rules"]
    assert m["onnx_exporter"] == {"exporter": "torchscript", "exporter_fallback": None}  # the ladder's base graph
    readme = (folder / "README.md").read_text()
    assert "import CoreML" in readme and "Demo weights" in readme and f"{MODEL}.mlpackage" in readme
    assert (folder / "labels.txt").read_text().split() == LABELS


def test_golden_vectors_rerun_through_the_emulated_hop(bundle):
    _, _, _, folder = bundle
    golden = json.loads((folder / "golden/golden.json").read_text())
    pixels = np.load(folder / golden["inputs"]["file"])
    expected = np.load(folder / golden["outputs"]["file"])
    assert pixels.dtype == np.uint8 and list(pixels.shape) == golden["inputs"]["shape"] and pixels.shape[-1] == 3
    assert list(expected.shape) == golden["outputs"]["shape"]
    mlpackage = folder / f"{MODEL}.mlpackage"
    runner = EmulatedCoreMLRunner(mlpackage)  # the unpacked package still resolves through its Manifest.json
    y = runner.run_raw(pixels.transpose(0, 3, 1, 2).astype(np.float32))
    tol = Tolerance(**golden["tolerance"])
    assert not tol.violations(compute_metrics(expected, y))
    # the classifier output agrees with the logits it was built from
    prog = load_program(mlpackage)
    out = prog.run({"image": pixels[:1].transpose(0, 3, 1, 2).astype(np.float32)})
    assert out["classLabel"] == LABELS[int(np.argmax(out["logits"]))]
    assert sum(out["classLabel_probs"].values()) == pytest.approx(1.0, abs=1e-3)


def test_cli_repeat_is_byte_identical(bundle):
    from vitedge.cli import main

    res, root, labels, _ = bundle
    sets = [f"{k}={v}" for k, v in OVERRIDES.items()]
    args = ["-q", "package", "--model", MODEL, "--labels", str(labels), "--samples", "8", "--imgsz", "64",
            "--out", str(root / "b.zip")]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    # (the first build stored the float64 ground truth, this one read it: the manifest keeps neither fact, nor the
    # cache's local path, only its key)
    assert set(res.manifest["parity_reference"]["cache"]) == {"key"}
    assert (root / "b.zip").read_bytes() == res.path.read_bytes()
    assert main(args) == 2  # exists: refuses without --force


def test_bad_input_is_refused_before_any_work(tmp_path):
    with pytest.raises(VitedgeError, match=".zip"):
        package(MODEL, tmp_path / "bundle.tar")
    with pytest.raises(VitedgeError, match="not found"):
        package(MODEL, tmp_path / "b.zip", labels=tmp_path / "missing.txt")
    with pytest.raises(VitedgeError, match="--ios"):
        package(MODEL, tmp_path / "b.zip", ios=15)
    assert not list(tmp_path.iterdir())


def _manifest_differences(a: dict, b: dict, path: str = "") -> list[str]:
    """Where two manifests differ (for the assertion message): JSON paths with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _manifest_differences(a.get(k), b.get(k), f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _manifest_differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_bundle_bytes_repeat_in_fresh_processes_on_any_thread_count(bundle, tmp_path):
    """Fresh processes with empty ground-truth caches (everything recomputed), on 2 threads and on 1 (torch and
    OpenBLAS through OMP_NUM_THREADS, ONNX Runtime and ExecuTorch through VITEDGE_THREADS), and the in-process
    fixture (torch on 1 thread, ONNX Runtime on every core) give the same bundle byte for byte: the manifest's
    measured hop metrics included, not only the golden vectors."""
    import os
    import subprocess
    import sys

    res, root, labels, _ = bundle
    cli = Path(__file__).resolve().parents[1] / "cli.py"

    def build(name, threads):
        out = root / f"{name}.zip"
        args = [sys.executable, str(cli), "-q", "package", "--model", MODEL, "--labels", str(labels), "--samples",
                "8", "--imgsz", "64", "--out", str(out)]
        for k, v in OVERRIDES.items():
            args += ["--set", f"{k}={v}"]
        env = {**os.environ, "VITEDGE_CACHE_DIR": str(tmp_path / name), "OMP_NUM_THREADS": threads,
               "VITEDGE_THREADS": threads}
        r = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        return out.read_bytes()

    def manifest(data: bytes) -> bytes:
        return zipfile.ZipFile(io.BytesIO(data)).read(f"{MODEL}/manifest.json")

    first = build("first", "2")  # against the in-process fixture: a rebuild in a fresh process, too
    for name, other in (("1 thread", build("one_thread", "1")), ("in-process", res.path.read_bytes())):
        a, b = json.loads(manifest(first)), json.loads(manifest(other))
        assert manifest(first) == manifest(other), (name, _manifest_differences(a, b))
        assert first == other, name
