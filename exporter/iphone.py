"""iPhone on-device timing and parity, thin over coremltools 9's experimental remote-device support
(`coremltools.models.ml_program.experimental`: `Device`, `MLModelBenchmarker`, which build and drive a
model-runner app through `devicectl`). Needs macOS, Xcode command-line tools and a tethered, developer-mode
iPhone; every missing piece is named plainly. Nothing here runs on Linux (dispatch is tested with stand-ins).
"""
from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import numpy as np

from ..models.errors import VitedgeError


def _experimental():
    try:
        from coremltools.models.ml_program.experimental import perf_utils, remote_device
    except Exception as e:  # noqa: BLE001 - any import failure means the feature is missing
        raise VitedgeError(f"--device iphone needs coremltools>=9 with ml_program.experimental ({e}); "
                           "pip install -U coremltools") from None
    return remote_device, perf_utils


def parse_device(spec: str) -> str | None:
    """`iphone` -> None (first connected iPhone), `iphone:NAME` -> NAME."""
    kind, _, name = spec.partition(":")
    if kind != "iphone":
        raise VitedgeError(f"--device takes iphone or iphone:NAME; got {spec!r}")
    return name or None


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
    remote_device, _ = experimental or _experimental()
    phones = remote_device.Device.get_connected_devices(remote_device.DeviceType.IPHONE)
    if name is not None:
        phones = [d for d in phones if d.name == name]
    if not phones:
        want = f"named {name!r} " if name else ""
        raise VitedgeError(f"no connected iPhone {want}found by devicectl: connect it, unlock it, enable "
                           "Developer Mode, and check `xcrun devicectl list devices`")
    return phones[0]


def benchmark_on_device(mlpackage: str | Path, device, golden_inputs: np.ndarray, input_name: str = "image",
                        iterations: int = 50, experimental=None) -> dict:
    """Time load and predict on the phone and run the golden vectors there (parity mode "device")."""
    _, perf_utils = experimental or _experimental()
    import coremltools as ct

    async def go():
        prepared = await device.prepare_for_model_debugging()
        model = ct.models.MLModel(str(mlpackage), compute_units=ct.ComputeUnit.CPU_AND_NE)
        bench = perf_utils.MLModelBenchmarker(model=model, device=prepared)
        load = await bench.benchmark_load(iterations=3)
        pred = await bench.benchmark_predict(iterations=iterations, warmup=True)
        outs = []
        for x in golden_inputs:
            from coremltools.models.ml_program.experimental.async_wrapper import MLModelAsyncWrapper
            wrapper = MLModelAsyncWrapper.from_spec_or_path(spec_or_path=str(mlpackage), device=prepared,
                                                            compute_units=ct.ComputeUnit.CPU_AND_NE)
            y = await wrapper.predict(inputs={input_name: x[None]})
            outs.append(np.asarray(next(iter(y.values()))).reshape(-1))
        return load, pred, np.stack(outs)

    load, pred, outputs = asyncio.run(go())
    return {"device": getattr(device, "name", str(device)), "load_ms": load.samples, "predict_ms": pred.samples,
            "outputs": outputs, "mode": "device"}
