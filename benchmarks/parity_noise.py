"""The study behind the noise-aware parity rule: intrinsic float32 noise, correct hops' error/noise, planted errors.

For the small (golden-fixture sized) config of every family and a few full-size defaults, with the seeded demo
weights: the train-form runs in float64 (ground truth) and float32 (per-sample intrinsic noise) on natural photos
and synthetic stress images. Then each correct hop -- deploy-form fp32 (torch), ONNX raw and ONNX simplified
(onnxsim), both on ONNX Runtime CPU -- and two planted errors (one output channel of the mid-network
Conv/Gemm/MatMul weight of the simplified ONNX scaled by 1.01 and by 1.001) are measured per sample:

    error_i = max_c |y_ic - y64_ic| / max_c |y64_ic|     (and, for comparison, the relative L2 form)
    noise_i = error_i of the float32 train-form (the rule raises it to its set's median: exporter/verdict/criteria.py)

The summary evaluates candidate (floor, K) pairs of the rule error_i <= max(floor, K * noise_i): the worst
correct-hop ratio (must stay well below 1) and which planted errors are caught, and compares error forms (max-abs,
L2) and noise estimates (own, raised to the set median) by how far the planted errors stand above the correct
hops. `--from FILE` re-evaluates stored measurements without measuring again. docs/parity_criteria.md quotes the
full run. Timing is irrelevant here (correctness numbers only).

    python benchmarks/parity_noise.py [--quick] [--configs A,B] [--out FILE] [--from FILE]

Length: one study (measuring, evaluating, re-evaluating) and the renderers of the README's verdict headline, which
gathers this study's figures with the fp16, compressed and false-failure studies' from their JSON.
"""
from __future__ import annotations

import copy
import json
import shutil
import statistics
import time
from pathlib import Path

import numpy as np
import torch

import _corpus
import _script
from _tables import load, sci, table
from vitedge.exporter.verdict.criteria import FLOAT32_RULE, allowances, effective_noise, rows, sample_errors
from vitedge.exporter.verdict.criteria import NoiseRule
from vitedge.exporter.verdict.inputs import natural_inputs, parity_inputs
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.verdict.parity import ground_truth, run_batched
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.models import create_model, get_spec, make_trained_like
from vitedge.models.reduced import reduced
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.targets.plants import plant_channel_scale

# (label, model, overrides, natural samples, stress samples): small configs of every family, then full size.
SMALL = [
    ("swiftformer", "swiftformer_xs", reduced("swiftformer")),
    ("slab_deit", "slab_deit_tiny", reduced("slab_deit")),
    ("prepbn_deit", "prepbn_deit_tiny", reduced("prepbn_deit")),
    ("slab_swin", "slab_swin_tiny", reduced("slab_swin")),
    ("prepbn_swin", "prepbn_swin_tiny", reduced("prepbn_swin")),
    ("slab_pvt", "slab_pvt_tiny", reduced("slab_pvt")),
    ("prepbn_pvt", "prepbn_pvt_tiny", reduced("prepbn_pvt")),
    ("slab_cswin", "slab_cswin_tiny", reduced("slab_cswin")),
    ("sima", "sima_nano_12_p16", reduced("sima")),
    ("sima_deit", "sima_deit_tiny", reduced("sima_deit")),
]
FULL = ["swiftformer_xs", "slab_deit_tiny", "prepbn_deit_tiny", "sima_nano_12_p16"]
PLANTS = (1.01, 1.001)
FLOORS = (1e-7, 3e-7, 1e-6, 3e-6, 1e-5)
KS = (3.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0)
MARGIN = 2.5  # a correct hop must stay below 1/MARGIN of its allowance
CORRECT = ("deploy-form", "onnx", "onnx-simplified")


def rel_l2(truth: np.ndarray, cand: np.ndarray) -> np.ndarray:
    t, c = rows(truth), rows(cand)
    return np.linalg.norm(c - t, axis=1) / np.maximum(np.linalg.norm(t, axis=1), 1e-300)


def measure(label: str, name: str, overrides: dict | None, n_nat: int, n_stress: int) -> dict:
    spec = get_spec(name)
    model = make_trained_like(create_model(name, **(overrides or {})), seed=0).eval()
    imgsz = spec.default_size(overrides)
    nat, _ = natural_inputs(n_nat, imgsz, 0, spec.mean, spec.std)
    x = torch.cat([nat, parity_inputs(n_stress, imgsz, 0, spec.mean, spec.std)]).numpy()
    sets = ("natural",) * n_nat + ("stress",) * n_stress
    t0 = time.perf_counter()
    truth = ground_truth(model, x, sets, batch=4)
    deploy, _ = build_deploy_form(model, imgsz)
    with torch.no_grad():
        outs = {"deploy-form": np.concatenate([deploy(torch.from_numpy(x[i:i + 4])).numpy()
                                               for i in range(0, len(x), 4)])}
    raw = check_onnx(export_onnx(copy.deepcopy(deploy), imgsz, batch=None))
    simp = simplify_onnx(raw)
    outs["onnx"] = run_batched(OnnxRuntimeRunner(raw, threads=1), x, 8)
    outs["onnx-simplified"] = run_batched(OnnxRuntimeRunner(simp, threads=1), x, 8)
    planted = {}
    for f in PLANTS:
        bad, where = plant_channel_scale(simp, f)
        outs[f"planted x{f}"] = run_batched(OnnxRuntimeRunner(bad, threads=1), x, 8)
        planted[f"planted x{f}"] = {"node": where.node, "op": where.op, "initializer": where.initializer,
                                    "channel": where.channel}
    res = {"label": label, "model": name, "overrides": overrides or {}, "imgsz": imgsz,
           "seconds": round(time.perf_counter() - t0, 1), "max_abs_y": float(np.abs(truth.y64).max()),
           "sets": list(sets), "noise": truth.noise.tolist(), "noise_l2": rel_l2(truth.y64, truth.y32).tolist(),
           "candidates": {}, "planted": planted}
    for k, y in outs.items():
        res["candidates"][k] = {"error": sample_errors(truth.y64, y).tolist(), "error_l2": rel_l2(truth.y64, y).tolist()}
    return res


def noise_of(r: dict, kind: str = "", median: bool = True) -> np.ndarray:
    """Per-sample noise as the rule uses it: raised to the median of its input set (or the sample's own)."""
    nz = np.asarray(r[f"noise{kind}"], dtype=np.float64)
    if not median:
        return nz
    sets = np.asarray(r["sets"])
    out = nz.copy()
    for s in set(r["sets"]):
        out[sets == s] = effective_noise(nz[sets == s])
    return out


def ratios(r: dict, cand: str, floor: float, k: float, kind: str = "", median: bool = True) -> np.ndarray:
    err = np.asarray(r["candidates"][cand][f"error{kind}"])
    return err / allowances(noise_of(r, kind, median), floor, k)


def evaluate(results: list[dict]) -> list[dict]:
    """Per (floor, K) of the rule as implemented: worst correct-hop ratio over all configs and samples, and the
    configs in which each planted error is caught."""
    out = []
    for floor in FLOORS:
        for k in KS:
            worst = max(float(ratios(r, c, floor, k).max()) for r in results for c in CORRECT)
            caught = {f"x{f}": [r["label"] for r in results if ratios(r, f"planted x{f}", floor, k).max() > 1]
                      for f in PLANTS}
            out.append({"floor": floor, "k": k, "worst_correct_ratio": worst, "caught": caught,
                        "ok": worst <= 1 / MARGIN and len(caught["x1.01"]) == len(results)})
    return out


def forms(results: list[dict]) -> dict:
    """Floor-free error/noise ratios per config for each error form and noise estimate: the worst correct hop
    and the planted errors, and the overall discrimination (smallest x1.01 ratio / largest correct ratio)."""
    out = {}
    for kind, kname in (("", "maxabs"), ("_l2", "l2")):
        for median in (False, True):
            per = {r["label"]: {"worst_correct": max(float(ratios(r, c, 0.0, 1.0, kind, median).max())
                                                     for c in CORRECT),
                                **{f"x{f}": float(ratios(r, f"planted x{f}", 0.0, 1.0, kind, median).max())
                                   for f in PLANTS}} for r in results}
            disc = min(v["x1.01"] for v in per.values()) / max(v["worst_correct"] for v in per.values())
            out[f"{kname}/{'median' if median else 'own'}"] = {"configs": per, "discrimination": disc}
    return out


def main() -> None:
    p = _script.parser("parity_noise", __doc__)
    p.add_argument("--configs", default=None, help="comma-separated config labels to measure now (default: all)")
    p.add_argument("--from", dest="source", type=Path, default=None,
                   help="re-evaluate the measurements stored in this results file instead of measuring")
    args = p.parse_args()
    started = time.time()
    if args.source:
        stored = json.loads(args.source.read_text())
        info, results = stored["machine"], stored["configs"]
        args.quick = stored["quick"]
        print(f"re-evaluating {len(results)} stored configs from {args.source}")
    else:
        info = _script.machine()
        _script.banner("parity_noise", info, args.quick)
        configs = [(lab, n, o, 6, 6) if args.quick else (lab, n, o, 18, 6) for lab, n, o in SMALL]
        if args.quick:
            configs = configs[:2]
        else:
            configs += [(f"{n} (full)", n, None, 8, 6) for n in FULL]
        # each config's row kept as it is measured (a stopped run resumes; `--configs` measures a subset now)
        results, missing = _corpus.measured_per_model({c[0]: (lambda c=c: [measure(*c)]) for c in configs},
                                                      _script.out_path("parity_noise", args).with_suffix(".partial"),
                                                      args.configs)
        if missing:
            print(f"not measured yet: {', '.join(missing)} (--configs)", flush=True)
    for r in results:
        sets = np.asarray(r["sets"])
        line = [f"{r['label']:24s} max|y| {r['max_abs_y']:7.3g}"]
        for s in ("natural", "stress"):
            nz = np.asarray(r["noise"])[sets == s]
            line.append(f"{s} noise med {np.median(nz):.1e} max {nz.max():.1e}")
        for c in CORRECT + tuple(f"planted x{f}" for f in PLANTS):
            line.append(f"{c} {ratios(r, c, 0.0, 1.0).max():.3g}")
        print("  ".join(line) + f"  ({r['seconds']} s)", flush=True)
    table = evaluate(results)
    compared = forms(results)
    chosen = next(t for t in table if t["floor"] == FLOAT32_RULE.floor and t["k"] == FLOAT32_RULE.k) \
        if FLOAT32_RULE.floor in FLOORS and FLOAT32_RULE.k in KS else None
    body = {"margin": MARGIN, "chosen": {"floor": FLOAT32_RULE.floor, "k": FLOAT32_RULE.k, "evaluation": chosen},
            "grid": table, "forms": compared, "configs": results, "not_measured": [] if args.source else missing}
    if args.source:  # the measurements' own provenance, beside this evaluation's
        body["measured"] = {k: stored.get(k) for k in ("command", "wall_s", "machine")}
        body["measured"]["command"] = stored.get("measured", {}).get("command") or stored.get("command")
    path = _script.write_results(_script.out_path("parity_noise", args), "parity_noise",
                                 dict(info), args, body, started)
    if not args.source and not missing:  # complete: nothing left to resume
        shutil.rmtree(_script.out_path("parity_noise", args).with_suffix(".partial"), ignore_errors=True)
    print("\nerror/noise ratios, floor-free (worst correct hop | planted x1.01 | x1.001) per error form / noise:")
    for name, f in compared.items():
        print(f"  {name:16s} discrimination (min x1.01 / max correct) {f['discrimination']:.2f}")
        for lab, v in f["configs"].items():
            print(f"    {lab:24s} {v['worst_correct']:6.2f} | {v['x1.01']:9.1f} | {v['x1.001']:8.1f}")
    print(f"\n(floor, K) grid of the rule (ok = correct hops <= 1/{MARGIN:g} of the allowance and x1.01 caught in "
          f"all {len(results)} configs):")
    for t in table:
        print(f"  floor {t['floor']:.0e} K {t['k']:5g}: worst correct {t['worst_correct_ratio']:.3f}  x1.01 caught "
              f"{len(t['caught']['x1.01'])}/{len(results)}  x1.001 caught {len(t['caught']['x1.001'])}/{len(results)}"
              f"{'  ok' if t['ok'] else ''}")
    if chosen:
        print(f"chosen floor {FLOAT32_RULE.floor:g}, K {FLOAT32_RULE.k:g}: worst correct ratio {chosen['worst_correct_ratio']:.3f}; "
              f"x1.001 missed in {[r['label'] for r in results if r['label'] not in chosen['caught']['x1.001']]}")
    print(f"results: {path}")


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


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
                     f"{sci(median['natural'])} / {sci(median['stress'])}"] + cells)
    return table(["config", "max\\|y\\|", "noise median (natural / stress)", "deploy-form", "onnx", "onnx-simplified",
                  "× 1.01", "× 1.001"], rows)


def _fp32_plants() -> list[tuple[float, bool, str]]:
    """(worst error, caught, config) of every planted candidate of parity_noise.json under the chosen rule."""
    d = load("parity_noise.json")
    rule = NoiseRule(d["chosen"]["floor"], d["chosen"]["k"])
    out = []
    for c in d["configs"]:
        allowed = _config_allowances(c, rule)
        for f in ("1.01", "1.001"):
            err = np.asarray(c["candidates"][f"planted x{f}"]["error"], np.float64)
            out.append((float(np.max(err)), bool(np.max(err / allowed) > 1), f"{c['label']} × {f}"))
    return out


def _both_ends(plants: list[tuple[float, bool, str]]) -> str:
    """The smallest error caught and the largest missed, each with its config."""
    caught = [p for p in plants if p[1]]
    missed = [p for p in plants if not p[1]]
    low = min(caught) if caught else None
    text = f"smallest caught {sci(low[0])} ({low[2]})" if low else "none caught"
    if missed:
        high = max(missed)
        return f"{text}, largest missed {sci(high[0])} ({high[2]}; {len(missed)} of {len(plants)} missed)"
    return f"{text}, none missed (of {len(plants)})"


PLANT_NAMES = {"zero_layer": "a zeroed layer", "sign_flip": "a sign-flipped channel"}   # else "a channel xF"


def _plant(r: dict) -> str:
    what = PLANT_NAMES.get(r["plant"]) or f"a channel × {r['plant'].removeprefix('x')}"
    return f"{what} at depth {r['position']:g}"


def _fp16_plants() -> list[tuple[float, bool, str]]:
    return [(r["worst_error"], r["caught"], f"{r['model']}/{r['artifact']}, {_plant(r)}")
            for r in load("fp16_verdicts.json")["cases"] if r["plant"] is not None]


def _compressed_cases(kind: str) -> list[dict]:
    return [r for r in load("compressed_verdicts.json")["cases"] if r["kind"] == kind and r["plant"] is not None]


def _compressed_plants(kind: str, by_outputs: bool) -> list[tuple[float, bool, str]]:
    return [(r["worst_error"], r["caught_by_outputs"] if by_outputs else r["caught"], f"{r['model']}, {_plant(r)}")
            for r in _compressed_cases(kind)]


def verdict_headline() -> str:
    """The README's verdict figures, both ends per precision: the smallest planted error caught and the largest
    missed in the sensitivity studies (the artifact's worst sample error against float64, of the largest logit),
    each with its config, and the false-failure estimate, each from its JSON."""
    lines = [f"- fp32 (the noise rule; `parity_noise.json`): {_both_ends(_fp32_plants())}",
             f"- fp16 (`fp16_verdicts.json`): {_both_ends(_fp16_plants())}"]
    for kind in load("compressed_verdicts.json")["summary"]["kinds"]:
        alone = _compressed_plants(kind, by_outputs=True)
        missed = [r for r in _compressed_cases(kind) if not r["caught"]]
        visible = (f" ({sum(bool(r.get('visible')) for r in missed)} of the missed moved the outputs beyond the "
                   "correct artifact's own error)" if missed else "")
        lines.append(f"- {kind} (`compressed_verdicts.json`), by the outputs and the weights check: "
                     f"{_both_ends(_compressed_plants(kind, by_outputs=False))}{visible}; the outputs alone caught "
                     f"{sum(p[1] for p in alone)} of {len(alone)}")
    ff = load("false_failures.json")["summary"]
    return ("Planted errors, per precision: the smallest caught and the largest missed (an error is the artifact's "
            "worst sample error against float64, of the largest logit):\n\n" + "\n".join(lines) + "\n\n"
            f"A correct fp32 export's estimated chance of failing at {ff['extrapolated_to']} natural samples: at "
            f"most {sci(ff['worst_p_fail_at_n'])} over the trained models of `false_failures.json` (target "
            f"{ff['target']:g}: {'met' if ff['met'] else '**not met**'}; the estimate's heuristic upper bound (not a "
            "confidence bound): at most "
            f"{sci(ff['worst_p_fail_at_n_upper'])}). {_first_draws()}{false_failure_samples()}")


def _first_draws() -> str:
    """The models the false-failure study's stopping rule measured again, and their first draws' estimates."""
    rows = load("false_failures_first_draw.json")["models"]
    worst = {r["model"]: max(a["tail"]["p_fail_at_n"] for a in r["artifacts"].values()) for r in rows}
    again = {m["model"]: m["samples"] for m in load("false_failures.json")["models"] if m["model"] in worst}
    n_again, n_first = "/".join(map(str, sorted(set(again.values())))), "/".join(
        map(str, sorted({r["samples"] for r in rows})))
    return (f"{len(rows)} of its models were measured again on {n_again} samples because their {n_first}-sample "
            "bound was above the target (the stopping rule); their first draws' estimates, kept in "
            "`false_failures_first_draw.json`: " + ", ".join(f"{m} {sci(p)}" for m, p in worst.items()) + ". ")


def false_failure_samples() -> str:
    """What the false-failure study's samples are, from false_failures.json's per-model rows: how many images of
    each kind (its "user" set: scikit-learn's digits, then augmented copies; its "natural" set: views of the
    shipped photos), how many of them distinct, on which models."""
    from vitedge.exporter.verdict import trained_reference
    from vitedge.exporter.verdict.images import PHOTOS_DIR

    rows = load("false_failures.json")["models"]
    digits = len(trained_reference.digits(8, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))[1])
    photos = len(list(PHOTOS_DIR.glob("*.jpg")))
    counts = sorted({(r["sets"].get("user", 0), r["sets"].get("natural", 0)) for r in rows})
    per_model = " or ".join(f"{min(u, digits)} original digits, {max(u - digits, 0)} augmented copies and {n} photo "
                            "views" for u, n in counts)
    judged = ", ".join(f"{r['model']} ({r['registry']} at {r['imgsz']} px, {r['weights']}, {r['samples']} samples)"
                       for r in rows)
    return (f"Its samples are not photographs of the world: scikit-learn's {digits} handwritten digits, then "
            f"augmented copies of them (shifted, rotated, rescaled, contrast, pixel noise), and views of the {photos} "
            f"shipped photos: per model {per_model}, judged on digit classifiers: {judged}.")


def fp32_worst_correct() -> str:
    """The largest fraction of its allowance a correct hop reached at the chosen rule (a comment's figure)."""
    return f"{load('parity_noise.json')['chosen']['evaluation']['worst_correct_ratio']:.2f}"


def fp32_plants_caught(factor: str) -> str:
    """How many configs' single-channel plant x`factor` the chosen rule caught, of how many."""
    d = load("parity_noise.json")
    return f"{len(d['chosen']['evaluation']['caught'][f'x{factor}'])} of {len(d['configs'])}"


TABLES = {
    "fp32_worst_correct": fp32_worst_correct,
    "fp32_plants_caught": fp32_plants_caught,
    "parity_sensitivity": parity_sensitivity,
    "parity_noise_ratios": parity_noise_ratios,
    "verdict_headline": verdict_headline,
}


if __name__ == "__main__":
    main()
