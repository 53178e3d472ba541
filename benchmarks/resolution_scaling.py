"""ONNX Runtime latency from 224 to 1024 px for the models that accept several sizes, both attention orders.

Models: swiftformer_xs (any multiple of 32), sima_nano_12_p16 (SimA XCiT: any multiple of 16; SimA
attention, order qk_first or kv_first) and slab_pvt_tiny (SLAB-PVT: simplified linear attention, order per
block; its SLA positional encodings are sized for one grid, so each size is the model *built* for it,
`--set img_size=S`: a 224 checkpoint does not load at another size, a model trained at S does). At every
size all candidates of all models are timed interleaved in one cell (ONNX Runtime, 1 thread, batch 1,
vitedge's deploy-form and ONNX export), until every ratio's 95 % CI is 4 % wide or the cell's time is up:
  - per model with a choice: qk_first and kv_first forced everywhere (`reparameterize(attn_order=...)`), and
    the FLOP rule's choice ("auto": per block, so possibly mixed; timed on its own only when mixed);
  - qk_first is not timed where it costs more than QK_SKIP_RATIO x the rule's MACs (the N x N' attention
    matrix grows with the square of the token count; at 1024 px SLAB-PVT's stage 1 would need 17 GB per head):
    the rule's choice is not in question there, and the JSON says so.
Reports per size and model the latency, GMACs per order (matmul/conv/linear, `vitedge.models.flops`),
qk_first/kv_first, and rule/best (the rule's latency over the measured best's: 1.000 where the rule picked
the faster one) with paired bootstrap CIs; where the rule and the measured choice differ, by how much.
Writes JSON and a PNG plot (latency vs size; qk/kv vs size) to benchmarks/results/ and prints a markdown
table for the README, then the ratios last.

    python benchmarks/resolution_scaling.py [--quick] [--sizes 224,320,...] [--max-s-per-size 60] [--out FILE]
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import _corpus
import _graphs
import _script
import _stats
from _tables import intervals, load, run_line
import _timing
from vitedge.exporter.core.settings import as_size, parse_sizes, size_side, written
from vitedge.models.input_size import canonical
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, get_spec, list_models, make_trained_like
from vitedge.models.flops import model_macs

ORDERS = ("qk_first", "kv_first")
# (model, has an attention order choice, quick overrides): the models that accept several sizes
MODELS = (("swiftformer_xs", False), ("sima_nano_12_p16", True), ("slab_pvt_tiny", True))
SIZES = (224, 320, 384, 448, 512, 640, 768, 896, 1024)
QUICK_SIZES = (64, 96, 128)
QUICK_OVERRIDES = {**_corpus.REDUCED, "slab_pvt_tiny": dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 2, 3, 4],
                                                     depths=[1, 2, 1, 1], num_classes=10)}
BUILT_PER_SIZE = {"slab_pvt_tiny"}  # positional encodings sized for the grid: built with img_size=S
QK_SKIP_RATIO = 8.0  # qk_first is not timed where it needs more than this many times the rule's MACs
CI_WIDTH = 0.04
BASE_MODEL = "swiftformer_xs"  # cross-model ratios are against it, at the same size and in the same rounds


def overrides_for(name: str, size: int, quick: bool) -> dict:
    ov = dict(QUICK_OVERRIDES.get(name, {})) if quick else {}
    if name in BUILT_PER_SIZE:
        ov["img_size"] = size
    return ov


def candidates(name: str, choice: bool, size: int, quick: bool) -> tuple[dict, dict]:
    """({label: deploy-form module}, facts): labels "-" (no choice) or the orders (+ "auto" when mixed)."""
    ov = overrides_for(name, size, quick)
    get_spec(name).check_imgsz(size, ov)
    train = make_trained_like(create_model(name, **ov), seed=0).eval()
    facts = {"overrides": ov, "train": train, "gmacs": {}, "skipped": {}}
    if not choice:
        facts["gmacs"]["-"] = model_macs(name, size, **ov) / 1e9
        facts["rule"] = "-"
        return {"-": reparameterize(train, size)}, facts
    rule_model = reparameterize(train, size)
    rule_orders = sorted(set(rule_model.reparam_summary.attention_order.values()))
    facts["rule"] = rule_orders[0] if len(rule_orders) == 1 else "auto"
    facts["rule_orders"] = dict(rule_model.reparam_summary.attention_order)
    macs = {o: model_macs(name, size, attn_order=o, **ov) / 1e9 for o in (*ORDERS, "auto")}
    facts["gmacs"] = macs
    out = {}
    for o in ORDERS:
        if macs[o] > QK_SKIP_RATIO * macs["auto"]:
            facts["skipped"][o] = (f"{o} needs {macs[o]:.1f} GMACs, {macs[o] / macs['auto']:.1f}x the rule's "
                                   f"{macs['auto']:.1f}: not timed (> {QK_SKIP_RATIO:g}x)")
            continue
        out[o] = rule_model if facts["rule"] == o else reparameterize(train, size, attn_order=o)
    if facts["rule"] == "auto":
        out["auto"] = rule_model
    return out, facts


def measure_size(size, quick: bool, timing: dict) -> dict:
    """One size cell: `size` is S, or (H, W) for a non-square size (as the model functions take it)."""
    print(f"\n{written(size)} px", flush=True)
    h, w = as_size(size)
    x = np.random.default_rng(size).standard_normal((1, 3, h, w)).astype(np.float32)
    graphs, per_model = {}, {}
    for name, choice in MODELS:
        if name not in list_models():
            per_model[name] = {"missing": "not registered"}
            continue
        try:
            mods, facts = candidates(name, choice, size, quick)
        except Exception as e:  # a size the model cannot take: say so, measure the others
            per_model[name] = {"missing": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            print(f"  {name}: not at {written(size)} px: {per_model[name]['missing']}", flush=True)
            continue
        ref = _graphs.ground_truth_on(facts.pop("train"), x)  # float64, judged by the pipeline's noise rule
        parity = {}
        for label, m in mods.items():
            g = _graphs.onnx_image_model(m, size, 1)
            problems = _graphs.parity_problems(ref, _timing.ort(g, threads=1).run(x))
            if problems:
                parity[label] = problems
            graphs[(name, label)] = g
        per_model[name] = {**facts, "labels": list(mods), "parity_problems": parity}
        print(f"  {name}: candidates {', '.join(mods)}; rule {facts['rule']}; GMACs "
              + ", ".join(f"{k} {v:.2f}" for k, v in facts["gmacs"].items())
              + "".join(f"; {why}" for why in facts["skipped"].values()), flush=True)
    keys = {f"{n}:{lbl}": g for (n, lbl), g in graphs.items()}
    pairs = [(f"{n}:kv_first", f"{n}:qk_first") for n, m in per_model.items()
             if "labels" in m and {"qk_first", "kv_first"} <= set(m["labels"])]
    t0 = time.perf_counter()
    # every candidate in fresh sessions per epoch: the intervals include the spread between sessions
    per = _timing.time_sessions(_timing.ort_fresh(keys, 1, x), pairs, timing["sessions"], timing["min_rounds"],
                                timing["max_s"], timing["ci_width"], 0.0, timing["min_s"]) if keys else {}
    times = _timing.pooled(per)
    out = {"imgsz": size, "rounds": len(next(iter(times.values()))) if times else 0,
           "seconds": round(time.perf_counter() - t0, 1), "models": {}}
    for name, m in per_model.items():
        if "labels" not in m:
            out["models"][name] = m
            continue
        out["models"][name] = summarize_model(name, m, per)
        _print_model(name, out["models"][name])
    base = out["models"].get(BASE_MODEL, {}).get("best")
    for name, m in out["models"].items():
        if name != BASE_MODEL and base and m.get("best"):
            # this model's latency over swiftformer_xs's (> 1: slower), paired by round
            m["over_" + BASE_MODEL] = _stats.speedup_sessions(per[f"{name}:{m['best']}"], per[f"{BASE_MODEL}:{base}"])
    return out


def summarize_model(name: str, m: dict, per: dict) -> dict:
    labels = [lbl for lbl in m["labels"] if lbl not in m["parity_problems"]]
    times = _timing.pooled(per)
    lat = {lbl: _stats.stats(times[f"{name}:{lbl}"]) for lbl in m["labels"]}
    med = {lbl: lat[lbl]["p50_ms"] for lbl in labels}
    best = min(med, key=med.get) if med else None
    res = {"overrides": m["overrides"], "gmacs": m["gmacs"], "rule": m["rule"], "skipped": m["skipped"],
           "parity_problems": m["parity_problems"], "latency": lat, "best": best}
    if "rule_orders" in m:
        res["rule_orders"] = sorted(set(m["rule_orders"].values()))
    if {"qk_first", "kv_first"} <= set(labels):
        res["qk_over_kv"] = _stats.speedup_sessions(per[f"{name}:qk_first"], per[f"{name}:kv_first"])
    if m["rule"] != "-" and best:
        rule = m["rule"] if m["rule"] in labels else None
        if rule is None:
            res["rule_over_best"] = None
        elif rule == best:
            res["rule_over_best"] = {"ratio": 1.0, "ci": [1.0, 1.0], "pairs": len(times[f"{name}:{rule}"]),
                                     "sessions": len(per[f"{name}:{rule}"])}
        else:
            res["rule_over_best"] = _stats.speedup_sessions(per[f"{name}:{rule}"], per[f"{name}:{best}"])
        res["rule_is_best"] = rule == best
    return res


def _print_model(name: str, m: dict) -> None:
    lat = ", ".join(f"{k} {v['p50_ms']:.2f} ms" for k, v in m["latency"].items())
    extra = ""
    if m.get("qk_over_kv"):
        extra += f"; qk/kv {_stats.fmt_ratio(m['qk_over_kv'])}"
    if m.get("rule_over_best"):
        extra += f"; rule {m['rule']} / best {m['best']}: {m['rule_over_best']['ratio']:.3f}x"
    print(f"  {name:<17} {lat}{extra}", flush=True)
    for lbl, p in m["parity_problems"].items():
        print(f"  PARITY FAILED {name} {lbl}: {'; '.join(p)}: not a candidate for the best", flush=True)


# ---- the FLOP rule against the measurement ------------------------------------------------------------

def disagreements(sizes: list[dict]) -> list[dict]:
    """Every (model, size) where the rule's order was not the faster median, with rule/best and its CI."""
    out = []
    for s in sizes:
        for name, m in s["models"].items():
            r = m.get("rule_over_best")
            if r and not m.get("rule_is_best"):
                out.append({"model": name, "imgsz": s["imgsz"], "rule": m["rule"], "best": m["best"], **r,
                            "beyond_noise": r["ci"][0] > 1.0})
    return out


# ---- plot and table -----------------------------------------------------------------------------------

def plot(sizes: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    names = [n for n, _ in MODELS]
    for i, name in enumerate(names):
        color = f"C{i}"
        for label in ("-", "auto", "kv_first", "qk_first"):
            pts = [(size_side(s["imgsz"]), s["models"][name]["latency"][label]["p50_ms"],
                    s["models"][name]["rule"] in ("-", label)) for s in sizes
                   if label in s["models"].get(name, {}).get("latency", {})]
            if not pts:
                continue
            # the rule's order solid (point by point: the rule may switch order with the size), the others dashed
            ax1.plot([p[0] for p in pts], [p[1] for p in pts], ":" if label == "kv_first" else "--", lw=0.9,
                     color=color, alpha=0.6)
            ax1.plot([p[0] for p in pts], [p[1] if p[2] else np.nan for p in pts], "-", marker="o", ms=3, color=color,
                     label=name if label == "-" else f"{name} {label}")
        pts = [(size_side(s["imgsz"]), s["models"][name]["qk_over_kv"]) for s in sizes
               if s["models"].get(name, {}).get("qk_over_kv")]
        if pts:
            xs = [p[0] for p in pts]
            ys = [p[1]["ratio"] for p in pts]
            err = [[y - p[1]["ci"][0] for y, p in zip(ys, pts)], [p[1]["ci"][1] - y for y, p in zip(ys, pts)]]
            ax2.errorbar(xs, ys, yerr=err, marker="o", ms=3, capsize=2, color=color, label=name)
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax1.set(yscale="log", ylabel="ONNX Runtime latency, 1 thread, batch 1 (ms)",
            title="latency by resolution (solid: the FLOP rule's order;\ndashed qk_first, dotted kv_first)")
    ax2.axhline(1.0, color="grey", lw=0.8)
    ax2.set(yscale="log", ylabel="qk_first / kv_first latency (> 1: kv_first faster)",
            title="attention order, measured (95% CI)")
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xlabel("image size (px; H x W at sqrt(H W))")
        ax.set_xticks([size_side(s["imgsz"]) for s in sizes], [written(s["imgsz"]) for s in sizes])
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(sizes: list[dict]) -> str:
    names = [n for n, _ in MODELS]
    head = "| px | " + " | ".join(f"{n} ms (order)" for n in names) + " | rule vs measured |"
    lines = [head, "|" + "---|" * (len(names) + 2)]
    for s in sizes:
        cells, notes = [], []
        for n in names:
            m = s["models"].get(n, {})
            if "best" not in m or m["best"] is None:
                cells.append("–")
                continue
            order = "" if m["best"] == "-" else f" ({m['best']})"
            cells.append(f"{m['latency'][m['best']]['p50_ms']:.1f}{order}")
            r = m.get("rule_over_best")
            if r and not m.get("rule_is_best"):
                notes.append(f"{n}: rule {m['rule']} {r['ratio']:.3f}× [{r['ci'][0]:.3f}–{r['ci'][1]:.3f}] slower")
            elif m.get("skipped"):
                notes.append(f"{n}: qk_first not timed (> {QK_SKIP_RATIO:g}× the MACs)")
        lines.append(f"| {written(s['imgsz'])} | " + " | ".join(cells) + f" | {'; '.join(notes) or 'rule = measured best'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = _script.parser("resolution_scaling", __doc__)
    ap.add_argument("--sizes", default=None, help=f"comma list of S or HxW (default {','.join(map(str, SIZES))})")
    ap.add_argument("--max-s-per-size", type=float, default=60.0, help="time budget per size cell (default 60)")
    args = ap.parse_args(argv)
    started, info = _script.begin("resolution_scaling", args.quick)
    sizes = ([canonical(z) for z in parse_sizes(args.sizes, "--sizes")] if args.sizes
             else list(QUICK_SIZES if args.quick else SIZES))  # S, or (H, W): a non-square size
    timing = ({"sessions": 2, "min_rounds": 3, "min_s": 0.0, "max_s": 0.05, "ci_width": CI_WIDTH} if args.quick else
              {"sessions": 3, "min_rounds": 5, "min_s": 3.0, "max_s": args.max_s_per_size, "ci_width": CI_WIDTH})
    results = [measure_size(s, args.quick, timing) for s in sizes]
    dis = disagreements(results)
    out = _script.out_path("resolution_scaling", args)
    png = plot(results, Path(out).with_suffix(".png"))
    table = markdown_table(results)
    body = {"settings": {"threads": 1, "batch": 1, "sizes": sizes, "models": [n for n, _ in MODELS],
                         "quick_overrides": QUICK_OVERRIDES if args.quick else None, "qk_skip_ratio": QK_SKIP_RATIO,
                         **timing, "built_per_size": sorted(BUILT_PER_SIZE)},
            "sizes": results, "rule_vs_measured": dis, "plot": png.name, "markdown": table}
    path = _script.write_results(out, "resolution_scaling", info, args, body, started)
    print(f"\nresults: {path}; plot: {png}\n{info['load_note']}")
    print("\nmarkdown table (ms = ONNX Runtime p50 of the measured best order; the README quotes it):\n")
    print(table)
    print("\nratios (95% CI; qk/kv > 1: kv_first faster; rule/best: the FLOP rule's order over the measured best):")
    for s in results:
        for name, m in s["models"].items():
            if m.get("qk_over_kv"):
                print(f"  {written(s['imgsz']):>7} px {name:<17} qk_first/kv_first: {_stats.fmt_ratio(m['qk_over_kv'])}")
            if m.get("rule_over_best") and not m.get("rule_is_best"):
                print(f"  {written(s['imgsz']):>7} px {name:<17} rule {m['rule']}/best {m['best']}: "
                      f"{_stats.fmt_ratio(m['rule_over_best'])}")
            if m.get("over_" + BASE_MODEL):
                print(f"  {written(s['imgsz']):>7} px {name:<17} latency over {BASE_MODEL}'s (> 1: slower): "
                      f"{_stats.fmt_ratio(m['over_' + BASE_MODEL])}")
    print(f"  the FLOP rule picked the measured best order at "
          f"{sum(1 for s in results for m in s['models'].values() if m.get('rule_is_best'))}/"
          f"{sum(1 for s in results for m in s['models'].values() if 'rule_is_best' in m)} (model, size) points; "
          + (", ".join(f"{d['model']} {written(d['imgsz'])} px {d['ratio']:.3f}x{' (beyond noise)' if d['beyond_noise'] else ''}"
                       for d in dis) or "no disagreement"))
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def resolution_scaling() -> str:
    """ONNX Runtime p50 per size and model, with the measured best attention order and the rule's verdict: the
    table resolution_scaling.py rendered from its own `sizes` and stored beside them in the JSON."""
    d = load("resolution_scaling.json")
    return d["markdown"] + f"\n\nRun: {run_line(d)}; {intervals(d['settings'], 'graph')}."


def resolution_scaling_summary() -> str:
    """In words, from the JSON: how far apart the two orders are per model (qk/kv at the first and last size both
    ran), and each model's latency over swiftformer_xs's (its range over the sizes)."""
    d = load("resolution_scaling.json")
    sizes = d["sizes"]
    parts = []
    for name in d["settings"]["models"]:
        both = [(s["imgsz"], s["models"][name]["qk_over_kv"]["ratio"]) for s in sizes
                if s["models"].get(name, {}).get("qk_over_kv")]
        if both:
            (s0, r0), (s1, r1) = both[0], both[-1]
            parts.append(f"kv_first is {r0:.2f}× faster than qk_first for {name} at {written(s0)} px and {r1:.2f}× at "
                         f"{written(s1)} px")
    over = []
    for name in d["settings"]["models"]:
        rs = [s["models"][name]["over_" + BASE_MODEL]["ratio"] for s in sizes
              if s["models"].get(name, {}).get("over_" + BASE_MODEL)]
        if rs:
            over.append(f"{name} {min(rs):.2f}–{max(rs):.2f}×")
    return "; ".join(parts) + f". Latency over {BASE_MODEL}'s, over the sizes: " + ", ".join(over)


TABLES = {"resolution_scaling": resolution_scaling, "resolution_scaling_summary": resolution_scaling_summary}


if __name__ == "__main__":
    raise SystemExit(main())
