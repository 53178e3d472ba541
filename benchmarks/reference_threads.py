"""Why the ladder's float32 reference runs on a fixed thread count (exporter/verdict/parity.py REFERENCE_THREADS).

The float32 train-form's deviation from float64 (each sample's intrinsic noise, which scales the parity allowance)
depends on the reduction order, hence on torch's intra-op thread count. For a few full-size models with the seeded
demo weights, on the default parity set: the noise per set (median, max) with the float32 train-form on 1, 2 and 4
threads, and the worst error / allowance (floor 3e-7, K 8, noise raised to its set median) of correct candidates
against each: the deploy-form (torch float32) and the simplified ONNX on ONNX Runtime (all threads, and 1).
Correctness figures only; timing is irrelevant.

    python benchmarks/reference_threads.py [--quick] [--samples N] [--out FILE]
"""
from __future__ import annotations

import copy
import time

import numpy as np
import torch

import _corpus
import _script
from _tables import load, table
from vitedge.exporter.verdict.criteria import FLOAT32_RULE, NoiseRule, sample_errors
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.verdict.inputs import parity_set
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.verdict.parity import REFERENCE_THREADS, run_batched
from vitedge.models import create_model, get_spec, make_trained_like
from vitedge.targets.onnx.target import OnnxRuntimeRunner

MODELS = ("swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16", "prepbn_pvt_tiny")
THREADS = (1, 2, 4)
BATCH = 8


def _run(model, x: torch.Tensor, dtype=None) -> np.ndarray:
    with torch.no_grad():
        return np.concatenate([model(x[i:i + BATCH] if dtype is None else x[i:i + BATCH].to(dtype)).double().numpy()
                               for i in range(0, len(x), BATCH)])


def measure(name: str, samples: int, overrides: dict | None, imgsz: int | None = None) -> dict:
    spec = get_spec(name)
    model = make_trained_like(create_model(name, **(overrides or {})), seed=0).eval()
    imgsz = imgsz or spec.default_size(overrides)
    ps = parity_set(samples, imgsz, mean=spec.mean, std=spec.std)
    sets = np.asarray(ps.sets)
    torch.set_num_threads(max(THREADS))
    y64 = _run(copy.deepcopy(model).double(), ps.x, torch.float64)
    noise = {}
    for t in THREADS:
        torch.set_num_threads(t)
        noise[t] = sample_errors(y64, _run(model, ps.x))
    torch.set_num_threads(REFERENCE_THREADS)
    deploy, _ = build_deploy_form(model, imgsz)
    graph = simplify_onnx(check_onnx(export_onnx(copy.deepcopy(deploy), imgsz, batch=None)))
    cands = {"deploy-form": sample_errors(y64, _run(deploy, ps.x)),
             "onnx-simplified (ORT all threads)": sample_errors(y64, run_batched(OnnxRuntimeRunner(graph), ps.numpy())),
             "onnx-simplified (ORT 1 thread)": sample_errors(y64, run_batched(OnnxRuntimeRunner(graph, threads=1),
                                                                              ps.numpy()))}
    out = {"model": name, "imgsz": imgsz, "overrides": overrides or {}, "samples": samples, "threads": {}}
    for t, nz in noise.items():
        per = {}
        for s in ps.present():
            m = sets == s
            allow = NoiseRule().allowance(nz[m])
            per[s] = {"noise_median": float(np.median(nz[m])), "noise_max": float(nz[m].max()),
                      "worst_ratio": {c: float((e[m] / allow).max()) for c, e in cands.items()}}
        out["threads"][str(t)] = per
    return out


def main() -> None:
    p = _script.parser("reference_threads", __doc__)
    p.add_argument("--samples", type=int, default=None, help="parity samples per model (default 16; --quick 4)")
    args = p.parse_args()
    samples = args.samples or (4 if args.quick else 16)
    names = MODELS[:1] if args.quick else MODELS
    info = _script.machine()
    _script.banner("reference_threads", info, args.quick)
    started = time.time()
    rows = [measure(n, samples, _corpus.REDUCED.get(n), 64) if args.quick else measure(n, samples, None) for n in names]
    path = _script.write_results(_script.out_path("reference_threads", args), "reference_threads", dict(info), args,
                                 {"reference_threads": REFERENCE_THREADS, "rule": {"floor": FLOAT32_RULE.floor,
                                                                                  "k": FLOAT32_RULE.k},
                            "models": rows}, started)
    print(f"{'model':18s} {'threads':>7s} {'set':8s} {'noise med':>9s} {'noise max':>9s}  worst ratio (deploy | ORT all | ORT 1)")
    for r in rows:
        for t, per in r["threads"].items():
            for s, d in per.items():
                w = list(d["worst_ratio"].values())
                print(f"{r['model']:18s} {t:>7s} {s:8s} {d['noise_median']:9.2e} {d['noise_max']:9.2e}  "
                      + " | ".join(f"{v:.2f}" for v in w))
    print(f"results: {path}")


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


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


TABLES = {"reference_threads": reference_threads}


if __name__ == "__main__":
    main()
