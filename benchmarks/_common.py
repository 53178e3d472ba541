"""Shared pieces of the benchmark scripts: the command line, interleaved timing, paired speedups with
confidence intervals, ONNX builds, the machine description and the JSON results.

Timing and statistics are the project's own (`vitedge.exporter.timing.latency`): every script times its
candidates *interleaved* in rounds, so load from other processes hits all of them alike, and reports
ratios of medians with a paired bootstrap interval. The scripts run as `python benchmarks/NAME.py`.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import io
import json
import math
import os
import platform
import random
import subprocess
import sys
import time
import types
import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import torch
import torch.nn as nn

from vitedge.exporter.timing import latency
from vitedge.exporter.onnx.onnx_export import (DEFAULT_OPSET, INPUT_NAME, OUTPUT_NAME, check_onnx, export_onnx,
                                               node_counts, simplify_onnx)
from vitedge.exporter.verdict.criteria import GroundTruth
from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, compute_metrics, ground_truth, judge, tolerances
from vitedge.models.flops import model_macs
from vitedge.targets.onnx.target import OnnxRuntimeRunner

RESULTS = Path(__file__).resolve().parent / "results"

# Reduced configurations (the test suite's: golden-fixture sized) for --quick and for time-short runs.
REDUCED = {
    "swiftformer_xs": dict(layers=[1, 1, 2, 1], embed_dims=[16, 24, 32, 48], num_classes=10),
    "slab_deit_tiny": dict(embed_dim=64, depth=2, num_heads=2, num_classes=10),
    "sima_nano_12_p16": dict(embed_dim=32, depth=2, num_heads=1, num_classes=10),
    "slab_swin_tiny": dict(embed_dim=16, depths=[1, 1, 2, 1], num_heads=[1, 2, 4, 8], mlp_ratio=2.0,
                           num_classes=10, drop_path_rate=0.0),
}


# ---- command line -----------------------------------------------------------------------------------

def parser(script: str, doc: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"benchmarks/{script}.py", description=doc.strip().splitlines()[0])
    p.add_argument("--quick", action="store_true", help="reduced configs and a few rounds (seconds; the smoke test)")
    p.add_argument("--out", type=Path, default=None,
                   help=f"JSON results file (default benchmarks/results/{script}.json; --quick: {script}.quick.json)")
    return p


def out_path(script: str, args: argparse.Namespace) -> Path:
    return args.out or RESULTS / (f"{script}.quick.json" if args.quick else f"{script}.json")


# ---- the machine --------------------------------------------------------------------------------------

def cpu_model() -> str:
    """`lscpu`'s model name (platform.processor() is empty on most Linux hosts)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return platform.processor() or platform.machine()


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def machine() -> dict:
    import onnxruntime

    cores = os.cpu_count() or 1
    return {"cpu": cpu_model(), "cores": cores, "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "load_start": load_average()}


def load_note(info: dict) -> str:
    """Whether other processes were competing for the cores (1-minute load average vs core count)."""
    loads = [info.get("load_start"), info.get("load_end")]
    worst = max((lv[0] for lv in loads if lv), default=0.0)
    if worst > 0.5 * info["cores"]:
        return (f"machine busy (1-min load average up to {worst:.1f} on {info['cores']} cores): absolute timings are "
                "inflated and noisy; the interleaved ratios and their CIs are the figures to read")
    return f"machine quiet (1-min load average up to {worst:.1f} on {info['cores']} cores)"


def describe_machine(info: dict) -> str:
    return f"{info['cpu']}, {info['cores']} cores, {info['platform']}, torch {info['torch']}, ORT {info['onnxruntime']}"


# ---- timing and ratios --------------------------------------------------------------------------------

def time_rounds(fns: dict[str, Callable[[], object]], min_rounds: int, max_s: float) -> dict[str, list[float]]:
    """Interleaved rounds (A, B, C, A, B, C, ...) after a short warm-up: at least `min_rounds`, until `max_s`."""
    return latency.time_interleaved(fns, warmup_s=min(0.2, max_s), min_iters=min_rounds, max_s=max_s)


def time_blocks(fns: dict[str, Callable[[], object]], rounds: int, block_s: float,
                seed: int = 0) -> dict[str, list[float]]:
    """Interleaved *blocks*: per round, each candidate runs back to back for at least `block_s` (and at least
    two calls); the median of the block's second half is that round's time (paired across candidates).

    For multi-thread ONNX Runtime sessions: each session owns a thread pool whose idle workers spin, and
    alternating sessions call by call makes them compete for the cores (measured: benchmarks/README.md, method
    notes)."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(fns)
        rng.shuffle(order)  # as latency.time_interleaved: where a candidate falls in the order shifts its time
        for k in order:
            f = fns[k]
            ts, end = [], time.perf_counter() + block_s
            while len(ts) < 2 or time.perf_counter() < end:
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
            out[k].append(float(np.median(ts[len(ts) // 2:])))
    return out


def time_until_precise(fns: dict[str, Callable[[], object]], pairs: list[tuple[str, str]], min_rounds: int,
                       max_s: float, ci_width: float, block_s: float = 0.0,
                       min_s: float = 0.0) -> dict[str, list[float]]:
    """Interleaved rounds (call by call, or blocks of `block_s` with `time_blocks`) until every (new, base)
    speedup's 95 % CI is at most `ci_width` wide (relative to the ratio), or `max_s` has passed; at least
    `min_rounds` and `min_s` (so that a cell spans more than a passing moment of the machine).

    The stopping rule looks at the interval's width only, never at where it lies, so it cannot steer a ratio
    towards a threshold; it spends rounds where the machine is noisy instead of reporting an interval too
    wide to say anything."""
    def rounds(n: int, warmup_s: float, seed: int) -> dict[str, list[float]]:
        # `seed`: the rounds done so far, so that every batch of rounds gets orders of its own
        if block_s > 0:
            return time_blocks(fns, n, block_s, seed=seed)  # the first half of every block is its own warm-up
        return latency.time_interleaved(fns, warmup_s=warmup_s, min_iters=n, max_s=0.0, seed=seed)

    start = time.perf_counter()
    times = rounds(min_rounds, min(0.2, max_s), 0)
    while time.perf_counter() - start < max(max_s, min_s):
        widths = [_rel_width(speedup(times[base], times[new])) for new, base in pairs]
        if all(w <= ci_width for w in widths) and time.perf_counter() - start >= min_s:
            break
        # grow by half each time (few bootstrap checks), but not far past the time budget
        done, elapsed = len(next(iter(times.values()))), time.perf_counter() - start
        n = max(1, min(max(min_rounds, done // 2), math.ceil((max(max_s, min_s) - elapsed) * done / elapsed)))
        for k, v in rounds(n, 0.0, done).items():
            times[k] += v
    return times


def _rel_width(r: dict) -> float:
    return (r["ci"][1] - r["ci"][0]) / r["ratio"]


def stats(times_s: list[float], batch: int = 1) -> dict:
    return latency.summarize(times_s, batch=batch).to_dict()


def speedup(base_s: list[float], new_s: list[float]) -> dict:
    """How many times faster `new` is than `base`: median(base) / median(new), paired bootstrap CI."""
    return latency.paired_ratio(base_s, new_s)


def fmt_ratio(r: dict, unit: str = "x") -> str:
    return f"{r['ratio']:.3f}{unit} (95% CI {r['ci'][0]:.3f}-{r['ci'][1]:.3f}, {r['pairs']} pairs)"


def print_ratios(results: list[dict], field: str) -> None:
    """The closing lines of a script: each model's ratios in `field` (name -> paired ratio), one per line."""
    for r in results:
        for key, q in r[field].items():
            print(f"  {r['model']} ({r['config']}) {key}: {fmt_ratio(q)}")


# ---- models and ONNX ----------------------------------------------------------------------------------

def gflop(name: str, imgsz: int, overrides: dict | None = None) -> float:
    """GFLOP of one image: 2 x the model's MACs (matmul, conv, linear; vitedge.models.flops)."""
    return 2.0 * model_macs(name, imgsz, **(overrides or {})) / 1e9


def onnx_image_model(model: nn.Module, imgsz: int, batch: int) -> onnx.ModelProto:
    """The project's ONNX path for image models: TorchScript export, checker, onnxsim (static batch)."""
    return simplify_onnx(check_onnx(export_onnx(model, imgsz, batch=batch)))


def onnx_token_model(module: nn.Module, example: torch.Tensor) -> onnx.ModelProto:
    """A (B, N, C) -> (B, N, C) layer through the same export, checker and onnxsim steps.

    The graph reuses the image graph's tensor names so the project's checker and simplifier accept it.
    """
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (example,), buf, dynamo=False, input_names=[INPUT_NAME],
                          output_names=[OUTPUT_NAME], opset_version=DEFAULT_OPSET, do_constant_folding=True)
    return simplify_onnx(check_onnx(onnx.load_from_string(buf.getvalue())))


def ort(model: onnx.ModelProto, threads: int, spinning: bool | None = None) -> OnnxRuntimeRunner:
    """ONNX Runtime CPU session; threads=0 lets ORT use every core; spinning None = ORT's default (on)."""
    return OnnxRuntimeRunner(model, threads=threads, spinning=spinning)


class Alternating:
    """Several sessions of one graph behind one `run`, used in turn, call by call: a candidate's time is then an
    average over where its sessions landed in memory rather than one placement's luck."""

    def __init__(self, runners: list):
        self.runners, self.calls = runners, 0

    def run(self, x: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self.runners[self.calls % len(self.runners)].run(x)


def ort_sessions(graphs: dict[str, onnx.ModelProto], threads: int, spinning: bool | None = None, seed: int = 0,
                 copies: int = 1) -> dict[str, OnnxRuntimeRunner | Alternating]:
    """`ort` for each graph (`copies` sessions of each behind an `Alternating`), created in a seeded random order
    and returned in the given key order. Identical sessions of one graph differed by up to 2.6 % in speed (A/A tests
    here: benchmarks/README.md, method notes), by when and where they were created; shuffling the creation order
    and alternating copies keeps that from favouring one candidate."""
    order = [(k, i) for k in graphs for i in range(copies)]
    random.Random(seed).shuffle(order)
    made: dict[str, list] = {k: [] for k in graphs}
    for k, _ in order:
        made[k].append(ort(graphs[k], threads, spinning))
    return {k: v[0] if copies == 1 else Alternating(v) for k, v in made.items()}


def total_nodes(model: onnx.ModelProto) -> dict:
    counts = node_counts(model)
    return {"total": int(sum(counts.values())), "by_op": counts}


def ground_truth_on(train: nn.Module, x: np.ndarray) -> GroundTruth:
    """The train-form's float64 ground truth (and per-sample float32 noise) on `x`, judged as one stress set: what
    the pipeline judges every hop against (exporter/verdict/parity.py)."""
    return ground_truth(train, np.ascontiguousarray(x, np.float32), ("stress",) * len(x))


def parity_problems(reference, candidate: np.ndarray) -> list[str]:
    """Empty when `candidate` passes. `reference` a GroundTruth: the pipeline's fp32 rule against float64 (the
    per-sample noise rule, so a correct graph of a chaotic model passes); plain float32 logits: the fp32 metric
    profile against them (comparing candidates that should agree, e.g. attention orders)."""
    if isinstance(reference, GroundTruth):
        return judge(reference, np.asarray(candidate), FLOAT64_TOLERANCES["fp32"])[2]
    return tolerances()["fp32"].violations(compute_metrics(reference, candidate))


def gemm_fn(n: int) -> tuple[Callable[[], object], float]:
    """An fp32 n x n x n torch matmul and its GFLOP: the machine's compute ceiling (single-thread once the
    caller has set `torch.set_num_threads(1)`, as deploy_speed.py does)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)

    def run():
        torch.mm(a, b, out=out)
    return run, 2.0 * n ** 3 / 1e9


def import_timm() -> tuple[types.ModuleType | None, str | None]:
    """(timm, None), or (None, why not): through tests/_timm.py's torchvision workaround (timm is test-only)."""
    try:
        import pytest

        from vitedge.tests._timm import import_timm as _import
    except ImportError as e:
        return None, f"the test helpers are not importable ({e})"
    try:
        return _import(), None
    except pytest.skip.Exception as e:
        return None, str(e.msg if hasattr(e, "msg") else e)


# ---- results ------------------------------------------------------------------------------------------

def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {str(k): _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, np.generic):
        return _finite(o.item())
    return o


def write_results(path: Path, script: str, info: dict, args: argparse.Namespace, body: dict,
                  started: float) -> Path:
    info["load_end"] = load_average()
    info["load_note"] = load_note(info)
    data = {"script": script, "quick": bool(args.quick), "machine": info, "wall_s": round(time.time() - started, 1),
            "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), **body}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_finite(data), indent=1, allow_nan=False) + "\n")
    return path


def begin(script: str, quick: bool, threads: int | None = 1) -> tuple[float, dict]:
    """Every script's opening: its start time, torch's intra-op threads (`threads`; None leaves them), the machine
    and its load (`machine`), printed as the first line (`banner`). Returns (started, machine info)."""
    started = time.time()
    if threads is not None:
        torch.set_num_threads(threads)
    info = machine()
    banner(script, info, quick)
    return started, info


def banner(script: str, info: dict, quick: bool) -> None:
    print(f"{script}{' (--quick)' if quick else ''} on {describe_machine(info)}; "
          f"load average {info['load_start']}", flush=True)


# ---- trained weights cached outside the repository ----------------------------------------------------

TRAINED_CACHE = Path.home() / ".cache" / "vitedge" / "trained"   # scripts/train_reference.py --out
def plant_counts(rows: list[dict]) -> dict:
    """The verdict studies' count of one kind of plant over its rows (each with `caught`, `caught_by_outputs`,
    `visible`): caught, of, caught by the outputs alone, and missed though visible in the outputs."""
    return {"caught": sum(r["caught"] for r in rows), "of": len(rows),
            "caught_by_outputs": sum(r["caught_by_outputs"] for r in rows),
            "visible_missed": sum(r["visible"] and not r["caught"] for r in rows)}


# the full-size trained corpus (scripts/train_reference.py's full-size table), all on digits at 64 px: SwiftFormer-XS,
# SLAB-DeiT-T (default config), SLAB-DeiT (depth 6, patch 8), SimA-Nano (p16) and PRepBN-PVT-Tiny
TRAINED_FULL = ("swiftformer_xs_digits64", "slab_deit_tiny_digits64", "slab_deit_digits64", "sima_nano_digits64",
                "prepbn_pvt_digits64")


def measured_per_model(measures: dict[str, Callable[[], list]], partial: Path, only: str | None) -> tuple[list, list]:
    """(every model's rows, in model order; the models not measured yet). A model's rows come from
    `partial`/NAME.json where an earlier run (stopped, or given `--models`) measured it, else from its measure,
    called when `only` (comma-separated names) selects it or is None, and kept there at once. The caller removes
    `partial` once nothing is missing."""
    partial.mkdir(parents=True, exist_ok=True)
    rows, missing = [], []
    for name, measure in measures.items():
        done = partial / f"{name}.json"
        if not done.is_file() and (only is None or name in only.split(",")):
            done.write_text(json.dumps(measure()))
        if done.is_file():
            rows += json.loads(done.read_text())
        else:  # what these rows lack (another run may be measuring it now)
            missing.append(name)
    return rows, missing


def cached_trained(name: str) -> tuple[nn.Module, int] | None:
    """(the trained train-form model, its image size) of a full-size reference cached by scripts/train_reference.py,
    or None when it is not cached here."""
    import vitedge

    if not (TRAINED_CACHE / f"{name}.pth").is_file():
        return None
    man = json.loads((TRAINED_CACHE / "manifest.json").read_text())["models"][name]
    model = vitedge.create_model(man["model"], **man["overrides"])
    vitedge.load_checkpoint(model, TRAINED_CACHE / f"{name}.pth", strict=True)
    return model.eval(), man["imgsz"]
