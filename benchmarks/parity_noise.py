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

    python benchmarks/parity_noise.py [--quick] [--out FILE] [--from FILE]
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import numpy as np
import torch

import _script
from vitedge.exporter.verdict.criteria import NOISE_FLOOR, NOISE_K, allowances, effective_noise, rows, sample_errors
from vitedge.exporter.verdict.inputs import natural_inputs, parity_inputs
from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, simplify_onnx
from vitedge.exporter.verdict.parity import ground_truth, run_batched
from vitedge.exporter.reparam.forms import build_deploy_form
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
    imgsz = spec.fixed_size(overrides or {}) or spec.default_imgsz
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
        results = [measure(*c) for c in configs]
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
    chosen = next(t for t in table if t["floor"] == NOISE_FLOOR and t["k"] == NOISE_K) \
        if NOISE_FLOOR in FLOORS and NOISE_K in KS else None
    body = {"margin": MARGIN, "chosen": {"floor": NOISE_FLOOR, "k": NOISE_K, "evaluation": chosen},
            "grid": table, "forms": compared, "configs": results}
    if args.source:  # the measurements' own provenance, beside this evaluation's
        body["measured"] = {k: stored.get(k) for k in ("command", "wall_s", "machine")}
        body["measured"]["command"] = stored.get("measured", {}).get("command") or stored.get("command")
    path = _script.write_results(_script.out_path("parity_noise", args), "parity_noise", dict(info), args, body, started)
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
        print(f"chosen floor {NOISE_FLOOR:g}, K {NOISE_K:g}: worst correct ratio {chosen['worst_correct_ratio']:.3f}; "
              f"x1.001 missed in {[r['label'] for r in results if r['label'] not in chosen['caught']['x1.001']]}")
    print(f"results: {path}")


if __name__ == "__main__":
    main()
