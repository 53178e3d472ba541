"""ExecuTorch speed: the `.pte` programs vitedge writes against ONNX Runtime on the same deploy-form.

For one model per family (swiftformer_xs, slab_deit_tiny, sima_nano_12_p16, 224 px, batch 1), at 1 thread and at
every core, candidates timed interleaved in one run (call by call at 1 thread; in blocks of >= 0.3 s at more, since idle
pool workers spin and would slow the next candidate):
  ort        ONNX Runtime (CPU, default session) on vitedge's simplified fp32 graph of the deploy-form;
  et         the fp32 `.pte`, XNNPACK, with the delegable rewrites (vitedge's default);
  et.plain   the fp32 `.pte` without them (`--executorch-rewrites off`: what the plain lowering delegates);
  et.int8    the int8 `.pte` (PT2E, XNNPACK quantizer), calibrated on 32 views of the shipped photos.
ExecuTorch's XNNPACK pool is process-wide (`portable_lib._unsafe_reset_threadpool`) and a program uses the pool
it was loaded with, so each cell sizes the pool, loads the programs anew, and gives ONNX Runtime as many
intra-op threads. Every candidate's outputs are checked first (fp32: the
pipeline's float64 noise rule; int8: the int8 profile's cosine to the deploy-form). Prints latency per candidate, then the
ratios with CIs, last, and the targets as PASS/MISS, measured, never tuned. Each cell times every candidate in 4
fresh sessions (ONNX Runtime sessions created and `.pte` programs loaded anew), its rounds interleaved within each;
the interval is a bootstrap over the sessions, then the rounds within them, so it includes the spread between
identical sessions (up to 2.6 % here), which one session pair's interval does not. The targets:
ExecuTorch fp32 >= ONNX Runtime fp32 and ExecuTorch int8 >= 1.8x its fp32.

    python benchmarks/executorch_speed.py [--quick] [--models a,b] [--out FILE]
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import torch

import _corpus
import _graphs
import _script
import _stats
from _tables import intervals, load, table
import _timing
from vitedge.exporter.reparam.build_forms import build_deploy_form, build_train_form
from vitedge.exporter.verdict.inputs import natural_inputs
from vitedge.exporter.verdict.parity import COMPRESSED_TOLERANCES
from vitedge.models.registry import input_stats
from vitedge.targets import get_target
from vitedge.targets.base import LowerSpec
from vitedge.targets.calibration import Calibration
from vitedge.targets.executorch.target import set_threads

MODELS = ("swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16")
PAIRS = (("et", "ort"), ("et", "et.plain"), ("et.int8", "et"))  # (new, base): base latency / new latency
TARGETS = {("et", "ort"): 1.0, ("et.int8", "et"): 1.8}
CALIB = 32
INT8_COSINE = COMPRESSED_TOLERANCES["int8"].cosine


def _lower(target, deploy, name: str, imgsz: int, precision: str, tmp: Path, rewrites: str, calib=None):
    tmp.mkdir(parents=True, exist_ok=True)
    spec = LowerSpec(name, imgsz, 1, precision, tmp, None, metadata={"mean": [0.0] * 3},
                     options={"executorch_rewrites": rewrites}, calibration=calib)
    return target.lower(deploy, spec)


def measure_model(name: str, overrides: dict, config: str, imgsz: int, thread_counts: list[int], timing: dict) -> dict:
    print(f"\n{name} ({config}) @ {imgsz}", flush=True)
    train = build_train_form(name, overrides=overrides).model
    deploy, _ = build_deploy_form(train, imgsz)
    target = get_target("executorch")
    mean, std = input_stats(train)
    xc, ids = natural_inputs(CALIB, imgsz, seed=5, mean=mean, std=std)
    calib = Calibration(xc.numpy(), ids, "natural")
    tmp = Path(tempfile.mkdtemp(prefix="et-speed-"))
    arts = {"et": _lower(target, deploy, name, imgsz, "fp32", tmp / "a", "on"),
            "et.plain": _lower(target, deploy, name, imgsz, "fp32", tmp / "b", "off"),
            "et.int8": _lower(target, deploy, name, imgsz, "int8", tmp / "c", "on", calib)}
    graph = _graphs.onnx_image_model(deploy, imgsz, 1)
    x = natural_inputs(8, imgsz, seed=9, mean=mean, std=std)[0].numpy()
    truth = _graphs.ground_truth_on(train, x)
    with torch.no_grad():
        ref = deploy(torch.from_numpy(x)).numpy()
    one = _timing.ort(graph, 1)  # the graph's static batch of 1
    checks = {"ort": _graphs.parity_problems(truth, np.concatenate([one.run(x[i:i + 1]) for i in range(len(x))]))}
    runners = {k: target.runner(a) for k, a in arts.items()}
    for k, r in runners.items():
        y = r.run(x)
        if k == "et.int8":  # the product's int8 profile (cosine), on demo weights: no task to judge accuracy on
            cos = (y * ref).sum(1) / (np.linalg.norm(y, axis=1) * np.linalg.norm(ref, axis=1))
            checks[k] = [] if cos.min() >= INT8_COSINE else [f"cosine {cos.min():.4f} < {INT8_COSINE}"]
        else:
            checks[k] = _graphs.parity_problems(truth, y)
    bad = {k: v for k, v in checks.items() if v}
    if bad:
        raise RuntimeError(f"outputs fail their check: {bad}")
    xb = x[:1]
    cells = []
    for r in runners.values():
        r.close()
    for threads in thread_counts:
        set_threads(threads)

        def fresh(_epoch):  # every candidate in a new session, programs loaded anew (after the pool is sized:
            # XNNPACK binds a method to the pool it was loaded with)
            runners = {k: target.runner(a) for k, a in arts.items()}
            ort = _timing.ort(graph, threads)
            fns = {"ort": lambda: ort.run(xb), **{k: (lambda r=r: r.run(xb)) for k, r in runners.items()}}
            return fns, lambda: [r.close() for r in runners.values()]

        # more threads: blocks, not call by call (the pools' idle workers spin and would compete: _timing)
        per = _timing.time_sessions(fresh, list(PAIRS), timing["sessions"], timing["min_rounds"], timing["max_s"],
                                    timing["ci_width"], block_s=timing["block_s"] if threads > 1 else 0.0,
                                    min_s=timing["min_s"])
        times = _timing.pooled(per)
        cell = {"threads": threads, "latency_ms": {k: _stats.stats(v) for k, v in times.items()},
                "speedups": {f"{new} vs {base}": _stats.speedup_sessions(per[base], per[new]) for new, base in PAIRS}}
        cells.append(cell)
        print(f"  {threads} thread(s): " + ", ".join(f"{k} {cell['latency_ms'][k]['p50_ms']:.2f} ms" for k in times),
              flush=True)
    return {"model": name, "config": config, "imgsz": imgsz, "cells": cells,
            "pte_bytes": {k: a.path.stat().st_size for k, a in arts.items()},
            "outside_delegate": {k: a.info["outside_delegate"] for k, a in arts.items()}}


def main(argv=None) -> int:
    ap = _script.parser("executorch_speed", __doc__)
    ap.add_argument("--models", default=",".join(MODELS), help="comma list (default: one per family)")
    args = ap.parse_args(argv)
    started, info = _script.begin("executorch_speed", args.quick)
    # sessions: each candidate timed in that many fresh sessions, the budget split between them (_timing.time_sessions)
    timing = ({"sessions": 2, "min_rounds": 3, "min_s": 0.0, "max_s": 0.05, "ci_width": 0.5, "block_s": 0.01}
              if args.quick else
              {"sessions": 4, "min_rounds": 20, "min_s": 16.0, "max_s": 80.0, "ci_width": 0.04, "block_s": 0.3})
    every = os.cpu_count() or 1
    thread_counts = [1] if args.quick else sorted({1, every})
    results = []
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        overrides = _corpus.REDUCED.get(name, {}) if args.quick else {}
        imgsz = 64 if args.quick and name != "slab_deit_tiny" else 224
        results.append(measure_model(name, overrides, "reduced" if args.quick else "real", imgsz, thread_counts,
                                     timing))
    targets = []
    for r in results:
        for cell in r["cells"]:
            for (new, base), floor in TARGETS.items():
                q = cell["speedups"][f"{new} vs {base}"]
                targets.append({"model": r["model"], "threads": cell["threads"], "ratio": f"{new} vs {base}",
                                "target": floor, "measured": q["ratio"], "ci": q["ci"],
                                "status": "PASS" if q["ratio"] >= floor else "MISS"})
    body = {"settings": {"batch": 1, "threads": thread_counts, "calibration": f"{CALIB} natural views",
                         **timing}, "models": results, "targets": targets}
    path = _script.write_results(_script.out_path("executorch_speed", args), "executorch_speed",
                                 info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    for t in targets:
        print(f"  {t['status']}  {t['model']} {t['threads']} thread(s): {t['ratio']} >= {t['target']}x: "
              f"measured {t['measured']:.3f}x (95% CI {t['ci'][0]:.3f}-{t['ci'][1]:.3f})")
    for r in results:
        for cell in r["cells"]:
            for key, q in cell["speedups"].items():
                print(f"  {r['model']} ({r['config']}) {cell['threads']} thread(s) {key}: {_stats.fmt_ratio(q)}")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def _x(r: dict) -> str:
    return f"{r['ratio']:.2f}x ({r['ci'][0]:.2f}-{r['ci'][1]:.2f})"


def executorch_speed() -> str:
    """ExecuTorch fp32 / int8 against ONNX Runtime fp32 on the same deploy-form, per thread count."""
    d = load("executorch_speed.json")
    rows = []
    for m in d["models"]:
        for c in m["cells"]:
            lat, sp = c["latency_ms"], c["speedups"]
            rows.append([m["model"], c["threads"]]
                        + [f"{lat[k]['p50_ms']:.2f} ms" for k in ("ort", "et", "et.plain", "et.int8")]
                        + [_x(sp["et vs ort"]), _x(sp["et vs et.plain"]), _x(sp["et.int8 vs et"])])
    head = ["model", "threads", "ONNX Runtime fp32", "ExecuTorch fp32", "fp32, no rewrites", "ExecuTorch int8",
            "ET fp32 vs ORT", "rewrites gain", "int8 vs fp32"]
    mach = d["machine"]
    sizes = ", ".join(f"{m['model']} {m['pte_bytes']['et'] / 1e6:.1f} MB fp32 / "
                      f"{m['pte_bytes']['et.int8'] / 1e6:.1f} MB int8" for m in d["models"])
    met = sum(t["status"] == "PASS" for t in d["targets"])
    return (table(head, rows, sep="| ---") + f"\n\nMedians (batch {d['settings']['batch']}) on {mach['cpu']}, "
            f"{mach['cores']} cores, {mach['date']}; {intervals(d['settings'], 'candidate')}. "
            f"Program sizes: {sizes}.\n"
            f"Targets: {met} of {len(d['targets'])} met.")


def executorch_ratios() -> str:
    """ET fp32 over ORT fp32 and int8 over fp32, per model, 1 thread / 2 threads, from executorch_speed.json."""
    d = load("executorch_speed.json")

    def per(key: str) -> str:
        return ", ".join(f"{m['model']} " + " / ".join(f"{c['speedups'][key]['ratio']:.2f}×" for c in m["cells"])
                         for m in d["models"])
    return f"{per('et vs ort')}; the int8 `.pte` against its fp32 {per('et.int8 vs et')}"


TABLES = {"executorch_speed": executorch_speed, "executorch_ratios": executorch_ratios}


if __name__ == "__main__":
    raise SystemExit(main())
