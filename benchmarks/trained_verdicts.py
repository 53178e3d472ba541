"""Verdicts on really trained weights (no timing): full-size models trained to convergence on scikit-learn's digits,
exported with their labelled held-out images as the parity set (`--images DIR --labels FILE`).

For each model: `vitedge export --target onnx,coreml --precision fp16` (the fp32 ONNX base graph, its fp16 graph on
ONNX Runtime, fp16 CoreML run by the MIL interpreter) on the held-out digits written as PNG files, every hop's status,
worst noise ratio per set and accuracy beside the float64 train-form's on the same images; then errors planted in
the saved fp32 ONNX (a zeroed layer, one output channel sign-flipped, one channel x1.01, at the middle weight)
judged by `vitedge parity`. Correct artifacts must
pass, plants must fail.

Models (weights produced by scripts/train_reference.py and cached outside the repository, in
~/.cache/vitedge/trained; trained here when missing), all at 64 px: SwiftFormer-XS (full config), SLAB-DeiT-T (full default
config: depth 12, patch 16), SLAB-DeiT (depth 6, patch 8), SimA-Nano (sima_nano_12_p16, full config: a 4x4 token grid) and PRepBN-PVT-Tiny (full config).
--quick: the small trained fixture of tests/fixtures/trained/ on 64 held-out images, fp32 ONNX and CoreML only.

Each model's row is kept in FILE.partial/ until every model is measured: `--models A,B` measures only those (and
trains them first where they are not cached) and writes the results of every model measured so far.

    python benchmarks/trained_verdicts.py [--quick] [--models A,B] [--out FILE]
"""
from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from PIL import Image

import _corpus
import _script
from _tables import load, table
import vitedge
from vitedge.exporter.verdict import trained_reference as tf
from vitedge.targets.plants import plant_channel_scale

CACHE = _corpus.TRAINED_CACHE
FULL = _corpus.TRAINED_FULL
PLANTS = {"zero_layer": 0.0, "sign_flip": -1.0, "x1.01": 1.01}


def _weights(quick: bool, only: str | None) -> dict:
    """name -> () -> (model, imgsz): the trained models, training the selected full-size ones first where they are
    missing from the cache."""
    if quick:
        return {"swiftformer_digits": lambda: (tf.load_reference("swiftformer_digits"), 32)}
    missing = [n for n in FULL if not (CACHE / f"{n}.pth").is_file() and (only is None or n in only.split(","))]
    if missing:
        subprocess.run([sys.executable, str(_script.RESULTS.parents[1] / "scripts" / "train_reference.py"), "--models",
                        ",".join(missing), "--out", str(CACHE)], check=True)
    return {n: (lambda n=n: _corpus.cached_trained(n)) for n in FULL}


def _write_heldout(root: Path, n: int | None) -> tuple[Path, Path]:
    """The held-out digits as PNG files in ImageFolder layout (8x8 ink upscaled to 64 px, RGB), and labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    _, held = tf.split()
    held = held if n is None else held[np.linspace(0, len(held) - 1, n).round().astype(int)]
    for i in held:
        folder = root / "images" / str(digits.target[i])
        folder.mkdir(parents=True, exist_ok=True)
        ink = (digits.images[i] / 16.0 * 255).astype(np.uint8)
        Image.fromarray(ink).resize((64, 64), Image.BILINEAR).convert("RGB").save(folder / f"{i}.png")
    (root / "labels.txt").write_text("".join(f"{c}\n" for c in range(10)))
    return root / "images", root / "labels.txt"


def _hop_row(h) -> dict:
    sets = h.sets or {}
    return {"hop": h.hop, "status": h.status, "mode": h.mode, "samples": h.samples,
            "noise_ratio": {s: d.get("noise_ratio") for s, d in sets.items()},
            "top1_accuracy": (sets.get("user") or {}).get("top1_accuracy"),
            "reference_top1_accuracy": (sets.get("user") or {}).get("reference_top1_accuracy"),
            "reason": h.reason}


def measure(name: str, model, imgsz: int, images: Path, labels: Path, work: Path, quick: bool) -> dict:
    out = work / name
    rep = vitedge.export(copy.deepcopy(model), targets="onnx,coreml", precision=None if quick else "fp16",
                         imgsz=imgsz, images=images, labels=labels, out=out, truth_cache=False)
    row = {"model": name, "imgsz": imgsz, "exit_code": rep.exit_code, "hops": [_hop_row(h) for h in rep.parity],
           "reference_top1_accuracy": rep.reference.get("top1_accuracy"), "planted": {}}
    graph = onnx.load(str(next(p for p in out.rglob("*.onnx") if ".raw." not in p.name and ".fp16." not in p.name)))
    for plant, factor in PLANTS.items():
        bad, where = plant_channel_scale(graph, factor, 0.5) if plant != "zero_layer" else _zero_layer(graph)
        path = work / f"{name}-{plant}.onnx"
        onnx.save(bad, str(path))
        prep = vitedge.parity(copy.deepcopy(model), artifact=path, imgsz=imgsz, images=images, labels=labels,
                              truth_cache=False)
        hop = next(h for h in prep.parity if h.hop.startswith("onnx"))
        row["planted"][plant] = {"status": hop.status, "caught": hop.status == "failed",
                                 "noise_ratio": {s: d.get("noise_ratio") for s, d in (hop.sets or {}).items()},
                                 "diverging_module": hop.diverging_module}
    return row


def _zero_layer(graph):
    """The middle Conv/Gemm/MatMul weight of `graph`, zeroed (every channel x0)."""
    from vitedge.targets.plants import weight_nodes
    from onnx import numpy_helper

    g = copy.deepcopy(graph)
    node, init_name, _ = weight_nodes(g)[len(weight_nodes(g)) // 2]
    init = next(i for i in g.graph.initializer if i.name == init_name)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 0, init.name))
    return g, node


def main(argv=None) -> int:
    ap = _script.parser("trained_verdicts", __doc__)
    ap.add_argument("--models", default=None, help="comma-separated subset of the models to measure now (default: all)")
    args = ap.parse_args(argv)
    started, info = _script.begin("trained_verdicts", args.quick)
    work = Path(tempfile.mkdtemp(prefix="vitedge-trained-"))
    partial = _script.out_path("trained_verdicts", args).with_suffix(".partial")  # one model's row per file
    try:
        images, labels = _write_heldout(work / "digits", 64 if args.quick else None)
        rows, missing = _corpus.measured_per_model(
            {n: (lambda n=n, load=load: [measure(n, *load(), images, labels, work, args.quick)])
             for n, load in _weights(args.quick, args.models).items()}, partial, args.models)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    correct_ok = all(h["status"] == "passed" for r in rows for h in r["hops"])
    caught = {p: sum(r["planted"][p]["caught"] for r in rows) for p in PLANTS}
    path = _script.write_results(_script.out_path("trained_verdicts", args), "trained_verdicts", info, args,
                                 {"models": rows, "summary": {"correct_passed": correct_ok, "caught": caught,
                                                        "of": len(rows), "not_measured": missing}}, started)
    if not missing:  # complete: nothing left to resume
        shutil.rmtree(partial, ignore_errors=True)
    print(f"\nresults: {path}")
    print("\ntrained models (hop: status, worst ratio on the labelled digits, top-1 hop / float64 train-form):")
    for r in rows:
        for h in r["hops"]:
            ratio = h["noise_ratio"].get("user")
            print(f"  {r['model']} {h['hop']}: {h['status']}, ratio {'-' if ratio is None else f'{ratio:.2f}'}, "
                  f"top-1 {h['top1_accuracy']:.3f} / {h['reference_top1_accuracy']:.3f}")
        print(f"  {r['model']} planted in the saved ONNX: " + ", ".join(
            f"{p} {'caught' if v['caught'] else 'MISSED'}" for p, v in r["planted"].items()))
    if missing:
        print(f"  not measured yet: {', '.join(missing)} (--models)")
    return 0 if correct_ok and all(v == len(rows) for v in caught.values()) else 1


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def trained_verdicts() -> str:
    """Each trained model's hops on its labelled held-out images (status and worst ratio over the sets) and the
    errors planted in its saved ONNX, from trained_verdicts.json."""
    d = load("trained_verdicts.json")
    hops = [h["hop"] for h in d["models"][0]["hops"]]
    plants = list(d["models"][0]["planted"])
    rows = []
    for m in d["models"]:
        by = {h["hop"]: h for h in m["hops"]}
        cells = []
        for name in hops:
            h = by.get(name)
            worst = max(h["noise_ratio"].values()) if h else None
            cells.append("" if h is None else ("passed" if h["status"] == "passed" else f"**{h['status']}**")
                         + f" {worst:.2f}")
        caught = ", ".join(f"{k} {'caught' if v['caught'] else '**missed**'}" for k, v in m["planted"].items())
        rows.append([m["model"], f"{100 * m['reference_top1_accuracy']:.1f} %"] + cells + [caught])
    head = (["model", "train-form top-1"] + [f"{h} (worst ratio)" for h in hops]
            + [f"planted in the ONNX ({len(plants)})"])
    return table(head, rows, sep="| ---")


TABLES = {"trained_verdicts": trained_verdicts}


if __name__ == "__main__":
    raise SystemExit(main())
