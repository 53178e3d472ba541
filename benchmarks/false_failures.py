"""The false-failure rate of the fp32 noise rule: how often a *correct* fp32 artifact fails, at 5000 natural samples.

For correct artifacts the worst-sample ratio error / allowance grows with the number of samples judged, so a rule
that passes 364 images may still fail 5000. Per family, this script runs correct fp32 artifacts (the raw exported
ONNX graph and the simplified one, on ONNX Runtime, as the `onnx` and `onnx-simplified` hops do) on >= 5000
natural samples, judges every sample by the default noise rule (exporter/criteria.py: NoiseRule, the envelope of
the train-form's float32 computations against float64) and records the distribution of the per-sample ratio:
quantiles, max, the count of samples above 1 (a false failure), and a tail fit.

Natural samples, at the model's size: scikit-learn's 1797 digits, then augmented copies (a random shift of up to
1/8 of the image, a rotation of up to 12 degrees, a scale of 0.9-1.1, contrast 0.6-1.2, brightness +-0.1, Gaussian
pixel noise of sigma up to 0.05), judged as one labelled set (`user`, as `--images` would be), and the shipped
photos' views (exporter/inputs.natural_inputs) as the `natural` set.

The estimate of P(a correct export fails at 5000 natural samples): the per-sample exceedance rate p = P(ratio > 1)
comes from a peaks-over-threshold fit: a generalized Pareto distribution fitted (maximum likelihood) to the ratios'
excesses over their 95th percentile. Its shape xi says how heavy the tail is (0: exponential, as a Gaussian-like
error's; > 0: a power law). The estimate is the fit's (maximum likelihood); beside it, a heuristic upper bound (not a
confidence bound: UPPER_METHOD) that takes xi at the upper end of its 95 % bootstrap interval (200 resamples of the
samples), never below 0, and refits the scale at that shape; the uncertainty of the scale and of the threshold is
not in it. P(fail at 5000) = 1 - (1 - p) ** 5000, read at ratio 1, for both. The target is judged on the
estimate; the upper bound is recorded and printed beside it, and the summary says where it is above the target (a
5000-sample tail fit cannot pin the shape down more tightly: measure that model on more, `--samples N --models X`).
The count of samples above 1 must be 0. Every sample's error and effective noise are kept in
~/.cache/vitedge/false_failures/RESULTS/NAME.npz (RESULTS: the results file's name without .json), so `--reevaluate`
recomputes every figure from them (another estimator, another K grid) without measuring again.

The stopping rule (STOPPING_RULE, rendered beside the figures): every model is measured on 5000 samples; a model whose
upper bound at 5000 is at or above the target is measured once more on 20000 samples, `--samples 20000 --models X`,
and its row is that fit. The 20000 samples are not a superset of the 5000: the digits' augmented copies draw each
parameter for all copies in turn from one generator, so after the first parameter the draws differ with the count.
The 5000-sample fits so replaced are kept beside them: `--models X --samples 5000 --out
benchmarks/results/false_failures_first_draw.json`, rendered after the study.

K and the floor are chosen here, not guessed: the estimate is made for each K of a grid (the floor fixed at the
product's, which binds on no sample of these models), and the summary names the smallest K of the grid that meets
the target on every model; the product's K (exporter/verdict/criteria.py) must be one that does. What a larger K
costs in sensitivity is measured by benchmarks/parity_noise.py (planted x1.01 / x1.001 channels over the same grid)
and benchmarks/trained_verdicts.py (planted errors in trained models' saved artifacts, judged by the product).

Models: the small trained fixtures of tests/fixtures/trained/ (SwiftFormer, SLAB-DeiT) and the full-size trained
corpus cached by scripts/train_reference.py (benchmarks/_corpus.TRAINED_FULL: SwiftFormer-XS, SLAB-DeiT-T's default
config, SLAB-DeiT depth 6 / patch 8, SimA-Nano, PRepBN-PVT-Tiny; all at 64 px) where cached.
--quick: the two small trained fixtures on 300 samples.

    python benchmarks/false_failures.py [--quick] [--models A,B] [--samples N] [--corpus photos] [--reevaluate]
                                        [--out FILE]

Length: one study (its two corpora, the tail fit, the measuring and re-evaluating driver) and the two renderers
that read its results files, which share the row statistics and their once-counted artifacts.
"""
from __future__ import annotations

import copy
import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

import _corpus
import _script
from _tables import load, sci
import vitedge
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_keeping_fusions
from vitedge.exporter.verdict.criteria import FLOAT32_RULE, NoiseRule, allowances, sample_errors
from vitedge.exporter.verdict.inputs import natural_inputs
from vitedge.exporter.verdict.parity import ROUNDING_ULPS, ground_truth, run_batched
from vitedge.models.registry import get_spec
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.exporter.verdict import trained_reference as tf

SAMPLES = 5000          # the figure: a correct export must fail less than once in 1000 at this many samples
PHOTOS = 500            # of them, views of the shipped photos (the rest: digits and their augmented copies)
TAIL_Q = 0.95           # the tail fit uses the ratios above this quantile
BOOT = 200              # bootstrap resamples for the tail shape's 95 % interval
TARGET = 1e-3           # the stated rate: P(a correct export fails at SAMPLES samples) below this
KS = (8.0, 10.0, 12.0, 15.0, 20.0)   # the K grid the rate is estimated for (the floor: the product's)
# what `p_fail_at_n_upper` is, written into the JSON's summary and the rendered text
UPPER_METHOD = ("heuristic, not a confidence bound: the tail's shape at the top of its 95 % bootstrap interval "
                f"({BOOT} resamples), the scale refitted at that shape; the scale's and the threshold's uncertainty "
                "are not in it")
STOPPING_RULE = (f"every model is measured on {SAMPLES} samples; one whose upper bound there is at or above the "
                 "target is measured once more on 20000 samples (a fresh draw, not a superset of the first) and its "
                 "row is that fit; the replaced 5000-sample fit is kept beside it (false_failures_first_draw.json)")
SMALL = ("swiftformer_digits", "slab_deit_digits")
# every sample's error and effective noise, per model, in a folder per results file (a --quick run keeps its own)
KEPT = Path.home() / ".cache" / "vitedge" / "false_failures"


def augmented_digits(n: int, imgsz: int, mean, std, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`n` digits at `imgsz` (normalized float32 NCHW) and labels: the 1797 originals, then augmented copies."""
    x, y = tf.digits(imgsz, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0))  # [0, 1] pixels
    plain = min(len(x), (n + 1) // 2)  # every digit once as it is (all 1797 at 5000 samples), then augmented copies
    base = np.linspace(0, len(x) - 1, plain).round().astype(int)
    idx = base[np.arange(n) % plain]
    x, y = torch.from_numpy(x[idx]), y[idx]
    g = torch.Generator().manual_seed(seed)
    aug = torch.arange(n) >= plain
    k = int(aug.sum())
    if k:
        u = lambda lo, hi: lo + (hi - lo) * torch.rand(k, generator=g)  # noqa: E731
        ang, scale = u(-12, 12) * math.pi / 180, u(0.9, 1.1)
        cos, sin = torch.cos(ang) / scale, torch.sin(ang) / scale
        theta = torch.stack([torch.stack([cos, -sin, u(-0.25, 0.25)], 1), torch.stack([sin, cos, u(-0.25, 0.25)], 1)], 1)
        xa = x[aug]
        grid = F.affine_grid(theta, list(xa.shape), align_corners=False)
        xa = F.grid_sample(xa, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        xa = xa * u(0.6, 1.2).view(-1, 1, 1, 1) + u(-0.1, 0.1).view(-1, 1, 1, 1)
        xa = xa + u(0.0, 0.05).view(-1, 1, 1, 1) * torch.randn(xa.shape, generator=g)
        x[aug] = xa.clamp(0, 1)
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)
    return ((x - m) / s).numpy(), y


def natural_samples(model_name: str, imgsz: int, n: int, photos: int) -> tuple[np.ndarray, tuple[str, ...]]:
    spec = get_spec(model_name)
    xd, _ = augmented_digits(n - photos, imgsz, spec.mean, spec.std)
    xp, _ = natural_inputs(photos, imgsz, seed=0, mean=spec.mean, std=spec.std)
    x = np.concatenate([xd, xp.numpy()]).astype(np.float32)
    return np.ascontiguousarray(x), ("user",) * len(xd) + ("natural",) * photos


def photo_corpus(model_name: str, imgsz: int, n: int) -> tuple[np.ndarray, tuple[str, ...], dict]:
    """`n` views of photographs, not digits: scikit-learn's two sample images (china, flower) and the shipped
    photos, cycled; each photo's first view is its eval transform, the later ones random crops, every other one
    flipped (exporter/verdict/inputs.photo_view, as the parity set's natural views). All `natural`."""
    from sklearn.datasets import load_sample_images

    from vitedge.exporter.verdict import images
    from vitedge.exporter.verdict.inputs import photo_view
    from vitedge.models.preprocess import Recipe

    Image, _ = images._pil()
    sk = load_sample_images()
    photos = [Image.fromarray(a) for a in sk.images] + [images.photo(name) for name in images.photo_names()]
    spec = get_spec(model_name)
    recipe = Recipe(spec.mean, spec.std)
    x = np.empty((n, 3, imgsz, imgsz), np.float32)
    for k in range(n):
        x[k] = photo_view(photos[k % len(photos)], k // len(photos), k, imgsz, 0, recipe)[0]
    what = {"distinct_photos": len(photos), "sklearn_sample_images": len(sk.images),
            "shipped_photos": len(photos) - len(sk.images), "views": n,
            "views_per_photo": [n // len(photos), -(-n // len(photos))]}
    return x, ("natural",) * n, what


def tail_estimate(ratios: np.ndarray, n: int = SAMPLES, boot: int = BOOT, seed: int = 0) -> dict:
    """P(the max over `n` samples > 1) from a generalized Pareto fit to the excesses over the TAIL_Q quantile: the
    fit's estimate (`p_fail_at_n`) and an upper bound with the shape at the upper end of its 95 % bootstrap interval
    (`p_fail_at_n_upper`; see the module doc)."""
    from scipy.stats import genpareto

    r = np.asarray(ratios, np.float64)

    def fit(sample):
        u = float(np.quantile(sample, TAIL_Q))
        ex = sample[sample > u] - u
        return u, ex, genpareto.fit(ex, floc=0)

    u, ex, (xi, _, scale) = fit(r)
    rng = np.random.default_rng(seed)
    xis = np.array([fit(r[rng.integers(0, r.size, r.size)])[2][0] for _ in range(boot)])
    xi_hi = max(0.0, float(np.quantile(xis, 0.975)))
    scale_hi = float(genpareto.fit(ex, f0=xi_hi, floc=0)[2])

    def at_one(shape, sc):
        p = (1 - TAIL_Q) * float(genpareto.sf(1.0 - u, shape, 0, sc))
        return p, -math.expm1(n * math.log1p(-min(p, 1 - 1e-16)))

    p, fail = at_one(xi, scale)
    p_hi, fail_hi = at_one(xi_hi, scale_hi)
    return {"threshold_ratio": u, "tail_samples": int(ex.size), "shape": float(xi), "scale": float(scale),
            "shape_ci95": [float(np.quantile(xis, 0.025)), float(np.quantile(xis, 0.975))], "p_sample": p,
            "p_fail_at_n": fail, "shape_upper": xi_hi, "scale_upper": scale_hi, "p_sample_upper": p_hi,
            "p_fail_at_n_upper": fail_hi, "n": n}


def ratio_stats(errors: np.ndarray, eff: np.ndarray, floor: float = FLOAT32_RULE.floor) -> dict:
    """The distribution of error / allowance at the product's rule, and the tail estimate at every K of the grid."""
    r = errors / allowances(eff, floor, FLOAT32_RULE.k)
    qs = (0.5, 0.9, 0.99, 0.999)
    by_k, tails = {}, {}
    for k in KS:
        rk = errors / allowances(eff, floor, k)
        t = tails[k] = tail_estimate(rk)
        by_k[f"{k:g}"] = {"max": float(rk.max()), "above_1": int((rk > 1).sum()), "p_fail_at_n": t["p_fail_at_n"],
                          "p_fail_at_n_upper": t["p_fail_at_n_upper"]}
    return {"samples": int(r.size), **{f"q{q:g}": float(np.quantile(r, q)) for q in qs}, "max": float(r.max()),
            "above_1": int((r > 1).sum()), "floor_bound": int((floor > FLOAT32_RULE.k * eff).sum()),
            "tail": tails.get(FLOAT32_RULE.k) or tail_estimate(r), "by_k": by_k}


def models(quick: bool) -> list[tuple[str, str, Callable[[], torch.nn.Module], int, str]]:
    """(name, registry model, train-form loader, imgsz, weights) for every model this run covers."""
    out = []
    for name in SMALL:
        entry = tf.manifest()["models"][name]
        out.append((name, entry["model"], lambda n=name: tf.load_reference(n), entry["imgsz"],
                    "trained (small fixture)"))
    cached = _corpus.cached_names()
    if quick or not cached:
        return out
    manifest = json.loads((_corpus.TRAINED_CACHE / "manifest.json").read_text())["models"]
    for name in _corpus.TRAINED_FULL:
        if name not in cached:
            print(f"{name}: not cached (scripts/train_reference.py --models {name}); skipped", flush=True)
            continue
        man = manifest[name]
        out.append((name, man["model"], lambda n=name: _corpus.cached_trained(n)[0], man["imgsz"],
                    "trained (full size, cached)"))
    return out


def measure(name: str, registry: str, load, imgsz: int, weights: str, n: int, photos: int, keep: Path,
            corpus: str = "digits") -> dict:
    """One model's row: its correct fp32 ONNX artifacts judged per sample on `corpus` (digits: the digits, their
    augmented copies and photo views; photos: photo views only, photo_corpus); the samples' errors and effective
    noise are kept in `keep`/NAME.npz."""
    t0 = time.time()
    train = load()
    what = None
    if corpus == "photos":
        x, sets, what = photo_corpus(registry, imgsz, n)
    else:
        x, sets = natural_samples(registry, imgsz, n, photos)
    truth = ground_truth(train, x, sets, threads64=torch.get_num_threads())
    deploy = vitedge.reparameterize(copy.deepcopy(train), imgsz=imgsz)
    raw = check_onnx(export_onnx(deploy, imgsz, batch=None))
    simp, _ = simplify_keeping_fusions(raw)
    row = {"model": name, "registry": registry, "imgsz": imgsz, "weights": weights, "samples": len(x),
           "sets": {s: sets.count(s) for s in dict.fromkeys(sets)}, "corpus": corpus, "artifacts": {}}
    if what is not None:
        row["corpus_samples"] = what
    kept = {}
    for art, graph in (("onnx", raw), ("onnx-simplified", simp)):
        out = run_batched(OnnxRuntimeRunner(graph), x)
        errors, eff = [], []
        for s in truth.present():  # each input set judged on its own (median-raised), as parity.judge does
            idx = truth.indices(s)
            errors.append(sample_errors(truth.y64[idx], out[idx]))
            eff.append(NoiseRule().judge_set(errors[-1], truth.noise[idx])[2])
        kept[f"{art}/errors"], kept[f"{art}/eff"] = np.concatenate(errors), np.concatenate(eff)
        row["artifacts"][art] = ratio_stats(kept[f"{art}/errors"], kept[f"{art}/eff"])
    keep.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(keep / f"{name}.npz", **kept)
    row["seconds"] = round(time.time() - t0, 1)
    return row


def reevaluate(row: dict, keep: Path) -> dict:
    """`row` with its statistics recomputed from the samples kept in `keep` (unchanged where none are kept here)."""
    path = keep / f"{row['model']}.npz"
    if not path.is_file():
        return row
    kept = np.load(path)
    for art in row["artifacts"]:
        row["artifacts"][art] = ratio_stats(kept[f"{art}/errors"], kept[f"{art}/eff"])
    return row


def main(argv=None) -> int:
    ap = _script.parser("false_failures", __doc__)
    ap.add_argument("--samples", type=int, default=None,
                    help=f"natural samples per model (default {SAMPLES}; the rate is always extrapolated to {SAMPLES})")
    ap.add_argument("--models", default=None, help="comma-separated subset of the models to measure now (default: all)")
    ap.add_argument("--reevaluate", action="store_true",
                    help="recompute every model's figures from its kept samples (no measuring)")
    ap.add_argument("--corpus", choices=("digits", "photos"), default="digits",
                    help="digits (default: the digits, their augmented copies and photo views) or photos (views of "
                         "scikit-learn's 2 sample images and the 14 shipped photos only; write it to its own --out)")
    args = ap.parse_args(argv)
    started, info = _script.begin("false_failures", args.quick, threads=2)
    n = args.samples or (300 if args.quick else SAMPLES)
    photos = max(1, n * PHOTOS // SAMPLES)
    results = _script.out_path("false_failures", args)
    partial = results.with_suffix(".partial")  # one model's row per file (resumable)
    keep = KEPT / results.stem

    def one(spec):
        row = measure(*spec, n=n, photos=photos, keep=keep, corpus=args.corpus)
        print(f"{spec[0]}: done in {row['seconds']} s", flush=True)
        return [row]

    if args.reevaluate:  # the rows of the results file, recomputed from their kept samples
        stored = json.loads(results.read_text())
        rows, missing = [reevaluate(r, keep) for r in stored["models"]], []
        measured = stored.get("measured") or {k: stored.get(k) for k in ("command", "wall_s", "machine")}
    else:
        measured = None
        rows, missing = _corpus.measured_per_model({m[0]: (lambda m=m: one(m)) for m in models(args.quick)},
                                                   partial, args.models)
        if not args.quick:  # a corpus model not trained here yet is not measured: say so, and keep the partial rows
            missing += [n for n in _corpus.TRAINED_FULL if n not in _corpus.cached_names()]
    arts = [a for r in rows for a in distinct(r["artifacts"])]  # identical raw/simplified counted once
    by_k = {k: max(a["by_k"][k]["p_fail_at_n"] for a in arts) for k in arts[0]["by_k"]}
    by_k_upper = {k: max(a["by_k"][k]["p_fail_at_n_upper"] for a in arts) for k in arts[0]["by_k"]}
    worst = max(a["tail"]["p_fail_at_n"] for a in arts)
    above = sum(a["above_1"] for a in arts)
    upper = {r["model"]: max(a["tail"]["p_fail_at_n_upper"] for a in r["artifacts"].values()) for r in rows}
    summary = {"corpus": args.corpus, "rule": {"floor": FLOAT32_RULE.floor, "k": FLOAT32_RULE.k, "rounding_ulps": ROUNDING_ULPS}, "target": TARGET,
               "samples": min(r["samples"] for r in rows), "extrapolated_to": SAMPLES,
               "worst_p_fail_at_n": worst, "above_1": above, "met": bool(worst < TARGET and above == 0),
               "worst_p_fail_at_n_upper": max(upper.values()), "upper_method": UPPER_METHOD,
               "upper_above_target": sorted(m for m, p in upper.items() if p >= TARGET),
               "worst_p_fail_by_k": by_k, "worst_p_fail_by_k_upper": by_k_upper,
               "smallest_k_meeting": next((float(k) for k, p in by_k.items() if p < TARGET), None),
               "not_measured": missing}
    body = {"models": rows, "summary": summary}
    if args.reevaluate:  # the measurements' own provenance, beside this evaluation's
        body["measured"] = measured
    path = _script.write_results(results, "false_failures", info, args, body, started)
    if not missing:  # complete: nothing left to resume
        shutil.rmtree(partial, ignore_errors=True)
    print(f"\nresults: {path}")
    print(f"\nper-sample ratio error / allowance of correct fp32 artifacts (floor {FLOAT32_RULE.floor:g}, K {FLOAT32_RULE.k:g}; "
          f"P(fail at {SAMPLES}): the tail fit's estimate, its upper bound in brackets):")
    for r in rows:
        for art, a in r["artifacts"].items():
            t = a["tail"]
            print(f"  {r['model']} {art} ({a['samples']} samples): median {a['q0.5']:.3f}, q99.9 {a['q0.999']:.3f}, "
                  f"max {a['max']:.3f}, above 1: {a['above_1']}, tail shape {t['shape']:.2f} "
                  f"[{t['shape_ci95'][0]:.2f}, {t['shape_ci95'][1]:.2f}], P(fail at {SAMPLES}) "
                  f"{t['p_fail_at_n']:.2g} ({t['p_fail_at_n_upper']:.2g})")
    if missing:
        print(f"  not measured yet: {', '.join(missing)} (--models)")
    print(f"worst P(fail at {SAMPLES}) per K: " + ", ".join(f"K {k}: {p:.2g} ({by_k_upper[k]:.2g})"
                                                             for k, p in by_k.items()))
    print(f"worst P(a correct export fails at {SAMPLES} samples) at K {FLOAT32_RULE.k:g}: {worst:.2g} (target < {TARGET:g}); "
          f"samples above 1: {above}: {'met' if summary['met'] else 'NOT met'}; the upper bound is above the target "
          f"for: {', '.join(summary['upper_above_target']) or 'none'}")
    return 0 if summary["met"] else 1


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def distinct(artifacts: dict) -> list[dict]:
    """A row's artifacts' statistics, each counted once: the raw and simplified graphs give identical ones where the
    simplification changed no output."""
    out = []
    for a in artifacts.values():
        if a not in out:
            out.append(a)
    return out


def worst_tail(m: dict) -> dict:
    """A model row's tail fit with the highest upper bound over its once-counted artifacts."""
    return max((a["tail"] for a in distinct(m["artifacts"])), key=lambda t: t["p_fail_at_n_upper"])


def model_row(m: dict, extrapolated_to: int) -> str:
    """One model's row of the study: its samples, median and largest ratio, count above 1, tail shape and estimate."""
    arts = distinct(m["artifacts"])
    t = worst_tail(m)
    same = " (its raw and simplified ONNX identical, counted once)" if len(arts) < len(m["artifacts"]) else ""
    return (f"{m['model']} ({m['weights']}, {m['samples']} samples{same}): median ratio "
            f"{max(a['q0.5'] for a in arts):.2f}, largest {max(a['max'] for a in arts):.2f}, "
            f"{sum(a['above_1'] for a in arts)} above 1, tail shape {t['shape']:.2f} "
            f"[{t['shape_ci95'][0]:.2f}, {t['shape_ci95'][1]:.2f}], P(fail at {extrapolated_to}) "
            f"{sci(t['p_fail_at_n'])} (upper bound {sci(t['p_fail_at_n_upper'])})")


def false_failures() -> str:
    """The false-failure study: per model, the samples, median and largest ratio of its correct fp32 ONNX artifacts,
    the tail's shape and the estimated probability that a correct export fails at the extrapolated size (with its
    upper bound); then that estimate per K of the grid, and the K the product uses."""
    d = load("false_failures.json")
    s = d["summary"]
    parts = [model_row(m, s["extrapolated_to"]) for m in d["models"]]
    grid = ", ".join(f"K {k}: {sci(p)} ({sci(s['worst_p_fail_by_k_upper'][k])})"
                     for k, p in s["worst_p_fail_by_k"].items())
    verdict = "met" if s["met"] else "**not met**"
    smallest = "none of the grid" if s["smallest_k_meeting"] is None else f"K = {s['smallest_k_meeting']:g}"
    above = s["upper_above_target"]
    return (f"{'; '.join(parts)}. Stopping rule: {STOPPING_RULE}. The worst estimate over these models per K of the grid (floor "
            f"{s['rule']['floor']:g}; upper bound in brackets): {grid}; the smallest K whose estimate meets the "
            f"target: {smallest}. At the product's K = {s['rule']['k']:g}, the target, a correct export failing "
            f"fewer than {s['target']:g} of the time at {s['extrapolated_to']} natural samples, is {verdict} by the "
            f"tail fit's estimate (at most {sci(s['worst_p_fail_at_n'])}); its upper bound ("
            + s.get("upper_method", UPPER_METHOD) + ") is " + (f"above the target for {', '.join(above)} (at most "
                                                          f"{sci(s['worst_p_fail_at_n_upper'])})" if above
                                                          else "below it too")
            + " (`benchmarks/results/false_failures.json`).")


def false_failures_first_draw() -> str:
    """The 5000-sample fits that the stopping rule replaced, kept beside the study (false_failures_first_draw.json):
    the same row per model, which of them the rule sent to the larger draw, and whether the larger draw's tail shape
    lies inside the first draw's 95 % interval (the two draws telling the same story, the larger one more tightly)."""
    d, study = load("false_failures_first_draw.json"), load("false_failures.json")
    target, later = study["summary"]["target"], {m["model"]: m for m in study["models"]}
    rows, notes = d["models"], []
    for m in rows:
        first, again = worst_tail(m), later[m["model"]]
        inside = first["shape_ci95"][0] <= worst_tail(again)["shape"] <= first["shape_ci95"][1]
        notes.append(f"{m['model']}: its {again['samples']}-sample shape {worst_tail(again)['shape']:.2f} lies "
                     + ("inside" if inside else "**outside**") + " this draw's interval")
    sent = [m["model"] for m in rows if worst_tail(m)["p_fail_at_n_upper"] >= target]
    return (f"The first draws of the models measured again, kept ({d['machine']['date'][:10]}, "
            f"`benchmarks/results/false_failures_first_draw.json`): "
            + "; ".join(model_row(m, d["summary"]["extrapolated_to"]) for m in rows)
            + f". Upper bound at or above the target {target:g} there, so measured again on more samples: "
            + (", ".join(sent) or "none") + "; the estimate itself above it: "
            + (", ".join(m["model"] for m in rows if worst_tail(m)["p_fail_at_n"] >= target) or "none") + "; "
            + "; ".join(notes) + ".")


def false_failures_photos() -> str:
    """The same study on photographs only (--corpus photos): per model, its samples, median and largest ratio, the
    count above 1 and the tail fit's estimate (false_failures_photos.json)."""
    d = load("false_failures_photos.json")
    s = d["summary"]
    what = d["models"][0]["corpus_samples"]
    parts = []
    for m in d["models"]:
        arts = distinct(m["artifacts"])
        t = worst_tail(m)
        parts.append(f"{m['model']} ({m['samples']} views): median ratio {max(a['q0.5'] for a in arts):.2f}, largest "
                     f"{max(a['max'] for a in arts):.2f}, {sum(a['above_1'] for a in arts)} above 1, "
                     f"P(fail at {s['extrapolated_to']}) {sci(t['p_fail_at_n'])} (heuristic bound "
                     f"{sci(t['p_fail_at_n_upper'])})")
    return (f"On photographs only ({what['distinct_photos']} distinct photos: scikit-learn's "
            f"{what['sklearn_sample_images']} sample images and the {what['shipped_photos']} shipped ones, each as its "
            f"eval view, then random crops, every other flipped; the same digit-trained models, whose task they are "
            f"not): {'; '.join(parts)}. Samples above 1: {s['above_1']}; at K = {s['rule']['k']:g} the estimate "
            f"{'meets' if s['met'] else 'does **not** meet'} the target (worst {sci(s['worst_p_fail_at_n'])}; "
            f"{d['machine']['date'][:10]}, `benchmarks/results/false_failures_photos.json`).")


TABLES = {"false_failures": false_failures, "false_failures_first_draw": false_failures_first_draw,
          "false_failures_photos": false_failures_photos}


if __name__ == "__main__":
    sys.exit(main())
