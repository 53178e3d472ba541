"""How many parity inputs a verdict needs: the same artifacts judged on the first n inputs of the default set.

The default parity set is prefix-stable (`parity_set(n)` is the first n samples of `parity_set(256)`), so one
measurement on 256 inputs gives every smaller set's verdict exactly: the ground truth, each artifact's outputs and
the rule (`exporter.verdict.parity.judge`, the ladder's own; each set's noise median taken over the prefix, as the
ladder takes it over its set) are restricted to the first n samples. For the small config of every family and the
full-size defaults, seeded demo weights, at the model's default size:

- correct artifacts: the raw and the simplified fp32 ONNX (fp32 rule) and the fp16 ONNX graph (fp16 rule), on
  ONNX Runtime CPU;
- errors planted in the saved graphs: one output channel of the mid-network weight zeroed, sign-flipped, x 1.01
  and x 1.001 in the simplified fp32 graph, and zeroed, sign-flipped and x 1.01 in the fp16 graph.

For each artifact and each n it records the verdict and the worst ratio to the allowance, and, on 256 inputs, how
many samples a plant fails by the per-sample rule (a plant that fails k of 256 samples is missed by a random
n-subset with probability C(256-k, n) / C(256, n)). The summary says, per n, which verdicts differ from the
256-input ones.
Correctness numbers only; the machine's speed does not matter.

    python benchmarks/parity_set_size.py [--quick] [--configs A,B] [--out FILE]
"""
from __future__ import annotations

import copy
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

import _corpus
import _script
import parity_noise  # its configs: the small config of every family and the full-size defaults
from _tables import load, table
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.exporter.verdict.criteria import sample_errors
from vitedge.exporter.verdict.parity import (FLOAT64_TOLERANCES, ground_truth, judge, run_batched, sample_rule,
                                             with_fp16_reference)
from vitedge.exporter.verdict.parity_cost import DEFAULT_SAMPLES
from vitedge.models import create_model, get_spec, make_trained_like
from vitedge.targets.graph.onnx_fp16 import convert_onnx_fp16
from vitedge.targets.graph.precision import default_policy
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.targets.plants import plant_channel_scale, plant_fp16_initializer

FULL = parity_noise.FULL + ["prepbn_pvt_tiny"]
MEASURED = 256                   # the set every verdict below is a prefix of
SIZES = (16, 32, 64, 128, 256)
FP32_PLANTS = {"zero_channel": 0.0, "sign_flip": -1.0, "x1.01": 1.01, "x1.001": 1.001}
FP16_PLANTS = ("x0", "sign_flip", "x1.01")  # targets.plants.change_weight names, on the fp16 graph's initializer
NAMED = ("fp32 zero_channel", "fp32 sign_flip", "fp32 x1.01")  # the errors every verdict must catch, in fp32


def _verdicts(truth, out: np.ndarray, profile: str, sizes) -> dict:
    """Per n: passed, the worst noise ratio over the sets, the worst median ratio (fp16) and `score`: the larger of
    the two as a fraction of its bound (above 1 fails), by the ladder's judge."""
    tol = FLOAT64_TOLERANCES[profile]
    res = {}
    for n in sizes:
        _, sets, problems = judge(truth.head(n), out[:n], tol)
        ratio = max(v["noise_ratio"] for v in sets.values())
        medians = [v["fp16_median_ratio"] for v in sets.values() if v.get("fp16_median_ratio") is not None]
        score = max([ratio] + [m / tol.fp16_median for m in medians])
        res[str(n)] = {"passed": not problems, "ratio": ratio, "score": score,
                       **({"median_ratio": max(medians)} if medians else {})}
    return res


def _failing_samples(truth, out: np.ndarray, profile: str) -> int:
    """How many samples fail the per-sample rule (the ladder's `sample_rule`, each set's noise raised to its median
    over the whole set): those a subset must hold one of to fail on the rule alone."""
    rule, noise, _ = sample_rule(FLOAT64_TOLERANCES[profile], truth)
    errors = sample_errors(truth.y64, out)
    return sum(int(np.sum(rule.judge_set(errors[idx], noise[idx])[0] > 1.0))
               for idx in map(truth.indices, truth.present()))


def measure(label: str, name: str, overrides: dict | None, n: int, sizes) -> dict:
    spec = get_spec(name)
    model = make_trained_like(create_model(name, **(overrides or {})), seed=0).eval()
    imgsz = spec.default_size(overrides)
    pset = parity_inputs_for(model, imgsz, n)
    x = pset.numpy()
    t0 = time.perf_counter()
    truth = ground_truth(model, x, pset.sets, batch=8)
    deploy, _ = build_deploy_form(model, imgsz)
    truth16 = with_fp16_reference(truth, deploy, x)
    raw = check_onnx(export_onnx(copy.deepcopy(deploy), imgsz, batch=None))
    simp = simplify_onnx(raw)
    graphs = {"onnx": ("fp32", raw, False), "onnx-simplified": ("fp32", simp, False)}
    for plant, factor in FP32_PLANTS.items():
        graphs[f"fp32 {plant}"] = ("fp32", plant_channel_scale(simp, factor)[0], True)
    tmp = Path(tempfile.mkdtemp(prefix="vitedge-setsize-"))
    try:
        fp16 = convert_onnx_fp16(simp, default_policy())
        onnx.save(fp16, str(tmp / "fp16.onnx"))  # plant_fp16_initializer plants in a saved graph
        graphs["onnx fp16"] = ("fp16", fp16, False)
        for plant in FP16_PLANTS:
            plant_fp16_initializer(tmp / "fp16.onnx", tmp / f"{plant}.onnx", plant, 0.5)
            graphs[f"fp16 {plant}"] = ("fp16", onnx.load(str(tmp / f"{plant}.onnx")), True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = {}
    for cand, (profile, graph, planted) in graphs.items():
        out = run_batched(OnnxRuntimeRunner(graph, threads=2), x, 8)
        t = truth16 if profile == "fp16" else truth
        rows[cand] = {"profile": profile, "planted": planted, "by_n": _verdicts(t, out, profile, sizes)}
        if planted:
            rows[cand]["failing_samples"] = _failing_samples(t, out, profile)
    return {"label": label, "model": name, "overrides": overrides or {}, "imgsz": imgsz, "samples": n,
            "seconds": round(time.perf_counter() - t0, 1), "artifacts": rows}


def miss_probability(failing: int, total: int, n: int) -> float:
    """Chance that a random n-subset of `total` samples holds none of the `failing` ones (hypergeometric)."""
    if n > total - failing:
        return 0.0
    return math.comb(total - failing, n) / math.comb(total, n)


def summarize(results: list[dict], sizes) -> dict:
    """Per n: the verdicts that differ from the largest set's (all, and those of correct artifacts and of the named
    plants: a zeroed channel, a sign flip, 1 %), the worst correct artifact's and the weakest caught plant's score
    (fraction of the bound that decides), and the plants missed."""
    top = str(max(sizes))
    out = {}
    for n in map(str, sizes):
        def differ(which) -> list[str]:
            return [f"{r['label']}: {c}" for r in results for c, a in r["artifacts"].items()
                    if which(c, a) and a["by_n"][n]["passed"] != a["by_n"][top]["passed"]]
        correct = [a["by_n"][n]["score"] for r in results for a in r["artifacts"].values() if not a["planted"]]
        caught = [a["by_n"][n]["score"] for r in results for a in r["artifacts"].values()
                  if a["planted"] and not a["by_n"][n]["passed"]]
        missed = [f"{r['label']}: {c}" for r in results for c, a in r["artifacts"].items()
                  if a["planted"] and a["by_n"][n]["passed"]]
        every = differ(lambda c, a: True)
        out[n] = {"same_verdicts": not every, "differ": every,
                  "differ_correct": differ(lambda c, a: not a["planted"]),
                  "differ_named": differ(lambda c, a: c in NAMED),
                  "worst_correct_score": max(correct), "weakest_caught_score": min(caught) if caught else None,
                  "plants_missed": missed}
    return out


def main() -> None:
    p = _script.parser("parity_set_size", __doc__)
    p.add_argument("--configs", default=None, help="comma-separated config labels to measure now (default: all)")
    args = p.parse_args()
    started, info = _script.begin("parity_set_size", args.quick, threads=None)
    n = 32 if args.quick else MEASURED
    sizes = tuple(s for s in SIZES if s <= n)
    configs = {c[0]: c for c in (parity_noise.SMALL[:2] if args.quick else parity_noise.SMALL)}
    if not args.quick:
        configs.update({f"{m} (full)": (f"{m} (full)", m, None) for m in FULL})
    partial = _script.out_path("parity_set_size", args).with_suffix(".partial")
    results, missing = _corpus.measured_per_model(
        {k: (lambda c=c: [measure(*c, n, sizes)]) for k, c in configs.items()}, partial, args.configs)
    for r in results:
        line = "  ".join(f"{c} " + "/".join(("fail" if not a["by_n"][str(s)]["passed"] else "pass") for s in sizes)
                         for c, a in r["artifacts"].items())
        print(f"{r['label']:26s} {line}  ({r['seconds']} s)", flush=True)
    summary = summarize(results, sizes) if results else {}
    _script.write_results(_script.out_path("parity_set_size", args), "parity_set_size", dict(info), args,
                          {"measured_samples": n, "sizes": list(sizes), "default_samples": DEFAULT_SAMPLES,
                           "summary": summary, "configs": results, "not_measured": missing}, started)
    if not missing:
        shutil.rmtree(partial, ignore_errors=True)
    print(f"\nverdicts per parity-set size (first n of {n} inputs; {len(results)} configs, every artifact):")
    for s, v in summary.items():
        same = f"same verdicts as n={n}" if v["same_verdicts"] else "DIFFERENT: " + "; ".join(v["differ"])
        weakest = "none caught" if v["weakest_caught_score"] is None else f"{v['weakest_caught_score']:.3g}"
        print(f"  n={s:>3}: {same}; worst correct {v['worst_correct_score']:.3g} of its bound; weakest caught plant "
              f"{weakest}; plants missed {len(v['plants_missed'])}")


# ---- tables: what scripts/render_benchmarks.py writes into docs/ from this script's JSON ----

def parity_set_size() -> str:
    """Per parity-set size: the verdicts that differ from the largest set's, the worst correct artifact and the
    weakest caught plant (each as a fraction of the bound that decides), and the plants missed."""
    d = load("parity_set_size.json")
    plants = sum(a["planted"] for r in d["configs"] for a in r["artifacts"].values())
    artifacts = sum(len(r["artifacts"]) for r in d["configs"])
    rows = []
    for n, v in d["summary"].items():
        rows.append([n + (" (default)" if int(n) == d["default_samples"] else ""),
                     f"{len(v['differ'])} of {artifacts}" + (": " + "; ".join(v["differ"]) if v["differ"] else ""),
                     f"{v['worst_correct_score']:.2f}", f"{v['weakest_caught_score']:.2f}",
                     f"{len(v['plants_missed'])} of {plants}"])
    return table(["inputs (first n)", f"verdicts unlike {d['measured_samples']}'s", "worst correct artifact",
                  "weakest caught plant", "plants missed"], rows)


def parity_set_size_fewest() -> str:
    """The named fp32 plants (zero, sign flip, 1 %) where the measured set catches them: the fewest samples any of
    them fails by the per-sample rule, of the measured set, and in how many of the configs x plants they are caught."""
    d = load("parity_set_size.json")
    top = str(d["measured_samples"])
    named = [r["artifacts"][c] for r in d["configs"] for c in NAMED]
    caught = [a for a in named if not a["by_n"][top]["passed"]]
    return (f"{min(a['failing_samples'] for a in caught)} of {d['measured_samples']} samples "
            f"({len(caught)} of {len(named)} caught)")


def parity_set_size_differ() -> str:
    """The verdicts at the default size unlike the measured set's: each artifact's score at both sizes and how many
    of the measured samples it fails by the per-sample rule."""
    d = load("parity_set_size.json")
    n, top = str(d["default_samples"]), str(d["measured_samples"])
    found = [(r["label"], c, a) for r in d["configs"] for c, a in r["artifacts"].items()
             if a["by_n"][n]["passed"] != a["by_n"][top]["passed"]]
    if not found:
        return "none"
    return "; ".join(f"{label} {c} ({a['by_n'][n]['score']:.3f} of its bound at {n}, {a['by_n'][top]['score']:.3f} at "
                     f"{top}; fails on {a['failing_samples']} of {top} samples by the per-sample rule)"
                     for label, c, a in found)


TABLES = {"parity_set_size": parity_set_size, "parity_set_size_fewest": parity_set_size_fewest,
          "parity_set_size_differ": parity_set_size_differ}


if __name__ == "__main__":
    main()
