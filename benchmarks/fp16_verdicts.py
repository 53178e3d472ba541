"""Where the fp16 rule's K comes from, and the smallest error it catches (no timing).

For each model: an fp16 CoreML package (run by vitedge's MIL interpreter, the hop `vitedge export` judges here) and an
fp16 ONNX graph (ONNX Runtime), both written by `vitedge export`, are judged against the train-form in float64 on the
parity set. Each sample's reference error is that of an independent fp16 computation: the deploy-form with weights
and module outputs rounded to float16 (exporter.verdict.parity.fp16_reference), raised to its set's median. The ratio
error / reference error is reported for the correct artifacts (what K must clear) and for errors planted in the saved
artifact: a whole layer zeroed, and one output channel x0, x-1, x1.1, x2, x10, at three depths (weight.bin of the
package, a float16 initializer of the ONNX graph). A plant is caught when the fp16 profile's own judge fails it (the
per-sample rule with K, the median rule, the metric bounds) and "visible" when it moves the outputs by more than 3x the correct artifact's own error on some sample.

Models: the trained reference fixtures (tests/fixtures/trained/, SwiftFormer and SLAB-DeiT trained on scikit-learn's
digits) and small demo configs of SimA and SLAB-Swin; the full run adds SwiftFormer-XS at its full size (224 px, demo
weights) and, where scripts/train_reference.py has cached it, the full SwiftFormer-XS trained on digits (64 px). After
the outputs, each artifact's stored weights are judged against the deploy-form's (exporter/verdict/weight_check.py, as every
fp16 hop is): `caught_by_outputs` says what the outputs alone decided, `weights_ratio` the weights check's worst.

    python benchmarks/fp16_verdicts.py [--quick] [--out FILE]
"""
from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import numpy as np

import _corpus
import _script
import _stats
from _tables import load, sci
import vitedge
from vitedge.exporter.verdict.criteria import effective_noise, sample_errors
from vitedge.precisions import TABLE
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, ground_truth, judge, run_batched, with_fp16_reference
from vitedge.exporter.verdict.weight_check import check_weights
from vitedge.models import make_trained_like
from vitedge.targets.coreml.runners import EmulatedCoreMLRunner
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import PLANT_FACTORS, plant_fp16_initializer, plant_package_weights

POSITIONS = (0.25, 0.5, 0.75)
VISIBLE = 3.0     # a plant is visible when it moves some sample's outputs by > 3x the correct artifact's error


def _models(quick: bool) -> dict:
    def trained(name):
        return lambda: (tf.load_reference(name), tf.manifest()["models"][name]["imgsz"], 64)

    def demo(name, imgsz, samples, **overrides):
        return lambda: (make_trained_like(vitedge.create_model(name, **overrides), seed=0).eval(), imgsz, samples)

    models = {"swiftformer_digits": trained("swiftformer_digits")}
    if quick:
        return models
    models.update({
        "slab_deit_digits": trained("slab_deit_digits"),
        "sima_small": demo("sima_nano_12_p16", 32, 64, depth=2, img_size=32, num_classes=10),
        "slab_swin_small": demo("slab_swin_tiny", 64, 64, depths=[1, 1, 1, 1], img_size=64, window_size=2,
                                num_classes=10),
        "swiftformer_xs_full": demo("swiftformer_xs", 224, 16),
    })
    if _corpus.cached_trained("swiftformer_xs_digits64") is not None:  # full size, trained (scripts/train_reference.py)
        models["swiftformer_xs_digits64"] = lambda: (*_corpus.cached_trained("swiftformer_xs_digits64"), 64)
    return models


def _ratios(truth_y64, out, noise16, sets) -> np.ndarray:
    err = sample_errors(truth_y64, out)
    eff = np.empty_like(noise16)
    sets = np.asarray(sets)
    for s in set(sets.tolist()):
        eff[sets == s] = effective_noise(noise16[sets == s])
    return err / eff


def _caught(truth, out) -> bool:
    """The product's verdict on the outputs: the fp16 profile's judge (per-sample rule, median rule, metric bounds)."""
    return bool(judge(truth, out, FLOAT64_TOLERANCES["fp16"])[2])


def _weights(deploy, path) -> dict:
    """The product's verdict on the stored weights (exporter/verdict/weight_check.py), as every fp16 hop runs it."""
    c = check_weights(deploy, path, "fp16")
    return {"weights": c.status, "weights_ratio": (c.worst or {}).get("ratio")}


def measure(name: str, make, work: Path, quick: bool) -> list[dict]:
    model, imgsz, n = make()
    n = 12 if quick else n
    out = work / name
    vitedge.export(copy.deepcopy(model), targets="onnx,coreml", precision="fp16", imgsz=imgsz, samples=n,
                   out=out / "run", truth_cache=False)
    ps = parity_inputs_for(model, imgsz, n)
    x, sets = ps.numpy(), ps.sets
    deploy = build_deploy_form(copy.deepcopy(model), imgsz)[0]
    truth = with_fp16_reference(ground_truth(model, x, sets), deploy, x)
    noise16 = truth.noise16
    package = next((out / "run").glob("*.mlpackage"))
    graph = next((out / "run").glob("*.fp16.onnx"))
    runners = {"coreml": lambda p: EmulatedCoreMLRunner(p, max_samples=None), "onnx-fp16": OnnxRuntimeRunner}
    planters = {"coreml": (package, plant_package_weights, ".mlpackage"),
                "onnx-fp16": (graph, plant_fp16_initializer, ".fp16.onnx")}
    rows = []
    for kind, (src, plant_fn, suffix) in planters.items():
        with runners[kind](src) as r:
            good = run_batched(r, x)
        good_r = _ratios(truth.y64, good, noise16, sets)
        good_err = sample_errors(truth.y64, good)
        rows.append({"model": name, "artifact": kind, "plant": None, "position": None, "samples": int(len(x)),
                     "worst_ratio": float(good_r.max()), "median_ratio": float(np.median(good_r)),
                     "worst_error": float(good_err.max()), "caught_by_outputs": _caught(truth, good),
                     **_weights(deploy, src)})
        rows[-1]["caught"] = rows[-1]["caught_by_outputs"] or rows[-1]["weights"] != "passed"
        plants = ("zero_layer", "sign_flip", "x10") if quick else tuple(PLANT_FACTORS)
        for pos in ((0.5,) if quick else POSITIONS):
            for plant in plants:
                dst = out / f"{kind}-{plant}-{pos}{suffix}"
                plant_fn(src, dst, plant, pos)
                with runners[kind](dst) as r:
                    bad = run_batched(r, x)
                ratio = _ratios(truth.y64, bad, noise16, sets)
                effect = sample_errors(good, bad) * np.abs(good).max(axis=1) / np.abs(truth.y64).max(axis=1)
                visible = bool(np.any(effect > VISIBLE * np.maximum(good_err, 1e-30)))
                rows.append({"model": name, "artifact": kind, "plant": plant, "position": pos,
                             "samples": int(len(x)), "worst_ratio": float(np.max(ratio)),
                             "median_ratio": float(np.median(ratio)), "worst_error": float(np.max(
                                 sample_errors(truth.y64, bad))),
                             "effect_over_correct_error": float(np.max(effect / np.maximum(good_err, 1e-30))),
                             "visible": visible, "caught_by_outputs": _caught(truth, bad),
                             **_weights(deploy, dst)})
                rows[-1]["caught"] = rows[-1]["caught_by_outputs"] or rows[-1]["weights"] != "passed"
                shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
    return rows


def summary(rows: list[dict]) -> dict:
    correct = [r for r in rows if r["plant"] is None]
    planted = [r for r in rows if r["plant"] is not None]
    by_plant = {}
    for p in dict.fromkeys(r["plant"] for r in planted):
        rs = [r for r in planted if r["plant"] == p]
        by_plant[p] = {**_stats.plant_counts(rs),
                       "smallest_caught_error": min((r["worst_error"] for r in rs if r["caught"]), default=None)}
    return {"k": TABLE['fp16'].profile.rule.k, "median": TABLE['fp16'].profile.rule.median, "worst_correct_ratio": max(r["worst_ratio"] for r in correct),
            "worst_correct_weights_ratio": max(r["weights_ratio"] or 0.0 for r in correct),
            "correct_failed": [f"{r['model']}/{r['artifact']}" for r in correct if r["caught"]],
            "smallest_caught_error": min((r["worst_error"] for r in planted if r["caught"]), default=None),
            "largest_missed_error": max((r["worst_error"] for r in planted if not r["caught"]), default=None),
            "plants": by_plant}


def main(argv=None) -> int:
    ap = _script.parser("fp16_verdicts", __doc__)
    args = ap.parse_args(argv)
    started, info = _script.begin("fp16_verdicts", args.quick)
    work = Path(tempfile.mkdtemp(prefix="vitedge-fp16-"))
    try:
        rows = [r for name, make in _models(args.quick).items() for r in measure(name, make, work, args.quick)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(rows)
    path = _script.write_results(_script.out_path("fp16_verdicts", args), "fp16_verdicts", info, args,
                                 {"settings": {"k": TABLE["fp16"].profile.rule.k,
                                                "median": TABLE["fp16"].profile.rule.median, "positions": POSITIONS,
                                         "visible": VISIBLE},
                            "cases": rows, "summary": summ}, started)
    print(f"\nresults: {path}")
    print(f"\nfp16 rule (K = {TABLE['fp16'].profile.rule.k:g}, median {TABLE['fp16'].profile.rule.median:g}): correct artifacts' worst ratio {summ['worst_correct_ratio']:.2f} "
          f"({len(summ['correct_failed'])} failed); per plant, caught / planted (visible but missed):")
    for p, e in summ["plants"].items():
        print(f"  {p}: {e['caught']}/{e['of']} ({e['visible_missed']})")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def fp16_verdicts() -> str:
    """What the fp16 rule caught and passed, from fp16_verdicts.json."""
    d = load("fp16_verdicts.json")
    s = d["summary"]
    low = min((r for r in d["cases"] if r["plant"] is not None and r["caught"]), key=lambda r: r["worst_error"])
    names = {"zero_layer": "a zeroed layer", "sign_flip": "a sign-flipped channel", "x10": "a channel × 10",
             "x2": "× 2", "x0": "× 0", "x1.1": "× 1.1"}
    plants = s["plants"]
    return (f"correct artifacts reach at most {s['worst_correct_ratio']:.2f} × their reference error and "
            f"{s['worst_correct_weights_ratio']:.2f} of the weights check's allowance ("
            + ("none failed" if not s["correct_failed"] else f"{len(s['correct_failed'])} failed") + "); caught: "
            + ", ".join(f"{names.get(k, k)} {v['caught']}/{v['of']}" for k, v in plants.items())
            + " (by the outputs alone: " + ", ".join(str(v["caught_by_outputs"]) for v in plants.values())
            + f"). The smallest error caught was {sci(s['smallest_caught_error'])} of the largest logit ("
            f"{low['model']}/{low['artifact']}, {names.get(low['plant'], low['plant'])} at depth {low['position']:g})")


def fp16_worst_correct() -> str:
    """The largest ratio of a correct fp16 artifact's worst sample to the fp16 reference's error (a comment's figure)."""
    return f"{load('fp16_verdicts.json')['summary']['worst_correct_ratio']:.2f}"


def fp16_correct_medians() -> str:
    """The range of the correct fp16 artifacts' set medians of that ratio."""
    medians = [r["median_ratio"] for r in load("fp16_verdicts.json")["cases"] if r["plant"] is None]
    return f"{min(medians):.2f}-{max(medians):.2f}"


def fp16_median_caught() -> str:
    """The range of the set medians of the x0 / x2 plants that no sample showed beyond K but the median bound
    caught (the plants the median rule is for)."""
    d = load("fp16_verdicts.json")
    k, bound = d["summary"]["k"], d["summary"]["median"]
    medians = [r["median_ratio"] for r in d["cases"]
               if r["plant"] in ("x0", "x2") and r["worst_ratio"] <= k and r["median_ratio"] > bound]
    return f"{min(medians):.1f}-{max(medians):.1f}"


TABLES = {"fp16_verdicts": fp16_verdicts, "fp16_worst_correct": fp16_worst_correct,
          "fp16_correct_medians": fp16_correct_medians, "fp16_median_caught": fp16_median_caught}


if __name__ == "__main__":
    raise SystemExit(main())
