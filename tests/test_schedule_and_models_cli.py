"""CLI contracts of issues 2 and 3: `vitedge models` lists every name; an unfinished LN->RepBN schedule warns
(with the lambda values) and `--strict-schedule` turns that into exit 2 with nothing written."""
import subprocess
import sys
from pathlib import Path

import torch

import vitedge
from vitedge.models import make_trained_like
from vitedge.models.layers import LinearNorm

REPO = Path(__file__).resolve().parents[1]
MINI = {"embed_dim": 64, "depth": 2, "num_heads": 2, "num_classes": 10}
SETS = [a for k, v in MINI.items() for a in ("--set", f"{k}={v}")]


def _cli(*args):
    return subprocess.run([sys.executable, "cli.py", *args], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_models_lists_every_registered_name():
    r = _cli("models")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["name", "family", "params", "GMACs"]
    listed = {line.split()[0] for line in lines[1:] if line.strip()}
    assert listed == set(vitedge.list_models())
    deit = next(line for line in lines if line.startswith("slab_deit_tiny "))
    assert "multiples of 16" in deit


def _mid_schedule_checkpoint(path: Path) -> Path:
    model = make_trained_like(vitedge.create_model("slab_deit_tiny", **MINI), seed=0)
    for m in model.modules():
        if isinstance(m, LinearNorm):
            m.iter.fill_(30000)  # lambda = 0.5: training stopped half-way through the LN -> RepBN schedule
    torch.save({"model": model.state_dict(), "epoch": 150}, path)
    return path


def test_unfinished_schedule_warns_and_strict_schedule_refuses(tmp_path):
    ck = _mid_schedule_checkpoint(tmp_path / "mid.pth")
    out = tmp_path / "deploy.pth"
    r = _cli("reparam", "--model", "slab_deit_tiny", *SETS, "--checkpoint", str(ck), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "schedule" in r.stderr and "0.5" in r.stderr and "RepBN only" in r.stderr
    assert out.exists()

    strict = tmp_path / "strict.pth"
    r = _cli("reparam", "--model", "slab_deit_tiny", *SETS, "--checkpoint", str(ck), "--out", str(strict),
             "--strict-schedule")
    assert r.returncode == 2 and "strict-schedule" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not strict.exists()

    dest = tmp_path / "export"
    r = _cli("export", "--model", "slab_deit_tiny", *SETS, "--checkpoint", str(ck), "--target", "onnx",
             "--samples", "4", "--out", str(dest), "--strict-schedule")
    assert r.returncode == 2 and not dest.exists()
