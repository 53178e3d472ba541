"""What each deploy-form rewrite is worth: the deploy-form with all of its family's rewrites against the same
deploy-form with all but one, for every rewrite, on ONNX Runtime (1 thread, batch 1).

Every graph goes through vitedge's own ONNX path (TorchScript export, checker, the fusion-keeping simplifier), as
`vitedge export` writes it; each is checked against the train-form's float64 ground truth (the pipeline's fp32
rule) before it is timed. The graphs of one model are timed interleaved, in --sessions epochs of fresh ONNX
Runtime sessions (the model's time budget split between them), until every ratio's 95 % CI is --ci-width wide
within each epoch (or --max-s-per-model has passed). The interval is a bootstrap over the sessions, then the
rounds within them, so it includes the spread between identical sessions. Ratio "all / all-but-X" > 1: rewrite
X makes the graph faster by that factor, given the others. Printed last: the ratios with their CIs.

    python benchmarks/rewrite_ablation.py [--quick] [--models a,b] [--out FILE]
"""
from __future__ import annotations

import time

import numpy as np

import _corpus
import _graphs
import _script
import _stats
from _tables import intervals, load, ratio, run_line, table
import _timing
from vitedge.exporter.verdict.inputs import parity_inputs
from vitedge.exporter.reparam import available_rewrites, reparameterize
from vitedge.models import create_model, get_spec, list_models, make_trained_like

MODELS = ("swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16")
SAMPLES = 8  # parity inputs per graph: a sanity check of each variant, not the export's verdict
COPIES = 3  # sessions per graph within an epoch, used in turn (_timing.ort_sessions: identical sessions differ)
SESSIONS = 4  # epochs of fresh sessions per model (_timing.time_sessions)


def measure_model(name: str, overrides: dict, config: str, imgsz: int, timing: dict) -> dict:
    train = make_trained_like(create_model(name, **overrides), seed=0).eval()
    rewrites = available_rewrites(train)
    variants = {"all": list(rewrites), **{f"all-but-{r}": [x for x in rewrites if x != r] for r in rewrites}}
    x = parity_inputs(SAMPLES, imgsz, seed=0).numpy()
    truth = _graphs.ground_truth_on(train, x)
    graphs = {k: _graphs.onnx_image_model(reparameterize(train, imgsz, rewrites=v), imgsz, 1)
              for k, v in variants.items()}
    checked = _timing.ort_sessions(graphs, threads=1, copies=1)
    parity = {k: _graphs.parity_problems(truth, np.concatenate([s.run(x[i:i + 1]) for i in range(len(x))]))
              for k, s in checked.items()}
    checked.clear()
    nodes = {k: _graphs.total_nodes(g) for k, g in graphs.items()}
    passed = [k for k in graphs if not parity[k]]
    # every passing graph in new sessions per epoch: the intervals include the sessions' spread
    fresh = _timing.ort_fresh({k: graphs[k] for k in passed}, 1, x[:1], copies=COPIES)
    pairs = [("all", k) for k in passed if k != "all"] if "all" in passed else []
    t0 = time.perf_counter()
    per = _timing.time_sessions(fresh, pairs, timing["sessions"], timing["min_rounds"], timing["max_s"],
                                timing["ci_width"], min_s=timing["min_s"])
    times = _timing.pooled(per)
    return {"model": name, "config": config, "overrides": overrides, "imgsz": imgsz, "rewrites": list(rewrites),
            "variants": variants, "nodes": nodes, "parity_failed": {k: v for k, v in parity.items() if v},
            "seconds": round(time.perf_counter() - t0, 1), "rounds": len(next(iter(times.values()), [])),
            "latency": {k: _stats.stats(v) for k, v in times.items()},
            "speedups": {f"all/{k}": _stats.speedup_sessions(per[k], per["all"]) for _, k in pairs}}


def main(argv=None) -> int:
    ap = _script.parser("rewrite_ablation", __doc__)
    ap.add_argument("--models", default=None, help=f"comma list (default: {','.join(MODELS)})")
    ap.add_argument("--ci-width", type=float, default=0.02,
                    help="stop a model once every ratio's 95%% CI is this wide (relative)")
    ap.add_argument("--max-s-per-model", type=float, default=120.0)
    ap.add_argument("--sessions", type=int, default=SESSIONS,
                    help=f"epochs of fresh sessions per model, the time budget split between them (default {SESSIONS})")
    args = ap.parse_args(argv)
    started, info = _script.begin("rewrite_ablation", args.quick)
    wanted = args.models.split(",") if args.models else list(MODELS)
    if args.quick:
        timing = {"sessions": 2, "min_rounds": 5, "max_s": 0.5, "min_s": 0.0, "ci_width": 1.0}
        plan = [(n, _corpus.REDUCED[n], "reduced", 64 if n != "slab_deit_tiny" else 224)
                for n in wanted if n in _corpus.REDUCED]
    else:
        timing = {"sessions": args.sessions, "min_rounds": 20, "max_s": args.max_s_per_model, "min_s": 10.0,
                  "ci_width": args.ci_width}
        plan = [(n, {}, "real", get_spec(n).default_imgsz) for n in wanted if n in list_models()]
    missing = [n for n in wanted if n not in list_models()]
    results = []
    for n, ov, cfg, s in plan:
        print(f"  {n} ({cfg}, {s} px) ...", flush=True)
        results.append(measure_model(n, ov, cfg, s, timing))
    body = {"settings": {"threads": 1, "batch": 1, "samples": SAMPLES, **timing}, "missing": missing,
            "models": results}
    path = _script.write_results(_script.out_path("rewrite_ablation", args), "rewrite_ablation",
                                 info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    for r in results:
        for k, why in r["parity_failed"].items():
            print(f"  {r['model']} {k}: failed parity, not timed: {'; '.join(why)}")
    print("\nratios (latency of all but one rewrite / latency of all, > 1 = that rewrite makes the graph faster):")
    _stats.print_ratios(results, "speedups")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def rewrite_ablation(name: str = "rewrite_ablation.json") -> str:
    """Per model and rewrite: all rewrites over all but that one (> 1: the rewrite makes the graph faster)."""
    rows = []
    for m in load(name)["models"]:
        for rw in m["rewrites"]:
            r = m["speedups"][f"all/all-but-{rw}"]
            nodes = f"{m['nodes']['all']['total']} / {m['nodes'][f'all-but-{rw}']['total']}"
            rows.append([m["model"], f"`{rw}`", nodes,
                         ratio(r)])
    return table(["model", "without this rewrite", "ONNX nodes (all / without)", "all / all-but"], rows)


def rewrite_ablation_run(name: str = "rewrite_ablation.json") -> str:
    """How a run was made, from its JSON: when, where, the load, the checks before timing, the stopping rule and
    how its intervals were computed."""
    d = load(name)
    m, s = d["machine"], d["settings"]
    return (f"Run: {run_line(d)}, load average {m['load_start']} at start, {m['load_end']} at end, {d['wall_s']:.0f} s "
            f"(`{d['command'].split(' --out')[0]}`). Per model, the deploy-form with all of its family's rewrites and "
            "with all but each one, each through vitedge's ONNX path (export, checker, the fusion-keeping simplifier) "
            f"and checked against the float64 ground truth on {s['samples']} inputs first; ONNX Runtime, "
            f"{s['threads']} thread, batch {s['batch']}, {COPIES} sessions per graph used in turn, all graphs of a "
            "model interleaved in random order per round until every CI was "
            f"{100 * s['ci_width']:g} % wide (at least {s['min_rounds']} rounds and {s['min_s']:g} s"
            + (f" per model, in {s['sessions']} epochs of fresh sessions" if s.get("sessions") else "")
            + f"); {intervals(s, 'graph', once='one set of sessions per graph')}. Ratio = latency without the rewrite / latency with all (> 1: the rewrite "
            "makes the graph faster, given the others).")


def rewrite_ablation_summary(name: str = "rewrite_ablation.json") -> str:
    """The rewrites whose interval lies above 1 (worth something, given the others), and how many others there are
    (their intervals reach 1), with the run's date and machine."""
    d = load(name)
    worth, within = [], 0
    for m in d["models"]:
        for rw in m["rewrites"]:
            r = m["speedups"][f"all/all-but-{rw}"]
            if r["ci"][0] > 1.0:
                worth.append(f"{m['model']} `{rw}` {ratio(r)}")
            else:
                within += 1
    return (f"{run_line(d)}: " + "; ".join(worth) + f"; the other {within}: intervals reaching 1")


TABLES = {"rewrite_ablation": rewrite_ablation, "rewrite_ablation_run": rewrite_ablation_run,
          "rewrite_ablation_summary": rewrite_ablation_summary}


if __name__ == "__main__":
    raise SystemExit(main())
