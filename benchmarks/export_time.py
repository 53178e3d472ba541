"""Wall time of the export pipeline: the README's main job phase by phase, `vitedge models`, and per target.

1. **The main job**, exactly as the README runs it (`vitedge export --model swiftformer_xs --target
   onnx,coreml --out DIR`, default settings, so the default parity set: 64 inputs), in a fresh process per run,
   median of `--main-repeats` (3) runs with the 1-min load average beside each, three series interleaved: **cold** (an
   empty float64 ground-truth cache: a first export of these weights), **warm** (the cache primed by one uncounted
   run: a re-export, the CI case; exporter/verdict/truth_cache.py) and cold with glibc's default allocator
   (VITEDGE_KEEP_FREED_MEMORY=0; its ratio to cold prints last). Each run is split into phases:
   the pipeline's own progress steps (train-form build, re-parameterization, float64 gate, reference runs,
   every hop, ONNX export, onnxsim, lowering) plus sub-phases timed by wrapping the functions that do them
   (demo weights, parity inputs, torch.jit.trace, CoreML conversion, MIL program load and interpreter run,
   report write, commit), found by identity in every loaded vitedge/coremltools module so that a module
   reorganisation moves nothing; what no phase covers (imports, the CLI summary) is listed as the remainder.
   Interleaved with them, **plain**: the same conversions without vitedge, in one fresh process (`torch.onnx.export`
   (dynamo) + onnxsim + `coremltools.convert` of the exported program at fp16, no re-parameterization, no
   verification: child_plain), the baseline of the ratios printed last (cold / plain and warm / plain, wall time
   and CPU seconds, paired bootstrap CIs) and of the targets: cold <= 1.5x plain with its CI, cold <= 20 s.
   `--main-only` measures this part (without the allocator series) and keeps the committed per-target results.
2. **`vitedge models`**, as a user starts it (a fresh process), median of 3; and coremltools' first import in a
   fresh interpreter, the CLI's lean import against the import as installed (IMPORT_PAIRS interleaved pairs).
3. **Per target** for one small model per family: onnx (fp32), onnx fp16, coreml (off macOS its hop runs on
   the numpy MIL interpreter, "emulated"), tensorrt (timed only where it can run), interleaved round by
   round with `--samples` (4) parity inputs; ratios: each target's wall time over the onnx fp32 pipeline's.

    python benchmarks/export_time.py [--quick] [--main-only] [--main-repeats N] [--samples N] [--repeats N] [--out FILE]

Length: one study (the main job, `vitedge models` and every target timed, each in fresh processes) and the tables
that render its JSON.
"""
from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from vitedge.exporter.core.allocator import ENV as KEEP_FREED_ENV
from vitedge.exporter.core.progress import Progress  # light: the child process times the heavy imports
from vitedge.exporter.verdict.parity_cost import DEFAULT_SAMPLES  # torch-free

MODELS = ("swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16")  # one small model per family
IMPORT_PAIRS = 6  # fresh-interpreter pairs timing coremltools' first import, lean and as installed
QUICK_MODELS = ("swiftformer_xs",)
# (label, target, precision); the first is the baseline of the ratios.
RUNS = (("onnx", "onnx", "fp32"), ("onnx-fp16", "onnx", "fp16"), ("coreml", "coreml", None),
        ("tensorrt", "tensorrt", None))
QUICK_IMGSZ = {"swiftformer_xs": 64, "sima_nano_12_p16": 64}  # reduced configs at small sizes (SLAB: 224 only)
MAIN_JOB = ["export", "--model", "swiftformer_xs", "--target", "onnx,coreml"]  # + --out DIR (the README's job)
TARGET_RATIO, TARGET_COLD_S = 1.5, 20.0  # the main job cold: within 1.5x the plain conversions, and 20 s here
PLAIN = "plain"  # the same conversions without vitedge: the baseline of the main job's ratios (child_plain)
PLAIN_COMMAND = ("torch.onnx.export (dynamo) + onnxsim + coremltools.convert(exported program, fp16), one process, "
                 "no verification")
MAIN_JOB_QUICK = ["--imgsz", "64", "--samples", "8", "--set", "layers=[1,1,2,1]", "--set", "embed_dims=[16,24,32,48]",
                  "--set", "num_classes=10"]  # _corpus.REDUCED's swiftformer_xs
# Sub-phases: (label, module, attribute path), wrapped wherever the function object is referenced.
SUB_PHASES = (
    ("demo weights (make_trained_like)", "vitedge.models.trained_like", "make_trained_like"),
    ("parity inputs (parity_inputs)", "vitedge.exporter.verdict.inputs", "parity_inputs"),
    ("float64 ground truth (parity.ground_truth)", "vitedge.exporter.verdict.parity", "ground_truth"),
    ("torch.jit.trace", "torch.jit", "trace"),
    ("CoreML conversion (coremltools.convert)", "coremltools", "convert"),
    ("MIL program load", "vitedge.targets.coreml.mil_interpreter", "load_program"),
    ("MIL interpreter run", "vitedge.targets.coreml.mil_interpreter", "MILProgram.run"),
    ("report.json write", "vitedge.exporter.core.report", "Report.write"),
    ("commit (tmp -> out)", "vitedge.exporter.core.outdir", "OutputFolder.commit"),
)


class StepTimes(Progress):
    """The pipeline's progress hook, recording every step's wall time instead of printing it."""

    def __init__(self, *args, **kwargs):
        super().__init__(enabled=False)
        self.steps: list[tuple[str, float]] = []

    @contextmanager
    def step(self, label: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.steps.append((label, time.perf_counter() - t0))


# ---- 1. the main job, in a child process -------------------------------------------------------------

class _SubPhases:
    """Timing wrappers around SUB_PHASES' functions, installed wherever the function object is referenced."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.missing: list[str] = []

    def install(self) -> None:
        import importlib

        for label, module, attr in SUB_PHASES:
            try:
                owner = importlib.import_module(module)
            except ImportError:
                self.missing.append(f"{module}.{attr}")
                continue
            *path, name = attr.split(".")
            for p in path:
                owner = getattr(owner, p, None)
            fn = getattr(owner, name, None) if owner is not None else None
            if fn is None:
                self.missing.append(f"{module}.{attr}")
                continue
            wrapped = self._wrap(label, fn)
            if path:  # a method: patch the class
                setattr(owner, name, wrapped)
                continue
            for mod in list(sys.modules.values()):  # every `from x import fn` copy too
                if getattr(mod, "__name__", "").split(".")[0] in ("vitedge", "coremltools", "torch"):
                    for k, v in list(vars(mod).items()):
                        if v is fn:
                            setattr(mod, k, wrapped)

    def _wrap(self, label: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t0
        return timed


def child_main_job(out_json: str, argv: list[str]) -> int:
    """Run `vitedge <argv>` in this process with the step hook and sub-phase wrappers; write the phases."""
    t0 = time.perf_counter()
    import torch  # noqa: F401
    import vitedge.cli
    from vitedge.targets.coreml.coremltools_import import lean_coremltools_import, quiet_coremltools

    lean_coremltools_import()  # what cli.main does first: coremltools is imported below as the job imports it
    with quiet_coremltools():  # (imported here so its wrappers exist; the job imports it anyway)
        pass
    import vitedge.exporter.flow.pipeline  # noqa: F401
    import vitedge.exporter.core.progress as progress_mod
    from vitedge.targets.coreml import mil_interpreter  # noqa: F401

    imports_s = time.perf_counter() - t0
    recorder: list[StepTimes] = []

    class Recording(StepTimes):
        def __init__(self, *args, **kwargs):
            super().__init__()
            recorder.append(self)

    progress_mod.Progress = Recording  # cli.main builds its Progress from this module at call time
    subs = _SubPhases()
    subs.install()
    with contextlib.redirect_stdout(io.StringIO()):
        rc = vitedge.cli.main(argv)
    total = time.perf_counter() - t0
    steps = recorder[0].steps if recorder else []
    Path(out_json).write_text(json.dumps({"rc": rc, "in_process_s": total, "imports_s": imports_s,
                                          "steps": steps, "sub_phases": subs.seconds, "not_wrapped": subs.missing}))
    return 0


def child_plain(out_json: str, out_dir: str, quick: bool) -> int:
    """The same conversions done plainly, as a user without vitedge would (no re-parameterization, no verification):
    `torch.onnx.export` (dynamo, the default) + onnxsim, and `coremltools.convert` of the exported program at fp16
    (the deployment target vitedge picks), each artifact saved; the model with its registry weights."""
    t0 = time.perf_counter()
    import coremltools as ct
    import onnx
    import onnxsim
    import torch
    from vitedge.models.registry import create_model

    imports_s = time.perf_counter() - t0
    out = Path(out_dir)
    out.mkdir(parents=True)
    overrides = dict(_plain_overrides()) if quick else {}
    imgsz = int(MAIN_JOB_QUICK[1]) if quick else 224
    model = create_model("swiftformer_xs", **overrides).eval()
    x = torch.randn(1, 3, imgsz, imgsz)
    phases = {}
    t = time.perf_counter()
    torch.onnx.export(model, (x,), str(out / "model.onnx"), dynamo=True)
    phases["torch.onnx.export"] = time.perf_counter() - t
    t = time.perf_counter()
    simplified, ok = onnxsim.simplify(onnx.load(str(out / "model.onnx")))
    onnx.save(simplified, str(out / "model.sim.onnx"))
    phases["onnxsim"] = time.perf_counter() - t
    t = time.perf_counter()
    program = torch.export.export(model, (x,)).run_decompositions({})
    ml = ct.convert(program, convert_to="mlprogram", compute_precision=ct.precision.FLOAT16,
                    minimum_deployment_target=ct.target.iOS16, skip_model_load=True)
    ml.save(str(out / "model.mlpackage"))
    phases["coremltools.convert (exported program, fp16)"] = time.perf_counter() - t
    Path(out_json).write_text(json.dumps({"rc": 0 if ok else 1, "in_process_s": time.perf_counter() - t0,
                                          "imports_s": imports_s, "steps": list(phases.items()), "sub_phases": {},
                                          "not_wrapped": []}))
    return 0


def _plain_overrides():
    """MAIN_JOB_QUICK's --set overrides as keyword arguments (the --quick plain run builds the same reduced model)."""
    sets = [MAIN_JOB_QUICK[i + 1] for i, a in enumerate(MAIN_JOB_QUICK) if a == "--set"]
    return [(k, json.loads(v)) for k, v in (a.split("=", 1) for a in sets)]


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:  # before the heavy imports: the child times them
    raise SystemExit(child_main_job(sys.argv[2], sys.argv[4:] if sys.argv[3:4] == ["--"] else sys.argv[3:]))
if __name__ == "__main__" and sys.argv[1:2] == ["--plain-child"]:
    raise SystemExit(child_plain(sys.argv[2], sys.argv[3], sys.argv[4:5] == ["--quick"]))

import _corpus  # noqa: E402
import _script  # noqa: E402
import _stats  # noqa: E402
from _tables import load, ratio, run_line, table, utc  # noqa: E402
from vitedge.exporter.timing import latency  # noqa: E402
from vitedge.exporter.flow.pipeline import export  # noqa: E402
from vitedge.exporter.core.target_plans import resolve_targets  # noqa: E402
from vitedge.models import list_models  # noqa: E402


def _main_job_run(label: str, i: int, quick: bool, tmp: Path, cache_dir: Path, env_extra: dict | None = None) -> dict:
    """One fresh process running the README's main job with the ground-truth cache in `cache_dir`."""
    out_dir, rec = tmp / f"main-{label}{i}", tmp / f"main-{label}{i}.json"
    argv = MAIN_JOB + ["--out", str(out_dir)] + (MAIN_JOB_QUICK if quick else [])
    env = {k: v for k, v in os.environ.items() if k not in ("VITEDGE_TRUTH_CACHE", KEEP_FREED_ENV)}  # defaults
    env.update({"VITEDGE_CACHE_DIR": str(cache_dir), **(env_extra or {})})
    child = (["--plain-child", str(rec), str(out_dir)] + (["--quick"] if quick else []) if label == PLAIN
             else ["--child", str(rec), "--", *argv])
    load_before = _script.load_average()  # the 1-min load average, beside every run
    cpu0 = os.times()
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), *child],
                       capture_output=True, text=True, cwd=str(tmp), env=env)
    wall = time.perf_counter() - t0
    cpu1 = os.times()
    if p.returncode != 0 or not rec.exists():
        raise RuntimeError(f"main job run {label} {i} failed (rc {p.returncode}): {p.stderr[-2000:]}")
    r = json.loads(rec.read_text())
    cache = {} if label == PLAIN else json.loads((out_dir / "report.json").read_text())["reference"].get("cache") or {}
    # the child's CPU seconds (all its threads): less sensitive than the wall time to other processes on the cores
    cpu = (cpu1.children_user - cpu0.children_user) + (cpu1.children_system - cpu0.children_system)
    r.update(wall_s=wall, cpu_s=cpu, load_before=load_before, load_after=_script.load_average(),
             cache=cache.get("status"))
    print(f"  main job, {label} run {i + 1}: {wall:.1f} s, {cpu:.1f} CPU s (exit {r['rc']}; ground truth cache: "
          f"{r['cache']}; 1-min load {load_before[:1]} -> {r['load_after'][:1]})", flush=True)
    return r


def run_main_job(quick: bool, repeats: int, tmp: Path, allocator: bool = True) -> tuple[dict, dict, dict | None, dict]:
    """The README's main job in fresh processes, `repeats` cold runs (an empty ground-truth cache: a first export)
    interleaved with `repeats` warm ones (the cache primed by one uncounted run: a re-export of the same weights,
    the CI case; --quick: by its first cold run, run first) and `repeats` cold ones with glibc's default allocator ($VITEDGE_KEEP_FREED_MEMORY=0: what
    exporter/core/allocator.py is worth), each round in a seeded random order; wall time, phases and load average per
    run. Returns (cold, warm, cold with the default allocator)."""
    warm_dir = tmp / "cache-warm"
    if not quick:
        print("  priming the warm runs' ground-truth cache (not counted)", flush=True)
        _main_job_run("priming", 0, quick, tmp, warm_dir)
    series = {"cold": [], "warm": [], **({"cold-default-malloc": []} if allocator else {}), PLAIN: []}
    order = random.Random(0)
    for i in range(repeats):
        labels = order.sample(list(series), len(series))
        if quick and i == 0:  # --quick (the smoke test): the first cold run fills the warm runs' cache, one run fewer
            labels.sort(key=lambda lbl: lbl != "cold")
        for label in labels:
            fills_warm = quick and i == 0 and label == "cold"
            cache = warm_dir if label == "warm" or fills_warm else tmp / f"cache-{label}{i}"
            extra = {KEEP_FREED_ENV: "0"} if label == "cold-default-malloc" else None
            series[label].append(_main_job_run(label, i, quick, tmp, cache, extra))
    out = {k: {**_summary(runs, quick, "warm" if k == "warm" else "cold", k == PLAIN),
               "allocator": "glibc default" if k == "cold-default-malloc" else "vitedge"} for k, runs in series.items()}
    return out["cold"], out["warm"], out.get("cold-default-malloc"), out[PLAIN]


def _summary(runs: list[dict], quick: bool, cache: str, plain: bool = False) -> dict:
    steps = list(dict.fromkeys(lbl for r in runs for lbl, _ in r["steps"]))
    subs = list(dict.fromkeys(lbl for r in runs for lbl in r["sub_phases"]))

    def med(values):
        return round(statistics.median(values), 3) if values else None

    phases = [{"phase": s, "kind": "step", "median_s": med([sum(t for l2, t in r["steps"] if l2 == s) for r in runs])}
              for s in steps]
    phases += [{"phase": s, "kind": "sub-phase", "median_s": med([r["sub_phases"].get(s, 0.0) for r in runs])}
               for s in subs]
    walls = [r["wall_s"] for r in runs]
    rest = [r["wall_s"] - sum(t for _, t in r["steps"]) for r in runs]
    command = PLAIN_COMMAND if plain else "vitedge " + " ".join(MAIN_JOB + ["--out", "DIR"] +
                                                                (MAIN_JOB_QUICK if quick else []))
    return {"command": command, "truth_cache": None if plain else cache,
            "cpu_median_s": med([r["cpu_s"] for r in runs]),
            "runs": [{"wall_s": round(r["wall_s"], 3), "cpu_s": round(r["cpu_s"], 3), "exit_code": r["rc"],
                      "load_before": r["load_before"],
                      "load_after": r["load_after"], "imports_s": round(r["imports_s"], 3), "cache": r["cache"]}
                     for r in runs],
            "wall_median_s": med(walls), "phases": phases,
            "remainder_median_s": med(rest), "imports_median_s": med([r["imports_s"] for r in runs]),
            "not_wrapped": runs[0]["not_wrapped"]}


def print_main_job(m: dict) -> None:
    runs = ", ".join(f"{r['wall_s']:.1f} s at 1-min load {r['load_before'][0] if r['load_before'] else '?'}"
                     for r in m["runs"])
    alloc = "" if m["allocator"] == "vitedge" else f", {m['allocator']} allocator"
    print(f"\nmain job, {m['truth_cache']} ground-truth cache{alloc}: {m['command']}: median {m['wall_median_s']:.2f} "
          f"s over {len(m['runs'])} fresh processes ({runs})")
    for p in m["phases"]:
        indent = "    of which " if p["kind"] == "sub-phase" else "  "
        share = 100 * p["median_s"] / m["wall_median_s"] if m["wall_median_s"] else 0
        print(f"{indent}{p['phase']:<58} {p['median_s']:8.2f} s  {share:5.1f} %")
    print(f"  {'outside the steps (interpreter start, imports, CLI summary)':<58} {m['remainder_median_s']:8.2f} s "
          f"(imports alone {m['imports_median_s']:.2f} s)")
    if m["not_wrapped"]:
        print(f"  (not found, so not split out: {', '.join(m['not_wrapped'])})")


# ---- 2. `vitedge models` ------------------------------------------------------------------------------

def time_models_command(repeats: int = 3) -> dict:
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "vitedge.cli", "models"], capture_output=True, text=True)
        walls.append(time.perf_counter() - t0)
        if p.returncode != 0:
            raise RuntimeError(f"vitedge models failed: {p.stderr[-500:]}")
    return {"walls_s": [round(w, 3) for w in walls], "median_s": round(statistics.median(walls), 3),
            "rows": len(p.stdout.splitlines()) - 1}


# ---- 2b. coremltools' import, as the CLI makes it and as installed ----------------------------------------------

IMPORT_PROBE = ("import sys, time\n"
                "from vitedge.targets.coreml import coremltools_import as ci\n"
                "if sys.argv[1] == 'lean': ci.lean_coremltools_import()\n"
                "t = time.perf_counter()\n"
                "with ci.quiet_coremltools(): pass\n"
                "print(time.perf_counter() - t)")


def time_coremltools_import(pairs: int) -> dict:
    """coremltools' first import in fresh interpreters (after vitedge's own), `pairs` pairs in a seeded order: lean
    (the CLI's: without the packages it imports only for converters vitedge never calls) and as installed. Ratio:
    as installed / lean (> 1: the CLI's import is faster)."""
    times = {"installed": [], "lean": []}
    order = random.Random(1)
    for _ in range(pairs):
        for mode in order.sample(list(times), 2):
            p = subprocess.run([sys.executable, "-c", IMPORT_PROBE, mode], capture_output=True, text=True)
            if p.returncode != 0:
                raise RuntimeError(f"coremltools import probe ({mode}) failed: {p.stderr[-500:]}")
            times[mode].append(float(p.stdout.split()[-1]))
    return {"seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
            "median_s": {k: round(statistics.median(v), 3) for k, v in times.items()},
            "ratio": latency.paired_ratio(times["installed"], times["lean"])}


# ---- 3. per target ------------------------------------------------------------------------------------

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
                        samples=samples, progress=progress, truth_cache=False)  # every round pays the same work
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
    overrides = _corpus.REDUCED[name] if quick else {}
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
        out["targets"][label] = {"target": target, "precision": precision, "wall": _stats.stats(walls),
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
    ap = _script.parser("export_time", __doc__)
    ap.add_argument("--main-repeats", type=int, default=None,
                    help="main-job runs, cold and warm each (default 3; --quick 1)")
    ap.add_argument("--samples", type=int, default=None, help="parity inputs per hop, per-target part (default 4; "
                                                              "--quick 2)")
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds per model (default 3, at least 2)")
    ap.add_argument("--main-only", action="store_true",
                    help="measure the main job (cold, warm, plain) and `vitedge models` only; keep the committed "
                         "per-target results and allocator study")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, per-target part (default 1: this box is "
                                                           "shared)")
    args = ap.parse_args(argv)
    samples = args.samples or (2 if args.quick else 4)
    main_repeats = args.main_repeats or (1 if args.quick else 3)
    if args.repeats < 2 or samples < 1 or main_repeats < 1:
        ap.error("--repeats must be >= 2 (a ratio needs pairs), --samples and --main-repeats >= 1")
    started = time.time()
    import torch

    info = _script.machine()
    _script.banner("export_time", info, args.quick)
    with tempfile.TemporaryDirectory(prefix="vitedge-export-time-") as tmp:
        main_job, main_job_warm, main_job_default_malloc, plain = jobs = run_main_job(
            args.quick, main_repeats, Path(tmp), allocator=not args.main_only)
        for m in jobs:
            if m is not None:
                print_main_job(m)
        if main_job_default_malloc is None:  # --main-only: the committed allocator study is kept
            kept = load("export_time.json")
            main_job_default_malloc, allocator = kept["main_job_default_malloc"], kept["allocator_ratio"]
        else:
            allocator = latency.paired_ratio(*([r["wall_s"] for r in m["runs"]] for m in (jobs[2], jobs[0])))
        against_plain = {f"{k}/plain{' (cpu)' if cpu else ''}": latency.paired_ratio(
            [r["cpu_s" if cpu else "wall_s"] for r in m["runs"]], [r["cpu_s" if cpu else "wall_s"] for r in plain["runs"]])
            for k, m in (("cold", main_job), ("warm", main_job_warm)) for cpu in (False, True)}
        models_cmd = time_models_command()
        print(f"\nvitedge models: median {models_cmd['median_s']:.2f} s over 3 fresh processes "
              f"({', '.join(f'{w:.2f}' for w in models_cmd['walls_s'])} s; {models_cmd['rows']} models)", flush=True)
        ct_import = time_coremltools_import(1 if args.quick else IMPORT_PAIRS)
        imp_s = ct_import["median_s"]
        print(f"coremltools' first import in a fresh process: as installed median {imp_s['installed']:.2f} s, "
              f"the CLI's (lean) {imp_s['lean']:.2f} s", flush=True)

        if args.main_only:  # the per-target part of the committed results, kept with its own provenance
            kept = load("export_time.json")
            runs = [tuple(r) for r in RUNS if r[0] in kept["settings"]["runs"]]
            unavailable, missing, results = kept["unavailable"], kept["missing"], kept["models"]
            per_target_measured = kept.get("per_target_measured") or {
                "date": kept["machine"]["date"], "cpu": kept["machine"]["cpu"], "command": kept["command"],
                "load_note": kept["machine"]["load_note"]}
            samples, args.repeats, args.threads = (kept["settings"][k] for k in ("samples", "repeats", "torch_threads"))
    if not args.main_only:
        per_target_measured = None
        with tempfile.TemporaryDirectory(prefix="vitedge-export-time-") as tmp:
            torch.set_num_threads(args.threads)
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
            print(f"\nper target ({samples} parity samples, {args.repeats} interleaved rounds):", flush=True)
            if not args.quick:
                # Pay the process-wide imports (coremltools, onnxsim, the MIL interpreter) once, on a tiny model
                # (--quick skips this: its first round includes them).
                for label, t, p in runs:
                    pipeline_call("swiftformer_xs", t, p, _corpus.REDUCED["swiftformer_xs"], 64, 1, Path(tmp), [])()
            results = [measure_model(m, runs, args.quick, samples, args.repeats, Path(tmp)) for m in models]
    body = {"settings": {"samples": samples, "pipeline_default_samples": DEFAULT_SAMPLES, "repeats": args.repeats,
                         "main_repeats": main_repeats, "torch_threads": args.threads, "runs": [r[0] for r in runs]},
            "main_job": main_job, "main_job_warm": main_job_warm,
            "main_job_default_malloc": main_job_default_malloc, "allocator_ratio": allocator,
            "main_job_plain": plain, "against_plain": against_plain,
            "targets": {"ratio_at_most": TARGET_RATIO, "cold_at_most_s": TARGET_COLD_S,
                        "ratio_met": against_plain["cold/plain"]["ci"][1] <= TARGET_RATIO,
                        "cold_s": main_job["wall_median_s"], "cold_met": main_job["wall_median_s"] <= TARGET_COLD_S},
            "per_target_measured": per_target_measured,
            "models_command": models_cmd, "coremltools_import": ct_import,
            "unavailable": unavailable, "missing": missing, "models": results}
    path = _script.write_results(_script.out_path("export_time", args), "export_time", info, args, body, started)
    print(f"\nresults: {path}\n{info['load_note']}")
    print(f"\nmain job, cold: glibc's default allocator / the command's own setting (exporter/core/allocator.py): "
          f"{_stats.fmt_ratio(allocator)}")
    print(f"coremltools' first import: as installed / the CLI's lean import: {_stats.fmt_ratio(ct_import['ratio'])}")
    print(f"\nratios (pipeline wall time relative to the onnx fp32 pipeline, {samples} parity samples):")
    for label, why in unavailable.items():
        print(f"  {label}: unavailable ({why})")
    _stats.print_ratios(results, "ratios")
    t = body["targets"]
    print(f"\nthe main job against the plain conversions ({PLAIN_COMMAND}; plain median {plain['wall_median_s']:.1f} s, "
          f"{plain['cpu_median_s']:.1f} CPU s):")
    for key, q in against_plain.items():
        print(f"  {key}: {_stats.fmt_ratio(q)}")
    print(f"target: cold/plain <= {TARGET_RATIO} with its CI: {'met' if t['ratio_met'] else 'NOT met'}; cold "
          f"{main_job['wall_median_s']:.1f} s <= {TARGET_COLD_S:g} s: {'met' if t['cold_met'] else 'NOT met'} "
          f"({info['load_note']})")
    return 0


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def _last_hop(t: dict) -> str:
    h = t["hops"][-1]
    return f"{h['hop']} {h['status']} ({h['mode']})"


def export_time_targets() -> str:
    """Per model and target: wall time (median of the rounds), the target's hop, the ratio to the onnx pipeline."""
    d = load("export_time.json")
    rows = []
    for m in d["models"]:
        for key, t in m["targets"].items():
            r = m["ratios"].get(f"{key}/onnx")
            rows.append([m["model"], key, f"{t['wall']['p50_ms'] / 1000:.2f}",
                         ", ".join(f"{w:.2f}" for w in t["walls_s"]),
                         _last_hop(t), ratio(r) if r else "1 (baseline)"])
    s, kept = d["settings"], d.get("per_target_measured")
    when = (f"{utc(kept['date'])}, {kept.get('cpu', 'CPU not recorded')} (the last full run; "
            f"`--main-only` keeps it)" if kept else run_line(d))
    intro = (f"Run: {when}; {s['samples']} parity samples per hop, {s['repeats']} interleaved rounds per model, "
             f"torch {s['torch_threads']} thread(s).")
    unavailable = "".join(f"\n\n- **{k}: unavailable here** — {v}" for k, v in d.get("unavailable", {}).items())
    return intro + unavailable + "\n\n" + table(["model", "target", "wall s (median)", "rounds (s)", "target hop",
                                                  "vs onnx fp32"], rows)


def export_time_stages() -> str:
    """Median seconds of each pipeline step, per model and target (the pipeline's own progress steps)."""
    d = load("export_time.json")
    cols = [(m["model"], key, t["steps_s"]) for m in d["models"] for key, t in m["targets"].items()]
    stages: list[str] = []
    for _, _, steps in cols:
        stages += [s for s in steps if s not in stages]
    rows = [[st] + [f"{steps[st]:.2f}" if st in steps else "" for _, _, steps in cols] for st in stages]
    return table(["stage"] + [f"{m} {k}" for m, k, _ in cols], rows)


def export_time_summary() -> str:
    """The per-target figures of export_time.json in one sentence (the summary quotes it)."""
    d = load("export_time.json")
    onnx = [m["targets"]["onnx"]["wall"]["p50_ms"] / 1000 for m in d["models"]]
    gate = [t["steps_s"]["equivalence gate (float64)"] for m in d["models"] for t in m["targets"].values()]

    def span(key: str) -> str:
        r = [m["ratios"][f"{key}/onnx"]["ratio"] for m in d["models"] if f"{key}/onnx" in m["ratios"]]
        return f"{min(r):.2f}–{max(r):.2f}×"
    return (f"With {d['settings']['samples']} parity samples the onnx pipeline takes "
            f"{min(onnx):.1f}–{max(onnx):.1f} s "
            f"per model, onnx fp16 {span('onnx-fp16')} that, coreml {span('coreml')} (the coremltools conversion "
            f"dominates); the float64 equivalence gate is the largest fixed stage "
            f"({min(gate):.1f}–{max(gate):.1f} s).")


def _runs(job: dict) -> str:
    return ", ".join(f"{r['wall_s']:.1f}" for r in job["runs"])


def export_main_job() -> str:
    """The README's main job, cold and warm, from export_time.json."""
    d = load("export_time.json")
    cold, warm = d["main_job"], d["main_job_warm"]
    return (f"**the main job takes {cold['wall_median_s']:.1f} s on a first export** (median of {len(cold['runs'])} "
            f"fresh processes with an empty ground-truth cache: {_runs(cold)} s) and **{warm['wall_median_s']:.1f} s "
            f"when re-exporting the same weights** (the cache holds their float64 ground truth: {_runs(warm)} s, "
            f"interleaved with the cold runs)")


def export_allocator() -> str:
    """The cold main job with glibc's default allocator, over the command's own setting, and which run measured it
    (a --main-only run keeps the full run's)."""
    d = load("export_time.json")
    kept = d.get("per_target_measured")
    when = (f"measured in the full run of {utc(kept['date'])}, which `--main-only` keeps"
            if kept else "interleaved in the same run")
    return f"**{ratio(d['allocator_ratio'])}** as long ({d['main_job_default_malloc']['wall_median_s']:.1f} s; {when})"


def _main_job_conditions(d: dict) -> str:
    """When, where and under what load the main job's series ran: date, machine, the 1-min load before each run."""
    loads = [x for k in ("main_job", "main_job_warm", "main_job_plain") for r in d[k]["runs"]
             for x in (r["load_before"] or [])[:1]]
    m = d["machine"]
    return f"{utc(m['date'])}, {m['cpu']}, {m['cores']} cores, 1-min load {min(loads):.1f}–{max(loads):.1f}"


def export_time_run(name: str = "export_time.json") -> str:
    """Which run measured the main job: date, machine, load (a saved run's JSON by `name`)."""
    return f"`benchmarks/results/{name}`, {_main_job_conditions(load(name))}"


def export_cold_phases(name: str = "export_time.json") -> str:
    """The cold main job's largest phases (medians), and the imports after the largest."""
    job = load(name)["main_job"]
    first, *rest = [f"{p['phase']} {p['median_s']:.1f} s" for p in
                    sorted((p for p in job["phases"] if p["kind"] == "step"), key=lambda p: -p["median_s"])[:3]]
    return ", ".join([first, f"imports {job['imports_median_s']:.1f} s", *rest])


def export_coremltools_import(name: str = "export_time.json") -> str:
    """coremltools' first import, as installed and as the command makes it (lean)."""
    imp = load(name)["coremltools_import"]
    m = imp["median_s"]
    return (f"{m['installed']:.1f} s as installed against {m['lean']:.1f} s as the command imports it, "
            f"**{ratio(imp['ratio'])}**")


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _targets(t: dict) -> str:
    """The main job's two targets and whether a run met them (export_time.json's `targets`)."""
    return (f"≤ {t['ratio_at_most']:g} with its CI: {_met(t['ratio_met'])}; ≤ {t['cold_at_most_s']:g} s: "
            f"{_met(t['cold_met'])}")


def export_time_headline() -> str:
    """The README's headline: the main job, cold and warm, against the plain conversions, with the targets."""
    d = load("export_time.json")
    if "against_plain" not in d:
        return "The main job against the plain conversions: not measured in `export_time.json` yet."
    cold, warm, plain, q, t = d["main_job"], d["main_job_warm"], d["main_job_plain"], d["against_plain"], d["targets"]
    n = d["settings"].get("pipeline_default_samples")
    return (f"The README's main job (`{cold['command']}`{f', {n} parity inputs' if n else ''}) against the same "
            f"conversions done plainly "
            f"({plain['command']}: {plain['wall_median_s']:.1f} s), interleaved in fresh processes "
            f"(`benchmarks/export_time.py`, {_main_job_conditions(d)} during the runs): "
            f"cold {cold['wall_median_s']:.1f} s, **{ratio(q['cold/plain'])}** the plain time "
            f"(target {_targets(t)}); re-exporting the same weights {warm['wall_median_s']:.1f} s, "
            f"{ratio(q['warm/plain'])}. In CPU seconds (less sensitive to other processes): cold "
            f"{ratio(q['cold/plain (cpu)'])}, warm {ratio(q['warm/plain (cpu)'])}.")


def export_time_brief(name: str) -> str:
    """Another machine's run of the main job against the plain conversions (a saved export_time JSON), in one
    sentence: the 20 s target is a wall time, so it depends on the CPU as much as on vitedge."""
    d = load(name)
    cold, plain, q, t = d["main_job"], d["main_job_plain"], d["against_plain"], d["targets"]
    return (f"{export_time_run(name)}: the plain conversions "
            f"{plain['wall_median_s']:.1f} s, the main job cold {cold['wall_median_s']:.1f} s, "
            f"**{ratio(q['cold/plain'])}** the plain time ({_targets(t)})")


def export_time_machines(*names: str) -> str:
    """The main job against the plain conversions in several saved runs, a column each (the same code on two CPUs)."""
    runs = [load(n) for n in names]

    def row(label: str, cell) -> list[str]:
        return [label] + [cell(d) for d in runs]
    return table([""] + [f"{d['machine']['cpu']}, {utc(d['machine']['date'])}" for d in runs], [
        row("the plain conversions, wall (of it imports)",
            lambda d: f"{d['main_job_plain']['wall_median_s']:.1f} s ({d['main_job_plain']['imports_median_s']:.1f} s)"),
        row("the main job cold, wall / CPU s",
            lambda d: f"{d['main_job']['wall_median_s']:.1f} s / {d['main_job']['cpu_median_s']:.1f}"),
        row("cold / plain, wall", lambda d: ratio(d["against_plain"]["cold/plain"])),
        row("cold / plain, CPU s", lambda d: ratio(d["against_plain"]["cold/plain (cpu)"])),
        row(f"cold ≤ {runs[0]['targets']['cold_at_most_s']:g} s", lambda d: _met(d["targets"]["cold_met"])),
    ])


TABLES = {
    "export_time_headline": export_time_headline,
    "export_time_brief": export_time_brief,
    "export_time_machines": export_time_machines,
    "export_time_targets": export_time_targets,
    "export_time_stages": export_time_stages,
    "export_time_summary": export_time_summary,
    "export_main_job": export_main_job,
    "export_allocator": export_allocator,
    "export_time_run": export_time_run,
    "export_cold_phases": export_cold_phases,
    "export_coremltools_import": export_coremltools_import,
}


if __name__ == "__main__":
    raise SystemExit(main())
