"""`vitedge bench --device iphone[:NAME]`: per size, lower the deploy-form to CoreML (or take the `--artifact`
package), time load and predict on the phone and run the golden vectors there; the bench report's `device` section.

Golden vectors: the first DEVICE_PARITY_SAMPLES inputs of the default parity set (natural and stress), compared
with the train-form's float64 ground truth on what the phone was really sent (8-bit pixels for `--input image`),
against the fp16 profile per input set, as the export ladder judges an fp16 hop. Parity mode is "device": the
phone's CoreML computed it.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Callable

import numpy as np
import torch.nn as nn

from . import latency
from ..verdict.hops import PARITY_SEED, parity_inputs_for
from ..verdict.inputs import IMAGENET_MEAN, IMAGENET_STD, parity_set
from .iphone import COMPUTE_UNITS, DEVICE_PARITY_SAMPLES, benchmark_on_device, device_inputs
from ..verdict.parity import FLOAT64_TOLERANCES, ground_truth, judge, tolerances as make_tolerances, with_fp16_reference


def _stats(samples_ms: list[float]) -> dict:
    return latency.summarize(np.asarray(samples_ms, np.float64) / 1e3, batch=1).to_dict()


def phone_section(phone) -> dict:
    """The `device` section's header, before any result."""
    return {"name": getattr(phone, "name", str(phone)), "os": getattr(phone, "os_version", None),
            "os_build": getattr(phone, "os_build_number", None), "type": "iphone",
            "compute_units": COMPUTE_UNITS, "input": "tensor", "results": []}


def time_package(section: dict, phone, team_id: str, package: Path, imgsz: int, train: nn.Module | None,
                 iterations: int, run: Callable | None = None, no_parity: str | None = None,
                 bundle_id: str | None = None) -> dict:
    """Time one saved package on the phone and run the golden vectors through it: one `results` entry (also
    appended to `section`). Without `train` (an artifact whose model is unknown) parity is not run: `no_parity`
    says why. The package's own input and output names drive it (iphone.io_names); `bundle_id`: the app's."""
    from ...targets.coreml import read_metadata

    run = run or benchmark_on_device
    meta = read_metadata(package)
    pre = meta.get("preprocessing") or {}
    image = meta.get("input") == "image"
    section["input"] = "image" if image else "tensor"
    if train is not None:
        pset = parity_inputs_for(train, imgsz, DEVICE_PARITY_SAMPLES)
    else:  # no model to take the statistics from: the package's own (parity is not run)
        pset = parity_set(DEVICE_PARITY_SAMPLES, imgsz, PARITY_SEED, pre.get("mean") or IMAGENET_MEAN,
                         pre.get("std") or IMAGENET_STD)
    x = pset.numpy()
    feed, ref_in = device_inputs(x, image, pre.get("mean"), pre.get("std"))
    # bundle_id only when given (None: benchmark_on_device derives the team's), so an injected runner of the
    # older signature keeps working
    got = run(package, phone, feed, team_id, iterations=iterations,
              **({"bundle_id": bundle_id} if bundle_id is not None else {}))
    if train is None:
        parity = {"mode": "device", "status": "not run", "samples": 0, "metrics": None, "tolerance": None,
                  "reason": no_parity}
    else:
        tol = make_tolerances(None, FLOAT64_TOLERANCES)["fp16"]
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


def run_on_phone(phone, team_id: str, train: nn.Module, make_deploy: Callable[[int], nn.Module], sizes: list[int],
                 tmp: Path, iterations: int, options: dict, log: Callable[[str], None],
                 runner: Callable | None = None, bundle_id: str | None = None) -> dict:
    """The `device` section: phone, OS, compute units, and per size load/predict percentiles and parity."""
    from ...targets.base import LowerSpec
    from ...targets.coreml import CoreMLTarget
    section = phone_section(phone)
    for s in sizes:
        log(f"imgsz {s}: iphone {section['name']}: converting, then timing load and predict on the phone")
        out = tmp / f"iphone{s}"
        out.mkdir(parents=True, exist_ok=True)
        art = CoreMLTarget().lower(make_deploy(s), LowerSpec(name="bench", imgsz=s, batch=1, precision="fp16",
                                                             out_dir=out, onnx_path=None, options=dict(options)))
        time_package(section, phone, team_id, art.path, s, train, iterations, runner, bundle_id=bundle_id)
    return section


__all__ = ["run_on_phone", "phone_section", "time_package"]
