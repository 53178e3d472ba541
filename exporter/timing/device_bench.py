"""`vitedge bench --device KIND[:NAME]` (the one kind today: iphone, the coreml target's): per size, lower the
deploy-form with the device's target (or take the `--artifact`), time load and predict on the device and run the
golden vectors there; the bench report's `device` section. What speaks to the device is the target's DeviceBench
(targets/base.py; the iPhone's is targets/coreml/iphone.py): this module imports no backend.

Golden vectors: the first `parity_samples` inputs of the default parity set (natural and stress), compared with the
train-form's float64 ground truth on what the device was really sent (8-bit pixels for `--input image`), against
the profile of the device's precision (fp16 for the iPhone) per input set, as the export ladder judges that hop.
Parity mode is "device": the device computed it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch.nn as nn

from . import latency
from ...errors import VitedgeError
from ...targets import get_target, rows
from ...targets.base import DeviceBench, LowerSpec, Target
from ...targets.rows import ONNX
from ..onnx.onnx_export import save_onnx
from ..verdict.hops import PARITY_SEED, parity_inputs_for
from ..verdict.inputs import IMAGENET_MEAN, IMAGENET_STD, parity_set
from ..verdict.parity import (FLOAT64_TOLERANCES, ground_truth, judge, profile_for, tolerances as make_tolerances,
                              with_fp16_reference)


@dataclass
class Connected:
    """A device reached before any work: its target, that target's DeviceBench, the device and the signing."""
    target: Target
    bench: DeviceBench
    device: object
    team_id: str | None = None


def connect(spec: str, team_id: str | None = None, bundle_id: str | None = None,
            row=None) -> Connected:
    """The device `spec` names (KIND or KIND:NAME), through the target whose row lists KIND in `devices` (`row`:
    the artifact's, which must); VitedgeError naming what is missing, before any work."""
    kind = spec.partition(":")[0]
    owners = [r for r in ([row] if row is not None else rows()) if kind in r.devices]
    if not owners:
        kinds = sorted({k for r in rows() for k in r.devices})
        if row is not None and kind in kinds:
            owner = next(r.name for r in rows() if kind in r.devices)
            raise VitedgeError(f"--device {kind} times a {owner} artifact; this is a {row.name} artifact")
        raise VitedgeError(f"--device takes {' or '.join(f'{k} or {k}:NAME' for k in kinds)}; got {spec!r}")
    target = get_target(owners[0].name)
    bench = target.device_bench(kind)
    device = bench.connect(spec)  # raises VitedgeError saying what is missing (platform, tools, the device)
    return Connected(target, bench, device, bench.signing(team_id, bundle_id))


def _stats(samples_ms: list[float]) -> dict:
    return latency.summarize(np.asarray(samples_ms, np.float64) / 1e3, batch=1).to_dict()


def phone_section(phone: Connected) -> dict:
    """The `device` section's header, before any result."""
    d = phone.device
    return {"name": getattr(d, "name", str(d)), "os": getattr(d, "os_version", None),
            "os_build": getattr(d, "os_build_number", None), "type": phone.bench.kind,
            "compute_units": phone.bench.compute_units, "input": "tensor", "results": []}


def time_package(section: dict, phone: Connected, package: Path, imgsz: int, train: nn.Module | None,
                 iterations: int, run: Callable | None = None, no_parity: str | None = None,
                 bundle_id: str | None = None) -> dict:
    """Time one saved artifact on the device and run the golden vectors through it: one `results` entry (also
    appended to `section`). Without `train` (an artifact whose model is unknown) parity is not run: `no_parity`
    says why. `run` (the device's DeviceBench.run by default) is injectable; `bundle_id`: the signed app's."""
    bench, samples = phone.bench, phone.bench.parity_samples
    run = run or bench.run
    meta = phone.target.read_metadata(package)
    pre = meta.get("preprocessing") or {}
    image = meta.get("input") == "image"
    section["input"] = "image" if image else "tensor"
    if train is not None:
        pset = parity_inputs_for(train, imgsz, samples)
    else:  # no model to take the statistics from: the package's own (parity is not run)
        pset = parity_set(samples, imgsz, PARITY_SEED, pre.get("mean") or IMAGENET_MEAN,
                         pre.get("std") or IMAGENET_STD)
    x = pset.numpy()
    feed, ref_in = bench.inputs(x, image, pre.get("mean"), pre.get("std"))
    # bundle_id only when given (None: the device's default), so an injected runner of the older signature works
    got = run(package, phone.device, feed, phone.team_id, iterations=iterations,
              **({"bundle_id": bundle_id} if bundle_id is not None else {}))
    if train is None:
        parity = {"mode": "device", "status": "not run", "samples": 0, "metrics": None, "tolerance": None,
                  "reason": no_parity}
    else:
        tol = make_tolerances(None, FLOAT64_TOLERANCES)[profile_for(bench.precision)]
        truth = with_fp16_reference(ground_truth(train, ref_in, pset.sets), train, ref_in)
        m, sets, problems = judge(truth, np.asarray(got["outputs"]), tol, pset.names)
        nonfinite = int((~np.isfinite(got["outputs"])).any(axis=1).sum())
        if nonfinite:
            problems.insert(0, f"non-finite outputs (NaN/Inf) in {nonfinite} of {len(x)} samples")
        parity = {"mode": "device", "status": "failed" if problems else "passed", "samples": int(len(x)),
                  "metrics": asdict(m), "tolerance": asdict(tol), "reason": "; ".join(problems) or None,
                  "sets": sets}
    section.update(name=got.get("name", section["name"]), os=got.get("os", section["os"]),
                   os_build=got.get("os_build", section["os_build"]))
    entry = {"imgsz": imgsz, "load_ms": _stats(got["load_ms"]), "predict_ms": _stats(got["predict_ms"]),
             "transport": got.get("transport", []), "parity": parity}
    section["results"].append(entry)
    return entry


def run_on_phone(phone: Connected, train: nn.Module, make_deploy: Callable[[int], nn.Module], sizes: list[int],
                 tmp: Path, iterations: int, options: dict, log: Callable[[str], None],
                 runner: Callable | None = None, bundle_id: str | None = None,
                 onnx_graph: Callable | None = None) -> dict:
    """The `device` section: device, OS, compute units, and per size load/predict percentiles and parity. A
    target that lowers from the ONNX graph (its row's `source`) gets `onnx_graph(deploy, imgsz)`, the simplified
    graph as `bench` builds it."""
    section, kind = phone_section(phone), phone.bench.kind
    for s in sizes:
        log(f"imgsz {s}: {kind} {section['name']}: converting, then timing load and predict on the device")
        out = tmp / f"{kind}{s}"
        out.mkdir(parents=True, exist_ok=True)
        deploy, onnx_path = make_deploy(s), None
        if phone.target.row.source == ONNX:
            onnx_path = save_onnx(onnx_graph(deploy, s), out / "bench.onnx")
        art = phone.target.lower(deploy, LowerSpec(name="bench", imgsz=s, batch=1, precision=phone.bench.precision,
                                                   out_dir=out, onnx_path=onnx_path, options=dict(options)))
        time_package(section, phone, art.path, s, train, iterations, runner, bundle_id=bundle_id)
    return section


__all__ = ["Connected", "connect", "run_on_phone", "phone_section", "time_package"]
