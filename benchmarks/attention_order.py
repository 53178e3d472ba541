"""Both attention orders, (Q K^T) V ("qk_first") and Q (K^T V) ("kv_first"), measured across token counts.

For SimA models (a reduced and a real config) at several image sizes, and for the SLA and SimA attention
layers alone over synthetic N, each order is timed on ONNX Runtime (1 thread) and torch (1 thread),
the two orders interleaved per point and backend. Reports the measured crossover N next to the FLOP rule's
(N = head_dim for both rules when N_q = N_k) and how far the rule's choice is from the measured best
(latency of the rule's order / latency of the faster order, per N). SLAB-DeiT and SLAB-Swin at 224 px: the
script prints the rule's choice there and why.

`--sizes`: the real SLAB-DeiT-T, SLAB-PVT-T, SLAB-Swin-T and SimA-Nano at 224, 384, 640x640 and 800x1344 (each
block's order decided on its real token count, `--imgsz`), the chosen orders against the other order in every
SLA / SimA block, interleaved, on ONNX Runtime and on ExecuTorch (XNNPACK), 1 thread; each point is written to
the JSON's `at_sizes` as soon as it is measured (a run cut short keeps what ran). A variant whose (Q K^T)
matrices alone would pass MAX_ATTENTION_GB is not built and says so.

    python benchmarks/attention_order.py [--quick] [--out FILE]
    python benchmarks/attention_order.py --sizes [--models a,b] [--only-sizes 224,640x640]

Length: one question (which order is faster where) asked two ways, over token counts and at the real models'
sizes, sharing the timing, the parity check and one JSON.
"""
from __future__ import annotations

import copy
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

import _corpus
import _graphs
import _script
import _stats
from _tables import intervals, load, ratio, run_line, table
import _timing
from vitedge.exporter.reparam import reparameterize
from vitedge.models import create_model, list_models, make_trained_like
from vitedge.models.layers import SimAAttention, SimplifiedLinearAttention, sima_rule, sla_rule

ORDERS = ("qk_first", "kv_first")
BACKENDS = ("onnxruntime", "torch")
SIMA_MODEL = "sima_nano_12_p16"

# (label, overrides or None for the real config, image sizes): p16, so N = (imgsz / 16)^2.
MODEL_SERIES_FULL = [("reduced", _corpus.REDUCED[SIMA_MODEL], (48, 64, 96, 128, 224, 320, 448)),
                     ("real", None, (64, 96, 128, 160, 224, 320))]
MODEL_SERIES_QUICK = [("reduced", _corpus.REDUCED[SIMA_MODEL], (64, 128))]
# (layer, dim, heads): the widths of slab_deit_tiny's SLA (d = 64) and sima_nano's attention (d = 32).
LAYERS = [("SimplifiedLinearAttention", 192, 3), ("SimAAttention", 128, 4)]
LAYER_N_FULL = (9, 16, 25, 36, 49, 64, 100, 144, 196, 256, 400, 784)  # squares: SLA lays V out on the grid
LAYER_N_QUICK = (16, 196)
FIXED_SIZE = ("slab_deit_tiny", "slab_swin_tiny")
SIZE_MODELS = ("slab_deit_tiny", "slab_pvt_tiny", "slab_swin_tiny", "sima_nano_12_p16")
SIZES = ("224", "384", "640x640", "800x1344")
MAX_ATTENTION_GB = 1.0  # the (Q K^T) matrices of one block, batch 1, float32: past this the variant is not built
SIZE_TIMING = {"min_rounds": 3, "max_s": 4.0, "sessions": 3}  # few rounds: the machine is shared; the CIs say how sure
SESSIONS = 3  # fresh sessions (ORT sessions, torch modules copied, programs loaded anew) per candidate and point


# ---- one point: both orders on both backends, interleaved ---------------------------------------------

def time_fresh(make, x: np.ndarray, labels: tuple[str, ...], sessions: int, rounds: int,
               max_s: float) -> dict[str, list[list[float]]]:
    """`labels`' candidates timed interleaved on `x` in `sessions` epochs, each with candidates made anew by
    `make(epoch)` (label -> run on x), the budget split between them: label -> rounds per session. No precision
    stop (a width of 0 is never reached): each epoch runs its share of `max_s`, as one session's rounds did."""
    def fresh(epoch):
        runs = make(epoch)
        return {k: (lambda f=runs[k]: f(x)) for k in labels}, runs.clear
    return _timing.time_sessions(fresh, [labels[:2]], sessions, rounds, max_s, 0.0)


def ort_maker(graphs: dict[str, object]):
    """label -> ONNX graph: each epoch, new 1-thread sessions created in a seeded random order."""
    def make(epoch):
        return {k: r.run for k, r in _timing.ort_sessions(graphs, threads=1, seed=1000 * epoch).items()}
    return make


def torch_maker(modules: dict[str, nn.Module]):
    """label -> module: each epoch, fresh copies (new memory, as a new session would get)."""
    def make(epoch):
        return {k: _torch_fn(copy.deepcopy(m)) for k, m in modules.items()}
    return make


def measure_point(makers: dict[str, object], x: np.ndarray, rule: str, rounds: int, max_s: float,
                  sessions: int) -> dict:
    """`makers[backend]`: `make(epoch)` -> {order: run}; returns per-backend stats and ratios, each interval a
    bootstrap over the sessions, then their rounds.

    Each backend's two orders are interleaved with each other only: a torch call just before an ONNX
    Runtime call slows that call (caches evicted), which would bias whichever order follows it."""
    out = {}
    for b in BACKENDS:
        per = time_fresh(makers[b], x, ORDERS, sessions, rounds, max_s / len(BACKENDS))
        t = _timing.pooled(per)
        med = {o: float(np.median(t[o])) for o in ORDERS}
        best = min(ORDERS, key=med.get)
        # median(qk) / median(kv): > 1 = kv_first faster
        qk_kv = _stats.speedup_sessions(per["qk_first"], per["kv_first"])
        penalty = ({"ratio": 1.0, "ci": [1.0, 1.0], "pairs": len(t[rule]), "sessions": sessions} if rule == best
                   else _stats.speedup_sessions(per[rule], per[best]))
        out[b] = {"latency": {o: _stats.stats(t[o]) for o in ORDERS}, "qk_over_kv": qk_kv, "best": best,
                  "rule_over_best": penalty}
    return out


def check_orders_agree(makers: dict, x: np.ndarray, reference: np.ndarray) -> list[str]:
    """Both orders compute the same function: every candidate's output against the torch reference."""
    probs = []
    for b, make in makers.items():
        for o, run in make(0).items():
            y = run(x)
            bad = _graphs.parity_problems(reference.reshape(len(reference), -1), y.reshape(len(y), -1))
            if bad:
                probs.append(f"{b}:{o}: {'; '.join(bad)}")
    return probs


# ---- SimA models at several sizes ---------------------------------------------------------------------

def model_series(label: str, overrides: dict | None, sizes, rounds: int, max_s: float, sessions: int) -> dict:
    train = make_trained_like(create_model(SIMA_MODEL, **(overrides or {})), seed=0).eval()
    d = next(m.head_dim for m in train.modules() if isinstance(m, SimAAttention))
    points = []
    for s in sizes:
        n = (s // 16) ** 2
        x = np.random.default_rng(s).standard_normal((1, 3, s, s)).astype(np.float32)
        with torch.no_grad():
            ref = train(torch.from_numpy(x)).numpy()
        deploys = {o: reparameterize(train, s, attn_order=o) for o in ORDERS}
        makers = {"onnxruntime": ort_maker({o: _graphs.onnx_image_model(m, s, 1) for o, m in deploys.items()}),
                  "torch": torch_maker(deploys)}
        # every SimA block sees the same N, so the rule picks one order for the whole model
        (rule,) = set(reparameterize(train, s).reparam_summary.attention_order.values())
        point = {"N": n, "imgsz": s, "rule": rule, "parity_problems": check_orders_agree(makers, x, ref),
                 **measure_point(makers, x, rule, rounds, max_s, sessions)}
        points.append(point)
        _print_point(f"{SIMA_MODEL} {label}", point)
    return _series(f"{SIMA_MODEL} ({label}{'' if overrides is None else ' config'})", "model", d, overrides, points)


def _torch_fn(module: nn.Module):
    module = module.eval()

    @torch.no_grad()
    def run(x: np.ndarray) -> np.ndarray:
        return module(torch.from_numpy(x)).numpy()
    return run


# ---- attention layers over synthetic N ----------------------------------------------------------------

def _layer(kind: str, dim: int, heads: int, n: int) -> nn.Module:
    if kind == "SimplifiedLinearAttention":
        return SimplifiedLinearAttention(dim, heads, num_tokens=n)
    return SimAAttention(dim, num_heads=heads, qkv_bias=True)


def layer_series(kind: str, dim: int, heads: int, ns, rounds: int, max_s: float, sessions: int) -> dict:
    d = dim // heads
    points = []
    for n in ns:
        base = make_trained_like(_layer(kind, dim, heads, n), seed=n).eval()
        rule = sla_rule(n, n, d, d) if kind == "SimplifiedLinearAttention" else sima_rule(n, d)
        x = np.random.default_rng(n).standard_normal((1, n, dim)).astype(np.float32)
        with torch.no_grad():
            ref = base(torch.from_numpy(x)).numpy()
        mods = {}
        for o in ORDERS:
            mods[o] = copy.deepcopy(base)
            mods[o].attn_order = o
        makers = {"onnxruntime": ort_maker({o: _graphs.onnx_token_model(m, torch.from_numpy(x))
                                            for o, m in mods.items()}),
                  "torch": torch_maker(mods)}
        point = {"N": n, "rule": rule, "parity_problems": check_orders_agree(makers, x, ref),
                 **measure_point(makers, x, rule, rounds, max_s, sessions)}
        points.append(point)
        _print_point(kind, point)
    return _series(f"{kind} (dim {dim}, {heads} heads)", "layer", d, None, points)


# ---- crossover and the rule's distance from the best --------------------------------------------------

def crossover(points: list[dict], backend: str) -> dict:
    """Where kv_first becomes faster: the first N from which it stays the faster median (with a log-log
    interpolation of qk/kv = 1 between that N and the previous one), and the first N from which it is
    faster beyond noise (the ratio's CI above 1 at that N and every larger one)."""
    ns = [p["N"] for p in points]
    q = [p[backend]["qk_over_kv"] for p in points]
    best = [p[backend]["best"] for p in points]
    out = {"N": None, "between": None, "flips": [ns[i] for i in range(1, len(ns)) if best[i] != best[i - 1]],
           "ties": [n for n, r in zip(ns, q) if r["ci"][0] <= 1.0 <= r["ci"][1]],
           "qk_significantly_faster_at": [n for n, r in zip(ns, q) if r["ci"][1] < 1.0],
           "kv_significantly_faster_from": next((ns[i] for i in range(len(ns)) if all(r["ci"][0] > 1.0 for r in q[i:])),
                                                None)}
    if all(b == "kv_first" for b in best):
        return {**out, "note": f"kv_first faster at every N measured (from N={ns[0]})"}
    if best[-1] != "kv_first":
        return {**out, "note": f"qk_first still faster at the largest N measured ({ns[-1]})"}
    i = max(j for j in range(len(best)) if best[j] != "kv_first") + 1
    n0, n1, r0, r1 = ns[i - 1], ns[i], q[i - 1]["ratio"], q[i]["ratio"]
    # r0 <= 1 < r1 here (the faster median switched), so the log ratios differ
    est = math.exp(math.log(n0) - math.log(r0) * (math.log(n1) - math.log(n0)) / (math.log(r1) - math.log(r0)))
    return {**out, "N": round(est, 1), "between": [n0, n1],
            "note": f"kv_first faster from N={n1} on (qk_first at N={n0})"}


def _series(name: str, kind: str, d: int | None, overrides: dict | None, points: list[dict]) -> dict:
    out = {"name": name, "kind": kind, "head_dim": d, "rule_crossover_N": d, "overrides": overrides,
           "points": points, "backends": {}}
    for b in BACKENDS:
        pen = max(points, key=lambda p: p[b]["rule_over_best"]["ratio"])
        out["backends"][b] = {
            "crossover": crossover(points, b),
            "max_rule_over_best": {"N": pen["N"], **pen[b]["rule_over_best"]},
            # where the rule's order is slower beyond noise (the CI of rule/best above 1)
            "rule_significantly_slower_at": [{"N": p["N"], **p[b]["rule_over_best"]} for p in points
                                             if p[b]["rule_over_best"]["ci"][0] > 1.0],
            "rule_is_best_at": [p["N"] for p in points if p[b]["best"] == p["rule"]]}
    return out


# ---- SLAB: fixed sizes ----------------------------------------------------------------------------------

def fixed_size_orders(quick: bool) -> list[dict]:
    out = []
    for name in FIXED_SIZE:
        if name not in list_models():
            out.append({"model": name, "missing": f"{name} is not registered yet"})
            continue
        overrides = _corpus.REDUCED[name] if quick else {}
        try:
            # trained-like: its LN->RepBN schedules are finished, as in a released checkpoint
            deploy = reparameterize(make_trained_like(create_model(name, **overrides)).eval(), 224)
        except Exception as e:  # a family still being finished: say so instead of failing the benchmark
            out.append({"model": name, "missing": f"reparameterize failed: {type(e).__name__}: {e}"})
            continue
        s = deploy.reparam_summary
        orders = sorted(set(s.attention_order.values()))
        out.append({"model": name, "config": "reduced" if quick else "real", "imgsz": 224, "orders": orders,
                    "blocks": len(s.attention_order), "reason_example": next(iter(s.attention_reason.values()), None),
                    "note": "fixed to 224 px (positional encodings / window sizes): N is fixed per block, "
                            "so the order never flips"})
    return out


# ---- the chosen orders against the other, real models at large sizes ----------------------------------

def _flipped(train: nn.Module, blocks: dict) -> nn.Module:
    """A copy of `train` whose every SLA / SimA block asks for the order its rule did not choose."""
    other = copy.deepcopy(train)
    mods = dict(other.named_modules())
    for path, b in blocks.items():
        mods[path].attn_order = "kv_first" if b["order"] == "qk_first" else "qk_first"
    return other


def _attention_gb(blocks: dict) -> float:
    """The largest set of (Q K^T) matrices one qk_first block of `blocks` forms (batch 1, float32), GB."""
    return max([b["n"] * b["n_kv"] * b["heads_windows"] * 4 / 1e9 for b in blocks.values()
                if b["order"] == "qk_first"], default=0.0)


def _heads_windows(train: nn.Module, blocks: dict, hw: tuple[int, int]) -> None:
    """Each block's heads x windows (how many N x N' matrices a (Q K^T) order forms), added to its record: SLAB-Swin
    windows tile its stage map (stride 4 * 2^i) padded to window multiples; the other families attend globally."""
    mods = dict(train.named_modules())
    for path, b in blocks.items():
        windows = 1
        if path.startswith("layers."):
            i, ws = int(path.split(".")[1]), math.isqrt(b["n"])
            windows = math.ceil(hw[0] / 4 / 2 ** i / ws) * math.ceil(hw[1] / 4 / 2 ** i / ws)
        b["heads_windows"] = getattr(mods[path], "num_heads", 1) * windows


def _et_artifact(target, deploy: nn.Module, name: str, hw: tuple[int, int], tmp: Path):
    from vitedge.targets.base import LowerSpec

    tmp.mkdir(parents=True, exist_ok=True)
    return target.lower(deploy, LowerSpec(name, hw, 1, "fp32", tmp, None, metadata={"mean": [0.0] * 3}))


def size_point(name: str, size: str, executorch: bool) -> dict:
    """One model at one size: both variants built, checked against each other, timed interleaved."""
    from vitedge.models.input_size import as_hw, canonical
    from vitedge.models.registry import set_input_size

    hw = as_hw(size)
    point = {"model": name, "imgsz": size, "input_size": list(hw)}
    train = make_trained_like(create_model(name)).eval()
    set_input_size(train, canonical(hw))
    chosen = reparameterize(train, canonical(hw))
    blocks = {p: dict(b) for p, b in chosen.reparam_summary.attention_blocks.items()}
    other_train = _flipped(train, blocks)
    other = reparameterize(other_train, canonical(hw), attn_order="auto")  # each block's own (flipped) order
    other_blocks = other.reparam_summary.attention_blocks
    _heads_windows(train, other_blocks, hw)
    point["blocks"] = {p: {k: b[k] for k in ("n", "n_kv", "d", "order")} for p, b in blocks.items()}
    point["orders_chosen"] = sorted({b["order"] for b in blocks.values()})
    gb = _attention_gb(other_blocks)
    point["other_attention_gb"] = round(gb, 3)
    if gb > MAX_ATTENTION_GB:
        point["skipped"] = (f"the other order's (Q K^T) matrices alone are {gb:.1f} GB in one block (past "
                            f"{MAX_ATTENTION_GB:g} GB): not built")
        return point
    x = np.random.default_rng(1).standard_normal((1, 3, *hw)).astype(np.float32)
    with torch.no_grad():
        ref = chosen(torch.from_numpy(x)).numpy()
    makers = {"onnxruntime": ort_maker({label: _graphs.onnx_image_model(deploy, canonical(hw), 1)
                                        for label, deploy in (("chosen", chosen), ("other", other))})}
    if executorch:
        from vitedge.targets import get_target
        from vitedge.targets.executorch.target import set_threads

        set_threads(1)
        target = get_target("executorch")
        tmp = Path(tempfile.mkdtemp(prefix="attn-order-"))
        try:
            arts = {label: _et_artifact(target, deploy, name, hw, tmp / label)
                    for label, deploy in (("chosen", chosen), ("other", other))}
            target.runner(arts["chosen"])  # an unavailable runtime says so here, before any timing
        except Exception as e:  # an unavailable runtime or a lowering failure: said, never timed
            point["executorch"] = {"skipped": f"{type(e).__name__}: {str(e)[:300]}"}
        else:  # each epoch loads both programs anew
            makers["executorch"] = lambda epoch: {k: target.runner(a).run for k, a in arts.items()}
    point["parity_problems"] = check_orders_agree(makers, x, ref)
    for backend, make in makers.items():
        per = time_fresh(make, x, ("chosen", "other"), SIZE_TIMING["sessions"], SIZE_TIMING["min_rounds"],
                         SIZE_TIMING["max_s"])
        t = _timing.pooled(per)
        point[backend] = {"latency": {o: _stats.stats(t[o]) for o in ("chosen", "other")},
                          # median(other) / median(chosen): > 1 = the chosen orders are faster
                          "other_over_chosen": _stats.speedup_sessions(per["other"], per["chosen"])}
    return point


def _print_size_point(p: dict) -> None:
    head = f"  {p['model']:<18} {p['imgsz']:<9} chosen {'/'.join(p['orders_chosen']):<18}"
    if "skipped" in p:
        print(f"{head} {p['skipped']}", flush=True)
        return
    for b in ("onnxruntime", "executorch"):
        if b in p:
            r = p[b]["other_over_chosen"]
            lat = p[b]["latency"]
            print(f"{head} {b:<11} chosen {lat['chosen']['p50_ms']:9.2f} ms  other {lat['other']['p50_ms']:9.2f} ms  "
                  f"other/chosen {_stats.fmt_ratio(r)}", flush=True)
    for prob in p.get("parity_problems", []):
        print(f"  PARITY {p['model']} {p['imgsz']}: {prob}")


def run_sizes(args) -> int:
    """--sizes: every (model, size) point, each merged into the JSON's `at_sizes` as soon as it is measured."""
    path = _script.out_path("attention_order", args)
    started, info = _script.begin("attention_order", False)
    models = args.models.split(",") if args.models else list(SIZE_MODELS)
    sizes = args.only_sizes.split(",") if args.only_sizes else list(SIZES)
    data = json.loads(path.read_text()) if path.exists() else {}
    block = {"settings": {"threads": 1, "batch": 1, **SIZE_TIMING, "max_attention_gb": MAX_ATTENTION_GB,
                          "executorch": not args.no_executorch},
             "machine": info, "points": [p for p in data.get("at_sizes", {}).get("points", [])
                                         if not (p["model"] in models and p["imgsz"] in sizes)]}
    for size in sizes:
        for name in models:
            t0 = time.perf_counter()
            p = size_point(name, size, not args.no_executorch)
            p["wall_s"] = round(time.perf_counter() - t0, 1)
            _print_size_point(p)
            block["points"].append(p)
            block["points"].sort(key=lambda q: (SIZES.index(q["imgsz"]) if q["imgsz"] in SIZES else 99,
                                                q["model"]))
            block["machine"]["load_end"] = _script.load_average()
            data["at_sizes"] = block
            path.write_text(json.dumps(_script._finite(data), indent=1, allow_nan=False) + "\n")
    print(f"\nresults: {path} ({time.time() - started:.0f} s)")
    return 0


# ---- printing -------------------------------------------------------------------------------------------

def _print_point(series: str, p: dict) -> None:
    for b in BACKENDS:
        q = p[b]
        lat = q["latency"]
        print(f"  {series:<28} N={p['N']:<4} {b:<11} qk {lat['qk_first']['p50_ms']:8.3f} ms  "
              f"kv {lat['kv_first']['p50_ms']:8.3f} ms  best {q['best']:<8} rule {p['rule']:<8} "
              f"rule/best {q['rule_over_best']['ratio']:.3f}", flush=True)
    for prob in p["parity_problems"]:
        print(f"  PARITY {series} N={p['N']}: {prob}")


def print_ratios(result: dict) -> None:
    print("\nratios (qk_first / kv_first latency per N; > 1 means kv_first is faster):")
    for s in result["series"]:
        for b in BACKENDS:
            pts = ", ".join(f"N={p['N']}: {p[b]['qk_over_kv']['ratio']:.2f} "
                            f"[{p[b]['qk_over_kv']['ci'][0]:.2f}-{p[b]['qk_over_kv']['ci'][1]:.2f}]"
                            for p in s["points"])
            print(f"  {s['name']} / {b}: {pts}")
    print("\ncrossover and the FLOP rule (rule/best = latency of the rule's order / the faster order's):")
    for s in result["series"]:
        for b in BACKENDS:
            r = s["backends"][b]
            c, pen, sig = r["crossover"], r["max_rule_over_best"], r["rule_significantly_slower_at"]
            where = f"measured N* ~ {c['N']:g} ({c['note']})" if c["N"] else c["note"]
            kv_sig = c["kv_significantly_faster_from"]
            qk_sig = c["qk_significantly_faster_at"]
            print(f"  {s['name']} / {b}: rule flips at N = d = {s['rule_crossover_N']}; {where}; kv_first faster "
                  f"beyond noise {'from N=' + str(kv_sig) if kv_sig else 'not throughout any tail'}, qk_first beyond "
                  f"noise {'at N=' + str(qk_sig) if qk_sig else 'nowhere'}; rule picked the faster median at "
                  f"{len(r['rule_is_best_at'])}/{len(s['points'])} N, worst rule/best {_stats.fmt_ratio(pen)} at "
                  f"N={pen['N']}; rule slower beyond noise "
                  + (", ".join(f"at N={x['N']} ({x['ratio']:.3f}x)" for x in sig) if sig else "nowhere"))
    for f in result["fixed_size"]:
        if "missing" in f:
            print(f"  {f['model']}: not measured: {f['missing']}")
        else:
            print(f"  {f['model']} ({f['config']}) @224: {'/'.join(f['orders'])} in all {f['blocks']} SLA blocks; "
                  f"{f['note']}")


def main(argv=None) -> int:
    ap = _script.parser("attention_order", __doc__)
    ap.add_argument("--sizes", action="store_true", help="the real models at large sizes, chosen order vs the other")
    ap.add_argument("--models", default=None, help=f"with --sizes: comma list (default {','.join(SIZE_MODELS)})")
    ap.add_argument("--only-sizes", default=None, help=f"with --sizes: comma list (default {','.join(SIZES)})")
    ap.add_argument("--no-executorch", action="store_true", help="with --sizes: ONNX Runtime only")
    args = ap.parse_args(argv)
    if args.sizes:
        return run_sizes(args)
    started, info = _script.begin("attention_order", args.quick)  # the same single core as ONNX Runtime's session
    rounds, max_s, sessions = (5, 0.15, 2) if args.quick else (15, 1.5 * SESSIONS, SESSIONS)
    series = []
    if SIMA_MODEL not in list_models():
        print(f"  {SIMA_MODEL} is not registered: SimA model series skipped")
    else:
        for label, overrides, sizes in (MODEL_SERIES_QUICK if args.quick else MODEL_SERIES_FULL):
            series.append(model_series(label, overrides, sizes, rounds, max_s, sessions))
    for kind, dim, heads in LAYERS:
        series.append(layer_series(kind, dim, heads, LAYER_N_QUICK if args.quick else LAYER_N_FULL, rounds, max_s,
                                   sessions))
    result = {"settings": {"threads": 1, "min_rounds": rounds, "max_s_per_point": max_s, "batch": 1,
                           "sessions": sessions, "backends": list(BACKENDS)},
              "series": series, "fixed_size": fixed_size_orders(args.quick)}
    out = _script.out_path("attention_order", args)
    if out.exists() and "at_sizes" in json.loads(out.read_text()):  # --sizes' points: kept (they run apart)
        result["at_sizes"] = json.loads(out.read_text())["at_sizes"]
    path = _script.write_results(out, "attention_order", info, args, result, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    print_ratios(result)  # last, as every benchmark script does
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


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


def attention_order_sizes() -> str:
    """The `--sizes` points of attention_order.json: per model and size, the chosen orders and other/chosen latency
    (with its 95 % CI) on ONNX Runtime and ExecuTorch; a point not measured says why."""
    d = load("attention_order.json").get("at_sizes")
    if not d or not d["points"]:
        return "_Not measured yet (`python benchmarks/attention_order.py --sizes`)._"
    rows, notes = [], []
    for p in d["points"]:
        ns = sorted({(b["n"], b["n_kv"]) for b in p["blocks"].values()})
        tokens = ", ".join(f"{n}" if n == nk else f"{n}/{nk}" for n, nk in ns[:4]) + (" ..." if len(ns) > 4 else "")
        cells = []
        for b in ("onnxruntime", "executorch"):
            cells.append(ratio(p[b]["other_over_chosen"]) if b in p else "not run")
        rows.append([p["model"], p["imgsz"], tokens, "/".join(p["orders_chosen"]), *cells])
        if "skipped" in p:
            notes.append(f"- {p['model']} at {p['imgsz']}: {p['skipped']}.")
        elif "skipped" in p.get("executorch", {}):
            notes.append(f"- {p['model']} at {p['imgsz']}: ExecuTorch not run: {p['executorch']['skipped']}.")
        if p.get("parity_problems"):
            why = "; ".join(p["parity_problems"])
            notes.append(f"- {p['model']} at {p['imgsz']}: the two variants disagree: {why}.")
    s = d["settings"]
    head = (f"Other order / chosen order, median latency (> 1: the chosen orders are faster), batch 1, "
            f"{s['threads']} thread, at least {s['min_rounds']} interleaved rounds per backend; "
            f"N = tokens per SLA / SimA block (N/N' where the keys are fewer); {intervals(s, 'candidate')}.")
    return (head + "\n\n" + table(["model", "size", "N per block", "chosen", "ONNX Runtime", "ExecuTorch"], rows)
            + ("\n\n" + "\n".join(notes) if notes else ""))


def attention_order_run() -> str:
    """How the token-count series were measured, from the JSON: when, where, the load, the rounds and sessions."""
    d = load("attention_order.json")
    m, s = d["machine"], d["settings"]
    return (f"Run: {run_line(d)}, load average (1/5/15 min) {m['load_start']} at start, {m['load_end']} at end, "
            f"{d['wall_s']:.0f} s. Batch {s['batch']}, {s['threads']} thread (ORT and torch), at least "
            f"{s['min_rounds']} rounds per point and session; {intervals(s, 'candidate')}.")


TABLES = {"attention_order": attention_order, "attention_order_sizes": attention_order_sizes,
          "attention_order_run": attention_order_run}


if __name__ == "__main__":
    raise SystemExit(main())
