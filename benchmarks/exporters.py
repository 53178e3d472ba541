"""The two ONNX exporters side by side (issue 20): TorchScript (`dynamo=False`) vs dynamo (torch.export), per family.

For one model of each family, the verified deploy-form (folded + rewrites) is exported by both exporters, each
at its default opset (TorchScript 17, dynamo 18), and measured on:
  - parity: ONNX Runtime vs the train-form's float64 ground truth on the default parity set (natural and stress),
    by the pipeline's fp32 noise rule, the raw and the onnxsim-simplified graph;
  - node counts (total and per op type), raw and simplified, and whether the dynamo exporter fell back;
  - export time: `export_onnx_info` + `check_onnx` + `simplify_onnx` (the pipeline's graph steps), the two
    exporters interleaved round by round;
  - ONNX Runtime latency of all four graphs (each exporter, raw and simplified), interleaved in one cell per
    thread setting (1 thread call by call; all threads in blocks of >= 0.3 s, see _timing.time_blocks), until
    every ratio's 95 % CI is 4 % wide or the cell's time is up. The baseline is the better TorchScript graph
    (raw or simplified, whichever is faster: what a user gets the usual way).
Ratios printed last: latency TorchScript-best / dynamo (> 1: the dynamo graph is faster), export time
dynamo / TorchScript (> 1: dynamo exports slower).

    python benchmarks/exporters.py [--quick] [--models swiftformer_xs,...] [--ci-width 0.04] [--out FILE]
"""
from __future__ import annotations

import copy
import time

import numpy as np

import _corpus
import _graphs
import _script
import _stats
from _tables import intervals, load, ratio, run_line, table
import _timing
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.exporter.onnx.onnx_export import EXPORTERS, check_onnx, default_opset, export_onnx_info, simplify_onnx
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, ground_truth, judge, run_batched
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, get_spec, list_models, make_trained_like

MODELS = ("swiftformer_xs", "slab_deit_tiny", "slab_swin_tiny", "slab_pvt_tiny", "slab_cswin_tiny",
          "sima_nano_12_p16", "sima_deit_tiny")  # one per family, real configs at their default sizes
QUICK = {"swiftformer_xs": (_corpus.REDUCED["swiftformer_xs"], 64)}  # --quick: one reduced model
THREAD_CONFIGS = ((1, 1), ("all", 0))  # (label, ONNX Runtime intra-op threads; 0 = every core)
BLOCK_S = 0.3
FORMS = ("raw", "simplified")


def build(name: str, overrides: dict, imgsz: int):
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    return train, reparameterize(train, imgsz)


def export_graphs(deploy, imgsz: int, exporter: str) -> tuple[dict, dict]:
    """{form: graph} and the export record of one exporter."""
    info = export_onnx_info(copy.deepcopy(deploy), imgsz, batch=1, exporter=exporter)
    raw = check_onnx(info.model)
    del raw.graph.value_info[:]  # as the pipeline keeps it
    return {"raw": raw, "simplified": simplify_onnx(raw)}, info.info()


def time_exports(deploy, imgsz: int, repeats: int) -> dict[str, list[float]]:
    """The pipeline's graph steps per exporter, interleaved round by round (seconds per round). The process-wide
    imports were paid by `export_graphs`, so every round is timed."""
    out: dict[str, list[float]] = {e: [] for e in EXPORTERS}
    for _ in range(repeats):
        for e in EXPORTERS:
            model = copy.deepcopy(deploy)
            t0 = time.perf_counter()
            simplify_onnx(check_onnx(export_onnx_info(model, imgsz, exporter=e).model))
            out[e].append(time.perf_counter() - t0)
    return out


def measure_cell(graphs: dict, label, threads: int, x: np.ndarray, timing: dict, valid: set) -> dict:
    sessions = {k: g for k, g in graphs.items() if k in valid}
    if not sessions:  # nothing passed parity: nothing is timed as if it were right
        print(f"    {label} thread(s): not timed: no graph passed parity", flush=True)
        return {"threads": label, "rounds": 0, "latency": {}, "speedups": {}, "not_timed": "no graph passed parity"}
    ts = [k for k in sessions if k.startswith("torchscript")]
    dyn = [k for k in sessions if k.startswith("dynamo")]
    pairs = [(d, t) for d in dyn for t in ts]
    t0 = time.perf_counter()
    block_s = 0.0 if threads == 1 else timing["block_s"]
    per = _timing.time_sessions(_timing.ort_fresh(sessions, threads, x), pairs, timing["sessions"],
                                timing["min_rounds"], timing["max_s"], timing["ci_width"], block_s, timing["min_s"])
    times = _timing.pooled(per)
    lat = {k: _stats.stats(v) for k, v in times.items()}
    cell = {"threads": label, "rounds": len(next(iter(times.values()))), "block_s": block_s or None,
            "seconds": round(time.perf_counter() - t0, 1), "latency": lat, "speedups": {}}
    if ts and dyn:
        best_ts = min(ts, key=lambda k: lat[k]["p50_ms"])  # the baseline: the faster TorchScript graph
        best_dyn = min(dyn, key=lambda k: lat[k]["p50_ms"])
        cell["baseline"] = best_ts
        for d in dyn:
            cell["speedups"][f"{best_ts}/{d}"] = _stats.speedup_sessions(per[best_ts], per[d])
        cell["speedups"]["torchscript-best/dynamo-best"] = _stats.speedup_sessions(per[best_ts], per[best_dyn])
    for k, s in lat.items():
        print(f"    {str(label):>3} thread(s) {k:<24} p50 {s['p50_ms']:8.3f} ms  CV {s['cv']:.3f}", flush=True)
    return cell


def measure_model(name: str, overrides: dict, config: str, imgsz: int, samples: int, repeats: int,
                  timing: dict) -> dict:
    print(f"\n{name} ({config} config, {imgsz} px)", flush=True)
    train, deploy = build(name, overrides, imgsz)
    pset = parity_inputs_for(train, imgsz, samples)
    x, truth = pset.numpy(), ground_truth(train, pset.numpy(), pset.sets)
    graphs, out = {}, {"model": name, "config": config, "overrides": overrides, "imgsz": imgsz,
                       "rewrites": list(deploy.reparam_summary.rewrites), "exporters": {}}
    valid = set()
    for exporter in EXPORTERS:
        forms, info = export_graphs(deploy, imgsz, exporter)
        entry = out["exporters"][exporter] = {"export": info, "opset": default_opset(exporter), "nodes": {},
                                              "parity": {}, "parity_problems": {}}
        for form, g in forms.items():
            key = f"{exporter}-{form}"
            graphs[key] = g
            y = run_batched(_timing.ort(g, threads=1), x)
            m, _, problems = judge(truth, y, FLOAT64_TOLERANCES["fp32"], pset.names)
            entry["nodes"][form] = _graphs.total_nodes(g)
            entry["parity"][form] = {"max_rel": m.max_rel, "cosine": m.cosine, "max_abs": m.max_abs}
            entry["parity_problems"][form] = problems
            if not problems:
                valid.add(key)
            print(f"  {key:<24} nodes {entry['nodes'][form]['total']:4d}  max_rel {m.max_rel:.2e}  "
                  f"cosine {m.cosine:.7f}{'  PARITY FAILED: ' + '; '.join(problems) if problems else ''}", flush=True)
        if info["exporter_fallback"]:
            print(f"  {exporter}: fell back to {info['exporter']}: {info['exporter_fallback']}", flush=True)
    times = time_exports(deploy, imgsz, repeats)
    out["export_time"] = {e: _stats.stats(times[e]) for e in EXPORTERS}
    out["export_time"]["dynamo/torchscript"] = _stats.speedup(times["dynamo"], times["torchscript"])
    print("  export + check + onnxsim: " + ", ".join(f"{e} {out['export_time'][e]['p50_ms'] / 1e3:.2f} s"
                                                      for e in EXPORTERS), flush=True)
    xb = np.random.default_rng(100).standard_normal((1, 3, imgsz, imgsz)).astype(np.float32)
    out["cells"] = [measure_cell(graphs, label, threads, xb, timing, valid) for label, threads in timing["threads"]]
    return out


def main(argv=None) -> int:
    ap = _script.parser("exporters", __doc__)
    ap.add_argument("--models", default=None, help=f"comma list (default: {','.join(MODELS)})")
    ap.add_argument("--samples", type=int, default=None, help="parity inputs (default 32; --quick 4)")
    ap.add_argument("--export-repeats", type=int, default=None, help="interleaved export rounds (default 5; --quick 2)")
    ap.add_argument("--ci-width", type=float, default=0.04,
                    help="stop a latency cell once every ratio's 95%% CI is this wide (relative)")
    ap.add_argument("--max-s-per-cell", type=float, default=60.0)
    args = ap.parse_args(argv)
    # one thread for the exports and the train-form reference; ORT threads are per cell
    started, info = _script.begin("exporters", args.quick)
    samples = args.samples or (4 if args.quick else 32)
    repeats = args.export_repeats or (2 if args.quick else 5)
    if args.quick:
        timing = {"sessions": 2, "min_rounds": 5, "max_s": 0.5, "min_s": 0.0, "ci_width": 1.0, "block_s": 0.05,
                  "threads": THREAD_CONFIGS[:1]}
        plan = [(n, ov, "reduced", s) for n, (ov, s) in QUICK.items()]
    else:
        # fresh sessions per cell (_timing.time_sessions): the intervals include the spread between sessions
        timing = {"sessions": 3, "min_rounds": 8, "max_s": args.max_s_per_cell, "min_s": 5.0,
                  "ci_width": args.ci_width, "block_s": BLOCK_S, "threads": THREAD_CONFIGS}
        wanted = args.models.split(",") if args.models else list(MODELS)
        plan = [(n, {}, "real", get_spec(n).default_imgsz) for n in wanted if n in list_models()]
    missing = [n for n in (args.models.split(",") if args.models else []) if n not in list_models()]
    results = [measure_model(n, ov, cfg, s, samples, repeats, timing) for n, ov, cfg, s in plan]
    body = {"settings": {"samples": samples, "export_repeats": repeats,
                         "opsets": {e: default_opset(e) for e in EXPORTERS}, "torch_threads": 1,
                         "ci_width": timing["ci_width"], "max_s_per_cell": timing["max_s"],
                         "sessions": timing["sessions"]},
            "missing": missing, "models": results}
    path = _script.write_results(_script.out_path("exporters", args), "exporters", info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    print("\nratios (latency: TorchScript's faster graph / dynamo, > 1 = dynamo faster; export time: dynamo / "
          "TorchScript, > 1 = dynamo slower):")
    for r in results:
        fallback = r["exporters"]["dynamo"]["export"]["exporter_fallback"]
        if fallback:
            print(f"  {r['model']}: dynamo fell back to TorchScript: {fallback}")
        for c in r["cells"]:
            for key, q in c["speedups"].items():
                print(f"  {r['model']} ({r['config']}) latency {c['threads']} thread(s) {key}: {_stats.fmt_ratio(q)}")
        print(f"  {r['model']} ({r['config']}) export time dynamo/torchscript: "
              f"{_stats.fmt_ratio(r['export_time']['dynamo/torchscript'])}")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def exporters() -> str:
    """Per model: the faster TorchScript graph over the faster dynamo graph (> 1: dynamo faster), and export time."""
    rows, d = [], load("exporters.json")
    for m in d["models"]:
        lat = [ratio(c["speedups"]["torchscript-best/dynamo-best"]) for c in m["cells"]]
        t = m["export_time"]
        rows.append([m["model"]] + lat + [f"{t['dynamo']['p50_ms'] / t['torchscript']['p50_ms']:.1f}×"])
    return (table(["model", "latency, 1 thread", "all threads", "export time"], rows, sep="| ---")
            + f"\n\nRun: {run_line(d)}; {intervals(d['settings'], 'graph')}.")


TABLES = {"exporters": exporters}


if __name__ == "__main__":
    raise SystemExit(main())
