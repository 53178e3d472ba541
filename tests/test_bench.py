"""The latency harness: a short real run, parity gating of latency, the regression gate, device dispatch."""
import json
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vitedge import cli
from vitedge.exporter.timing.bench import run_bench
from vitedge.exporter.timing.bench_report import format_table, require_matplotlib, write_plot
from vitedge.targets.coreml.iphone import check_device
from vitedge.errors import VitedgeError
from vitedge.models.reduced import reduced
from vitedge.targets.base import Runner

REPO = Path(__file__).resolve().parents[1]
TINY = reduced("swiftformer")
QUICK = dict(warmup_s=0.05, max_s=0.0)


class BrokenRunner(Runner):
    """Looks like a backend but computes something else: parity must fail and latency be invalid."""
    mode = "device"
    backend = "broken"

    def run(self, x):
        return np.random.default_rng(0).normal(size=(x.shape[0], 10)).astype(np.float32)


@pytest.fixture(scope="module")
def report():
    return run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch,torch-deploy,onnxruntime",
                     min_iters=12, inject={"onnxruntime": BrokenRunner()}, **QUICK)


def test_real_run_counts_iterations_and_pairs(report):
    ok = {r.backend: r for r in report.results if r.valid}
    assert set(ok) == {"torch", "torch-deploy"}
    for r in ok.values():
        assert r.latency["iters"] >= 12
        assert r.parity["max_rel"] <= 1e-4
        assert r.latency["p50_ci_ms"][0] <= r.latency["p50_ms"] <= r.latency["p50_ci_ms"][1]
    ratio = next(q for q in report.ratios if q["denominator"] == "torch-deploy")
    assert ratio["pairs"] >= 12 and ratio["ci"][0] <= ratio["ratio"] <= ratio["ci"][1]


def test_broken_backend_is_failed_and_latency_invalid(report):
    bad = next(r for r in report.results if r.backend == "onnxruntime")
    assert bad.status == "failed" and not bad.valid and bad.latency is None
    assert "parity failed" in bad.reason
    assert "invalid" in format_table(report)


def test_plot_is_a_png(report, tmp_path):
    p = write_plot(report, tmp_path / "bench.png")
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 100 and height > 100


def test_unavailable_backends_say_why():
    r = run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch,tensorrt,coreml", min_iters=3,
                  **QUICK)
    by = {x.backend: x for x in r.results}
    assert by["tensorrt"].status == "unavailable" and by["tensorrt"].reason
    assert by["coreml"].status == "unavailable" and by["coreml"].reason
    assert by["torch"].valid


def test_ort_spinning_reaches_the_session_and_the_report(tmp_path):
    from vitedge.targets.onnx.target import OnnxRuntimeRunner

    def spin_entry(runner):
        return runner.session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning")

    r = _cli("--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
             "--set", "num_classes=10", "--imgsz", "64", "--backends", "onnxruntime", "--threads", "0",
             "--ort-spinning", "off", "--min-iters", "3", "--warmup-s", "0", "--max-s", "0",
             "--report", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    d = json.loads((tmp_path / "r.json").read_text())
    assert d["settings"]["ort_spinning"] == "off" and d["threads"] == 0
    assert d["results"][0]["valid"] and d["results"][0]["status"] == "ok"
    # the session itself carries the setting (ONNX Runtime keeps its config entries readable)
    from vitedge.exporter.timing.bench import _ort_runner
    from vitedge.models import create_model
    m = create_model("swiftformer_xs", **TINY).eval()
    assert spin_entry(_ort_runner(m, 64, 1, 0, spinning=False)) == "0"
    assert spin_entry(_ort_runner(m, 64, 1, 0, spinning=True)) == "1"
    assert "no spinning" in _ort_runner(m, 64, 1, 0, spinning=False).backend
    default = _ort_runner(m, 64, 1, 0)
    with pytest.raises(Exception):  # ONNX Runtime's default: the entry is not set at all
        spin_entry(default)
    assert isinstance(default, OnnxRuntimeRunner) and "no spinning" not in default.backend
    r = _cli("--model", "swiftformer_xs", "--ort-spinning", "sometimes")
    assert r.returncode == 2 and "--ort-spinning" in r.stderr


def _hide_matplotlib(monkeypatch):
    """Make `import matplotlib` fail as it does where the [plot] extra is not installed."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_plot_without_matplotlib_exits_2_with_the_install_hint(report, tmp_path, monkeypatch, capsys):
    _hide_matplotlib(monkeypatch)
    with pytest.raises(VitedgeError, match=r"--plot needs matplotlib, which is not installed: pip install "
                                           r"'vitedge\[plot\]'"):
        require_matplotlib()
    with pytest.raises(VitedgeError, match="vitedge\\[plot\\]"):
        write_plot(report, tmp_path / "never.png")
    code = cli.main(["bench", "--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set",
                     "embed_dims=[16,24,32,48]", "--set", "num_classes=10", "--imgsz", "64", "--backends",
                     "torch-deploy", "--min-iters", "2", "--warmup-s", "0", "--max-s", "0",
                     "--plot", str(tmp_path / "p.png")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("vitedge: error: --plot needs matplotlib") and "vitedge[plot]" in err[-1]
    assert not list(tmp_path.iterdir())


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "cli.py", "bench", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_cli_regression_gate_both_ways(tmp_path):
    base = tmp_path / "base.json"
    args = ["--model", "swiftformer_xs", "--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
            "--set", "num_classes=10", "--imgsz", "64", "--backends", "torch-deploy", "--min-iters", "5",
            "--warmup-s", "0.05", "--max-s", "0"]
    r = _cli(*args, "--report", str(base), "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    d = json.loads(base.read_text())
    assert d["results"][0]["key"] == "torch-deploy@64" and d["results"][0]["valid"]
    # A baseline 1000x faster than anything real: a regression, exit 1.
    d["results"][0]["latency"]["p50_ms"] /= 1000
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps(d))
    r = _cli(*args, "--baseline", str(fast), "--max-regression", "10")
    assert r.returncode == 1 and "REGRESSION" in r.stdout
    # A baseline 1000x slower: no regression, exit 0.
    d["results"][0]["latency"]["p50_ms"] *= 1e6
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(d))
    r = _cli(*args, "--baseline", str(slow), "--max-regression", "10")
    assert r.returncode == 0 and "REGRESSION" not in r.stdout


def test_cli_bad_usage_exit_2():
    r = _cli("--model", "swiftformer_xs", "--backends", "torch,nope")
    assert r.returncode == 2 and "--backends" in r.stderr
    r = _cli("--model", "swiftformer_xs", "--baseline", "x.json")
    assert r.returncode == 2 and "--max-regression" in r.stderr


def test_iphone_dispatch_names_what_is_missing():
    with pytest.raises(VitedgeError, match="needs macOS"):
        check_device("iphone", platform="linux")
    with pytest.raises(VitedgeError, match="Xcode command-line tools"):
        check_device("iphone", platform="darwin", which=lambda _: None)

    phone = SimpleNamespace(name="Test iPhone")

    class FakeDevice:
        @staticmethod
        def get_connected_devices(kind):
            assert kind == "IPHONE"
            return [phone]

    fake = (SimpleNamespace(Device=FakeDevice, DeviceType=SimpleNamespace(IPHONE="IPHONE")), None)
    assert check_device("iphone", platform="darwin", which=lambda _: "/usr/bin/x", experimental=fake) is phone
    assert check_device("iphone:Test iPhone", platform="darwin", which=lambda _: "/x", experimental=fake) is phone
    with pytest.raises(VitedgeError, match="no connected iPhone named 'Other'"):
        check_device("iphone:Other", platform="darwin", which=lambda _: "/x", experimental=fake)
    with pytest.raises(VitedgeError, match="--device takes"):
        check_device("android", platform="darwin")


def test_order_measured_times_both_orders_and_plots(tmp_path):
    sima = dict(embed_dim=32, depth=1, num_heads=2, num_classes=10)
    r = run_bench("sima_nano_12_p16", overrides=sima, imgsz="32,96", backends="torch-deploy", min_iters=4,
                  order="measured", **QUICK)
    assert [o["imgsz"] for o in r.order] == [32, 96]
    for o in r.order:
        assert set(o["latency"]) == {"qk_first", "kv_first"}
        assert all(s["iters"] >= 4 for s in o["latency"].values())
        assert o["measured_best"] in ("qk_first", "kv_first")
    # head_dim 16: N=4 < 16 -> (QK^T)V at 32 px; N=36 >= 16 -> Q(K^T V) at 96 px (SimA's official rule)
    assert [o["rule_choice"] for o in r.order] == [["qk_first"], ["kv_first"]]
    assert write_plot(r, tmp_path / "o.png").stat().st_size > 1000
    with pytest.raises(VitedgeError, match="SLA or SimA"):
        run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch-deploy", min_iters=2,
                  order="measured", **QUICK)


def test_order_measured_on_multi_thread_ort_says_the_sessions_compete():
    sima = dict(embed_dim=32, depth=1, num_heads=2, num_classes=10)
    common = dict(overrides=sima, imgsz="32", backends="onnxruntime", min_iters=2, order="measured", threads=0,
                  **QUICK)
    r = run_bench("sima_nano_12_p16", **common)
    assert "--ort-spinning off" in r.settings["order_note"] and r.order[0]["backend"] == "onnxruntime"
    quiet = run_bench("sima_nano_12_p16", ort_spinning=False, **common)
    assert "order_note" not in quiet.settings and quiet.settings["ort_spinning"] == "off"
