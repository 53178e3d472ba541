"""`bench --device iphone`: the wiring to coremltools' remote-device classes, tested against those very classes
autospecced (create_autospec(..., spec_set=True)), so a wrong name or signature fails here; the transport twin
of the package, run by the MIL emulator; the signing team. No phone is reachable here: the phone's answers are
the emulator's, which proves the wiring, never the phone.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from unittest.mock import create_autospec

import numpy as np
import pytest
import torch

import vitedge
from vitedge.exporter.timing import bench as bench_mod
from vitedge.targets.coreml import iphone
from vitedge.exporter.timing.bench import run_bench
from vitedge.exporter.timing.bench_report import format_table
from vitedge.errors import VitedgeError
from vitedge.models.trained_like import make_trained_like
from vitedge.targets.base import LowerSpec
from vitedge.targets.coreml import CoreMLTarget, EmulatedCoreMLRunner, load_program_spec, quantized_pixels

ct = pytest.importorskip("coremltools")
from coremltools.models.ml_program.experimental import async_wrapper, perf_utils, remote_device  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TINY = dict(layers=[1, 1, 1, 1], embed_dims=[16, 24, 32, 48], num_classes=10)
TEAM = "ABCDE12345"


def _phone(name="Test iPhone"):
    """A real coremltools Device, autospecced: prepare_for_model_debugging is an async method of the real class."""
    session = create_autospec(remote_device._AppSession, instance=True, spec_set=True)
    real = remote_device.Device(name=name, type=remote_device.DeviceType.IPHONE, identifier="id", udid="udid",
                                os_version="18.5", os_build_number="22F76", developer_mode_state="enabled",
                                state=remote_device.DeviceState.CONNECTED, session=None)
    prepared = remote_device.Device(**{**{f: getattr(real, f) for f in real.__dataclass_fields__},
                                       "session": session})
    phone = create_autospec(real, spec_set=True)
    for f in ("name", "os_version", "os_build_number", "type", "state"):
        setattr(phone, f, getattr(real, f))  # autospec makes data fields mocks: give them the real values
    phone.prepare_for_model_debugging.return_value = prepared
    return phone, prepared, session


class Fakes:
    """coremltools' benchmarker and async wrapper, autospecced; the wrapper 'predicts' with the MIL emulator."""

    def __init__(self, monkeypatch, corrupt: bool = False):
        self.bench_cls = create_autospec(perf_utils.MLModelBenchmarker, spec_set=True)
        # the instance specced from a real one (instance attributes included): coremltools 9 keeps the model that
        # benchmark_load loaded in `_loaded_model`, never unloading it; here that model is an autospecced wrapper
        real = perf_utils.MLModelBenchmarker(model=create_autospec(ct.models.MLModel, instance=True), device=None)
        bench = self.bench_cls.return_value = create_autospec(real, spec_set=True)
        self.kept = create_autospec(async_wrapper.RemoteMLModelAsyncWrapper, instance=True, spec_set=True)
        bench._loaded_model = self.kept
        M = perf_utils.MLModelBenchmarker.Measurement
        bench.benchmark_load.return_value = M.from_samples([41.0, 38.5, 39.0])
        bench.benchmark_predict.return_value = M.from_samples([2.0, 2.1, 1.9, 2.2, 2.0])
        self.wrapper_cls = create_autospec(async_wrapper.MLModelAsyncWrapper, spec_set=True)
        self.wrapper = create_autospec(async_wrapper.RemoteMLModelAsyncWrapper, instance=True, spec_set=True)
        self.wrapper_cls.from_spec_or_path.return_value = self.wrapper
        self.sent = []
        self.corrupt = corrupt
        monkeypatch.setattr(perf_utils, "MLModelBenchmarker", self.bench_cls)
        monkeypatch.setattr(async_wrapper, "MLModelAsyncWrapper", self.wrapper_cls)

    def answer_with(self, package: Path):
        emu = EmulatedCoreMLRunner(package)

        async def predict(inputs, state=None):
            x = inputs["image"]
            assert x.dtype == np.float32 and x.shape[0] == 1  # what the transport carries, one at a time
            self.sent.append(x)
            y = emu.run_raw(x)
            if self.corrupt:
                y = y[:, ::-1].copy()
            return {"logits": y.astype(np.float16)}  # the app returns what CoreML returns (fp16 here)
        self.wrapper.predict.side_effect = predict


def test_old_calls_fail_against_the_real_signatures():
    """The two calls issue 15 found wrong: they fail here against autospecced coremltools, the new ones pass."""
    wrapper_cls = create_autospec(async_wrapper.MLModelAsyncWrapper, spec_set=True)
    with pytest.raises(TypeError, match="weights_dir"):
        wrapper_cls.from_spec_or_path(spec_or_path="m.mlpackage", device=None, compute_units=ct.ComputeUnit.CPU_AND_NE)
    wrapper_cls.from_spec_or_path(spec_or_path="m.mlpackage", weights_dir="w", device=None,
                                  compute_units=ct.ComputeUnit.CPU_AND_NE)
    model = create_autospec(ct.models.MLModel, instance=True, spec_set=True)
    with pytest.raises(AttributeError, match="get_compiled_path"):
        model.get_compiled_path()
    model.get_compiled_model_path()
    phone, _, _ = _phone()
    with pytest.raises(TypeError):
        asyncio.run(phone.prepare_for_model_debugging(team=TEAM))  # not a parameter of the real method
    creds = remote_device.AppSigningCredentials(development_team=TEAM)
    asyncio.run(phone.prepare_for_model_debugging(credentials=creds))


def test_team_id_from_flag_or_environment():
    with pytest.raises(VitedgeError, match="--team-id TEAMID or set VITEDGE_TEAM_ID"):
        iphone.resolve_team_id(None, environ={})
    with pytest.raises(VitedgeError, match="not an Apple Team ID"):
        iphone.resolve_team_id("abc", environ={})
    assert iphone.resolve_team_id(None, environ={"VITEDGE_TEAM_ID": TEAM}) == TEAM
    assert iphone.resolve_team_id("ZYXWV98765", environ={"VITEDGE_TEAM_ID": TEAM}) == "ZYXWV98765"


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    out = tmp_path_factory.mktemp("iphone")
    labels = out / "labels.txt"
    labels.write_text("".join(f"c{i}\n" for i in range(10)))
    train = make_trained_like(vitedge.create_model("swiftformer_xs", **TINY), seed=0).eval()
    art = CoreMLTarget().lower(vitedge.reparameterize(train, 64), LowerSpec(
        name="cls", imgsz=64, batch=1, precision="fp16", out_dir=out, onnx_path=None,
        options={"input": "image", "labels": str(labels)}))
    return art, out


def test_transport_twin_computes_what_the_package_computes(classifier):
    art, out = classifier
    spec = load_program_spec(art.path)
    twin, notes = iphone.transport_spec(spec)
    assert [o.name for o in twin.description.output] == ["logits"] and len(notes) == 2
    assert twin.description.input[0].type.WhichOneof("Type") == "multiArrayType"
    assert spec.description.input[0].type.WhichOneof("Type") == "imageType"  # the package itself is untouched
    weights = ct.models.MLModel(str(art.path), skip_model_load=True).weights_dir
    twin_path = out / "twin.mlpackage"
    ct.models.MLModel(twin, weights_dir=weights, skip_model_load=True).save(str(twin_path))
    x = np.random.default_rng(0).standard_normal((3, 3, 64, 64)).astype(np.float32)
    pixels = quantized_pixels(x, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    a = EmulatedCoreMLRunner(art.path).run_raw(pixels)
    b = EmulatedCoreMLRunner(twin_path).run_raw(pixels)
    assert np.array_equal(a, b) and EmulatedCoreMLRunner(twin_path).program.input_kind != "image"


def _bench(monkeypatch, fakes: Fakes, phone, **kw):
    monkeypatch.setattr(iphone, "check_device", lambda spec: phone)
    real_benchmark = iphone.benchmark_on_device

    def benchmark(path, device, feed, team_id, **k):
        fakes.answer_with(Path(path))
        return real_benchmark(path, device, feed, team_id, **k)
    monkeypatch.setattr(iphone, "benchmark_on_device", benchmark)
    return run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch", min_iters=5, warmup_s=0.0,
                     max_s=0.0, device="iphone", **kw)


@pytest.mark.parametrize("input_kind", ["tensor", "image"])
def test_bench_times_on_the_phone_and_runs_the_golden_vectors_there(monkeypatch, input_kind):
    fakes = Fakes(monkeypatch)
    phone, prepared, session = _phone()
    report = _bench(monkeypatch, fakes, phone, team_id=TEAM, coreml_options={"input": input_kind})
    creds = phone.prepare_for_model_debugging.call_args.kwargs["credentials"]
    # the team's own bundle ID, never coremltools' shared default com.coremltools.modelrunnerd
    assert creds == remote_device.AppSigningCredentials(development_team=TEAM,
                                                        bundle_identifier="com.abcde12345.vitedge.modelrunner")
    model = fakes.bench_cls.call_args.kwargs["model"]
    assert isinstance(model, ct.models.MLModel) and fakes.bench_cls.call_args.kwargs["device"] is prepared
    b = fakes.bench_cls.return_value
    b.benchmark_load.assert_awaited_once()
    assert b.benchmark_predict.await_args.kwargs["iterations"] == 5
    # one wrapper, loaded once, every golden input through it, then unloaded; the app session stopped
    fakes.wrapper_cls.from_spec_or_path.assert_called_once()
    kw = fakes.wrapper_cls.from_spec_or_path.call_args.kwargs
    assert kw["weights_dir"].endswith("bench.mlpackage/Data/com.apple.CoreML/weights") and kw["device"] is prepared
    assert isinstance(kw["spec_or_path"], type(model.get_spec()))  # the transport twin, not the package path
    assert kw["compute_units"] == ct.ComputeUnit.CPU_AND_NE
    fakes.wrapper.load.assert_awaited_once()
    assert fakes.wrapper.predict.await_count == iphone.DEVICE_PARITY_SAMPLES
    fakes.wrapper.unload.assert_awaited_once()
    fakes.kept.unload.assert_awaited_once()  # the benchmarker's model, released before the wrapper loads its own
    assert fakes.kept.unload.await_args_list and fakes.wrapper.load.await_count == 1
    session.stop.assert_called_once()
    sent = np.concatenate(fakes.sent)
    if input_kind == "image":
        assert sent.min() >= 0 and sent.max() <= 255 and np.array_equal(sent, np.round(sent))
    d = report.to_dict()["device"]
    assert d["name"] == "Test iPhone" and d["os"] == "18.5" and d["compute_units"] == "CPU_AND_NE"
    r = d["results"][0]
    assert r["load_ms"]["p50_ms"] == pytest.approx(39.0) and r["predict_ms"]["iters"] == 5
    assert {"p50_ms", "p90_ms", "p99_ms"} <= set(r["predict_ms"])
    assert r["parity"]["mode"] == "device" and r["parity"]["status"] == "passed", r["parity"]
    assert report.exit_code == 0 and "iphone Test iPhone (iOS 18.5, CPU_AND_NE) @64" in format_table(report)


def test_failed_phone_parity_fails_the_bench(monkeypatch):
    fakes = Fakes(monkeypatch, corrupt=True)
    phone, _, session = _phone()
    report = _bench(monkeypatch, fakes, phone, team_id=TEAM)
    p = report.device["results"][0]["parity"]
    assert p["status"] == "failed" and p["mode"] == "device" and report.exit_code == 1
    fakes.wrapper.unload.assert_awaited_once()
    session.stop.assert_called_once()


def test_missing_team_fails_before_any_work(monkeypatch):
    phone, _, _ = _phone()
    monkeypatch.setattr(iphone, "check_device", lambda spec: phone)
    monkeypatch.delenv("VITEDGE_TEAM_ID", raising=False)
    with pytest.raises(VitedgeError, match="--team-id"):
        run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch", device="iphone")
    phone.prepare_for_model_debugging.assert_not_called()
    with pytest.raises(VitedgeError, match="goes with --device"):
        run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch", coreml_options={"input": "image"})


def test_cli_device_on_linux_is_a_clear_usage_error():
    if sys.platform == "darwin":
        pytest.skip("this machine is a Mac: the platform check passes")
    r = subprocess.run([sys.executable, str(REPO / "cli.py"), "bench", "--model", "swiftformer_xs", "--device",
                        "iphone", "--team-id", TEAM], capture_output=True, text=True)
    assert r.returncode == 2 and "needs macOS" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_bundle_id_from_the_flag_or_derived_from_the_team(monkeypatch):
    """coremltools falls back to com.coremltools.modelrunnerd, an App ID that exists in every coremltools user's
    account, so Xcode's automatic provisioning cannot register it for yours: --bundle-id, else one of your team's."""
    assert iphone.resolve_bundle_id(None, TEAM) == "com.abcde12345.vitedge.modelrunner"
    assert iphone.resolve_bundle_id("com.example.runner", TEAM) == "com.example.runner"
    with pytest.raises(VitedgeError, match="is not a bundle identifier"):
        iphone.resolve_bundle_id("my runner", TEAM)
    fakes = Fakes(monkeypatch)
    phone, _, _ = _phone()
    _bench(monkeypatch, fakes, phone, team_id=TEAM, bundle_id="com.example.runner")
    creds = phone.prepare_for_model_debugging.call_args.kwargs["credentials"]
    assert creds == remote_device.AppSigningCredentials(development_team=TEAM, bundle_identifier="com.example.runner")
    phone.prepare_for_model_debugging.reset_mock()
    with pytest.raises(VitedgeError, match="--bundle-id"):
        run_bench("swiftformer_xs", overrides=TINY, imgsz="64", backends="torch", device="iphone", team_id=TEAM,
                  bundle_id="not valid")
    phone.prepare_for_model_debugging.assert_not_called()  # refused before any work
    from vitedge.exporter.timing.bench_api import bench
    with pytest.raises(VitedgeError, match="goes with --device"):
        bench("swiftformer_xs", bundle_id="com.example.runner")


def test_a_foreign_package_is_driven_by_its_own_input_and_output_names(monkeypatch, classifier, tmp_path):
    """A package whose input and output are not "image" / "logits" (an artifact made elsewhere): the names come
    from its spec, not from defaults (the old call fell back to "image" / "logits")."""
    art, _ = classifier
    spec = load_program_spec(art.path)
    ct.utils.rename_feature(spec, "image", "pixels")
    ct.utils.rename_feature(spec, "logits", "scores")
    weights = ct.models.MLModel(str(art.path), skip_model_load=True).weights_dir
    foreign = tmp_path / "foreign.mlpackage"
    ct.models.MLModel(spec, weights_dir=weights, skip_model_load=True).save(str(foreign))
    assert iphone.io_names(iphone.transport_spec(spec)[0]) == ("pixels", "scores")
    fakes = Fakes(monkeypatch)
    emu = EmulatedCoreMLRunner(art.path)

    async def predict(inputs, state=None):
        return {"scores": emu.run_raw(inputs["pixels"]).astype(np.float16)}
    fakes.wrapper.predict.side_effect = predict
    phone, prepared, _ = _phone()
    feed = np.zeros((2, 3, 64, 64), np.float32)
    got = iphone.benchmark_on_device(foreign, phone, feed, TEAM, iterations=3,
                                     experimental=(remote_device, perf_utils, async_wrapper))
    assert list(fakes.bench_cls.return_value.benchmark_predict.await_args.kwargs["inputs"]) == ["pixels"]
    assert got["outputs"].shape == (2, 10)


def test_mac_check_finds_the_phone_as_coremltools_does():
    """coremltools keeps only devices whose devicectl tunnelState is "connected" (Device.get_connected_devices):
    mac_check.sh asks vitedge's check_device (which calls it), not a grep of `devicectl list devices`, which also
    lists paired phones that are unreachable."""
    text = (REPO / "scripts" / "mac_check.sh").read_text()
    assert "grep -qi iphone" not in text and "check_device('iphone')" in text
    import inspect
    assert "get_connected_devices" in inspect.getsource(iphone.check_device)
    src = inspect.getsource(remote_device.Device.get_connected_devices)
    assert "DeviceState.CONNECTED" in src  # the filter mac_check now shares
