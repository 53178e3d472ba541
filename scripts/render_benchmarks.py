"""Render the measurement tables of the README, benchmarks/README.md and docs/ from benchmarks/results/*.json.

A rendered block sits between two marker comments,

    <!-- rendered: NAME ARG ... -->
    ...
    <!-- /rendered -->

(or, for figures inside a sentence, `<!-- rendered: NAME ARG -->...<!-- /rendered -->` on one line) and is replaced
by RENDERERS[NAME](*ARGS): one function per table or figure, reading the JSON's own fields, so no figure in a block
is typed by hand. Prose outside the markers is not touched. `python scripts/render_benchmarks.py` rewrites
the files; `--check` only compares (exit 1 on drift). tests/test_rendered_tables.py re-renders and fails on drift.
Torch-free: json and the standard library only.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from vitedge.exporter.verdict.criteria import NoiseRule

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# the files that hold rendered blocks
FILES = ("README.md", "benchmarks/README.md", "docs/onnx.md", "docs/parity.md", "docs/parity_criteria.md",
         "docs/quantization.md", "docs/executorch.md")
# a block (the markers on lines of their own) or a fragment inside a sentence (markers and figures on one line:
# Markdown ends a paragraph at a line that starts with a comment)
BLOCK = re.compile(r"<!-- rendered: ([^>]*?) -->(\n?)(.*?)<!-- /rendered -->", re.S)


class RenderError(ValueError):
    """A marker names no renderer, or its JSON lacks what the renderer reads."""


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def ratio(r: dict, sign: str = "×") -> str:
    """A paired ratio with its 95 % CI, as every table prints it."""
    return f"{r['ratio']:.3f}{sign} [{r['ci'][0]:.3f}–{r['ci'][1]:.3f}]"


def table(head: list[str], rows: list[list], sep: str = "|---") -> str:
    line = "| " + " | ".join(head) + " |"
    rule = "|" + "---|" * len(head) if sep == "|---" else "| " + " | ".join("---" for _ in head) + " |"
    return "\n".join([line, rule] + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def run_line(d: dict) -> str:
    m = d["machine"]
    return f"{m['date'][:16].replace('T', ' ')} UTC, {m['cpu']}, {m['cores']} cores, ONNX Runtime {m['onnxruntime']}"


# ---------------------------------------------------------------------------------------------- deploy speed
def _threads(c: dict) -> str:
    if c["threads"] == 1:
        return "1"
    return "all no-spin" if c.get("spinning") == "off" else "all"


def _cell(m: dict, threads, batch: int, spinning: str = "default") -> dict | None:
    return next((c for c in m["cells"] if c["threads"] == threads and c["batch"] == batch
                 and c.get("spinning", "default") == spinning), None)


def _target(d: dict, model: str, key: str) -> dict | None:
    return next((t for t in d.get("targets", []) if t.get("model") == model and t["target"].endswith(f"({key})")),
                None)


def _with_target(d: dict, model: str, key: str, r: dict) -> str:
    t = _target(d, model, key)
    if t is None:
        return ratio(r)
    met = "met" if t["status"] == "PASS" else "**missed**"
    return f"{ratio(r)} (target ≥ {t['threshold']:.2f}: {met})"


def deploy_speed_headline(name: str = "deploy_speed.json") -> str:
    """Per model: vitedge's deploy-form over the best plain export (c/a) at 1 thread and all threads, batch 1,
    and over timm's port (c/d), with the run's targets."""
    d = load(name)
    rows = []
    for m in d["models"]:
        one, every = _cell(m, 1, 1), _cell(m, "all", 1)
        rows.append([m["model"], _with_target(d, m["model"], "c/a", one["speedups"]["c/a"]),
                     ratio(every["speedups"]["c/a"]) if every else "",
                     _with_target(d, m["model"], "c/d", one["speedups"]["c/d"]) if "c/d" in one["speedups"] else ""])
    head = ["model", "deploy-form vs best plain export, 1 thread, batch 1", "same, all threads, batch 1",
            "vs timm's port (its best export), 1 thread"]
    return f"Run: {run_line(d)} (`benchmarks/results/{name}`):\n\n" + table(head, rows, sep="| ---")


def deploy_speed_model(name: str, model: str) -> str:
    """One model's cells: latencies of (a) the best plain export, (b) folded, (c) folded + rewrites, (d) the best
    timm export, GFLOP/s, % of the GEMM and the paired ratios."""
    m = next(m for m in load(name)["models"] if m["model"] == model)
    timm = any("d" in c["baselines"] for c in m["cells"])
    nodes = ", ".join(f"({k}) {n['total']}" for k, n in m["nodes"].items())
    head = ["threads", "batch", "rounds", "(a) =", "(a) ms", "(b) ms", "(c) ms"] + (["(d) =", "(d) ms"] if timm else [])
    head += ["(c) GFLOP/s", "(c) % GEMM", "b/a", "c/a"] + (["c/d"] if timm else [])
    rows = []
    for c in m["cells"]:
        a = c["baselines"]["a"]["best"]
        row = [_threads(c), c["batch"], c["rounds"], a, f"{c['latency'][a]['p50_ms']:.2f}",
               f"{c['latency']['b']['p50_ms']:.2f}", f"{c['latency']['c']['p50_ms']:.2f}"]
        if timm:
            dd = c["baselines"]["d"]["best"]
            row += [dd, f"{c['latency'][dd]['p50_ms']:.2f}"]
        pct = c["pct_gemm"].get("c") if c["threads"] == 1 else None
        row += [f"{c['gflops']['c']:.1f}", "" if pct is None else f"{pct:.1f}", ratio(c["speedups"]["b/a"]),
                ratio(c["speedups"]["c/a"])] + ([ratio(c["speedups"]["c/d"])] if timm else [])
        rows.append(row)
    return f"Rewrites in (c): {', '.join(m['rewrites'])}. ONNX nodes: {nodes}.\n\n" + table(head, rows)


def deploy_speed_targets(name: str) -> str:
    """The run's targets as the script judged them (PASS / MISS on the point estimate, the CI stated)."""
    rows = []
    for t in load(name)["targets"]:
        if "ratio" in t:
            clears = "clears the target" if t["ci_clears"] else "reaches below the target"
            got = f"{t['ratio']:.3f}× [{t['ci'][0]:.3f}–{t['ci'][1]:.3f}] (base {t['base']}); the CI {clears}"
        elif "below" in t:
            got = f"{t['ratios'] - len(t['below'])}/{t['ratios']} ratios clear it"
        elif "pct_gemm" in t:
            got = f"{t['pct_gemm']:.1f} % of the GEMM"
        else:
            got = t["why"]
        rows.append([t["target"], got, f"**{t['status']}**"])
    return table(["target", "measured", "status"], rows)


# ------------------------------------------------------------------------------------------- attention order
def attention_order(index: str) -> str:
    """One series of attention_order.json: qk/kv and rule/best per token count N, ONNX Runtime and torch."""
    s = load("attention_order.json")["series"][int(index)]
    rows = []
    for p in s["points"]:
        n = f"{p['N']} ({p['imgsz']} px)" if p.get("imgsz") else str(p["N"])
        row = [n, p["rule"]]
        for b in ("onnxruntime", "torch"):
            row += [ratio(p[b]["qk_over_kv"]), f"{p[b]['rule_over_best']['ratio']:.3f}"]
        rows.append(row)
    title = f"**{s['name']}** — d = {s['head_dim']}, the rule flips at N = {s['rule_crossover_N']}"
    bullets = [f"- {label}: {_attention_summary(s['backends'][b], len(s['points']))}"
               for b, label in (("onnxruntime", "ONNX Runtime"), ("torch", "torch"))]
    return (title + "\n\n" + table(["N", "rule", "ORT qk/kv", "ORT rule/best", "torch qk/kv", "torch rule/best"], rows)
            + "\n\n" + "\n".join(bullets))


def _attention_summary(b: dict, points: int) -> str:
    """One backend's crossover and the rule's distance from the best order, in words."""
    x = b["crossover"]
    if x["N"] is not None:
        where = (f"kv_first is the faster median from N = {x['between'][1]} on "
                 f"(interpolated crossover N* ≈ {x['N']:g})")
    else:
        where = x["note"]
    slow = b["rule_significantly_slower_at"]
    worst = b["max_rule_over_best"]
    return (f"{where}; kv_first faster beyond noise from N = {x['kv_significantly_faster_from']}; the rule picked the "
            f"faster median at {len(b['rule_is_best_at'])}/{points} N; worst rule/best {ratio(worst)} at N = "
            f"{worst['N']}; the rule's order is "
            + ("never slower beyond noise." if not slow else
               "slower beyond noise at " + ", ".join(f"N = {p['N']} ({ratio(p)})" for p in slow) + "."))


# ---------------------------------------------------------------------------------------------- export time
def _last_hop(t: dict) -> str:
    h = t["hops"][-1]
    return f"{h['hop']} {h['status']} ({h['mode']})"


def export_time_targets() -> str:
    """Per model and target: wall time (median of the rounds), the target's hop, the ratio to the onnx pipeline."""
    d = load("export_time.json")
    rows = []
    for m in d["models"]:
        for key, t in m["targets"].items():
            r = m["ratios"].get(f"{key}/onnx")
            rows.append([m["model"], key, f"{t['wall']['p50_ms'] / 1000:.2f}",
                         ", ".join(f"{w:.2f}" for w in t["walls_s"]),
                         _last_hop(t), ratio(r) if r else "1 (baseline)"])
    s = d["settings"]
    intro = (f"Run: {run_line(d)}; {s['samples']} parity samples per hop, {s['repeats']} interleaved rounds per model, "
             f"torch {s['torch_threads']} thread(s).")
    unavailable = "".join(f"\n\n- **{k}: unavailable here** — {v}" for k, v in d.get("unavailable", {}).items())
    return intro + unavailable + "\n\n" + table(["model", "target", "wall s (median)", "rounds (s)", "target hop",
                                                  "vs onnx fp32"], rows)


def export_time_stages() -> str:
    """Median seconds of each pipeline step, per model and target (the pipeline's own progress steps)."""
    d = load("export_time.json")
    cols = [(m["model"], key, t["steps_s"]) for m in d["models"] for key, t in m["targets"].items()]
    stages: list[str] = []
    for _, _, steps in cols:
        stages += [s for s in steps if s not in stages]
    rows = [[st] + [f"{steps[st]:.2f}" if st in steps else "" for _, _, steps in cols] for st in stages]
    return table(["stage"] + [f"{m} {k}" for m, k, _ in cols], rows)


def export_time_summary() -> str:
    """The per-target figures of export_time.json in one sentence (the summary quotes it)."""
    d = load("export_time.json")
    onnx = [m["targets"]["onnx"]["wall"]["p50_ms"] / 1000 for m in d["models"]]
    gate = [t["steps_s"]["equivalence gate (float64)"] for m in d["models"] for t in m["targets"].values()]

    def span(key: str) -> str:
        r = [m["ratios"][f"{key}/onnx"]["ratio"] for m in d["models"] if f"{key}/onnx" in m["ratios"]]
        return f"{min(r):.2f}–{max(r):.2f}×"
    return (f"With {d['settings']['samples']} parity samples the onnx pipeline takes "
            f"{min(onnx):.1f}–{max(onnx):.1f} s "
            f"per model, onnx fp16 {span('onnx-fp16')} that, coreml {span('coreml')} (the coremltools conversion "
            f"dominates); the float64 equivalence gate is the largest fixed stage "
            f"({min(gate):.1f}–{max(gate):.1f} s).")


# ---------------------------------------------------------------------------------------- resolution scaling
def resolution_scaling() -> str:
    """ONNX Runtime p50 per size and model, with the measured best attention order and the rule's verdict: the
    table resolution_scaling.py rendered from its own `sizes` and stored beside them in the JSON."""
    return load("resolution_scaling.json")["markdown"]


# ----------------------------------------------------------------------------------------- rewrite ablation
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


# ---------------------------------------------------------------------------------------------- executorch
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
            f"{mach['cores']} cores, {mach['date']}; ratios are paired bootstrap 95 % intervals. "
            f"Program sizes: {sizes}.\n"
            f"Targets: {met} of {len(d['targets'])} met.")


# -------------------------------------------------------------------------------------------- quantization
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
    return table(["model", "int8 speed-up, 1 thread", "all threads", "ONNX size fp32 / int8"], rows, sep="| ---")


# ----------------------------------------------------------------------------------------------- exporters
def exporters() -> str:
    """Per model: the faster TorchScript graph over the faster dynamo graph (> 1: dynamo faster), and export time."""
    rows = []
    for m in load("exporters.json")["models"]:
        lat = [ratio(c["speedups"]["torchscript-best/dynamo-best"]) for c in m["cells"]]
        t = m["export_time"]
        rows.append([m["model"]] + lat + [f"{t['dynamo']['p50_ms'] / t['torchscript']['p50_ms']:.1f}×"])
    return table(["model", "latency, 1 thread", "all threads", "export time"], rows, sep="| ---")


# ------------------------------------------------------------------------------------------ parity (docs/)
def _noise_ratio_text(r: float) -> str:
    if r < 1:
        return f"{r:.2f}"
    return f"{r:.0f}" if r >= 1000 else f"{r:#.3g}".rstrip(".")


def _set_medians(c: dict) -> dict[str, float]:
    """The median float32 noise of each input set of one parity_noise.json config."""
    by_set: dict[str, list[float]] = {}
    for n, s in zip(c["noise"], c["sets"]):
        by_set.setdefault(s, []).append(n)
    return {s: statistics.median(v) for s, v in by_set.items()}


def _config_allowances(c: dict, rule: NoiseRule) -> np.ndarray:
    """The product's per-sample allowance of one parity_noise.json config, each input set judged as one set."""
    sets, noise = np.asarray(c["sets"]), np.asarray(c["noise"], np.float64)
    allowed = np.empty(len(noise))
    for s in set(c["sets"]):
        allowed[sets == s] = rule.allowance(noise[sets == s])
    return allowed


def parity_sensitivity() -> str:
    """Per config of parity_noise.json: the float32 noise medians, each hop's worst error with its noise ratio
    under the chosen rule (per sample max(floor, K x its noise raised to its set's median)), and the planted
    errors'."""
    d = load("parity_noise.json")
    floor, k = d["chosen"]["floor"], d["chosen"]["k"]
    hops = ("deploy-form", "onnx", "onnx-simplified", "planted x1.01", "planted x1.001")
    rule = NoiseRule(floor, k)
    rows = []
    for c in d["configs"]:
        median = _set_medians(c)
        allowed = _config_allowances(c, rule)
        cells, ratios = [], {}
        for h in hops:
            err = c["candidates"][h]["error"]
            ratios[h] = float(np.max(np.asarray(err, np.float64) / allowed))
            cells.append(f"{max(err):.1e} ({_noise_ratio_text(ratios[h])})")
        caught = next((f for f in ("1.001", "1.01") if ratios[f"planted x{f}"] > 1), "none")
        rows.append([c["label"], f"{median['natural']:.1e} / {median['stress']:.1e}"] + cells + [caught])
    head = ["config", "noise median natural / stress", "deploy-form", "onnx", "onnx-simplified", "× 1.01", "× 1.001",
            "smallest caught"]
    return table(head, rows, sep="| ---")


def _e(x: float) -> str:
    """1.0e-7 rather than 1.0e-07 (and 0 rather than 0.0e+0)."""
    if x == 0:
        return "0"
    return f"{x:.1e}".replace("e-0", "e-").replace("e+0", "e+")


def _sig3(r: float) -> str:
    """Three significant digits, never an exponent: 1.50, 43.1, 431, 17300."""
    s = f"{r:#.3g}"
    return f"{float(s):.0f}" if "e" in s else s.rstrip(".")


def parity_noise_ratios() -> str:
    """parity_criteria.md's study table: each candidate's worst error over its noise (raised to the set median),
    floor-free, per config of parity_noise.json."""
    rows = []
    for c in load("parity_noise.json")["configs"]:
        median = _set_medians(c)
        cells = []
        for h in ("deploy-form", "onnx", "onnx-simplified", "planted x1.01", "planted x1.001"):
            err = c["candidates"][h]["error"]
            cells.append(_sig3(max(e / max(n, median[s]) for e, n, s in zip(err, c["noise"], c["sets"]))))
        rows.append([c["label"], f"{c['max_abs_y']:.2g}" if c["max_abs_y"] < 10 else f"{c['max_abs_y']:.1f}",
                     f"{_e(median['natural'])} / {_e(median['stress'])}"] + cells)
    return table(["config", "max\\|y\\|", "noise median (natural / stress)", "deploy-form", "onnx", "onnx-simplified",
                  "× 1.01", "× 1.001"], rows)


def reference_threads() -> str:
    """The natural-set float32 noise median per thread count, and the worst correct ratio against the 1- and
    2-thread references."""
    rows = []
    for m in load("reference_threads.json")["models"]:
        th = m["threads"]

        def worst(n: str) -> float:
            return max(r for s in th[n].values() for r in s["worst_ratio"].values())
        noise = [f"{th[n]['natural']['noise_median']:.2e}".replace("e-0", "e-") for n in ("1", "2", "4")]
        rows.append([m["model"]] + noise
                    + [f"{worst('1'):.2f} / {worst('2'):.2f}"])
    return table(["model", "1 thread", "2 threads", "4 threads",
                  "worst correct ratio vs the 1-thread / 2-thread reference"], rows)


def compressed_profiles() -> str:
    """Per compressed profile and criterion: the worst correct value | the threshold | the best planted value."""
    def num(x, spec: str) -> str:
        return "-" if x is None else format(x, spec)
    rows = []
    for kind, s in load("compressed_profiles.json")["summary"].items():
        row = [kind]
        for key, spec in (("cosine", ".4f"), ("psnr_db", ".1f"), ("top1_agreement", ".3f"), ("accuracy_drop", ".2g")):
            c = s[key]
            row.append(f"{num(c['worst_correct'], spec)} \\| {c['threshold']:g} \\| {num(c['best_planted'], spec)}")
        rows.append(row)
    return table(["profile", "cosine", "PSNR dB", "top-1 agreement", "accuracy drop"], rows)


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


def all_models_summary() -> str:
    """What benchmarks/results/all_models.json holds, counted from its rows."""
    d = load("all_models.json")
    ms, rule = d["models"], d["settings"]["rule"]
    n = len(ms)
    today = sum(m.get("rule") == rule for m in ms)
    missed = [m["model"] for m in ms if not m["planted"]["x1.01"]["caught"]]
    probe = sum(m.get("measured_in") == "this run" for m in ms)
    worst = [max(m["worst_noise_ratio"].values()) for m in ms]
    return (f"`benchmarks/results/all_models.json` as committed: {n} models, {sum(m['exit_code'] == 0 for m in ms)} "
            f"exit 0, the worst hop at {min(worst):.2f}–{max(worst):.2f} of its allowance on the logits; × 1.01 "
            f"caught in {n - len(missed)} of {n} rows" + (f" (not in {', '.join(missed)})" if missed else "")
            + f", × 1.001 in {sum(m['planted']['x1.001']['caught'] for m in ms)} of {n}; "
            + ("every row measured with the feature probe" if probe == n else
               f"{probe} rows measured with the feature probe, {n - probe} from the earlier run without it")
            + " (`measured_in`); "
            + ("every row" if today == n else f"{today} rows") + f" judged by today's fp32 rule (floor "
            f"{rule['noise_floor']:g}, K {rule['noise_k']:g})" + (f", {n - today} by an earlier one" if today < n else "")
            + " (each row's `rule`).")




def trained_verdicts() -> str:
    """Each trained model's hops on its labelled held-out images (status and worst ratio over the sets) and the
    errors planted in its saved ONNX, from trained_verdicts.json."""
    d = load("trained_verdicts.json")
    hops = [h["hop"] for h in d["models"][0]["hops"]]
    plants = list(d["models"][0]["planted"])
    rows = []
    for m in d["models"]:
        by = {h["hop"]: h for h in m["hops"]}
        cells = []
        for name in hops:
            h = by.get(name)
            worst = max(h["noise_ratio"].values()) if h else None
            cells.append("" if h is None else ("passed" if h["status"] == "passed" else f"**{h['status']}**")
                         + f" {worst:.2f}")
        caught = ", ".join(f"{k} {'caught' if v['caught'] else '**missed**'}" for k, v in m["planted"].items())
        rows.append([m["model"], f"{100 * m['reference_top1_accuracy']:.1f} %"] + cells + [caught])
    head = (["model", "train-form top-1"] + [f"{h} (worst ratio)" for h in hops]
            + [f"planted in the ONNX ({len(plants)})"])
    return table(head, rows, sep="| ---")


def verdict_headline() -> str:
    """The README's verdict figures: the smallest planted error caught per precision (the artifact's worst sample
    error against float64, of the largest logit) and the false-failure estimate, each from its JSON."""
    d = load("parity_noise.json")
    rule = NoiseRule(d["chosen"]["floor"], d["chosen"]["k"])
    fp32 = []
    for c in d["configs"]:
        allowed = _config_allowances(c, rule)
        for f in ("1.001", "1.01"):
            err = np.asarray(c["candidates"][f"planted x{f}"]["error"], np.float64)
            if np.max(err / allowed) > 1:
                fp32.append(float(np.max(err)))
    parts = [f"fp32 {_e(min(fp32))} (`parity_noise.json`)",
             f"fp16 {_e(load('fp16_verdicts.json')['summary']['smallest_caught_error'])} (`fp16_verdicts.json`)"]
    kinds = load("compressed_verdicts.json")["summary"]["kinds"]
    parts.append(", ".join(f"{k} {_e(v['smallest_caught_by_outputs_error'])}" for k, v in kinds.items())
                 + " by the outputs alone, smaller ones by the weights check (`compressed_verdicts.json`)")
    ff = load("false_failures.json")["summary"]
    return (f"Smallest planted error caught, per precision: {'; '.join(parts)}. A correct fp32 export's estimated "
            f"chance of failing at {ff['extrapolated_to']} natural samples: at most {_e(ff['worst_p_fail_at_n'])} "
            f"over the trained models of `false_failures.json` (target {ff['target']:g}: "
            f"{'met' if ff['met'] else '**not met**'}; the estimate's upper bound: at most "
            f"{_e(ff['worst_p_fail_at_n_upper'])}).")


def compressed_verdicts() -> str:
    """Per compressed kind: K, the worst correct ratio to the emulation, planted errors caught (by the outputs
    alone), the x1.1 plants caught and the smallest error the outputs caught, from compressed_verdicts.json."""
    rows = []
    for kind, k in load("compressed_verdicts.json")["summary"]["kinds"].items():
        plants = k["plants"].values()
        caught, of = sum(p["caught"] for p in plants), sum(p["of"] for p in plants)
        small = k["plants"]["x1.1"]
        rows.append([f"`{kind}`", f"{k['k']:g}", f"{k['worst_correct_ratio']:.2f}",
                     f"{caught}/{of} ({sum(p['caught_by_outputs'] for p in plants)})",
                     f"{small['caught']}/{small['of']}", f"{k['smallest_caught_by_outputs_error']:.1e}"])
    head = ["kind", "K", "worst correct ratio", "caught / planted (by the outputs alone)", "× 1.1 caught",
            "smallest error caught by the outputs"]
    return table(head, rows, sep="| ---")


def false_failures() -> str:
    """The false-failure study: per model, the samples, median and largest ratio of its correct fp32 ONNX artifacts,
    the tail's shape and the estimated probability that a correct export fails at the extrapolated size (with its
    upper bound); then that estimate per K of the grid, and the K the product uses."""
    d = load("false_failures.json")
    s = d["summary"]
    parts = []
    for m in d["models"]:
        arts = list(m["artifacts"].values())
        t = max((a["tail"] for a in arts), key=lambda t: t["p_fail_at_n_upper"])
        parts.append(f"{m['model']} ({m['weights']}, {m['samples']} samples): median ratio "
                     f"{max(a['q0.5'] for a in arts):.2f}, largest {max(a['max'] for a in arts):.2f}, "
                     f"{sum(a['above_1'] for a in arts)} above 1, tail shape {t['shape']:.2f} "
                     f"[{t['shape_ci95'][0]:.2f}, {t['shape_ci95'][1]:.2f}], P(fail at {s['extrapolated_to']}) "
                     f"{_e(t['p_fail_at_n'])} (upper bound {_e(t['p_fail_at_n_upper'])})")
    grid = ", ".join(f"K {k}: {_e(p)} ({_e(s['worst_p_fail_by_k_upper'][k])})"
                     for k, p in s["worst_p_fail_by_k"].items())
    verdict = "met" if s["met"] else "**not met**"
    smallest = "none of the grid" if s["smallest_k_meeting"] is None else f"K = {s['smallest_k_meeting']:g}"
    above = s["upper_above_target"]
    return (f"{'; '.join(parts)}. The worst estimate over these models per K of the grid (floor "
            f"{s['rule']['floor']:g}; upper bound in brackets): {grid}; the smallest K whose estimate meets the "
            f"target: {smallest}. At the product's K = {s['rule']['k']:g}, the target, a correct export failing "
            f"fewer than {s['target']:g} of the time at {s['extrapolated_to']} natural samples, is {verdict} by the "
            f"tail fit's estimate (at most {_e(s['worst_p_fail_at_n'])}); its upper bound (the tail's shape at the "
            "top of its 95 % bootstrap interval) is " + (f"above the target for {', '.join(above)} (at most "
                                                          f"{_e(s['worst_p_fail_at_n_upper'])})" if above
                                                          else "below it too")
            + " (`benchmarks/results/false_failures.json`).")


# ----------------------------------------------------------------------- figures inside sentences (fragments)
def _runs(job: dict) -> str:
    return ", ".join(f"{r['wall_s']:.1f}" for r in job["runs"])


def export_main_job() -> str:
    """The README's main job, cold and warm, from export_time.json."""
    d = load("export_time.json")
    cold, warm = d["main_job"], d["main_job_warm"]
    return (f"**the main job takes {cold['wall_median_s']:.1f} s on a first export** (median of {len(cold['runs'])} "
            f"fresh processes with an empty ground-truth cache: {_runs(cold)} s) and **{warm['wall_median_s']:.1f} s "
            f"when re-exporting the same weights** (the cache holds their float64 ground truth: {_runs(warm)} s, "
            f"interleaved with the cold runs)")


def export_allocator() -> str:
    """The cold main job with glibc's default allocator, over the command's own setting."""
    d = load("export_time.json")
    return f"**{ratio(d['allocator_ratio'])}** as long ({d['main_job_default_malloc']['wall_median_s']:.1f} s)"


def export_all_time() -> str:
    """Every registered model's default export, from export_all_time.json."""
    d = load("export_all_time.json")
    ms = sorted(d["models"], key=lambda m: m["wall_s"])
    ok = [m for m in ms if m["exit_code"] == 0 and m["wall_s"] <= d["settings"]["target_s"]]
    rest, slow = ms[:-3], ms[-3:][::-1]
    return (f"**{len(ok)} of {len(ms)} exit 0 within {d['settings']['target_s'] / 60:g} minutes**: "
            f"{rest[0]['wall_s']:.0f}–{rest[-1]['wall_s']:.0f} s for {len(rest)} of them, median "
            f"{statistics.median(m['wall_s'] for m in ms):.0f} s; the slowest are "
            + ", ".join(f"{m['model']} {m['wall_s']:.0f} s" for m in slow))


def matrix_scale() -> str:
    """The 12-cell plan on 1 and 2 local workers, Ray, and a fully cached re-run, from matrix_scale.json."""
    d = load("matrix_scale.json")
    med, r = d["median_s"], d["ratios"]
    return (f"1 local worker {med['local1']:.2f} s, 2 workers {med['local2']:.2f} s ({ratio(r['local1/local2'])}), "
            f"Ray with 2 CPUs {med['ray2']:.2f} s ({ratio(r['ray2/local2'])} of the 2-worker pool's time; Ray's "
            f"start-up, {d['ray_start_s']:.1f} s, not included); **a fully cached re-run of the "
            f"{d['settings']['cells']} cells in a fresh process: {med['cached']:.2f} s**")


def coreml_sizes() -> str:
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


def executorch_ratios() -> str:
    """ET fp32 over ORT fp32 and int8 over fp32, per model, 1 thread / 2 threads, from executorch_speed.json."""
    d = load("executorch_speed.json")

    def per(key: str) -> str:
        return ", ".join(f"{m['model']} " + " / ".join(f"{c['speedups'][key]['ratio']:.2f}×" for c in m["cells"])
                         for m in d["models"])
    return f"{per('et vs ort')}; the int8 `.pte` against its fp32 {per('et.int8 vs et')}"


def fp16_verdicts() -> str:
    """What the fp16 rule caught and passed, from fp16_verdicts.json."""
    s = load("fp16_verdicts.json")["summary"]
    names = {"zero_layer": "a zeroed layer", "sign_flip": "a sign-flipped channel", "x10": "a channel × 10",
             "x2": "× 2", "x0": "× 0", "x1.1": "× 1.1"}
    plants = s["plants"]
    return (f"correct artifacts reach at most {s['worst_correct_ratio']:.2f} × their reference error and "
            f"{s['worst_correct_weights_ratio']:.2f} of the weights check's allowance ("
            + ("none failed" if not s["correct_failed"] else f"{len(s['correct_failed'])} failed") + "); caught: "
            + ", ".join(f"{names.get(k, k)} {v['caught']}/{v['of']}" for k, v in plants.items())
            + " (by the outputs alone: " + ", ".join(str(v["caught_by_outputs"]) for v in plants.values())
            + f"). The smallest error caught was {_e(s['smallest_caught_error'])} of the largest logit")



def compressed_int8() -> str:
    """The int8 profile's worst correct values against its thresholds, from compressed_profiles.json."""
    s = load("compressed_profiles.json")["summary"]["int8"]
    return (f"worst correct int8 artifact cosine {s['cosine']['worst_correct']:.3f} (threshold "
            f"{s['cosine']['threshold']:g}), PSNR {s['psnr_db']['worst_correct']:.1f} dB "
            f"({s['psnr_db']['threshold']:g}), "
            f"top-1 agreement {s['top1_agreement']['worst_correct']:.3f} ({s['top1_agreement']['threshold']:g}); "
            + ("every planted-broken int8 artifact fails" if not s["planted_passed"]
               else f"{len(s['planted_passed'])} planted-broken int8 artifacts pass"))


def deploy_speed_line(name: str) -> str:
    """A deploy-speed run's 1-thread, batch-1 c/a per model (c/d beside it) and its floor, in one sentence."""
    d = load(name)
    parts = []
    for m in d["models"]:
        sp = _cell(m, 1, 1)["speedups"]
        cd = f" (c/d {ratio(sp['c/d'])})" if "c/d" in sp else ""
        parts.append(f"{m['model']} {ratio(sp['c/a'])}{cd}")
    floor = next(t for t in d["targets"] if "below" in t)
    return (f"1 thread, batch 1, c/a: {', '.join(parts)}; floor: {floor['ratios'] - len(floor['below'])}/"
            f"{floor['ratios']} lower bounds ≥ {floor['threshold']:g}")


RENDERERS = {f.__name__: f for f in (
    deploy_speed_headline, deploy_speed_model, deploy_speed_targets, attention_order, export_time_targets,
    export_time_stages, export_time_summary, resolution_scaling, rewrite_ablation, executorch_speed,
    quantization_speed, exporters, parity_sensitivity, all_models_summary, parity_noise_ratios,
    reference_threads, compressed_profiles, quantization_fixtures, export_main_job, export_allocator,
    export_all_time, matrix_scale, coreml_sizes, executorch_ratios, fp16_verdicts, deploy_speed_line,
    trained_verdicts, compressed_int8, false_failures, compressed_verdicts, verdict_headline)}


def render_text(text: str) -> str:
    """`text` with every rendered block replaced by its renderer's output."""
    def one(match: re.Match) -> str:
        name, *args = match.group(1).split()
        if name not in RENDERERS:
            raise RenderError(f"no renderer named {name!r} (known: {', '.join(sorted(RENDERERS))})")
        try:
            body = RENDERERS[name](*args)
        except (KeyError, IndexError, StopIteration, TypeError) as e:
            raise RenderError(f"{match.group(1)}: {type(e).__name__}: {e}") from e
        nl = match.group(2)
        return f"<!-- rendered: {match.group(1)} -->{nl}{body}{nl}<!-- /rendered -->"
    return BLOCK.sub(one, text)


def blocks(text: str) -> list[str]:
    """The marker lines (`NAME ARG ...`) of `text`, in order."""
    return [m.group(1) for m in BLOCK.finditer(text)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a file differs from its render")
    args = ap.parse_args(argv)
    drift = []
    for rel in FILES:
        path = REPO / rel
        text = path.read_text()
        new = render_text(text)
        if new != text:
            drift.append(rel)
            if not args.check:
                path.write_text(new)
    verb = "out of date" if args.check else "re-rendered"
    for rel in drift:
        print(f"{rel}: {verb}")
    return 1 if (drift and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
