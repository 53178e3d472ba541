"""Wall time of the whole export pipeline (`vitedge.export`) per target, for one small model per family.

Each run is the full pipeline a user gets: train-form build, re-parameterization, the float64
equivalence gate, ONNX export + onnxsim, the target's lowering, and the parity hop after every step.
Targets: onnx (fp32), onnx fp16, coreml (off macOS its hop runs on the numpy MIL interpreter, "emulated"),
tensorrt (timed only where it can run; otherwise listed unavailable with the reason). The targets of one
model are run interleaved, round by round; each run is split into the pipeline's own progress steps and
the report's per-hop `seconds`. Ratios: each target's wall time over the onnx fp32 pipeline's.

Parity samples: the pipeline default is 256 parity inputs; here `--samples` (default 4) keeps the run to
minutes, and every per-sample stage is listed so its cost can be scaled.

    python benchmarks/export_time.py [--quick] [--samples N] [--repeats N] [--out FILE]
"""
from __future__ import annotations

import statistics
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import _common as C
from vitedge.exporter import latency
from vitedge.exporter.pipeline import export
from vitedge.exporter.progress import Progress
from vitedge.exporter.target_plans import resolve_targets
from vitedge.models import list_models

MODELS = ("swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16")  # one small model per family
QUICK_MODELS = ("swiftformer_xs",)
# (label, target, precision); the first is the baseline of the ratios.
RUNS = (("onnx", "onnx", "fp32"), ("onnx-fp16", "onnx", "fp16"), ("coreml", "coreml", None),
        ("tensorrt", "tensorrt", None))
QUICK_IMGSZ = {"swiftformer_xs": 64, "sima_nano_12_p16": 64}  # reduced configs at small sizes (SLAB: 224 only)


class StepTimes(Progress):
    """The pipeline's progress hook, recording every step's wall time instead of printing it."""

    def __init__(self):
        super().__init__(enabled=False)
        self.steps: list[tuple[str, float]] = []

    @contextmanager
    def step(self, label: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.steps.append((label, time.perf_counter() - t0))


def availability(target: str) -> str | None:
    """None when `target` can lower and run its hop here, else why not."""
    plan = resolve_targets(target)[0]
    if plan.target is None:
        return plan.missing
    ok, why = plan.target.available()
    return None if ok else why


def pipeline_call(name: str, target: str, precision: str | None, overrides: dict, imgsz: int | None,
                  samples: int, tmp: Path, record: list):
    """A callable running one export into a fresh folder; each call appends its wall time, steps and hops."""

    def run():
        progress = StepTimes()
        out = Path(tempfile.mkdtemp(dir=tmp)) / "out"
        t0 = time.perf_counter()
        report = export(name, target, precision=precision, overrides=overrides or None, imgsz=imgsz, out=out,
                        samples=samples, progress=progress)
        wall = time.perf_counter() - t0
        record.append({"wall_s": wall, "steps": progress.steps, "exit_code": report.exit_code,
                       "hops": [{"hop": h.hop, "status": h.status, "mode": h.mode, "seconds": h.seconds,
                                 "reason": h.reason} for h in report.parity]})
    return run


def _median_steps(records: list[dict]) -> dict[str, float]:
    labels = list(dict.fromkeys(lbl for r in records for lbl, _ in r["steps"]))
    return {lbl: round(statistics.median(s for r in records for l2, s in r["steps"] if l2 == lbl), 3) for lbl in labels}


def _median_hops(records: list[dict]) -> list[dict]:
    out = []
    for h in records[-1]["hops"]:
        secs = [x["seconds"] for r in records for x in r["hops"] if x["hop"] == h["hop"] and x["seconds"] is not None]
        out.append({**h, "seconds": round(statistics.median(secs), 3) if secs else None})
    return out


def measure_model(name: str, runs, quick: bool, samples: int, repeats: int, tmp: Path) -> dict:
    overrides = C.REDUCED[name] if quick else {}
    imgsz = QUICK_IMGSZ.get(name) if quick else None
    records = {label: [] for label, *_ in runs}
    fns = {label: pipeline_call(name, t, p, overrides, imgsz, samples, tmp, records[label]) for label, t, p in runs}
    # Every export builds everything from scratch and the process-wide imports were paid by the warm-up
    # export in main(), so the interleaved helper's untimed first round is recorded as a round too
    # (--quick has no warm-up export: its first round includes the imports).
    latency.time_interleaved(fns, warmup_s=0.0, min_iters=repeats - 1, max_s=0.0)
    out = {"model": name, "config": "reduced" if quick else "real", "overrides": overrides, "imgsz": imgsz or 224,
           "targets": {}, "ratios": {}}
    for label, target, precision in runs:
        recs = records[label]
        walls = [r["wall_s"] for r in recs]
        out["targets"][label] = {"target": target, "precision": precision, "wall": C.stats(walls),
                                 "walls_s": [round(w, 3) for w in walls], "exit_code": recs[-1]["exit_code"],
                                 "steps_s": _median_steps(recs), "hops": _median_hops(recs)}
        _print_target(name, label, out["targets"][label])
    base = runs[0][0]
    for label, *_ in runs[1:]:
        out["ratios"][f"{label}/{base}"] = latency.paired_ratio([r["wall_s"] for r in records[label]],
                                                                [r["wall_s"] for r in records[base]])
    return out


def _print_target(name: str, label: str, t: dict) -> None:
    hops = ", ".join(f"{h['hop']} {h['status']}{' (' + h['mode'] + ')' if h['mode'] else ''}" for h in t["hops"])
    print(f"  {name:<18} {label:<10} {t['wall']['p50_ms'] / 1e3:7.2f} s (median of {t['wall']['iters']}; "
          f"exit {t['exit_code']}): {hops}", flush=True)
    steps = "; ".join(f"{k} {v:.2f}" for k, v in t["steps_s"].items())
    print(f"      stages (s): {steps}", flush=True)


def main(argv=None) -> int:
    ap = C.parser("export_time", __doc__)
    ap.add_argument("--samples", type=int, default=None, help="parity inputs per hop (default 4; --quick 2)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per model (default 3, at least 2)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: this box is shared)")
    args = ap.parse_args(argv)
    samples = args.samples or (2 if args.quick else 4)
    if args.repeats < 2 or samples < 1:
        ap.error("--repeats must be >= 2 (a ratio needs pairs) and --samples >= 1")
    started = time.time()
    torch.set_num_threads(args.threads)
    info = C.machine()
    C.banner("export_time", info, args.quick)
    runs, unavailable = [], {}
    for label, target, precision in RUNS:
        why = availability(target)
        if why is None:
            runs.append((label, target, precision))
        else:
            unavailable[label] = why
            print(f"  {label}: unavailable here: {why}")
    wanted = QUICK_MODELS if args.quick else MODELS
    models = [m for m in wanted if m in list_models()]
    missing = {m: "not registered" for m in wanted if m not in models}
    with tempfile.TemporaryDirectory(prefix="vitedge-export-time-") as tmp:
        if not args.quick:
            # Pay the process-wide imports (coremltools, onnxsim, the MIL interpreter) once, on a tiny model.
            # (--quick skips this: its first round includes them.)
            warm = [[] for _ in runs]
            for (label, t, p), rec in zip(runs, warm):
                pipeline_call("swiftformer_xs", t, p, C.REDUCED["swiftformer_xs"], 64, 1, Path(tmp), rec)()
        results = [measure_model(m, runs, args.quick, samples, args.repeats, Path(tmp)) for m in models]
    body = {"settings": {"samples": samples, "pipeline_default_samples": 256, "repeats": args.repeats,
                         "torch_threads": args.threads, "runs": [r[0] for r in runs]},
            "unavailable": unavailable, "missing": missing, "models": results}
    path = C.write_results(C.out_path("export_time", args), "export_time", info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    print(f"\nratios (pipeline wall time relative to the onnx fp32 pipeline, {samples} parity samples):")
    for label, why in unavailable.items():
        print(f"  {label}: unavailable ({why})")
    for r in results:
        for key, q in r["ratios"].items():
            print(f"  {r['model']} ({r['config']}) {key}: {C.fmt_ratio(q)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
