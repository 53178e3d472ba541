"""Each registered model's intrinsic float32 noise with the seeded demo weights, on natural and stress inputs.

For every model at its default size, with `make_trained_like(seed=0)` (the demo weights `vitedge export` uses
without a checkpoint), the train-form runs in float64 and in float32 on the default parity set (natural photos and
synthetic stress images interleaved 3:1). Per sample, noise = max|y32 - y64| / max|y64| (exporter/verdict/criteria.py).
Records max|y64| (is the residual stream bounded at full depth?) and the noise per set (median, max), which is
what the noise-aware parity rule scales its allowance by. Timing is irrelevant here.

    python benchmarks/intrinsic_noise.py [--quick] [--models a,b] [--samples N] [--out FILE]
"""
from __future__ import annotations

import time

import numpy as np
import torch

import _corpus
import _graphs
import _script
from vitedge.exporter.verdict.inputs import parity_set
from vitedge.exporter.verdict.parity import ground_truth
from vitedge.models import create_model, get_spec, list_models, make_trained_like

QUICK_MODELS = ("swiftformer_xs", "slab_deit_tiny", "prepbn_deit_tiny", "sima_nano_12_p16")
QUICK_OVERRIDES = {**_corpus.REDUCED, "prepbn_deit_tiny": _corpus.REDUCED["slab_deit_tiny"]}  # golden-fixture sizes
BATCH = 4  # float64 chunk: bounded memory for the big models


def summarize(noise: np.ndarray) -> dict:
    return {"median": float(np.median(noise)), "max": float(noise.max()), "min": float(noise.min()),
            "samples": int(noise.size)}


def measure(name: str, samples: int, overrides: dict | None = None) -> dict:
    spec = get_spec(name)
    model = make_trained_like(create_model(name, **(overrides or {})), seed=0).eval()
    imgsz = spec.default_size(overrides)
    ps = parity_set(samples, imgsz, seed=0, mean=spec.mean, std=spec.std)
    t0 = time.perf_counter()
    truth = ground_truth(model, ps.x, ps.sets, batch=BATCH)
    y64, noise = truth.y64, truth.noise
    out = {"model": name, "family": spec.family, "imgsz": imgsz, "overrides": overrides or {},
           "float32_threads": truth.float32_threads,
           "max_abs_y": float(np.abs(y64).max()), "seconds": round(time.perf_counter() - t0, 1), "sets": {}}
    for s in ps.present():
        idx = ps.indices(s)
        out["sets"][s] = {**summarize(noise[idx]), "max_abs_y": float(np.abs(y64[idx]).max())}
    return out


def model_macs_or_zero(name: str) -> float:
    try:
        return _graphs.gflop(name, get_spec(name).default_imgsz)
    except Exception:
        return 0.0


def main() -> None:
    p = _script.parser("intrinsic_noise", __doc__)
    p.add_argument("--models", default=None, help="comma-separated model names (default: all registered)")
    p.add_argument("--samples", type=int, default=None,
                   help="parity samples per model (default by cost: 12 (9 natural, 3 stress) below 10 GFLOP per "
                        "image, 8 below 40, 4 above; --quick 4)")
    args = p.parse_args()
    torch.set_num_threads(1)  # correctness figures only: one thread keeps a shared machine usable
    names = args.models.split(",") if args.models else (list(QUICK_MODELS) if args.quick else list_models())
    names.sort(key=lambda n: model_macs_or_zero(n))  # small first: a long run's partial JSON covers the most models
    def samples_for(name: str) -> int:  # modest counts for the big models: float64 on CPU is slow
        if args.samples or args.quick:
            return args.samples or 4
        gf = model_macs_or_zero(name)
        return 12 if gf < 10 else 8 if gf < 40 else 4
    info = _script.machine()
    _script.banner("intrinsic_noise", info, args.quick)
    started = time.time()
    rows = []
    path = _script.out_path("intrinsic_noise", args)
    for name in names:
        overrides = QUICK_OVERRIDES.get(name) if args.quick else None
        r = measure(name, samples_for(name), overrides)
        rows.append(r)
        partial = {"samples": "per model (models[].sets[].samples)", "weights": "make_trained_like(seed=0)", "models": rows,
                   "complete": len(rows) == len(names)}
        # written after every model: survives an interrupted run
        _script.write_results(path, "intrinsic_noise", dict(info), args, partial, started)
        nat, st = r["sets"]["natural"], r["sets"].get("stress")
        print(f"{name:20s} max|y| {r['max_abs_y']:9.3g}  natural noise median {nat['median']:.2e} max "
              f"{nat['max']:.2e}" + (f"  stress median {st['median']:.2e} max {st['max']:.2e}" if st else "")
              + f"  ({r['seconds']} s)", flush=True)
    print(f"results: {path}")


if __name__ == "__main__":
    main()
