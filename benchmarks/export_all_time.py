"""Wall time of `vitedge export --model NAME --target onnx` with default settings, for every registered model.

Issue 17's target: every registered model exports with default settings in <= 5 minutes on the 2-core development
machine. Each export runs as a user runs it: a fresh process, the default parity set (its size by the GMACs rule,
exporter/verdict/parity_cost.py), and an empty float64 ground-truth cache (a first export of those weights: the cache would
only make a re-export faster). Smallest model first; the JSON is rewritten after each model, with the 1-min load
average before and after every export, the parity sample count, exit code and each pipeline step's seconds (from
the progress lines). The summary printed last: the slowest exports and how many are within the target.

    python benchmarks/export_all_time.py [--quick] [--models a,b] [--update] [--compare REV] [--out FILE]

--quick: two reduced configs at 64 px with 8 samples (the smoke test), not a result to quote.
--update: re-measure only --models and keep the other rows of the existing results file.
--compare REV [--update]: before and after in one run: every model exported by the code committed at REV and at HEAD (each
unpacked with `git archive` and imported ahead of the installed vitedge), the two exports of a model back to back
in alternating order, into export_all_time_compare.json (rewritten after each model; the models in an order whose every
prefix spans their sizes, so that an interrupted run is still a spread sample). Printed last: the median and the slowest model's time on
each side, and the ratio of the medians (before / after) with a bootstrap interval over the models, paired. With
--update, the --out file of an interrupted --compare run is resumed: its rows are kept, the commit its after side
measured is measured again (not today's HEAD), only the models it lacks are exported, and its earlier sessions'
machine records are kept beside this one's (`earlier_sessions`).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _corpus
import _graphs
import _script
from _stats import fmt_ratio, speedup
from _tables import load, ratio, run_line, utc
from vitedge.exporter.timing.latency import bootstrap_ci
from vitedge.models import get_spec, list_models

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 300.0
QUICK_MODELS = ("swiftformer_xs", "sima_nano_12_p16")
QUICK_ARGS = ["--imgsz", "64", "--samples", "8"]


def export_once(name: str, tmp: Path, quick: bool, imgsz: str | None = None, code: Path | None = None) -> dict:
    """One `vitedge export --model NAME --target onnx` in a fresh process with an empty ground-truth cache (at
    `imgsz` when given, else the model's default size), importing vitedge from `code` when given (source_tree)."""
    out, cache = tmp / name, tmp / f"cache-{name}"
    argv = [sys.executable, "-m", "vitedge.cli", "export", "--model", name, "--target", "onnx", "--out", str(out)]
    if quick:
        argv += QUICK_ARGS + _script.set_flags(_corpus.REDUCED[name])
    if imgsz:
        argv += ["--imgsz", imgsz]
    env = {**os.environ, "VITEDGE_CACHE_DIR": str(cache), **({"PYTHONPATH": str(code)} if code else {})}
    env.pop("VITEDGE_TRUTH_CACHE", None)
    load_before = _script.load_average()
    t0 = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    steps = _script.cli_steps(p.stderr)
    return {"model": name, "imgsz": report.get("imgsz"), "exit_code": p.returncode, "wall_s": round(wall, 1),
            "load_before": load_before,
            "load_after": _script.load_average(), "samples": report.get("samples"),
            "samples_rule": report.get("samples_rule"),
            "status": report.get("status"), "cache": ((report.get("reference") or {}).get("cache") or {}).get("status"),
            "hops": {h["hop"]: {"status": h["status"], "samples": h["samples"], "seconds": h["seconds"]}
                     for h in report.get("parity", [])},
            "steps_s": steps, "error": None if p.returncode in (0, 1) else p.stderr.strip().splitlines()[-1:]}


def settings(args) -> dict:
    """The export command every row ran, as the results file records it (both modes)."""
    return {"command": "vitedge export --model NAME --target onnx --out DIR" +
            (" " + " ".join(QUICK_ARGS) + " --set (reduced config)" if args.quick else "") +
            (f" --imgsz {args.imgsz}" if args.imgsz else ""), "imgsz": args.imgsz,
            "truth_cache": "empty (cold) per export"}


def commit_of(rev: str) -> str:
    """The full hash of the commit `rev` names; exits with a one-line message where it names none."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, capture_output=True,
                            text=True)
    if commit.returncode != 0:
        raise SystemExit(f"--compare {rev}: not a commit of this repository ({commit.stderr.strip()})")
    return commit.stdout.strip()


def source_tree(rev: str, into: Path) -> dict:
    """The tree committed at `rev`, unpacked as `into`/vitedge: a process with PYTHONPATH=`into` imports that code
    ahead of the installed (editable) vitedge, which a fresh interpreter checks. {"rev", "commit", "path"}."""
    sha, pkg = commit_of(rev), into / "vitedge"
    pkg.mkdir(parents=True)
    tree = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=tree, check=True)
    where = subprocess.run([sys.executable, "-c", "import vitedge; print(vitedge.__file__)"], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(into)}).stdout.strip()
    if not where or Path(where).resolve().parent != pkg.resolve():
        raise SystemExit(f"the code of {rev} unpacked in {pkg} is not what a fresh process imports ({where!r})")
    return {"rev": rev, "commit": sha, "path": into}


def spread(names: list[str]) -> list[str]:
    """`names` (smallest first) in an order whose every prefix spans their sizes: the largest, the smallest, then
    midpoints by bisection. A --compare run stopped early still holds the slowest model and a spread of the rest."""
    order, intervals = [len(names) - 1, 0][:len(names)], [(0, len(names) - 1)]
    while intervals:
        lo, hi = intervals.pop(0)
        if hi - lo >= 2:
            mid = (lo + hi) // 2
            order.append(mid)
            intervals += [(lo, mid), (mid, hi)]
    return [names[i] for i in order]


def resumed(path: Path, rev: str) -> tuple[dict, str, list]:
    """--compare --update: the rows of an interrupted run's file, the commit its after side measured (the resumed
    run measures the same code, whatever HEAD is now) and its earlier sessions' machine records."""
    old = json.loads(path.read_text())
    if old["revisions"]["before"]["commit"] != commit_of(rev):
        raise SystemExit(f"--update: {path} compared against {old['revisions']['before']['commit'][:10]}, not {rev}")
    earlier = old.get("earlier_sessions", []) + [{k: old[k] for k in ("machine", "wall_s", "command")} |
                                                 {"models": [r["model"] for r in old["after"]]}]
    return {side: old[side] for side in ("before", "after")}, old["revisions"]["after"]["commit"], earlier


def compare(names: list[str], rev: str, args, info: dict, started: float) -> None:
    """--compare: each model exported by the code at `rev` (before) and at HEAD (after), back to back, the models
    in `spread` order. With --update, an interrupted run's file is resumed: its rows kept, its after commit
    measured again in place of HEAD, and only the models it lacks exported."""
    names = spread(names)
    path = Path(args.out or _script.RESULTS / f"export_all_time_compare{'.quick' if args.quick else ''}.json")
    rows, after, earlier = {"before": [], "after": []}, "HEAD", []
    if args.update and path.is_file():
        rows, after, earlier = resumed(path, rev)
    done = {r["model"] for r in rows["after"]}
    with tempfile.TemporaryDirectory(prefix="vitedge-export-compare-") as tmp:
        code = {side: source_tree(r, Path(tmp) / side) for side, r in (("before", rev), ("after", after))}
        for i, name in enumerate(names):
            if name in done:
                continue
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):  # neither always first
                rows[side].append(export_once(name, Path(tmp) / f"out-{side}", args.quick, args.imgsz,
                                              code[side]["path"]))
            body = {"settings": {**settings(args),
                                 "order": "models in spread order (the largest, the smallest, then bisection); "
                                          "before and after alternate which goes first"},
                    "revisions": {side: {k: c[k] for k in ("rev", "commit")} for side, c in code.items()},
                    **rows, "complete": len(rows["after"]) == len(list_models()),
                    "summary": compare_summary(rows), **({"earlier_sessions": earlier} if earlier else {})}
            _script.write_results(path, "export_all_time", dict(info), args, body, started)
            b, a = rows["before"][-1], rows["after"][-1]
            print(f"{name:20s} before {b['wall_s']:7.1f} s (exit {b['exit_code']})  after {a['wall_s']:7.1f} s "
                  f"(exit {a['exit_code']})  {a['samples']} samples  (1-min load {b['load_before'][:1]})", flush=True)
    s = compare_summary(rows)
    print(f"\nresults: {path}\n")
    for side in ("before", "after"):
        q = s[side]
        print(f"{side} ({code[side]['commit'][:10]}): median {q['median_s']:.1f} s, slowest {q['slowest']['model']} "
              f"{q['slowest']['wall_s']:.1f} s, {q['exit_0']}/{q['models']} exit 0")
    print("\nratios (before / after; > 1: the export got faster):")
    print(f"  median model's time: {fmt_ratio(s['median_ratio'])}")
    print(f"  per model, median of the ratios: {s['per_model_median']:.3f}x (95% CI {s['per_model_ci'][0]:.3f}-"
          f"{s['per_model_ci'][1]:.3f}, {s['median_ratio']['pairs']} models)")


def compare_summary(rows: dict) -> dict:
    """Each side's median and slowest export, and before / after over the models measured on both sides."""
    def side(rs):
        worst = max(rs, key=lambda r: r["wall_s"])
        return {"models": len(rs), "exit_0": sum(r["exit_code"] == 0 for r in rs),
                "median_s": round(statistics.median(r["wall_s"] for r in rs), 1),
                "slowest": {"model": worst["model"], "wall_s": worst["wall_s"]}}

    before, after = [r["wall_s"] for r in rows["before"]], [r["wall_s"] for r in rows["after"]]
    per_model = [b / a for b, a in zip(before, after)]
    return {"before": side(rows["before"]), "after": side(rows["after"]), "median_ratio": speedup(before, after),
            "per_model_median": statistics.median(per_model), "per_model_ci": list(bootstrap_ci(per_model)),
            "per_model": {r["model"]: round(q, 3) for r, q in zip(rows["after"], per_model)}}


def main() -> None:
    p = _script.parser("export_all_time", __doc__)
    p.add_argument("--models", default=None, help="comma-separated model names (default: all registered)")
    p.add_argument("--update", action="store_true", help="re-measure --models only; keep the other rows (with "
                   "--compare: resume the --out file's interrupted run)")
    p.add_argument("--imgsz", default=None,
                   help="export every model at this size (S or HxW, e.g. 256x320) instead of its default; write the "
                        "results to their own file (--out)")
    p.add_argument("--compare", default=None, metavar="REV",
                   help="before and after: every model exported by the code at REV and at HEAD, interleaved")
    args = p.parse_args()
    names = args.models.split(",") if args.models else list(QUICK_MODELS if args.quick else list_models())
    names.sort(key=lambda n: _graphs.gflop(n, 64, _corpus.REDUCED[n]) if args.quick
               else _graphs.gflop(n, get_spec(n).default_imgsz))
    info = _script.machine()
    _script.banner("export_all_time", info, args.quick)
    started = time.time()
    if args.compare:
        return compare(names, args.compare, args, info, started)
    path = Path(_script.out_path("export_all_time", args))
    kept = []
    if args.update and path.is_file():
        kept = [r for r in json.loads(path.read_text())["models"] if r["model"] not in names]
    rows = []
    with tempfile.TemporaryDirectory(prefix="vitedge-export-all-") as tmp:
        for name in names:
            r = export_once(name, Path(tmp), args.quick, args.imgsz)
            rows.append(r)
            every = sorted(kept + rows, key=lambda r: r["wall_s"])
            body = {"settings": {**settings(args), "target_s": TARGET_S},
                    "models": every, "complete": len(every) == (len(names) if args.quick else len(list_models()))}
            _script.write_results(path, "export_all_time", dict(info), args, body, started)  # survives an interruption
            print(f"{name:20s} exit {r['exit_code']}  {r['wall_s']:7.1f} s  {r['samples']} samples  "
                  f"(1-min load {r['load_before'][:1]} -> {r['load_after'][:1]})", flush=True)
    every = sorted(kept + rows, key=lambda r: -r["wall_s"])
    print(f"\nresults: {path} (1-min load average beside every export)")
    print(f"\nslowest exports (default settings, cold ground-truth cache; target {TARGET_S:.0f} s):")
    for r in every[:5]:
        print(f"  {r['model']:20s} {r['wall_s']:7.1f} s  exit {r['exit_code']}  {r['samples']} samples")
    within = sum(r["wall_s"] <= TARGET_S and r["exit_code"] == 0 for r in every)
    print(f"within {TARGET_S:.0f} s and exit 0: {within}/{len(every)}")


# ---- tables: what scripts/render_benchmarks.py writes into the READMEs and docs/ from this script's JSON ----


def export_all_time() -> str:
    """Every registered model's default export, from export_all_time.json."""
    d = load("export_all_time.json")
    ms = sorted(d["models"], key=lambda m: m["wall_s"])
    ok = [m for m in ms if m["exit_code"] == 0 and m["wall_s"] <= d["settings"]["target_s"]]
    rest, slow = ms[:-3], ms[-3:][::-1]
    return (f"**{len(ok)} of {len(ms)} exit 0 within {d['settings']['target_s'] / 60:g} minutes**: "
            f"{rest[0]['wall_s']:.0f}–{rest[-1]['wall_s']:.0f} s for {len(rest)} of them, median "
            f"{statistics.median(m['wall_s'] for m in ms):.0f} s; the slowest are "
            + ", ".join(f"{m['model']} {m['wall_s']:.0f} s" for m in slow))


def export_all_sizes() -> str:
    """Every registered model exported at a size other than its default (export_all_time_256x320.json)."""
    d = load("export_all_time_256x320.json")
    ms = d["models"]
    passed = [m for m in ms if m["exit_code"] == 0 and m["status"] == "passed"]
    failed = [f"{m['model']} (exit {m['exit_code']}: {(m['error'] or [m['status']])[0]})" for m in ms
              if m not in passed]
    scope = ("registered models" if d["complete"] else
             f"models measured (one or more per family; {len(list_models())} are registered)")
    return (f"**{len(passed)} of {len(ms)} {scope} export and pass every hop at "
            f"{d['settings']['imgsz']}** (`vitedge export --model NAME --target onnx --imgsz {d['settings']['imgsz']}`, "
            f"default settings, seeded demo weights, {d['machine']['date'][:10]}"
            + (f"; not passed: {', '.join(failed)}" if failed else "") + f"; median "
            f"{statistics.median(m['wall_s'] for m in ms):.0f} s, slowest {max(m['wall_s'] for m in ms):.0f} s "
            "on the shared 2-core machine, under other load: `benchmarks/results/export_all_time_256x320.json`).")


def _given_models(command: str) -> list[str] | None:
    """The --models of a results file's command line, or None."""
    words = command.split()
    return words[words.index("--models") + 1].split(",") if "--models" in words else None


def export_all_compare(name: str = "export_all_time_compare.json") -> str:
    """Before and after, from a --compare run's JSON (by default export_all_time_compare.json)."""
    d = load(name)
    s, rev = d["summary"], d["revisions"]
    n, total = s["after"]["models"], len(list_models())
    given = _given_models(d["command"])
    if given:
        scope = f"all {n} models given by `--models`" if n == len(given) else (
            f"{n} of the {len(given)} models given by `--models` (the run was stopped; its order makes them a spread "
            "of their sizes, the largest included)")
    else:
        scope = f"all {n} registered models" if d["complete"] else (
            f"{n} of the {total} registered models (the run was stopped; its order makes them a spread of sizes, the "
            "largest included)")
    side = {k: f"median {s[k]['median_s']:.0f} s, slowest {s[k]['slowest']['model']} {s[k]['slowest']['wall_s']:.0f} s"
            for k in ("before", "after")}
    return (f"before (`{rev['before']['commit'][:10]}`): {side['before']}; after (`{rev['after']['commit'][:10]}`): "
            f"{side['after']}; before / after (above 1: faster after), the median model's time "
            f"**{ratio(s['median_ratio'])}**, the median of the per-model ratios {s['per_model_median']:.3f}× "
            f"[{s['per_model_ci'][0]:.3f}–{s['per_model_ci'][1]:.3f}]; over {scope} ({_sessions_line(d)})")


def _sessions_line(d: dict) -> str:
    """The run line of a --compare file, naming every session of a resumed run (--update) with its models."""
    earlier = d.get("earlier_sessions", [])
    if not earlier:
        return run_line(d)
    counts = [len(e["models"]) for e in earlier]
    counts.append(d["summary"]["after"]["models"] - sum(counts))
    cpus = sorted({e["machine"]["cpu"] for e in earlier} | {d["machine"]["cpu"]})
    return (f"{len(counts)} sessions on the same two commits: "
            + "; ".join(f"{utc(m['date'])}, {n} model{'s' if n != 1 else ''}" for m, n in
                        zip([e["machine"] for e in earlier] + [d["machine"]], counts))
            + f"; {' / '.join(cpus)}, {d['machine']['cores']} cores, ONNX Runtime {d['machine']['onnxruntime']}")


def export_all_compare_earlier() -> str:
    """Before and after against the code of the committed all-models run (export_all_time_compare_ab46b7e.json)."""
    return export_all_compare("export_all_time_compare_ab46b7e.json")


def export_all_compare_gmacs_v2() -> str:
    """Before and after over the models whose default parity set the 64-input cap changed
    (export_all_time_compare_gmacs_v2.json)."""
    return export_all_compare("export_all_time_compare_gmacs_v2.json")


TABLES = {"export_all_time": export_all_time, "export_all_sizes": export_all_sizes,
          "export_all_compare": export_all_compare, "export_all_compare_earlier": export_all_compare_earlier,
          "export_all_compare_gmacs_v2": export_all_compare_gmacs_v2}


if __name__ == "__main__":
    main()
