"""The noise study scripts run (`--quick`) and write the JSON that docs/parity_criteria.md and the README quote."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _run(script: str, out: Path) -> dict:
    r = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), "--quick", "--out", str(out)], cwd=BENCH,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{script}: {r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    data = json.loads(out.read_text())
    assert data["script"] == script and data["quick"] is True
    return data


def test_intrinsic_noise_quick(tmp_path):
    data = _run("intrinsic_noise", tmp_path / "n.json")
    assert data["complete"] and len(data["models"]) == 4
    for m in data["models"]:
        assert 0 < m["sets"]["natural"]["median"] < 1e-4 and m["max_abs_y"] > 0


def test_parity_noise_quick(tmp_path):
    data = _run("parity_noise", tmp_path / "p.json")
    chosen = data["chosen"]["evaluation"]
    assert chosen is not None and chosen["worst_correct_ratio"] < 1
    labels = [c["label"] for c in data["configs"]]
    assert chosen["caught"]["x1.01"] == labels  # the planted 1 % error is caught in every measured config
    assert {"maxabs/own", "maxabs/median", "l2/own", "l2/median"} <= set(data["forms"])
