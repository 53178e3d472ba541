"""Every --out problem is found before any work and exits 2 with one line (never 3, never at the final rename), and
--force replaces only what vitedge wrote: a folder holding a user's own file survives it."""
from __future__ import annotations

import subprocess
import time

import pytest

from vitedge.cli import main
from vitedge.exporter.core import outdir

TINY = ["--model", "swiftformer_xs", "--set", "layers=[1,1,1,1]", "--set", "embed_dims=[8,8,16,16]",
        "--set", "num_classes=5", "--imgsz", "32", "--samples", "2"]


def _refused(args, capsys, *needles) -> str:
    t0 = time.perf_counter()
    assert main(["-q", "export", *TINY, *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("vitedge: error:"), err
    assert all(n in err for n in needles), err
    assert time.perf_counter() - t0 < 5, "refused only after work"
    return err


@pytest.mark.parametrize("out", [".", "..", "runs/.."])
def test_dot_and_dotdot_are_refused(out, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(["--out", out], capsys, "'.' or '..'")


def test_a_file_and_a_path_under_a_file_are_refused(tmp_path, capsys):
    f = tmp_path / "afile.txt"
    f.write_text("mine")
    _refused(["--out", str(f)], capsys, "is a file")
    _refused(["--out", str(f / "sub")], capsys, "which is a file")
    assert f.read_text() == "mine"


def test_proc_is_refused_before_any_work(capsys):
    _refused(["--out", "/proc/vitedge-x"], capsys, "cannot write in /proc")


def test_an_immutable_parent_is_refused_before_any_work(tmp_path, capsys):
    parent = tmp_path / "locked"
    parent.mkdir()
    if subprocess.run(["chattr", "+i", str(parent)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem (needs ext4-like attributes and root)")
    try:
        _refused(["--out", str(parent / "run")], capsys, "cannot write in", str(parent))
        _refused(["--out", str(parent / "a" / "b")], capsys, "cannot write in")
    finally:
        subprocess.run(["chattr", "-i", str(parent)], check=True)
    assert list(parent.iterdir()) == []


def test_force_keeps_foreign_files_unless_clean(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["-q", "export", *TINY, "--out", str(out)]) == 0
    manifest = (out / outdir.MANIFEST).read_text()
    assert "report.json" in manifest and "swiftformer_xs.onnx" in manifest
    assert main(["-q", "export", *TINY, "--out", str(out), "--force"]) == 0  # vitedge's own files: replaced
    (out / "thesis.txt").write_text("four years of work")
    _refused(["--out", str(out), "--force"], capsys, "did not write", "thesis.txt", "--force --clean")
    assert (out / "thesis.txt").read_text() == "four years of work" and (out / "report.json").is_file()
    _refused(["--out", str(out), "--clean"], capsys, "only goes with --force")
    assert main(["-q", "export", *TINY, "--out", str(out), "--force", "--clean"]) == 0
    assert not (out / "thesis.txt").exists() and (out / "report.json").is_file()


def test_package_refuses_a_zip_under_a_file_before_any_work(tmp_path, capsys):
    f = tmp_path / "afile.txt"
    f.write_text("x")
    assert main(["-q", "package", "--model", "swiftformer_xs", "--out", str(f / "b.zip")]) == 2
    assert "which is a file" in capsys.readouterr().err
