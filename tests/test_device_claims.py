"""What the docs claim about device runs: a result on a device is claimed only with its log committed
(benchmarks/results/gpu_check/); a run whose log was not kept says "reported, log not kept". And the device
table's facts that come from upstream sources (coremltools 9.0's ModelRunner deploys to iOS 17.0)."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
LOGS = REPO / "benchmarks" / "results" / "gpu_check"
NOT_KEPT = "reported, log not kept"


def _device_rows() -> list[dict]:
    text = (DOCS / "devices.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith("| ")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == ["path", "needs", "status", "evidence"], header
    rows = []
    for ln in lines[2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the next table
        rows.append(dict(zip(header, cells)))
    return rows


def test_every_device_path_states_its_status_and_evidence():
    rows = _device_rows()
    paths = " ".join(r["path"] for r in rows)
    for needed in ("TensorRT 10", "TensorRT 11", "int8", "CUDA buffers", "gpu_check.sh", "CoreML on macOS",
                   "mac_check.sh", "iPhone", "ExecuTorch on this machine", "Android"):
        assert needed in paths, needed
    for r in rows:
        assert r["status"] and r["evidence"], r


def test_a_device_result_is_claimed_only_with_its_log():
    """A status that says something passed or ran on a device cites a committed log, or says the log was not kept."""
    logs = {p.name for p in LOGS.glob("*.log")}
    for r in _device_rows():
        claims = re.search(r"\b(passed|ran|succeeded)\b", r["status"]) and "verified here" not in r["status"]
        if claims:
            cited = set(re.findall(r"gpu_check/([\w.-]+\.log)", r["status"] + r["evidence"]))
            assert NOT_KEPT in r["status"] or (cited and cited <= logs), r
    for page in ("devices.md", "tensorrt.md"):
        text = (DOCS / page).read_text()
        for m in re.finditer(r"H200", text):  # the one reported GPU run
            around = text[max(0, m.start() - 400):m.end() + 600]
            assert NOT_KEPT in around or any(name in around for name in logs), (page, around)
    assert (LOGS / "README.md").is_file() and NOT_KEPT in (LOGS / "README.md").read_text()


def test_the_iphone_row_names_the_ios_the_model_runner_app_needs():
    iphone = next(r for r in _device_rows() if r["path"].startswith("iPhone"))
    assert "iOS 17+" in iphone["needs"] and "iOS 16" not in iphone["needs"]
    assert "--bundle-id" in iphone["needs"]
