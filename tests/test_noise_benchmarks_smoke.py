"""The noise study scripts run (`--quick`) and write the JSON that docs/parity_criteria.md and docs/parity.md quote.

Minutes of CPU: `benchmarks`-marked, run by `python -m pytest -m benchmarks` (see tests/test_benchmarks_smoke.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
pytestmark = pytest.mark.benchmarks


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


def test_all_models_quick(tmp_path):
    data = _run("all_models", tmp_path / "a.json")
    assert data["complete"] and {m["model"] for m in data["models"]} == {"swiftformer_xs", "sima_nano_12_p16"}
    for m in data["models"]:
        assert m["exit_code"] == 0 and m["samples"] == 8 and set(m["intrinsic_noise"]) == {"natural", "stress"}
        assert set(m["hops"]) == {"deploy-form", "onnx", "onnx-simplified"}
        assert all(0 < r <= 1 for r in m["worst_noise_ratio"].values())
        assert set(m["planted"]) == {"x1.01", "x1.001"}
        noise = min(d["median"] for d in m["intrinsic_noise"].values())
        for p in m["invisible_plants"]:  # passed over only when invisible, or a grouped (depthwise) Conv
            assert p.get("why") == "grouped (depthwise) Conv" or p["effect"] <= 2 * noise, p
        assert m["plant_effect_x1.01"] > 2 * noise
    for m in data["models"]:  # reduced configs: x1.01 is caught and localized to exactly the planted module
        planted = m["planted"]["x1.01"]  # (tests/test_sensitivity.py: x1.001 too)
        assert planted["caught"] and planted["planted_module"], planted
        assert planted["diverging_module"] == planted["planted_module"], planted


def test_reference_threads_quick(tmp_path):
    data = _run("reference_threads", tmp_path / "t.json")
    assert data["reference_threads"] == 2 and len(data["models"]) == 1
    per = data["models"][0]["threads"]
    assert set(per) == {"1", "2", "4"} and all(set(v) == {"natural"} or set(v) == {"natural", "stress"}
                                               for v in per.values())
    assert all(0 < d["noise_median"] and all(r < 1 for r in d["worst_ratio"].values())
               for v in per.values() for d in v.values())
