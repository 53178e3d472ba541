"""The command line as users run it: `python cli.py ...` from the repo root and the `vitedge` console script,
in subprocesses: exit codes 0/1/2, refusing to overwrite, --force, quarantine, reparam + parity."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitedge import cli
from vitedge.models import catalog
from vitedge.tests._ci import unavailable

REPO = Path(__file__).resolve().parents[1]
MINI = ["--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
        "--set", "num_classes=10", "--imgsz", "32", "--samples", "4"]


def run_cli(*args, script: bool = False) -> subprocess.CompletedProcess:
    if script:
        exe = shutil.which("vitedge")
        if exe is None:
            unavailable("the `vitedge` console script is not installed (pip install -e .)")
        cmd = [exe, *args]
    else:
        cmd = [sys.executable, "cli.py", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def _one_line_error(proc):
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vitedge: error: "), proc.stderr
    return lines[0]


def test_export_refuse_overwrite_force_and_quarantine(tmp_path):
    out = tmp_path / "xs"
    ok = run_cli("export", *MINI, "--out", str(out))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "PASSED" in ok.stdout and "onnx-simplified" in ok.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 0 and report["weights"] == "untrained"
    before = (out / "swiftformer_xs.onnx").read_bytes()

    again = run_cli("export", *MINI, "--out", str(out))
    assert again.returncode == 2 and "--force" in _one_line_error(again)
    assert (out / "swiftformer_xs.onnx").read_bytes() == before

    failed = run_cli("export", *MINI, "--out", str(out), "--force", "--tol", "fp32.max_rel=1e-12")
    assert failed.returncode == 1 and "FAILED" in failed.stdout
    assert not (out / "swiftformer_xs.onnx").exists()
    assert (out / "quarantine" / "swiftformer_xs.onnx").exists()
    report = json.loads((out / "report.json").read_text())
    assert report["exit_code"] == 1 and report["quarantine"] == "quarantine"
    assert {h["status"] for h in report["parity"]} == {"failed"}

    # the quarantined graph itself is fine: parity with the default tolerance passes (console script)
    check = run_cli("parity", *MINI, "--artifact", str(out / "quarantine" / "swiftformer_xs.onnx"),
                    "--report", str(tmp_path / "parity.json"), script=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert json.loads((tmp_path / "parity.json").read_text())["parity"][1]["hop"] == "onnx"


def test_reparam_then_parity_on_a_corrupted_deploy_checkpoint(tmp_path):
    ckpt = tmp_path / "deploy.pth"
    made = run_cli("reparam", *[a for a in MINI if a not in ("--samples", "4")], "--out", str(ckpt), script=True)
    assert made.returncode == 0, made.stdout + made.stderr
    assert "equivalence gate (float64) passed" in made.stdout
    payload = torch.load(ckpt, weights_only=True)
    key = "network.4.1.linear.fc1.weight"
    payload["state_dict"][key] = payload["state_dict"][key] * 1.5
    torch.save(payload, tmp_path / "bad.pth")
    bad = run_cli("parity", *MINI, "--deploy-checkpoint", str(tmp_path / "bad.pth"), "--report",
                  str(tmp_path / "r.json"))
    assert bad.returncode == 1 and "network.4.1.linear.fc1" in bad.stdout
    hop = json.loads((tmp_path / "r.json").read_text())["parity"][0]
    assert (hop["hop"], hop["status"], hop["diverging_module"]) == ("deploy-form", "failed", "network.4.1.linear.fc1")


def test_bad_input_exits_2_with_one_line_and_nothing_written(tmp_path):
    out = tmp_path / "never"
    bad = run_cli("export", "--model", "swiftformer_xz", "--out", str(out))
    assert bad.returncode == 2 and "swiftformer_xs" in _one_line_error(bad)  # did-you-mean
    wrong = run_cli("export", "--model", "swiftformer_xs", "--target", "onnx", "--ios", "17", "--out", str(out),
                    script=True)
    assert wrong.returncode == 2 and "--ios" in _one_line_error(wrong)
    assert list(tmp_path.iterdir()) == []


def test_bad_usage_exits_2(capsys, tmp_path):
    # --model is optional (a transformers folder names its model), so its absence is the pipeline's bad input
    out = tmp_path / "never"
    assert cli.main(["export", "--target", "onnx", "--out", str(out)]) == 2
    assert "--model is needed" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit) as e:
        cli.main(["export", "--model", "swiftformer_xs", "--precision", "int4"])
    assert e.value.code == 2


def test_models_prints_every_catalog_row(monkeypatch, capsys):
    # The catalog itself (all registered names, params, GMACs) is tested in test_catalog; a subset keeps this fast.
    names = ["sima_nano_12_p16", "slab_deit_tiny", "swiftformer_xs"]
    monkeypatch.setattr(catalog, "list_models", lambda: names)
    assert cli.main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["name", "family", "params", "GMACs"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == names
    assert f"{catalog.model_table(['swiftformer_xs'])[0]['params'] / 1e6:.2f} M" in rows["swiftformer_xs"]
