"""Quantized and compressed artifacts side by side (issue 18): size, ONNX Runtime CPU latency, top-1 on the
trained reference fixtures.

Per model and precision, in one run:
  - latency (swiftformer_xs and slab_deit_tiny, real configs at 224 px, seeded trained-like weights; calibration:
    the pipeline's default, 64 views of the shipped calibration photos): the fp32 deploy-form ONNX, raw export and
    onnxsim-simplified (the baseline is whichever is faster: what a user gets the usual way), the int8 QDQ graph
    (`--precision int8`, ONNX Runtime encoding: uint8 activations) and, for reference, the TensorRT encoding
    (int8 symmetric activations) on ONNX Runtime; interleaved at 1 thread (call by call) and all threads (blocks
    of >= 0.3 s), until every ratio's 95 % CI is 4 % wide or the cell's time is up;
  - size: ONNX fp32 vs int8 bytes for the same models; CoreML packages fp16 vs w8 / palette4 / palette6 (iOS 16)
    and w8a8 (iOS 17) on swiftformer_l3 (28 M parameters, where weights dominate the package; 64 px: the size
    does not depend on the input size);
  - top-1 on the trained fixtures (tests/fixtures/trained/, 364 held-out digits, 95 % Wilson CIs, and agreement
    with fp32): fp32, int8 (both encodings, ONNX Runtime), CoreML fp16 / w8 / palette4 / palette6 / w8a8 run by
    the MIL interpreter; calibration: 64 training-split digits (a user's --calib-images).
Targets (issue 18, revised): int8 >= 1.3x faster than fp32 for swiftformer_xs and >= 1.5x for slab_deit_tiny
(1 thread, batch 1); w8 >= 1.8x and palette4 >= 3.5x smaller than fp16; top-1 within 0.5 points of fp32 for
int8, w8 and w8a8. Ratios and target lines are printed last.

    python benchmarks/quantization.py [--quick] [--ci-width 0.04] [--max-s-per-cell 60] [--out FILE]
"""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import _corpus
import _script
import _stats
from _tables import intervals, load, ratio, run_line, table
import _timing
from vitedge.exporter.quantize.calibrate import natural_calibration
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, make_trained_like
from vitedge.models.registry import input_stats
from vitedge.targets.base import LowerSpec
from vitedge.targets.coreml import CoreMLTarget, EmulatedCoreMLRunner
from vitedge.targets.coreml.compress import compress_package
from vitedge.targets.graph.qdq import quantize_qdq
from vitedge.exporter.verdict import trained_reference as tf

LATENCY = {"swiftformer_xs": ({}, 224), "slab_deit_tiny": ({}, 224)}
LATENCY_QUICK = {"swiftformer_xs": (_corpus.REDUCED["swiftformer_xs"], 64)}
SIZES = ("swiftformer_l3", {}, 64)
SIZES_QUICK = ("swiftformer_l3", {"layers": [1, 1, 1, 1]}, 32)  # L3 widths, one block per stage (8.4 M)
KINDS = {"w8": 16, "palette4": 16, "palette6": 16, "w8a8": 17}  # kind: iOS (the export's default for it)
TARGETS = {"int8_speedup": {"swiftformer_xs": 1.3, "slab_deit_tiny": 1.5}, "w8_smaller": 1.8,
           "palette4_smaller": 3.5, "top1_drop_points": 0.5}
THREAD_CONFIGS = ((1, 1), ("all", 0))
CALIB = 64
BLOCK_S = 0.3


def _bytes(path: Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---- latency and ONNX sizes -------------------------------------------------------------------------------

def latency_model(name: str, overrides: dict, imgsz: int, timing: dict) -> dict:
    print(f"\n{name} ({imgsz} px){' reduced' if overrides else ''}: ONNX Runtime fp32 vs int8", flush=True)
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    deploy = reparameterize(train, imgsz)
    raw = check_onnx(export_onnx(deploy, imgsz, batch=1))
    del raw.graph.value_info[:]
    graphs = {"fp32-raw": raw, "fp32-simplified": simplify_onnx(raw)}
    mean, std = input_stats(train)
    calib = natural_calibration(CALIB, imgsz, mean, std)
    for enc, key in (("onnxruntime", "int8"), ("tensorrt", "int8-tensorrt-encoding")):
        graphs[key] = quantize_qdq(graphs["fp32-simplified"], calib.x, calibration_ids=calib.ids, encoding=enc).model
    out = {"model": name, "overrides": overrides, "imgsz": imgsz, "calibration": calib.note,
           "bytes": {k: len(g.SerializeToString()) for k, g in graphs.items()}, "cells": []}
    out["bytes"]["fp32/int8"] = out["bytes"]["fp32-simplified"] / out["bytes"]["int8"]
    x = np.random.default_rng(100).standard_normal((1, 3, imgsz, imgsz)).astype(np.float32)
    for label, threads in timing["threads"]:
        pairs = [(k, b) for k in ("int8", "int8-tensorrt-encoding") for b in ("fp32-raw", "fp32-simplified")]
        block_s = 0.0 if threads == 1 else timing["block_s"]
        t0 = time.perf_counter()
        per = _timing.time_sessions(_timing.ort_fresh(graphs, threads, x), pairs, timing["sessions"],
                                    timing["min_rounds"], timing["max_s"], timing["ci_width"], block_s,
                                    timing["min_s"])
        times = _timing.pooled(per)
        lat = {k: _stats.stats(v) for k, v in times.items()}
        base = min(("fp32-raw", "fp32-simplified"), key=lambda k: lat[k]["p50_ms"])
        cell = {"threads": label, "baseline": base, "rounds": len(times[base]),
                "seconds": round(time.perf_counter() - t0, 1), "latency": lat,
                "speedups": {f"{base}/{k}": _stats.speedup_sessions(per[base], per[k])
                             for k in ("int8", "int8-tensorrt-encoding")}}
        for k, s in lat.items():
            print(f"    {str(label):>3} thread(s) {k:<24} p50 {s['p50_ms']:8.3f} ms  CV {s['cv']:.3f}", flush=True)
        out["cells"].append(cell)
    return out


# ---- CoreML sizes ---------------------------------------------------------------------------------------

def fp16_packages(deploy, name: str, imgsz: int, batch: int, work: Path) -> dict[int, Path]:
    """{iOS: the fp16 package} for every deployment target the kinds need (the compression sources)."""
    out = {}
    for ios in sorted(set(KINDS.values())):
        folder = work / f"{name}-ios{ios}"
        folder.mkdir()
        spec = LowerSpec(name=name, imgsz=imgsz, batch=batch, precision="fp16", out_dir=folder, onnx_path=None,
                         options={"ios": ios})
        out[ios] = CoreMLTarget().lower(deploy, spec).path
    return out


def coreml_sizes(name: str, overrides: dict, imgsz: int, work: Path) -> dict:
    print(f"\n{name} ({imgsz} px){' reduced' if overrides else ''}: CoreML package sizes", flush=True)
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    deploy = reparameterize(train, imgsz)
    params = sum(p.numel() for p in train.parameters())
    mean, std = input_stats(train)
    calib = natural_calibration(4, imgsz, mean, std).x  # the size does not depend on the calibration
    out = {"model": name, "overrides": overrides, "imgsz": imgsz, "params": params, "packages": {}}
    sources = fp16_packages(deploy, name, imgsz, 1, work)
    out["packages"]["fp16"] = {"ios": 16, "bytes": _bytes(sources[16])}
    for kind, ios in KINDS.items():
        c = compress_package(sources[ios], work / f"{name}-{kind}.mlpackage", kind,
                             calibration=calib if kind == "w8a8" else None)
        b = c.info["bytes"]
        out["packages"][kind] = {"ios": ios, "bytes": b["package"], "smaller_than_fp16": b["package_ratio"],
                                 "weights_ratio": b["weights_ratio"]}
        print(f"    {kind:<9} iOS {ios}: {b['package'] / 1e6:7.2f} MB, {b['package_ratio']:.2f}x smaller than fp16",
              flush=True)
    return out


# ---- top-1 on the trained fixtures -----------------------------------------------------------------------

def fixture_accuracy(name: str, work: Path) -> dict:
    print(f"\n{name}: top-1 on the held-out digits", flush=True)
    x, y = tf.heldout(name)
    train, deploy = tf.deploy_form(name)
    ref = tf.torch_logits(train, x)
    calib, ids = tf.calibration_images(name, CALIB)
    logits = {"fp32": ref}
    fp32 = tf.onnx_fp32(name)
    for enc, key in (("onnxruntime", "int8"), ("tensorrt", "int8-tensorrt-encoding")):
        logits[key] = tf.ort_logits(quantize_qdq(fp32, calib, calibration_ids=ids, encoding=enc).model, x)
    imgsz = tf.manifest()["models"][name]["imgsz"]
    sources = fp16_packages(deploy, name, imgsz, 52, work)  # 52: the 364 held-out digits in 7 runs
    logits["coreml-fp16"] = EmulatedCoreMLRunner(sources[16], max_samples=None).run(x)
    for kind, ios in KINDS.items():
        c = compress_package(sources[ios], work / f"{name}-{kind}.mlpackage", kind,
                             calibration=calib if kind == "w8a8" else None, calibration_ids=ids)
        logits[f"coreml-{kind}"] = EmulatedCoreMLRunner(c.path, max_samples=None).run(x)
    out = {}
    for k, v in logits.items():
        acc = tf.accuracy(v, y)
        out[k] = {**acc, "agreement_with_fp32": float((v.argmax(1) == ref.argmax(1)).mean()),
                  "drop_points": round(100 * (out.get("fp32", acc)["top1"] - acc["top1"]), 3)}
        print(f"    {k:<24} {tf.describe(acc)}  agreement {out[k]['agreement_with_fp32']:.4f}", flush=True)
    return out


def main(argv=None) -> int:
    ap = _script.parser("quantization", __doc__)
    ap.add_argument("--ci-width", type=float, default=0.04,
                    help="stop a latency cell once every ratio's 95%% CI is this wide (relative)")
    ap.add_argument("--max-s-per-cell", type=float, default=60.0)
    args = ap.parse_args(argv)
    started, info = _script.begin("quantization", args.quick)
    if args.quick:
        timing = {"sessions": 2, "min_rounds": 5, "max_s": 0.5, "min_s": 0.0, "ci_width": 1.0, "block_s": 0.05,
                  "threads": THREAD_CONFIGS[:1]}
        lat_plan, size_plan = LATENCY_QUICK, SIZES_QUICK
    else:
        # fresh sessions per cell (_timing.time_sessions): the intervals include the spread between sessions
        timing = {"sessions": 3, "min_rounds": 8, "max_s": args.max_s_per_cell, "min_s": 5.0,
                  "ci_width": args.ci_width, "block_s": BLOCK_S, "threads": THREAD_CONFIGS}
        lat_plan, size_plan = LATENCY, SIZES
    work = Path(tempfile.mkdtemp(prefix="vitedge-quant-bench-"))
    try:
        lat = [latency_model(n, ov, s, timing) for n, (ov, s) in lat_plan.items()]
        sizes = coreml_sizes(*size_plan, work)
        # --quick: the first fixture (every kind on all 364 held-out digits; the full run has both)
        acc = {n: fixture_accuracy(n, work) for n in tf.reference_names()[:1 if args.quick else None]}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    body = {"settings": {"calibration_samples": CALIB, "ci_width": timing["ci_width"], "max_s_per_cell": timing["max_s"],
                         "sessions": timing["sessions"], "torch_threads": 1, "targets": TARGETS},
            "latency": lat, "coreml_sizes": sizes, "fixtures": acc}
    path = _script.write_results(_script.out_path("quantization", args), "quantization", info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    print("\nratios (latency: the faster fp32 graph / int8, > 1 = int8 faster; size: fp16 package / compressed, "
          "> 1 = smaller; top-1: points below fp32):")
    for r in lat:
        for c in r["cells"]:
            for key, q in c["speedups"].items():
                print(f"  {r['model']} latency {c['threads']} thread(s) {key}: {_stats.fmt_ratio(q)}")
        print(f"  {r['model']} ONNX size fp32/int8: {r['bytes']['fp32/int8']:.2f}x")
        want = TARGETS["int8_speedup"].get(r["model"])
        one = next((c for c in r["cells"] if c["threads"] == 1), None)
        if want and one and not args.quick:
            got = one["speedups"][f"{one['baseline']}/int8"]["ratio"]
            print(f"  target int8 >= {want}x at 1 thread for {r['model']}: {got:.3f}x "
                  f"({'met' if got >= want else 'NOT met'})")
    for kind, p in sizes["packages"].items():
        if kind != "fp16":
            print(f"  {sizes['model']} CoreML {kind} (iOS {p['ios']}): {p['smaller_than_fp16']:.2f}x smaller than fp16")
    for kind, key in (("w8", "w8_smaller"), ("palette4", "palette4_smaller")):
        got = sizes["packages"][kind]["smaller_than_fp16"]
        print(f"  target {kind} >= {TARGETS[key]}x smaller ({sizes['model']}, {sizes['params'] / 1e6:.1f} M params): "
              f"{got:.2f}x ({'met' if got >= TARGETS[key] else 'NOT met'})")
    for n, a in acc.items():
        for k, v in a.items():
            if k != "fp32":
                gated = k in ("int8", "coreml-w8", "coreml-w8a8")
                verdict = (f"; target <= {TARGETS['top1_drop_points']}: "
                           f"{'met' if v['drop_points'] <= TARGETS['top1_drop_points'] else 'NOT met'}") if gated else ""
                print(f"  {n} top-1 {k}: {v['drop_points']:+.2f} points below fp32 (agreement "
                      f"{v['agreement_with_fp32']:.4f}){verdict}")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def quantization_speed() -> str:
    """int8 QDQ (the graph vitedge writes) over the faster fp32 deploy-form graph, 1 thread and all threads."""
    d = load("quantization.json")
    goals = d["settings"]["targets"]["int8_speedup"]
    rows = []
    for m in d["latency"]:
        row = [m["model"]]
        for c in m["cells"]:
            r = c["speedups"][f"{c['baseline']}/int8"]
            goal = goals.get(m["model"]) if c["threads"] == 1 else None
            met = "" if goal is None else f" (target ≥ {goal:g}: {'met' if r['ratio'] >= goal else '**missed**'})"
            row.append(ratio(r) + met)
        rows.append(row + [f"{m['bytes']['fp32/int8']:.2f}×"])
    return (table(["model", "int8 speed-up, 1 thread", "all threads", "ONNX size fp32 / int8"], rows, sep="| ---")
            + f"\n\nRun: {run_line(d)}; {intervals(d['settings'], 'graph')}.")


def quantization_fixtures() -> str:
    """Top-1 of every artifact kind on the trained fixtures' held-out digits, and its agreement with fp32."""
    fx = load("quantization.json")["fixtures"]
    names = {"fp32": "fp32", "int8": "int8 (ONNX Runtime encoding)",
             "int8-tensorrt-encoding": "int8 (TensorRT encoding, on ONNX Runtime)", "coreml-fp16": "CoreML fp16",
             "coreml-w8": "w8", "coreml-palette4": "palette4", "coreml-palette6": "palette6", "coreml-w8a8": "w8a8"}
    order = ("swiftformer_digits", "slab_deit_digits")

    def top1(r: dict, full: bool) -> str:
        lo, hi = r["wilson95"]
        return f"{r['correct']} ({100 * r['top1']:.2f} %, {100 * lo:.1f}-{100 * hi:.1f})" if full else str(r["correct"])
    rows = []
    for key, label in names.items():
        row = [label]
        for f in order:
            r = fx[f][key]
            row += [top1(r, key == "fp32" or r["correct"] != fx[f]["fp32"]["correct"]),
                    "" if key == "fp32" else f"{r['agreement_with_fp32']:.4f}"]
        rows.append(row)
    return table(["artifact", "SwiftFormer top-1", "agreement with fp32", "SLAB-DeiT top-1", "agreement"], rows)


def coreml_sizes_table() -> str:
    """How much smaller each compressed CoreML package is than the fp16 one, from quantization.json."""
    q = load("quantization.json")
    d, goals = q["coreml_sizes"], q["settings"]["targets"]

    def one(kind: str, x: float, first: bool) -> str:
        goal = goals.get(f"{kind}_smaller")
        verdict = "met" if goal is not None and x >= goal else "**missed**"
        met = "" if goal is None else f" ({'target ' if first else ''}≥ {goal:g}: {verdict})"
        return f"{kind} {x:.2f}×" + (" smaller than fp16" if first else "") + met
    packs = [(k, v["smaller_than_fp16"]) for k, v in d["packages"].items() if "smaller_than_fp16" in v]
    return (f"CoreML sizes on {d['model']} ({d['params'] / 1e6:.1f} M parameters): "
            + ", ".join(one(k, x, i == 0) for i, (k, x) in enumerate(packs)))


TABLES = {
    "quantization_speed": quantization_speed,
    "quantization_fixtures": quantization_fixtures,
    "coreml_sizes": coreml_sizes_table,
}


if __name__ == "__main__":
    raise SystemExit(main())
