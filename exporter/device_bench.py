"""`vitedge bench --device iphone[:NAME]`: per size, lower the deploy-form to CoreML, time load and predict on
the phone and run the golden vectors there; the bench report's `device` section.

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
from .hops import parity_inputs_for
from .iphone import COMPUTE_UNITS, DEVICE_PARITY_SAMPLES, benchmark_on_device, device_inputs
from .parity import FLOAT64_TOLERANCES, ground_truth, judge, tolerances as make_tolerances


def _stats(samples_ms: list[float]) -> dict:
    return latency.summarize(np.asarray(samples_ms, np.float64) / 1e3, batch=1).to_dict()


def run_on_phone(phone, team_id: str, train: nn.Module, make_deploy: Callable[[int], nn.Module], sizes: list[int],
                 tmp: Path, iterations: int, options: dict, log: Callable[[str], None],
                 runner: Callable | None = None) -> dict:
    """The `device` section: phone, OS, compute units, and per size load/predict percentiles and parity."""
    from ..targets.base import LowerSpec
    from ..targets.coreml import CoreMLTarget, read_metadata
    run = runner or benchmark_on_device
    tol = make_tolerances(None, FLOAT64_TOLERANCES)["fp16"]
    section = {"name": getattr(phone, "name", str(phone)), "os": getattr(phone, "os_version", None),
               "os_build": getattr(phone, "os_build_number", None), "type": "iphone",
               "compute_units": COMPUTE_UNITS, "input": options.get("input") or "tensor", "results": []}
    for s in sizes:
        log(f"imgsz {s}: iphone {section['name']}: converting, then timing load and predict on the phone")
        out = tmp / f"iphone{s}"
        out.mkdir(parents=True, exist_ok=True)
        art = CoreMLTarget().lower(make_deploy(s), LowerSpec(name="bench", imgsz=s, batch=1, precision="fp16",
                                                             out_dir=out, onnx_path=None, options=dict(options)))
        pre = read_metadata(art.path).get("preprocessing", {})
        pset = parity_inputs_for(train, s, DEVICE_PARITY_SAMPLES)
        x = pset.numpy()
        feed, ref_in = device_inputs(x, art.info["input"] == "image", pre.get("mean"), pre.get("std"))
        truth = ground_truth(train, ref_in, pset.sets)
        got = run(art.path, phone, feed, team_id, iterations=iterations)
        m, sets, problems = judge(truth, np.asarray(got["outputs"]), tol, pset.names)
        nonfinite = int((~np.isfinite(got["outputs"])).any(axis=1).sum())
        if nonfinite:
            problems.insert(0, f"non-finite outputs (NaN/Inf) in {nonfinite} of {len(x)} samples")
        section.update(name=got.get("name", section["name"]), os=got.get("os", section["os"]),
                       os_build=got.get("os_build", section["os_build"]))
        section["results"].append({
            "imgsz": s, "load_ms": _stats(got["load_ms"]), "predict_ms": _stats(got["predict_ms"]),
            "transport": got.get("transport", []),
            "parity": {"mode": "device", "status": "failed" if problems else "passed", "samples": int(len(x)),
                       "metrics": asdict(m), "tolerance": asdict(tol), "reason": "; ".join(problems) or None,
                       "sets": sets}})
    return section


__all__ = ["run_on_phone"]
