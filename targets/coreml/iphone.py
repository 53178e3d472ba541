"""The iPhone, the coreml target's tethered device (its DeviceBench, `vitedge bench --device iphone[:NAME]`): on-device
timing and golden vectors, thin over coremltools 9's experimental remote-device support
(`coremltools.models.ml_program.experimental`: `Device`, `AppSigningCredentials`, `MLModelBenchmarker`,
`MLModelAsyncWrapper`), which builds coremltools' model-runner app with Xcode, signs it with your team,
installs it through `devicectl` and talks to it over files.

What the phone needs (checked in this order, each missing piece named): macOS, the Xcode command-line tools
(xcrun, xcodebuild, devicectl), a connected iPhone on iOS 17+ (coremltools 9.0's ModelRunner app target deploys to
17.0) that devicectl's tunnel reaches (coremltools keeps devices whose `tunnelState` is "connected"), unlocked, with
Developer Mode on, and an Apple Developer Team ID (`--team-id` or VITEDGE_TEAM_ID) so Xcode can sign the app for
it, under a bundle identifier of that team's (`--bundle-id`; by default derived from the team, see
`resolve_bundle_id`).

The model-runner app passes tensors only: every input is wrapped as an MLMultiArray and every output must be one
(Float16/32/64 or Int32). So the phone runs a transport twin of the package: the same ML Program with an
image input declared as a float32 NCHW multi-array of pixels 0-255 (the program's own input already is one),
and a classifier's label/dictionary outputs dropped (`logits` stays). Pixels are rounded to 8 bits before
they are sent, so the reference sees what a camera frame would give. Nothing here runs on Linux: the wiring is
tested against coremltools' own classes, autospecced. The bench itself (lowering, judging the phone's outputs,
the report) is exporter/timing/device_bench.py's, through `IphoneBench`.
"""
from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ..base import DeviceBench

TEAM_ENV = "VITEDGE_TEAM_ID"
COMPUTE_UNITS = "CPU_AND_NE"   # as the macOS device hop; ALL aborts on some hosts
LOAD_ITERATIONS = 3
DEVICE_PARITY_SAMPLES = 16     # golden inputs sent to the phone (each is a devicectl file round trip)
TRANSPORT_DTYPES = (np.float16, np.float32, np.float64, np.int32)  # what the runner app's TensorDescriptor carries


def _experimental():
    try:
        from coremltools.models.ml_program.experimental import async_wrapper, perf_utils, remote_device
    except Exception as e:  # noqa: BLE001 - any import failure means the feature is missing
        raise VitedgeError(f"--device iphone needs coremltools>=9 with ml_program.experimental ({e}); "
                           "pip install -U coremltools") from None
    return remote_device, perf_utils, async_wrapper


def parse_device(spec: str) -> str | None:
    """`iphone` -> None (first connected iPhone), `iphone:NAME` -> NAME."""
    kind, _, name = spec.partition(":")
    if kind != "iphone":
        raise VitedgeError(f"--device takes iphone or iphone:NAME; got {spec!r}")
    return name or None


def resolve_team_id(value: str | None = None, environ=os.environ) -> str:
    """The Apple Developer Team ID that signs the model-runner app: --team-id, else VITEDGE_TEAM_ID."""
    team = (value or environ.get(TEAM_ENV) or "").strip()
    if not team:
        raise VitedgeError(f"--device iphone needs a signing team: pass --team-id TEAMID or set {TEAM_ENV} (the "
                           "10-character Team ID of your Apple Developer account: Xcode > Settings > Accounts)")
    if not re.fullmatch(r"[A-Z0-9]{10}", team):
        raise VitedgeError(f"--team-id {team!r} is not an Apple Team ID (10 characters, A-Z and 0-9, as shown in "
                           "Xcode > Settings > Accounts)")
    return team


def resolve_bundle_id(value: str | None, team_id: str) -> str:
    """The model-runner app's bundle identifier: `--bundle-id`, else com.<team>.vitedge.modelrunner. Never
    coremltools' default (com.coremltools.modelrunnerd): that App ID is every coremltools user's, so Xcode's
    automatic provisioning cannot register it for your team."""
    if value is None:
        return f"com.{team_id.lower()}.vitedge.modelrunner"
    if not re.fullmatch(r"[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+", value):
        raise VitedgeError(f"--bundle-id {value!r} is not a bundle identifier (reverse-DNS, letters, digits, '-' "
                           "and '.', e.g. com.example.modelrunner)")
    return value


def check_device(spec: str, platform: str | None = None, which=shutil.which, experimental=None):
    """Return the connected coremltools Device for `spec`, or raise VitedgeError naming what is missing."""
    name = parse_device(spec)
    platform = platform or sys.platform
    if platform != "darwin":
        raise VitedgeError(f"--device {spec} needs macOS with Xcode and a tethered iPhone; this machine is "
                           f"{platform} (CoreML cannot run here)")
    if which("xcrun") is None or which("xcodebuild") is None:
        raise VitedgeError("--device iphone needs the Xcode command-line tools (xcrun, xcodebuild, devicectl): "
                           "install Xcode and run xcode-select --install")
    remote_device = (experimental or _experimental())[0]
    phones = remote_device.Device.get_connected_devices(remote_device.DeviceType.IPHONE)
    if name is not None:
        phones = [d for d in phones if d.name == name]
    if not phones:
        want = f"named {name!r} " if name else ""
        raise VitedgeError(f"no connected iPhone {want}found by devicectl: connect it, unlock it, enable "
                           "Developer Mode, and check `xcrun devicectl list devices`")
    return phones[0]


def transport_spec(spec):
    """A copy of the package's spec that the model-runner app can drive (see the module doc); (spec, notes)."""
    from coremltools.proto import FeatureTypes_pb2
    twin, notes = type(spec)(), []
    twin.CopyFrom(spec)
    for inp in twin.description.input:
        if inp.type.WhichOneof("Type") == "imageType":
            h, w = inp.type.imageType.height, inp.type.imageType.width
            inp.type.ClearField("imageType")
            inp.type.multiArrayType.shape.extend([1, 3, h, w])
            inp.type.multiArrayType.dataType = FeatureTypes_pb2.ArrayFeatureType.FLOAT32
            notes.append(f"input {inp.name}: image -> float32 multi-array [1, 3, {h}, {w}] of pixels 0-255")
    keep = [o for o in twin.description.output if o.type.WhichOneof("Type") == "multiArrayType"]
    dropped = [o.name for o in twin.description.output if o.type.WhichOneof("Type") != "multiArrayType"]
    if dropped:
        del twin.description.output[:]
        twin.description.output.extend(keep)
        twin.description.predictedFeatureName = ""
        twin.description.predictedProbabilitiesName = ""
        names = {o.name for o in keep}
        for fn in twin.mlProgram.functions.values():
            for block in fn.block_specializations.values():
                ops = [op for op in block.operations if not set(o.name for o in op.outputs) & set(dropped)]
                del block.operations[:]
                block.operations.extend(ops)
                outs = [o for o in block.outputs if o in names]
                del block.outputs[:]
                block.outputs.extend(outs)
        notes.append(f"outputs {', '.join(dropped)} dropped (not multi-arrays); {', '.join(sorted(names))} kept")
    return twin, notes


def device_inputs(x: np.ndarray, image: bool, mean, std) -> tuple[np.ndarray, np.ndarray]:
    """(what the phone is sent, what the reference must see) for normalized NCHW inputs `x`."""
    x = np.asarray(x, np.float32)
    if not image:
        return x, x
    from .runners import quantized_pixels
    p = quantized_pixels(x, mean, std)
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return p, ((p / 255.0 - m) / s).astype(np.float32)


def _carry(a: np.ndarray) -> np.ndarray:
    """An array the remote transport can carry: float32 unless it already is one of its dtypes."""
    a = np.ascontiguousarray(a)
    return a if a.dtype in TRANSPORT_DTYPES else a.astype(np.float32)


def io_names(spec) -> tuple[str, str]:
    """(input, output) names to drive a (transport twin's) spec with: its first input and its first multi-array
    output, as the package declares them (a foreign package need not say "image" / "logits")."""
    outputs = [o.name for o in spec.description.output if o.type.WhichOneof("Type") == "multiArrayType"]
    if not spec.description.input or not outputs:
        raise VitedgeError("the CoreML package has no input or no multi-array output for the phone to return")
    return spec.description.input[0].name, outputs[0]


def benchmark_on_device(mlpackage: str | Path, device, golden_feed: np.ndarray, team_id: str,
                        input_name: str | None = None, output: str | None = None, iterations: int = 50,
                        load_iterations: int = LOAD_ITERATIONS, experimental=None,
                        bundle_id: str | None = None) -> dict:
    """Time load and predict on the phone (MLModelBenchmarker) and run every golden input through one loaded
    model (one MLModelAsyncWrapper, unloaded at the end). `golden_feed` is what to send (see device_inputs);
    `input_name` / `output` default to the package's own (io_names); `bundle_id` to resolve_bundle_id's."""
    remote_device, perf_utils, async_wrapper = experimental or _experimental()
    import coremltools as ct

    cu = getattr(ct.ComputeUnit, COMPUTE_UNITS)
    weights_dir = ct.models.MLModel(str(mlpackage), skip_model_load=True).weights_dir
    twin, notes = transport_spec(ct.models.MLModel(str(mlpackage), skip_model_load=True).get_spec())
    spec_input, spec_output = io_names(twin)
    input_name, output = input_name or spec_input, output or spec_output
    feeds = [_carry(x[None]) for x in golden_feed]

    async def go():
        creds = remote_device.AppSigningCredentials(development_team=team_id,
                                                    bundle_identifier=resolve_bundle_id(bundle_id, team_id))
        prepared = await device.prepare_for_model_debugging(credentials=creds)
        try:
            model = ct.models.MLModel(twin, weights_dir=weights_dir, compute_units=cu, skip_model_load=True)
            bench = perf_utils.MLModelBenchmarker(model=model, device=prepared)
            load = await bench.benchmark_load(iterations=load_iterations)
            pred = await bench.benchmark_predict(inputs={input_name: feeds[0]}, iterations=iterations, warmup=True)
            # coremltools 9 keeps the first model benchmark_load loaded (perf_utils.py, `_loaded_model`) and has no
            # call that unloads it: unload it here, so the phone does not hold two copies with the wrapper's below
            kept = getattr(bench, "_loaded_model", None)
            if kept is not None:
                await kept.unload()
            del bench, kept
            gc.collect()
            wrapper = async_wrapper.MLModelAsyncWrapper.from_spec_or_path(
                spec_or_path=twin, weights_dir=weights_dir, compute_units=cu, device=prepared)
            await wrapper.load()
            try:
                outs = []
                for feed in feeds:
                    y = await wrapper.predict(inputs={input_name: feed})
                    if output not in y:
                        raise RuntimeError(f"the phone returned {sorted(y)} without {output!r}")
                    outs.append(np.asarray(y[output], np.float32).reshape(-1))
            finally:
                await wrapper.unload()
        finally:
            session = getattr(prepared, "session", None)
            if session is not None:
                session.stop()  # the devicectl process that drives the model-runner app
        return load, pred, np.stack(outs)

    load, pred, outputs = asyncio.run(go())
    return {"name": getattr(device, "name", str(device)), "os": getattr(device, "os_version", None),
            "os_build": getattr(device, "os_build_number", None), "compute_units": COMPUTE_UNITS,
            "load_ms": list(load.samples), "predict_ms": list(pred.samples), "outputs": outputs,
            "transport": notes, "mode": "device"}


class IphoneBench(DeviceBench):
    """The coreml target's DeviceBench: each call goes through this module's functions (looked up when called)."""
    kind = "iphone"
    compute_units = COMPUTE_UNITS
    parity_samples = DEVICE_PARITY_SAMPLES
    precision = "fp16"

    def connect(self, spec: str):
        return check_device(spec)

    def signing(self, team_id: str | None, bundle_id: str | None) -> str:
        team = resolve_team_id(team_id)
        if bundle_id is not None:
            resolve_bundle_id(bundle_id, team)  # a malformed --bundle-id: exit 2 before any work
        return team

    def inputs(self, x: np.ndarray, image: bool, mean, std) -> tuple[np.ndarray, np.ndarray]:
        return device_inputs(x, image, mean, std)

    def run(self, path, device, feed: np.ndarray, team_id: str | None, iterations: int,
            bundle_id: str | None = None) -> dict:
        return benchmark_on_device(path, device, feed, team_id, iterations=iterations, bundle_id=bundle_id)


__all__ = ["IphoneBench", "TEAM_ENV", "COMPUTE_UNITS", "DEVICE_PARITY_SAMPLES", "parse_device", "resolve_team_id",
           "resolve_bundle_id", "check_device", "transport_spec", "io_names", "device_inputs", "benchmark_on_device"]
