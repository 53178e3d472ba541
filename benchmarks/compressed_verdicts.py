"""Where the compressed rule's K comes from, and the smallest error it catches (no timing).

For each model and compressed kind, `vitedge export` writes the artifact (int8: the QDQ ONNX graph, run by ONNX Runtime;
w8 / palette4 / palette6 / w8a8: the CoreML package, run by vitedge's MIL interpreter), and the product's own judge
(exporter.quantize.compressed.judge_compressed: the kind's profile, the resolution bounds and the compressed rule) grades it on
the samples `vitedge export` judges it on (the parity set's natural samples that did not calibrate; the emulated
CoreML hop runs the first 16). Each sample's reference error is that of an independent emulation of the kind in torch
(exporter.verdict.emulate.compressed_reference), raised to its set's median. Reported: the ratio error / reference error of
the correct artifacts (what K must clear), and of errors planted in the saved artifact: a whole layer zeroed, and one
output channel x0, x-1, x1.1, x2, x10 at three depths, written into the int8 graph's per-channel weight scales or the
package's scales / lookup table in weight.bin (a palette's lookup table on iOS 16 serves the whole tensor: its
"channel" plants scale the whole layer). A plant is caught when the judge fails it, and "visible" when it moves some
sample's outputs by more than 3x the correct artifact's own error on that sample. After the outputs, the artifact's
stored weights are judged against the deploy-form's per output channel (exporter/verdict/weight_check.py, as every compressed
hop is): each row says what the outputs alone decided (`caught_by_outputs`) and the weights check's worst ratio.

Models: the trained reference fixtures (tests/fixtures/trained/: SwiftFormer and SLAB-DeiT trained on scikit-learn's
digits) and small configs of SimA and SLAB-Swin (demo weights: no task, no decision margins; the profiles' metric
bounds were chosen on trained weights, and a demo-weight artifact that misses them is judged here all the same, its
row saying so); the full run adds the full-size trained corpus where it is cached (SwiftFormer-XS, SLAB-DeiT-T,
SLAB-DeiT depth 6, SimA-Nano, PRepBN-PVT-Tiny trained on digits at 64 px; scripts/train_reference.py, cached in ~/.cache/vitedge/trained).
Each model's rows are kept in FILE.partial/ until every model is measured: `--models A,B` measures only those and
writes the results of every model measured so far; a stopped run resumes there.

    python benchmarks/compressed_verdicts.py [--quick] [--models A,B] [--kinds K1,K2] [--remeasure K1,K2] [--out FILE]
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
from _tables import load, table
import vitedge
from vitedge.exporter.quantize.compressed import JudgedSamples, judge_compressed
from vitedge.exporter.verdict.criteria import effective_noise, sample_errors
from vitedge.precisions import EMULATED, PROFILES, TABLE
from vitedge.exporter.reparam.build_forms import build_deploy_form
from vitedge.exporter.verdict.hops import parity_inputs_for
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, compute_metrics, profile_for, run_batched
from vitedge.exporter.verdict.weight_check import judge_weights
from vitedge.models import make_trained_like
from vitedge.targets.coreml.runners import EmulatedCoreMLRunner
from vitedge.targets.onnx.target import OnnxRuntimeRunner
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import PLANT_FACTORS, plant_int8_scale, plant_package_compression

KINDS = ("int8", "w8", "palette4", "palette6", "w8a8")
QUICK_KINDS, QUICK_PLANTS = ("int8", "w8"), ("zero_layer", "sign_flip", "x1.1")
POSITIONS = (0.25, 0.5, 0.75)
VISIBLE = 3.0
SAMPLES = 64
# the rows' numbers, recorded with the results (keyed as the JSON has always been)
COMPRESSED_K = {n: p.rule.k for n, p in PROFILES.items() if p.rule.reference == EMULATED}
COMPRESSED_MEDIAN = {n: p.rule.median for n, p in PROFILES.items() if p.rule.reference == EMULATED}
WEIGHT_K = {n: p.weight_k for n, p in TABLE.items() if p.weight_k is not None}


def _models(quick: bool) -> dict:
    def trained(name):
        return lambda: (tf.load_reference(name), tf.manifest()["models"][name]["imgsz"])

    def demo(name, imgsz, **overrides):
        return lambda: (make_trained_like(vitedge.create_model(name, **overrides), seed=0).eval(), imgsz)

    models = {"swiftformer_digits": trained("swiftformer_digits")}
    if quick:
        return models
    models.update({
        "slab_deit_digits": trained("slab_deit_digits"),
        "sima_small": demo("sima_nano_12_p16", 32, depth=2, img_size=32, num_classes=10),
        "slab_swin_small": demo("slab_swin_tiny", 64, depths=[1, 1, 1, 1], img_size=64, window_size=2,
                                num_classes=10),
    })
    for name in _corpus.TRAINED_FULL:  # the full-size trained corpus, where it is cached here
        if _corpus.cached_trained(name) is not None:
            models[name] = lambda name=name: _corpus.cached_trained(name)
    return models


def _runner(kind: str, path: Path):
    return OnnxRuntimeRunner(path) if kind == "int8" else EmulatedCoreMLRunner(path)


def _judge(kind: str, path: Path, judged: JudgedSamples, deploy):
    """(the product's verdict on the artifact at `path`: its outputs by the kind's profile and compressed rule, then
    its stored weights, as `vitedge export` judges it; its outputs on the samples judged)."""
    tol = FLOAT64_TOLERANCES[profile_for(kind)]
    with _runner(kind, path) as r:
        hop = judge_compressed(kind, r, judged, tol, kind)
        out = run_batched(r, judged.x[:hop.samples])
    outputs_failed = hop.status == "failed"
    judge_weights(hop, deploy, path, kind)
    hop.outputs_failed = outputs_failed
    return hop, out


def _row(name, kind, plant, pos, where, hop, out, good, truth) -> dict:
    (s, d), = hop.sets.items()
    err = sample_errors(truth.y64, out)
    ref = sample_errors(truth.y64, truth.yq)
    row = {"model": name, "kind": kind, "plant": plant, "position": pos, "weight": where, "samples": hop.samples,
           "set": s, "worst_ratio": float(np.max(err / effective_noise(ref))),
           "median_ratio": d.get("compressed_median_ratio"), "noise_ratio": d["noise_ratio"],
           "worst_error": float(err.max()), "reference_error": float(ref.max()),
           "caught": hop.status == "failed", "caught_by_outputs": hop.outputs_failed,
           "weights_ratio": (hop.weights.get("worst") or {}).get("ratio"), "weights": hop.weights.get("status"),
           "problems": d["problems"]}
    mq = compute_metrics(truth.y64, truth.yq)  # what the kind's own emulation reaches on these samples
    row.update(emulation_cosine=mq.cosine, emulation_psnr_db=mq.psnr_db, metric_bounds=d.get("metric_bounds"))
    if good is not None:
        good_err = sample_errors(truth.y64, good)
        effect = sample_errors(good, out) * np.abs(good).max(axis=1) / np.abs(truth.y64).max(axis=1)
        ratio = effect / np.maximum(good_err, 1e-30)
        row.update(effect_over_correct_error=float(ratio.max()), visible=bool(np.any(ratio > VISIBLE)))
    return row


def measure(name: str, make, work: Path, quick: bool, kinds: tuple | None = None) -> list[dict]:
    model, imgsz = make()
    print(f"\n{name}", flush=True)
    rows = []
    for kind in kinds or (QUICK_KINDS if quick else KINDS):
        out = work / name / kind
        rep = vitedge.export(copy.deepcopy(model), targets="onnx" if kind == "int8" else "coreml", precision=kind,
                             imgsz=imgsz, samples=SAMPLES, out=out, truth_cache=False)
        # a hop that failed leaves its artifact in quarantine/: judged here all the same (the row says it failed)
        src = next((p for d in (out, out / "quarantine") for p in d.glob("*.int8.onnx" if kind == "int8"
                                                                          else "*.mlpackage")), None)
        if src is None:  # nothing was written: the row says why
            hop = rep.parity[-1]
            rows.append({"model": name, "kind": kind, "plant": None, "built": False, "reason": hop.reason})
            print(f"  {kind:<9} not built: {hop.reason}", flush=True)
            continue
        ids = (rep.calibration or {}).get("ids") or ()
        deploy = build_deploy_form(copy.deepcopy(model), imgsz)[0]
        judged = JudgedSamples.build(model, parity_inputs_for(model, imgsz, SAMPLES), ids, deploy=deploy)
        hop, good = _judge(kind, src, judged, deploy)
        truth = judged.with_emulation(judged.truth.head(hop.samples), judged.x[:hop.samples], kind)
        rows.append(_row(name, kind, None, None, None, hop, good, None, truth))
        print(f"  {kind:<9} correct: {hop.status} worst ratio {rows[-1]['worst_ratio']:.3g} median "
              f"{rows[-1]['median_ratio']}, weights {rows[-1]['weights_ratio']:.3g}", flush=True)
        plant_fn, suffix = (plant_int8_scale, ".onnx") if kind == "int8" else (plant_package_compression, ".mlpackage")
        for pos in ((0.5,) if quick else POSITIONS):
            for plant in (QUICK_PLANTS if quick else tuple(PLANT_FACTORS)):
                dst = out / f"planted-{plant}-{pos}{suffix}"
                where = plant_fn(src, dst, plant, pos)
                hop, bad = _judge(kind, dst, judged, deploy)
                rows.append(_row(name, kind, plant, pos, where, hop, bad, good, truth))
                r = rows[-1]
                print(f"  {kind:<9} {plant:<10} @{pos} {where}: {'caught' if r['caught'] else 'passed'} (outputs "
                      f"{'failed' if r['caught_by_outputs'] else 'passed'}, worst ratio {r['worst_ratio']:.3g}; "
                      f"weights {r['weights_ratio']:.3g}), effect {r['effect_over_correct_error']:.3g}x the correct "
                      "error", flush=True)
                shutil.rmtree(dst, ignore_errors=True) if dst.is_dir() else dst.unlink(missing_ok=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """Per kind: the worst ratios of correct artifacts, and per plant how many were caught (by the hop, by its
    outputs alone) among the models whose correct artifact passed (a plant in an artifact that already fails proves
    nothing; those models are listed in `correct_failed`)."""
    out = {"not_built": [f"{r['model']}/{r['kind']}: {r['reason']}" for r in rows if r.get("built") is False]}
    rows = [r for r in rows if r.get("built") is not False]
    correct = [r for r in rows if r["plant"] is None]
    failed = {(r["model"], r["kind"]) for r in correct if r["caught"]}
    planted = [r for r in rows if r["plant"] is not None and (r["model"], r["kind"]) not in failed]
    out.update(correct_failed=[f"{r['model']}/{r['kind']}: {r['problems']}" for r in correct if r["caught"]], kinds={})
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in correct if r["kind"] == kind]
        bad = [r for r in planted if r["kind"] == kind]
        by_plant = {}
        for p in dict.fromkeys(r["plant"] for r in bad):
            rs = [r for r in bad if r["plant"] == p]
            by_plant[p] = {**_stats.plant_counts(rs),
                           "smallest_weights_ratio": min(r["weights_ratio"] or 0.0 for r in rs)}
        out["kinds"][kind] = {
            "k": PROFILES[profile_for(kind)].rule.k, "worst_correct_ratio": max(r["worst_ratio"] for r in mine),
            "worst_correct_median": max((r["median_ratio"] or 0.0) for r in mine),
            "worst_correct_weights_ratio": max((r["weights_ratio"] or 0.0) for r in mine),
            "smallest_caught_error": min((r["worst_error"] for r in bad if r["caught"]), default=None),
            "smallest_caught_by_outputs_error": min((r["worst_error"] for r in bad if r["caught_by_outputs"]),
                                                    default=None),
            "largest_missed_error": max((r["worst_error"] for r in bad if not r["caught"]), default=None),
            "plants": by_plant}
    return out


def _remeasure(partial: Path, models: str | None, kinds: tuple, work: Path, quick: bool) -> None:
    """Measure `kinds` again for the selected models kept in `partial` (after a fix of the judge or the emulation)."""
    import json

    for name, make in _models(quick).items():
        done = partial / f"{name}.json"
        if done.is_file() and (models is None or name in models.split(",")):
            new = measure(name, make, work, quick, kinds)
            rows = [r for r in json.loads(done.read_text()) if r["kind"] not in kinds] + new
            done.write_text(json.dumps(sorted(rows, key=lambda r: KINDS.index(r["kind"]))))


def main(argv=None) -> int:
    ap = _script.parser("compressed_verdicts", __doc__)
    ap.add_argument("--models", default=None, help="comma-separated subset of the models (default: all)")
    ap.add_argument("--remeasure", default=None, help="comma-separated kinds: measure them again for the --models "
                    "already measured (their rows replace the kept ones)")
    ap.add_argument("--kinds", default=None, help="comma-separated kinds to measure for the models measured now "
                    f"(default: all of {', '.join(KINDS)}; the summary lists, per model, the kinds it holds)")
    args = ap.parse_args(argv)
    kinds = tuple(args.kinds.split(",")) if args.kinds else None
    started, info = _script.begin("compressed_verdicts", args.quick)
    work = Path(tempfile.mkdtemp(prefix="vitedge-compressed-"))
    partial = _script.out_path("compressed_verdicts", args).with_suffix(".partial")  # one model's rows per file
    try:
        if args.remeasure:
            _remeasure(partial, args.models, tuple(args.remeasure.split(",")), work, args.quick)
        rows, missing = _corpus.measured_per_model(
            {n: (lambda n=n, make=make: measure(n, make, work, args.quick, kinds))
             for n, make in _models(args.quick).items()},
            partial, args.models)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(rows)
    summ["not_measured"] = missing  # said, not hidden
    summ["kinds_measured"] = {m: sorted({r["kind"] for r in rows if r["model"] == m}, key=KINDS.index)
                              for m in dict.fromkeys(r["model"] for r in rows)}
    path = _script.write_results(_script.out_path("compressed_verdicts", args), "compressed_verdicts", info, args,
                                 {"settings": {"k": COMPRESSED_K, "median": COMPRESSED_MEDIAN, "positions": POSITIONS,
                                         "visible": VISIBLE, "samples": SAMPLES, "weight_k": WEIGHT_K},
                            "cases": rows, "summary": summ}, started)
    if not missing:  # complete: nothing left to resume
        shutil.rmtree(partial, ignore_errors=True)
    print(f"\nresults: {path}")
    print(f"\ncompressed rule (median bounds {COMPRESSED_MEDIAN}); correct artifacts failed: "
          f"{summ['correct_failed'] or 'none'}; models not measured yet: {summ['not_measured'] or 'none'}")
    for kind, e in summ["kinds"].items():
        plants = ", ".join(f"{p} {v['caught']}/{v['of']} ({v['caught_by_outputs']}, {v['visible_missed']})"
                           for p, v in e["plants"].items())
        print(f"  {kind} (K = {e['k']:g}): worst correct ratio {e['worst_correct_ratio']:.2f}, median "
              f"{e['worst_correct_median']:.2f}, weights {e['worst_correct_weights_ratio']:.2f}; caught / planted "
              f"(by the outputs alone, visible but missed): {plants}")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


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


def compressed_correct(kind: str, field: str, digits: str = "2") -> str:
    """One figure of a kind's correct artifacts from the summary (worst_correct_ratio, worst_correct_median, ...),
    to `digits` decimals (a comment's figure)."""
    return f"{load('compressed_verdicts.json')['summary']['kinds'][kind][field]:.{int(digits)}f}"


def compressed_model_median(model: str, kind: str, digits: str = "2") -> str:
    """The set median of a correct artifact's ratio to its emulation, for one model and kind."""
    [r] = [r for r in load("compressed_verdicts.json")["cases"]
           if r["model"] == model and r["kind"] == kind and r["plant"] is None]
    return f"{r['median_ratio']:.{int(digits)}f}"


def weights_check_correct(*kinds: str) -> str:
    """The largest deviation of a correct artifact's channel (or palette tensor) in units of the weights check's
    allowance before K (the JSON's ratio x the kind's weight K), over `kinds`."""
    summary = load("compressed_verdicts.json")["summary"]["kinds"]
    worst = max(summary[k]["worst_correct_weights_ratio"] * TABLE[k].weight_k for k in kinds)
    return f"{worst:.2f}"


TABLES = {"compressed_verdicts": compressed_verdicts, "compressed_correct": compressed_correct,
          "compressed_model_median": compressed_model_median, "weights_check_correct": weights_check_correct}


if __name__ == "__main__":
    raise SystemExit(main())
