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

The estimate of P(a correct export fails at 5000 samples): the per-sample exceedance rate p = P(ratio > 1) comes
from an exponential fit to the tail of log(ratio) above its 95th percentile (a generalized Pareto tail of shape 0,
fitted by its mean excess). Assumption stated: the log-ratio's tail is no heavier than exponential. The rule's
ratio is an error over an allowance bounded below (by the floor and the set's median noise), so its tail is
Gaussian-like and the exponential fit over-states it (conservative). Then P(fail at 5000) = 1 - (1 - p) ** 5000.
The empirical count of samples above 1 is printed beside it (it must be 0).

Models: the full-size trained references cached by scripts/train_reference.py (SwiftFormer-XS, SLAB-DeiT: depth 6,
patch 8, 64 px) where cached, the small trained fixtures of tests/fixtures/trained/ (SwiftFormer, SLAB-DeiT), and
SimA-Nano (reduced config, seeded weights: no trained SimA exists; said so in its row).
--quick: the two small trained fixtures on 300 samples.

    python benchmarks/false_failures.py [--quick] [--out FILE]
"""
from __future__ import annotations

import copy
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

import _common as C
import vitedge
from vitedge.exporter.criteria import NOISE_FLOOR, NOISE_K, NoiseRule, sample_errors
from vitedge.exporter.inputs import natural_inputs
from vitedge.exporter.onnx_export import check_onnx, export_onnx, simplify_keeping_fusions
from vitedge.exporter.parity import ROUNDING_ULPS, ground_truth, run_batched
from vitedge.models.registry import get_spec
from vitedge.targets.ort import OnnxRuntimeRunner
from vitedge.tests import trained_fixtures as tf

SAMPLES = 5000          # the figure: a correct export must fail less than once in 1000 at this many samples
PHOTOS = 500            # of them, views of the shipped photos (the rest: digits and their augmented copies)
TAIL_Q = 0.95           # the tail fit uses the ratios above this quantile
TARGET = 1e-3           # the stated rate: P(a correct export fails at SAMPLES samples) below this
FULL = ("swiftformer_xs_digits64", "slab_deit_digits64")
SMALL = ("swiftformer_digits", "slab_deit_digits")


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


def tail_estimate(ratios: np.ndarray, n: int = SAMPLES) -> dict:
    """The per-sample exceedance P(ratio > 1) from an exponential fit to log(ratio) above its TAIL_Q quantile, and
    P(the max over `n` samples > 1) from it (see the module doc for the assumption)."""
    lr = np.log(np.asarray(ratios, np.float64))
    u = float(np.quantile(lr, TAIL_Q))
    excess = lr[lr > u] - u
    beta = float(excess.mean()) if excess.size else 0.0
    p = (1 - TAIL_Q) * (math.exp(u / beta) if beta > 0 and u < 0 else 1.0)
    return {"threshold_ratio": math.exp(u), "tail_scale": beta, "tail_samples": int(excess.size),
            "p_sample": p, "p_fail_at_n": -math.expm1(n * math.log1p(-min(p, 1 - 1e-16))), "n": n}


def ratio_stats(r: np.ndarray) -> dict:
    qs = (0.5, 0.9, 0.99, 0.999)
    return {"samples": int(r.size), **{f"q{q:g}": float(np.quantile(r, q)) for q in qs}, "max": float(r.max()),
            "above_1": int((r > 1).sum()), "tail": tail_estimate(r)}


def models(quick: bool) -> list[tuple[str, str, torch.nn.Module, int, str]]:
    """(name, registry model, train-form, imgsz, weights) for every model this run covers."""
    out = []
    for name in SMALL:
        entry = tf.manifest()["models"][name]
        out.append((name, entry["model"], tf.load_reference(name), entry["imgsz"], "trained (small fixture)"))
    if quick:
        return out
    for name in FULL:
        got = C.cached_trained(name)
        if got is None:
            print(f"{name}: not cached (scripts/train_reference.py --models {name}); skipped", flush=True)
            continue
        out.append((name, "swiftformer_xs" if "swiftformer" in name else "slab_deit_tiny", got[0], got[1],
                    "trained (full size, cached)"))
    torch.manual_seed(0)
    sima = vitedge.create_model("sima_nano_12_p16", img_size=32, **C.REDUCED["sima_nano_12_p16"]).eval()
    out.append(("sima_nano_reduced", "sima_nano_12_p16", sima, 32, "seeded (no trained SimA exists)"))
    return out


def measure(name: str, registry: str, train, imgsz: int, weights: str, n: int, photos: int) -> dict:
    t0 = time.time()
    x, sets = natural_samples(registry, imgsz, n, photos)
    truth = ground_truth(train, x, sets, threads64=torch.get_num_threads())
    deploy = vitedge.reparameterize(copy.deepcopy(train), imgsz=imgsz)
    raw = check_onnx(export_onnx(deploy, imgsz, batch=None))
    simp, _ = simplify_keeping_fusions(raw)
    rule = NoiseRule()
    row = {"model": name, "registry": registry, "imgsz": imgsz, "weights": weights, "samples": len(x),
           "sets": {s: sets.count(s) for s in dict.fromkeys(sets)}, "artifacts": {}}
    for art, graph in (("onnx", raw), ("onnx-simplified", simp)):
        out = run_batched(OnnxRuntimeRunner(graph), x)
        r = np.concatenate([_set_ratios(rule, truth, out, s) for s in truth.present()])
        row["artifacts"][art] = ratio_stats(r)
    row["seconds"] = round(time.time() - t0, 1)
    return row


def _set_ratios(rule: NoiseRule, truth, out: np.ndarray, s: str) -> np.ndarray:
    """Per-sample ratios of one input set, as parity.judge computes them (median-raised over that set)."""
    idx = truth.indices(s)
    return rule.judge_set(sample_errors(truth.y64[idx], out[idx]), truth.noise[idx])[0]


def main(argv=None) -> int:
    ap = C.parser("false_failures", __doc__)
    ap.add_argument("--samples", type=int, default=None,
                    help=f"natural samples per model (default {SAMPLES}; the rate is always extrapolated to {SAMPLES})")
    ap.add_argument("--small-only", action="store_true", help="only the small trained fixtures (a busy machine)")
    args = ap.parse_args(argv)
    started, info = C.begin("false_failures", args.quick, threads=2)
    n = args.samples or (300 if args.quick else SAMPLES)
    photos = max(1, n * PHOTOS // SAMPLES)
    rows = []
    for spec in models(args.quick or args.small_only):
        rows.append(measure(*spec, n=n, photos=photos))
        print(f"{spec[0]}: done in {rows[-1]['seconds']} s", flush=True)
    worst = max(a["tail"]["p_fail_at_n"] for r in rows for a in r["artifacts"].values())
    above = sum(a["above_1"] for r in rows for a in r["artifacts"].values())
    summary = {"rule": {"floor": NOISE_FLOOR, "k": NOISE_K, "rounding_ulps": ROUNDING_ULPS}, "target": TARGET,
               "samples": n, "extrapolated_to": SAMPLES,
               "worst_p_fail_at_n": worst, "above_1": above, "met": bool(worst < TARGET and above == 0)}
    path = C.write_results(C.out_path("false_failures", args), "false_failures", info, args,
                           {"models": rows, "summary": summary}, started)
    print(f"\nresults: {path}")
    print(f"\nper-sample ratio error / allowance of correct fp32 artifacts ({n} natural samples each; "
          f"P(fail at {SAMPLES}) from the tail fit):")
    for r in rows:
        for art, a in r["artifacts"].items():
            print(f"  {r['model']} {art}: median {a['q0.5']:.3f}, q99.9 {a['q0.999']:.3f}, max {a['max']:.3f}, "
                  f"above 1: {a['above_1']}, P(fail at {SAMPLES}) {a['tail']['p_fail_at_n']:.2g}")
    print(f"worst P(a correct export fails at {SAMPLES} samples): {worst:.2g} (target < {TARGET:g}); samples above 1: "
          f"{above}: {'met' if summary['met'] else 'NOT met'}")
    return 0 if summary["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
