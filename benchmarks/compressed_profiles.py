"""Where the compressed parity profiles' thresholds come from (issue 18): correct and planted-broken compressed
artifacts of the trained reference fixtures, judged as the ladder judges them.

For each trained fixture (tests/fixtures/trained/) and each kind, correct artifacts (int8 in both QDQ encodings;
CoreML w8 / palette4 / palette6 on iOS 16 and 18, w8a8 on iOS 17 and 18) and planted-broken ones (the stem conv's
int8 weight scales sign-flipped; int8 calibrated on blank images or on one image; a w8 scale vector sign-flipped;
a palette4 lookup table reversed; w8a8 calibrated on blank images), and one subtle change that shows the
detection limit (one output channel's int8 stem scale doubled: an error of the size of quantization noise, which
the profiles are not meant to catch; the fp32 hops before quantization catch such errors in the base graph), are
run on
  - natural: the parity set's natural samples from photos that do not calibrate (exporter/quantize/calibrate.py), as the
    compressed hops see them; for CoreML also the first 16 (the emulated hop's prefix);
  - digits: the 364 held-out digits with their labels (a labelled --images folder), calibrated on 64
    training-split digits,
and judged against the train-form in float64 by exporter/verdict/parity.judge with the kind's profile
(COMPRESSED_TOLERANCES, with the one-sample resolution bounds of exporter/quantize/compressed.py). No timing: the figures
are deterministic, and benchmarks/results/compressed_profiles.json is what docs/quantization.md quotes.
Printed last: per profile and criterion, the worst value a correct artifact reached, the threshold, and the
best value a planted-broken one reached; and which detection-limit cases passed.

    python benchmarks/compressed_profiles.py [--quick] [--out FILE]
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import _script
from _tables import load, table
from vitedge.exporter.quantize.calibrate import natural_calibration
from vitedge.exporter.quantize.compressed import JudgedSamples, resolution_bounds
from vitedge.exporter.core.report import Tolerance
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.verdict.inputs import parity_set
from vitedge.exporter.verdict.parity import COMPRESSED_TOLERANCES, ground_truth, judge, profile_for
from vitedge.models.registry import input_stats
from vitedge.targets.base import LowerSpec
from vitedge.targets.coreml import CoreMLTarget, EmulatedCoreMLRunner
from vitedge.targets.coreml.compress import compress_package
from vitedge.targets.graph.qdq import quantize_qdq
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import corrupt_package

CALIB = 64
EMULATED_PREFIX = 16
CRITERIA = ("cosine", "psnr_db", "top1_agreement", "accuracy_drop")
PACKAGE_KINDS = {16: ("w8", "palette4", "palette6"), 17: ("w8a8",), 18: ("w8", "palette4", "palette6", "w8a8")}
QUICK_KINDS = {16: ("w8", "palette4"), 17: ("w8a8",)}
CORRUPT = {"w8": ("constexpr_affine_dequantize", "scale", lambda v: -v),
           "palette4": ("constexpr_lut_to_dense", "lut", lambda v: v[::-1])}


def _stem_scale(model: onnx.ModelProto, change) -> onnx.ModelProto:
    """A copy with `change` applied to the stem conv's int8 weight scales (the first Conv reading a dequantized
    weight): all of them sign-flipped (broken), or one channel's scale doubled (the detection limit)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    dq = {n.output[0]: n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in inits}
    conv = next(n for n in m.graph.node if n.op_type == "Conv" and n.input[1] in dq)
    scale = inits[dq[conv.input[1]].input[1]]
    scale.CopyFrom(numpy_helper.from_array(change(numpy_helper.to_array(scale).copy()), scale.name))
    return m


def _double_first(a: np.ndarray) -> np.ndarray:
    a[0] *= 2
    return a


def _verdict(kind: str, truth: GroundTruth, out: np.ndarray) -> dict:
    # the profile's bounds alone: the per-sample compressed rule (against the kind's emulation) is measured by
    # compressed_verdicts.py
    tol = replace(COMPRESSED_TOLERANCES[profile_for(kind)], **{k: None for k in Tolerance.COMPRESSED})
    labelled = 0 if truth.labels is None else int((truth.labels >= 0).sum())
    metrics, sets, problems = judge(truth, out, resolution_bounds(tol, len(out), labelled))
    (d,) = sets.values()
    return {"samples": len(out), "metrics": asdict(metrics), "accuracy_drop": d.get("accuracy_drop"),
            "top1_accuracy": d.get("top1_accuracy"), "top1_accuracy_ci95": d.get("top1_accuracy_ci95"),
            "passed": not problems, "problems": problems}


def measure_fixture(name: str, work: Path, quick: bool) -> list[dict]:
    print(f"\n{name}", flush=True)
    train, deploy = tf.deploy_form(name)
    mean, std = input_stats(train)
    imgsz = tf.manifest()["models"][name]["imgsz"]
    nat_cal = natural_calibration(CALIB, imgsz, mean, std)
    judged = JudgedSamples.build(train, parity_set(64 if quick else 256, imgsz, 0, mean, std), nat_cal.ids)
    xd, yd = tf.heldout(name)
    digits = ground_truth(train, xd, ("user",) * len(xd), yd)
    dig_cal, dig_ids = tf.calibration_images(name, CALIB)
    sets = {"natural": (judged.x, judged.truth, nat_cal.x), "digits": (xd, digits, dig_cal)}
    rows = []

    def record(kind: str, case: str, planted: bool, where: str, out: np.ndarray, truth: GroundTruth,
               prefix: bool, limit: bool = False) -> None:
        v = _verdict(kind, truth, out)
        row = {"fixture": name, "kind": kind, "profile": profile_for(kind), "case": case, "planted": planted,
               "detection_limit": limit, "set": where, **v}
        if prefix:
            row["emulated_prefix"] = _verdict(kind, truth.head(EMULATED_PREFIX), out[:EMULATED_PREFIX])
        rows.append(row)
        m = v["metrics"]
        drop = "" if v["accuracy_drop"] is None else f" drop {100 * v['accuracy_drop']:+.2f} pt"
        tag = " (detection limit)" if limit else " (planted)" if planted else ""
        print(f"  {case:<38} {where:<8} cos {m['cosine']:8.5f} PSNR {m['psnr_db']:6.1f} top-1 "
              f"{m['top1_agreement']:.3f}{drop}  {'pass' if v['passed'] else 'FAIL'}{tag}", flush=True)

    fp32 = tf.onnx_fp32(name)
    for where, (x, truth, cal) in sets.items():
        q = {enc: quantize_qdq(fp32, cal, encoding=enc).model for enc in ("onnxruntime", "tensorrt")}
        for enc, model in q.items():
            record("int8", f"int8 {enc}", False, where, tf.ort_logits(model, x), truth, False)
        record("int8", "int8 stem scales flipped", True, where,
               tf.ort_logits(_stem_scale(q["onnxruntime"], np.negative), x), truth, False)
        record("int8", "int8 stem: one channel's scale x2", False, where,
               tf.ort_logits(_stem_scale(q["onnxruntime"], _double_first), x), truth, False, limit=True)
        blank = quantize_qdq(fp32, np.zeros_like(cal[:8])).model
        record("int8", "int8 blank calibration", True, where, tf.ort_logits(blank, x), truth, False)
        if not quick:
            one = quantize_qdq(fp32, cal[:1]).model
            record("int8", "int8 one-image calibration", True, where, tf.ort_logits(one, x), truth, False)

    for ios, kinds in (QUICK_KINDS if quick else PACKAGE_KINDS).items():
        folder = work / f"{name}-ios{ios}"
        folder.mkdir()
        spec = LowerSpec(name=name, imgsz=imgsz, batch=16, precision="fp16", out_dir=folder, onnx_path=None,
                         options={"ios": ios})
        src = CoreMLTarget().lower(deploy, spec).path
        for kind in kinds:
            for where, (x, truth, cal) in sets.items():
                if kind != "w8a8" and where == "digits" and (folder / f"{kind}-natural.mlpackage").exists():
                    path = folder / f"{kind}-natural.mlpackage"  # weight-only: one package serves both sets
                else:
                    path = compress_package(src, folder / f"{kind}-{where}.mlpackage", kind,
                                            calibration=cal if kind == "w8a8" else None).path
                run = EmulatedCoreMLRunner(path, max_samples=None).run
                record(kind, f"coreml {kind} iOS {ios}", False, where, run(x), truth, where == "natural")
                if kind in CORRUPT and where == "natural" and ios == 16:
                    bad = folder / f"{kind}-corrupt.mlpackage"
                    corrupt_package(path, bad, *CORRUPT[kind])
                    label = "scale sign-flipped" if kind == "w8" else "LUT reversed"
                    record(kind, f"coreml {kind} iOS {ios} {label}", True, where,
                           EmulatedCoreMLRunner(bad, max_samples=None).run(x), truth, True)
                if kind == "w8a8" and where == "natural":
                    blank = compress_package(src, folder / "w8a8-blank.mlpackage", kind,
                                             calibration=np.zeros_like(cal[:16]))
                    record(kind, f"coreml w8a8 iOS {ios} blank calibration", True, where,
                           EmulatedCoreMLRunner(blank.path, max_samples=None).run(x), truth, True)
    return rows


def _judgements(rows: list[dict]) -> list[dict]:
    """Every judgement a row holds: over all its samples and, for CoreML, over the emulated hop's prefix."""
    out = []
    for r in rows:
        out.append(r)
        if r.get("emulated_prefix"):
            out.append({**r, **r["emulated_prefix"], "set": f"{r['set']}, first {EMULATED_PREFIX}"})
    return out


def summary(rows: list[dict]) -> dict:
    """Per profile and criterion: worst correct value, threshold, best planted value (over the judged sets and
    the emulated prefixes)."""
    out = {}
    rows = _judgements(rows)
    for profile, tol in COMPRESSED_TOLERANCES.items():
        mine = [r for r in rows if r["profile"] == profile]
        if not mine:
            continue
        entry = {}
        for c in CRITERIA:
            def val(r):
                return r["accuracy_drop"] if c == "accuracy_drop" else r["metrics"][c]
            worst_ok = [val(r) for r in mine if not r["planted"] and not r["detection_limit"] and val(r) is not None]
            planted = [val(r) for r in mine if r["planted"] and val(r) is not None]
            upper = c == "accuracy_drop"
            entry[c] = {"threshold": getattr(tol, c),
                        "worst_correct": (max(worst_ok) if upper else min(worst_ok)) if worst_ok else None,
                        "best_planted": (min(planted) if upper else max(planted)) if planted else None}
        entry["correct_failed"] = [f"{r['fixture']} {r['case']} ({r['set']})" for r in mine
                                   if not r["planted"] and not r["detection_limit"] and not r["passed"]]
        entry["detection_limit_passed"] = [f"{r['fixture']} {r['case']} ({r['set']})" for r in mine
                                           if r["detection_limit"] and r["passed"]]
        entry["planted_passed"] = [f"{r['fixture']} {r['case']} ({r['set']})" for r in mine
                                   if r["planted"] and r["passed"]]
        out[profile] = entry
    return out


def main(argv=None) -> int:
    ap = _script.parser("compressed_profiles", __doc__)
    args = ap.parse_args(argv)
    started, info = _script.begin("compressed_profiles", args.quick)
    names = ["swiftformer_digits"] if args.quick else tf.reference_names()
    work = Path(tempfile.mkdtemp(prefix="vitedge-profiles-"))
    try:
        rows = [r for n in names for r in measure_fixture(n, work, args.quick)]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summ = summary(rows)
    body = {"settings": {"calibration_samples": CALIB, "emulated_prefix": EMULATED_PREFIX,
                         "profiles": {k: dataclasses.asdict(v) for k, v in COMPRESSED_TOLERANCES.items()}},
            "cases": rows, "summary": summ}
    path = _script.write_results(_script.out_path("compressed_profiles", args), "compressed_profiles",
                                 info, args, body, started)
    print(f"\nresults: {path}")
    print("\nprofiles (per criterion: worst correct artifact | threshold | best planted-broken artifact):")
    for profile, entry in summ.items():
        cells = [f"{c} {_f(e['worst_correct'])} | {_f(e['threshold'])} | {_f(e['best_planted'])}"
                 for c, e in entry.items() if c in CRITERIA]
        print(f"  {profile}: " + "; ".join(cells))
        if entry["correct_failed"] or entry["planted_passed"]:
            print(f"  {profile}: correct but failed: {entry['correct_failed']}; planted but passed: "
                  f"{entry['planted_passed']}")
        if entry["detection_limit_passed"]:
            print(f"  {profile}: below the detection limit (passed): {entry['detection_limit_passed']}")
    return 0


def _f(v) -> str:
    return "-" if v is None else f"{v:.4g}"


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def compressed_profiles() -> str:
    """Per compressed profile and criterion: the worst correct value | the threshold | the best planted value."""
    def num(x, spec: str) -> str:
        return "-" if x is None else format(x, spec)
    rows = []
    for kind, s in load("compressed_profiles.json")["summary"].items():
        row = [kind]
        for key, spec in (("cosine", ".4f"), ("psnr_db", ".1f"), ("top1_agreement", ".3f"), ("accuracy_drop", ".2g")):
            c = s[key]
            row.append(f"{num(c['worst_correct'], spec)} \\| {c['threshold']:g} \\| {num(c['best_planted'], spec)}")
        rows.append(row)
    return table(["profile", "cosine", "PSNR dB", "top-1 agreement", "accuracy drop"], rows)


def compressed_int8() -> str:
    """The int8 profile's worst correct values against its thresholds, from compressed_profiles.json."""
    s = load("compressed_profiles.json")["summary"]["int8"]
    return (f"worst correct int8 artifact cosine {s['cosine']['worst_correct']:.3f} (threshold "
            f"{s['cosine']['threshold']:g}), PSNR {s['psnr_db']['worst_correct']:.1f} dB "
            f"({s['psnr_db']['threshold']:g}), "
            f"top-1 agreement {s['top1_agreement']['worst_correct']:.3f} ({s['top1_agreement']['threshold']:g}); "
            + ("every planted-broken int8 artifact fails" if not s["planted_passed"]
               else f"{len(s['planted_passed'])} planted-broken int8 artifacts pass"))


TABLES = {"compressed_profiles": compressed_profiles, "compressed_int8": compressed_int8}


if __name__ == "__main__":
    raise SystemExit(main())
