"""The benchmark scripts run (`--quick`), print their ratios last and write the JSON that the README and
docs/benchmarks/ are rendered from.

The scripts run concurrently in subprocesses, as a user runs them (`python benchmarks/NAME.py`);
their timings are meaningless here (the point is that they run and report). Those runs are minutes of CPU (most of
it exports), so they carry the `benchmarks` marker and stay out of the default run: `python -m pytest -m benchmarks`
runs them (docs/contributing.md: before committing a benchmark's JSON, or after changing what a script imports).
The default run checks what breaks a script silently: every name a script imports from vitedge or from the
benchmarks' helpers exists. The ratio and target logic is checked on synthetic numbers.

Length: one smoke check per benchmark script, all fed by one concurrent run of the scripts (the `runs` fixture).
"""
from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = ("attention_order", "export_time", "deploy_speed", "exporters", "matrix_scale", "resolution_scaling",
           "quantization", "compressed_profiles", "rewrite_ablation", "fp16_verdicts", "trained_verdicts",
           "compressed_verdicts")
TIMEOUT_S = 600  # a generous ceiling for a busy shared machine; on a quiet one each takes about a minute
CI_RE = re.compile(r"\d+\.\d+x \(95% CI \d+\.\d+-\d+\.\d+, \d+ pairs(, \d+ sessions)?\)")
MACHINE_KEYS = {"cpu", "cores", "date", "load_start", "load_end", "load_note"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("bench")
    procs = {s: subprocess.Popen([sys.executable, str(BENCH / f"{s}.py"), "--quick", "--out", str(tmp / f"{s}.json")],
                                 cwd=BENCH, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for s in SCRIPTS}
    out = {}
    for s, p in procs.items():
        try:
            stdout, stderr = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        out[s] = {"rc": p.returncode, "stdout": stdout, "stderr": stderr, "json": tmp / f"{s}.json"}
    return out


def _result(runs: dict, script: str) -> tuple[list[str], dict]:
    r = runs[script]
    assert r["rc"] == 0, f"{script} failed (rc {r['rc']}):\n{r['stdout'][-3000:]}\n{r['stderr'][-3000:]}"
    data = json.loads(r["json"].read_text())
    assert data["script"] == script and data["quick"] is True
    assert MACHINE_KEYS <= set(data["machine"]) and data["machine"]["cores"] >= 1
    return [ln for ln in r["stdout"].splitlines() if ln.strip()], data


def _tail_after(lines: list[str], header: str) -> list[str]:
    """The lines after the last occurrence of `header`: the ratios section must end the output."""
    idx = [i for i, ln in enumerate(lines) if ln.startswith(header)]
    assert idx, f"no {header!r} section in the output"
    tail = lines[idx[-1] + 1:]
    assert tail and not any(ln.startswith("results:") for ln in tail)
    return tail


@pytest.mark.benchmarks
def test_attention_order_quick(runs):
    lines, data = _result(runs, "attention_order")
    tail = _tail_after(lines, "ratios (qk_first / kv_first")
    assert sum(bool(CI_RE.search(ln)) for ln in tail) >= len(data["series"]) * 2  # rule/best per series and backend
    kinds = {s["kind"] for s in data["series"]}
    assert kinds == {"model", "layer"}
    for s in data["series"]:
        assert s["head_dim"] > 0 and len(s["points"]) >= 2
        for p in s["points"]:
            assert p["parity_problems"] == [], p["parity_problems"]  # both orders compute the same function
            for b in ("onnxruntime", "torch"):
                q = p[b]
                assert set(q["latency"]) == {"qk_first", "kv_first"} and q["best"] in q["latency"]
                assert q["qk_over_kv"]["ci"][0] <= q["qk_over_kv"]["ratio"] <= q["qk_over_kv"]["ci"][1]
                # each interval is over fresh sessions, so it includes the spread between identical ones
                assert q["qk_over_kv"]["sessions"] == data["settings"]["sessions"] >= 2
                assert q["rule_over_best"]["ratio"] >= 1.0 or q["best"] != p["rule"]
        for b in ("onnxruntime", "torch"):
            assert {"crossover", "max_rule_over_best", "rule_significantly_slower_at",
                    "rule_is_best_at"} <= set(s["backends"][b])
    fixed = {f["model"]: f for f in data["fixed_size"]}
    assert set(fixed) == {"slab_deit_tiny", "slab_swin_tiny"}
    for f in fixed.values():
        assert "missing" in f or (f["imgsz"] == 224 and f["orders"])


@pytest.mark.benchmarks
def test_export_time_quick(runs):
    lines, data = _result(runs, "export_time")
    tail = _tail_after(lines, "ratios (pipeline wall time")
    assert any(CI_RE.search(ln) for ln in tail)
    runs_done = data["settings"]["runs"]
    assert "onnx" in runs_done and "onnx-fp16" in runs_done
    for label in ("coreml", "tensorrt"):
        # every target is either timed or listed unavailable with its reason
        assert label in runs_done or data["unavailable"][label]
    for m in data["models"]:
        for label in runs_done:
            t = m["targets"][label]
            assert t["wall"]["iters"] >= 2 and t["exit_code"] == 0
            assert "exporting ONNX" in t["steps_s"] and any(h["seconds"] is not None for h in t["hops"])
        assert set(m["ratios"]) == {f"{lbl}/onnx" for lbl in runs_done if lbl != "onnx"}
    # the README's main job, phase by phase, in fresh processes with the load average beside every run
    job = data["main_job"]
    assert job["command"].startswith("vitedge export --model swiftformer_xs --target onnx,coreml")
    # the allocator's worth: the same cold job with glibc's default allocator, its ratio printed before the last
    assert data["main_job_default_malloc"]["allocator"] == "glibc default" and job["allocator"] == "vitedge"
    assert all(r["exit_code"] == 0 for r in data["main_job_default_malloc"]["runs"])
    assert data["allocator_ratio"]["pairs"] == len(job["runs"])
    assert any(ln.startswith("main job, cold: glibc's default allocator") and CI_RE.search(ln) for ln in lines)
    assert len(job["runs"]) >= 1 and all(r["exit_code"] == 0 and r["load_before"] for r in job["runs"])
    # against the same conversions done plainly, interleaved: wall and CPU ratios with CIs, the last lines printed
    plain = data["main_job_plain"]
    assert all(r["exit_code"] == 0 and r["cpu_s"] > 0 for r in plain["runs"]) and len(plain["runs"]) == len(job["runs"])
    assert {p["phase"] for p in plain["phases"]} == {
        "torch.onnx.export", "onnxsim", "coremltools.convert (exported program, fp16)"}
    assert set(data["against_plain"]) == {"cold/plain", "cold/plain (cpu)", "warm/plain", "warm/plain (cpu)"}
    # coremltools' first import, the CLI's lean one against the import as installed, in fresh interpreters
    imp = data["coremltools_import"]
    assert imp["ratio"]["pairs"] == len(imp["seconds"]["lean"]) == len(imp["seconds"]["installed"]) >= 1
    assert all(t > 0 for ts in imp["seconds"].values() for t in ts)
    assert any(ln.startswith("coremltools' first import: as installed / the CLI's lean import") and CI_RE.search(ln)
               for ln in lines)
    assert data["targets"]["ratio_met"] == (data["against_plain"]["cold/plain"]["ci"][1] <= 1.5)
    plain_tail = _tail_after(lines, "the main job against the plain conversions")
    assert sum(bool(CI_RE.search(ln)) for ln in plain_tail) == 4 and plain_tail[-1].startswith("target: cold/plain")
    phases = {p["phase"]: p for p in job["phases"]}
    assert {"equivalence gate (float64)", "exporting ONNX", "simplifying ONNX (onnxsim)"} <= set(phases)
    assert any(p.startswith("coreml hop") for p in phases) and any(p.startswith("lowering to coreml") for p in phases)
    assert {"demo weights (make_trained_like)", "CoreML conversion (coremltools.convert)", "MIL interpreter run",
            "report.json write"} <= set(phases)
    assert sum(p["median_s"] for p in job["phases"] if p["kind"] == "step") <= 1.05 * job["wall_median_s"]
    # cold runs compute the ground truth, warm ones read it from the cache the priming run filled
    warm = data["main_job_warm"]
    assert job["truth_cache"] == "cold" and {r["cache"] for r in job["runs"]} == {"stored"}
    assert warm["truth_cache"] == "warm" and {r["cache"] for r in warm["runs"]} == {"hit"}
    assert len(warm["runs"]) == len(job["runs"]) and all(r["exit_code"] == 0 for r in warm["runs"])
    assert data["models_command"]["rows"] > 30 and data["models_command"]["median_s"] > 0


@pytest.mark.benchmarks
def test_deploy_speed_quick(runs):
    lines, data = _result(runs, "deploy_speed")
    tail = _tail_after(lines, "speedups (base latency / new latency")
    assert any(CI_RE.search(ln) for ln in tail)
    assert any(ln.strip().startswith(("PASS:", "MISS:")) for ln in tail)
    assert data["gemm"]["gflops_median"] > 0
    measured = {m["model"] for m in data["models"]}
    assert measured | set(data["missing"]) == {"swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16", "slab_swin_tiny"}
    for m in data["models"]:
        assert m["gflop_per_image"] > 0 and m["parity_failed"] == {}
        assert {"a.ts", "a.ts+sim", "b", "c"} <= set(m["nodes"]) and all(n["total"] > 0 for n in m["nodes"].values())
        # vitedge's graphs keep every GELU fusion the plain raw export gets from ONNX Runtime
        gelu = {k: n["ort_fused"].get("Gelu", 0) for k, n in m["nodes"].items()}
        assert gelu["c"] >= gelu["a.ts"] and gelu["b"] >= gelu["a.ts"], gelu
        assert sorted((str(c["threads"]), c["spinning"], c["batch"]) for c in m["cells"]) == [
            ("1", "default", 1), ("all", "default", 1), ("all", "off", 1)]  # ORT's default session and no-spin
        for c in m["cells"]:
            assert c["rounds"] >= 3 and c["seconds"] >= 0
            assert {"b/a", "c/a"} <= set(c["speedups"]) and set(c["latency"]) == set(m["variants"])
            # the baseline is the faster candidate of this very cell, and the ratio is taken against it
            a = c["baselines"]["a"]
            assert a["best"] == min(a["p50_ms"], key=a["p50_ms"].get)
            # every exporter's raw and simplified graph is a candidate, unless that exporter failed (said why)
            assert {"a.ts", "a.ts+sim"} <= set(a["p50_ms"]) <= {"a.ts", "a.ts+sim", "a.dyn", "a.dyn+sim"}
            assert ("a.dyn" in a["p50_ms"]) != ("a.dyn" in m["export_failed"])
            assert c["speedups"]["c/a"]["base"] == a["best"] and "a.ts/a.ts+sim" in c["onnxsim_effect"]
            assert (c["gemm_gflops"] is not None) == (c["threads"] == 1)
            assert all((p is not None) == (c["threads"] == 1) for p in c["pct_gemm"].values())
        if m["model"] == "swiftformer_xs":  # timm's port is measured, or the reason it is not is recorded
            assert "c/d" in m["cells"][0]["speedups"] or m["skipped"]["d"]
    statuses = {t["status"] for t in data["targets"]}
    assert statuses <= {"PASS", "MISS", "NOT MEASURED"} and len(data["targets"]) >= 3


@pytest.mark.benchmarks
def test_exporters_quick(runs):
    lines, data = _result(runs, "exporters")
    tail = _tail_after(lines, "ratios (latency: TorchScript")
    assert sum(bool(CI_RE.search(ln)) for ln in tail) >= 2  # latency and export time, each with its CI
    assert data["settings"]["opsets"] == {"dynamo": 18, "torchscript": 17}
    for m in data["models"]:
        for exporter in ("dynamo", "torchscript"):
            e = m["exporters"][exporter]
            assert e["export"]["exporter"] == exporter and e["export"]["exporter_fallback"] is None
            assert e["parity_problems"] == {"raw": [], "simplified": []}
            assert all(e["nodes"][form]["total"] > 0 for form in ("raw", "simplified"))
        assert m["export_time"]["dynamo/torchscript"]["pairs"] >= 2
        cell = m["cells"][0]
        assert set(cell["latency"]) == {f"{e}-{f}" for e in ("dynamo", "torchscript") for f in ("raw", "simplified")}
        assert cell["baseline"].startswith("torchscript") and "torchscript-best/dynamo-best" in cell["speedups"]
        # every interval over fresh sessions, so it includes the spread between identical ones
        assert all(r["sessions"] == data["settings"]["sessions"] >= 2 for r in cell["speedups"].values())


@pytest.mark.benchmarks
def test_rewrite_ablation_quick(runs):
    lines, data = _result(runs, "rewrite_ablation")
    tail = _tail_after(lines, "ratios (latency of all but one rewrite")
    assert {m["model"] for m in data["models"]} == {"swiftformer_xs", "slab_deit_tiny", "sima_nano_12_p16"}
    for m in data["models"]:
        assert m["parity_failed"] == {} and m["rounds"] >= 5
        assert all(r["sessions"] == data["settings"]["sessions"] >= 2 for r in m["speedups"].values())
        # one ratio per rewrite of the family, each printed with its CI
        assert set(m["speedups"]) == {f"all/all-but-{r}" for r in m["rewrites"]} and len(m["rewrites"]) >= 2
        assert sum(f"{m['model']} (reduced) all/all-but-" in ln and bool(CI_RE.search(ln)) for ln in tail) == len(
            m["rewrites"])
    swift = next(m for m in data["models"] if m["model"] == "swiftformer_xs")
    # the ONNX-form rewrite is real: without it the attention's norms go back to ReduceSum + Sqrt
    assert swift["nodes"]["all"]["by_op"].get("ReduceL2", 0) > 0
    assert swift["nodes"]["all-but-l2_normalize_reduce_l2"]["by_op"].get("ReduceL2", 0) == 0


@pytest.mark.benchmarks
def test_matrix_scale_quick(runs):
    lines, data = _result(runs, "matrix_scale")
    tail = _tail_after(lines, "ratios and figures")
    assert sum(bool(CI_RE.search(ln)) for ln in tail) == 2  # local1/local2 and ray2/local2
    assert any(ln.strip().startswith(("PASS:", "MISS:")) for ln in tail)
    assert data["settings"]["cells"] == 2 and set(data["runs"]) == {"local1", "local2", "ray2", "cached"}
    for name in ("local1", "local2", "ray2"):
        assert all(r["cells"] == 2 and r["wall_s"] > 0 for r in data["runs"][name])
    cached = data["runs"]["cached"][0]
    assert cached["exit_code"] == 0 and cached["imported_torch"] is False  # the cached re-run needs no torch
    assert data["targets"][0]["status"] in ("PASS", "MISS")


@pytest.mark.benchmarks
def test_resolution_scaling_quick(runs):
    lines, data = _result(runs, "resolution_scaling")
    tail = _tail_after(lines, "ratios (95% CI")
    assert any(CI_RE.search(ln) for ln in tail) and tail[-1].strip().startswith("the FLOP rule picked")
    assert (runs["resolution_scaling"]["json"].parent / data["plot"]).stat().st_size > 0  # the PNG beside the JSON
    assert data["markdown"].startswith("| px |") and data["markdown"] in runs["resolution_scaling"]["stdout"]
    assert [s["imgsz"] for s in data["sizes"]] == data["settings"]["sizes"]
    for s in data["sizes"]:
        assert set(s["models"]) == {"swiftformer_xs", "sima_nano_12_p16", "slab_pvt_tiny"}
        for name, m in s["models"].items():
            assert m["parity_problems"] == {} and m["best"] in m["latency"], (name, m)
            if name != "swiftformer_xs":  # the order choice: both orders (or why not), the rule against the best
                assert {"qk_first", "kv_first"} <= set(m["latency"]) | set(m["skipped"])
                assert m["rule"] in ("qk_first", "kv_first", "auto")
                r = m["rule_over_best"]  # None only where the rule's own order was not timed (too costly)
                assert (r is None and m["rule"] in m["skipped"]) or r["ratio"] >= 1.0
                assert r is None or r["sessions"] == data["settings"]["sessions"] >= 2
                assert m["gmacs"]["auto"] <= min(m["gmacs"]["qk_first"], m["gmacs"]["kv_first"]) + 1e-9
    flagged = {(d["model"], d["imgsz"]) for d in data["rule_vs_measured"]}
    assert flagged == {(n, s["imgsz"]) for s in data["sizes"] for n, m in s["models"].items()
                       if m.get("rule_is_best") is False}


# ---- every name a script takes from vitedge or from the helpers exists (the default run's check) ----------

def _exists(module, attr: str) -> bool:
    """`attr` is defined by `module`, or is a submodule of it (`from vitedge.exporter import reparam`)."""
    if hasattr(module, attr):
        return True
    try:
        importlib.import_module(f"{module.__name__}.{attr}")
        return True
    except ModuleNotFoundError:
        return False


def _ours(name: str) -> bool:
    return name == "vitedge" or name.startswith("vitedge.") or (name.startswith("_") and (BENCH / f"{name}.py").exists())


def unresolved_names(script: Path) -> list[str]:
    """`module.name` for each name `script` imports, or reads as an attribute of a module it imported, that
    vitedge or the benchmarks' helper modules no longer define."""
    tree = ast.parse(script.read_text(), str(script))
    bound, missing = {}, []  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _ours(a.name):
                    bound[a.asname or a.name] = importlib.import_module(a.name if a.asname else a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _ours(node.module):
            mod = importlib.import_module(node.module)
            for a in node.names:
                if not _exists(mod, a.name):
                    missing.append(f"{node.module}.{a.name}")
                elif isinstance(getattr(mod, a.name, None), type(mod)):
                    bound[a.asname or a.name] = getattr(mod, a.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            mod = bound[node.value.id]
            if not _exists(mod, node.attr):
                missing.append(f"{mod.__name__}.{node.attr}")
    return sorted(set(missing))


def test_every_name_the_scripts_import_exists():
    """A rename in vitedge or in a helper breaks the script that imports the old name, and only a run of that
    script would show it; this finds it without running any (the runs: `python -m pytest -m benchmarks`)."""
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) > len(SCRIPTS)
    sys.path.insert(0, str(BENCH))
    try:
        missing = {p.name: unresolved_names(p) for p in scripts}
    finally:
        sys.path.remove(str(BENCH))
    assert {k: v for k, v in missing.items() if v} == {}


def test_a_renamed_name_is_found(tmp_path):
    """The check above both ways: a script importing a name vitedge lacks, or reading one off a module, is named."""
    script = tmp_path / "renamed.py"
    script.write_text("from vitedge.exporter.verdict.parity import ground_truth, ground_truth_v2\n"
                      "from vitedge.exporter.verdict import parity\n"
                      "import vitedge.models.reduced as red\n"
                      "parity.compute_metrics, parity.no_such_function, red.REDUCED, red.REDUCD\n")
    assert unresolved_names(script) == ["vitedge.exporter.verdict.parity.ground_truth_v2",
                                        "vitedge.exporter.verdict.parity.no_such_function",
                                        "vitedge.models.reduced.REDUCD"]


# ---- the logic, on synthetic numbers ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def bench_modules():
    sys.path.insert(0, str(BENCH))
    try:
        import attention_order
        import deploy_speed
        yield attention_order, deploy_speed
    finally:
        sys.path.remove(str(BENCH))


def test_attention_order_at_a_size_times_both_orders_over_fresh_sessions(bench_modules, monkeypatch):
    """--sizes' point: the chosen and the flipped orders agree, and their ratio is over fresh sessions (ONNX Runtime
    only here: lowering ExecuTorch programs is minutes on this machine)."""
    ao, _ = bench_modules
    monkeypatch.setattr(ao, "SIZE_TIMING", {"min_rounds": 2, "max_s": 0.05, "sessions": 2})
    p = ao.size_point("sima_nano_12_p16", "64", executorch=False)
    assert p["parity_problems"] == [] and p["orders_chosen"] == ["qk_first"]  # N = 16 < d = 32
    r = p["onnxruntime"]["other_over_chosen"]
    assert r["sessions"] == 2 and len(r["per_session"]) == 2 and r["ci"][0] <= r["ratio"] <= r["ci"][1]
    assert "executorch" not in p


def _point(n: int, qk_over_kv: float) -> dict:
    best = "kv_first" if qk_over_kv > 1 else "qk_first"
    r = {"ratio": qk_over_kv, "ci": [qk_over_kv * 0.98, qk_over_kv * 1.02], "pairs": 10}
    return {"N": n, "onnxruntime": {"qk_over_kv": r, "best": best}}


def test_crossover_interpolates_between_the_flip(bench_modules):
    ao, _ = bench_modules
    c = ao.crossover([_point(16, 0.5), _point(64, 0.8), _point(256, 1.25), _point(1024, 2.0)], "onnxruntime")
    assert c["between"] == [64, 256] and c["flips"] == [256]
    assert c["N"] == pytest.approx(128.0, rel=1e-6)  # log-log: ratio 0.8 -> 1.25 is symmetric about 1
    assert c["kv_significantly_faster_from"] == 256 and c["qk_significantly_faster_at"] == [16, 64]
    none = ao.crossover([_point(16, 0.5), _point(64, 0.9)], "onnxruntime")
    assert none["N"] is None and "qk_first still faster" in none["note"]
    always = ao.crossover([_point(16, 1.1), _point(64, 1.5)], "onnxruntime")
    assert always["N"] is None and "kv_first faster at every N" in always["note"]


def _model(name: str, ups: dict, pct_c: float = 50.0) -> dict:
    cell = {"threads": 1, "batch": 1, "pct_gemm": {"c": pct_c},
            "speedups": {k: {"ratio": r, "ci": [lo, hi], "pairs": 20} for k, (r, lo, hi) in ups.items()}}
    return {"model": name, "config": "real", "skipped": {}, "cells": [cell]}


def test_targets_report_what_is_measured(bench_modules):
    _, ds = bench_modules
    models = [_model("slab_deit_tiny", {"c/a": (1.14, 1.10, 1.17), "b/a": (1.0, 0.96, 1.03)}),
              _model("swiftformer_xs", {"c/a": (1.12, 1.05, 1.15), "c/d": (1.10, 1.09, 1.12)}, pct_c=91.0)]
    swift_a, swift_d, slab, sima, floor, *stretch = ds.check_targets(models)
    assert slab["model"] == "slab_deit_tiny" and slab["status"] == "MISS"  # 1.14 < 1.15: no rounding up
    assert swift_a["status"] == "PASS" and swift_a["ci_clears"] is False    # 1.12, but its CI reaches 1.05
    assert swift_d["status"] == "PASS" and swift_d["threshold"] == 1.10     # exactly on the threshold passes
    assert sima["status"] == "NOT MEASURED"
    assert floor["status"] == "MISS"
    assert [(b["model"], b["ratio"]) for b in floor["below"]] == [("slab_deit_tiny", "b/a")]
    assert {x["model"]: x["status"] for x in stretch} == {"slab_deit_tiny": "MISS", "swiftformer_xs": "PASS"}
    missing = ds.check_targets([_model("swiftformer_xs", {})])
    assert missing[0]["status"] == "NOT MEASURED"


def test_baseline_is_the_faster_candidate_with_parity(bench_modules):
    _, ds = bench_modules
    times = {"a.ts": [0.010, 0.011, 0.010], "a.ts+sim": [0.012, 0.013, 0.012], "c": [0.009] * 3,
             "d.ts": [0.020] * 3, "d.ts+sim": [0.015] * 3}
    picked = ds.pick_baselines(times, parity={})
    assert picked["a"]["best"] == "a.ts" and picked["d"]["best"] == "d.ts+sim"
    # a candidate whose output failed the parity check is never the baseline, however fast
    assert ds.pick_baselines(times, parity={"a.ts": ["batch 1: max_rel 1"]})["a"]["best"] == "a.ts+sim"
    assert ds.candidate_keys("a") == [f"a.{e}{p}" for e in ds.PLAIN_EXPORTS for p in ds.PLAIN_PASSES]


def test_block_rounds_pair_the_second_half_of_each_block():
    sys.path.insert(0, str(BENCH))
    try:
        import _stats
        import _timing
    finally:
        sys.path.remove(str(BENCH))
    calls = {"slow": 0, "fast": 0}

    def make(name, first_s, then_s):
        def f():  # the very first call is slow (a cold start): the first block's second half leaves it out
            calls[name] += 1
            time.sleep(first_s if calls[name] == 1 else then_s)
        return f

    fns = {"slow": make("slow", 0.02, 0.004), "fast": make("fast", 0.02, 0.002)}
    out = _timing.time_blocks(fns, rounds=3, block_s=0.02)
    assert [len(v) for v in out.values()] == [3, 3]
    assert all(0.002 <= t < 0.015 for t in out["slow"]) and all(0.001 <= t < 0.012 for t in out["fast"])
    r = _stats.speedup(out["slow"], out["fast"])
    assert r["ratio"] > 1.2 and r["pairs"] == 3
    # the precision loop stops on the interval's width: identical candidates converge at once
    t = _timing.time_until_precise({"x": lambda: time.sleep(0.001), "y": lambda: time.sleep(0.001)}, [("y", "x")],
                                   min_rounds=4, max_s=5.0, ci_width=10.0, block_s=0.003)
    assert len(t["x"]) == len(t["y"]) == 4


@pytest.mark.benchmarks
def test_quantization_quick(runs):
    lines, data = _result(runs, "quantization")
    tail = _tail_after(lines, "ratios (")
    assert any("fp32-simplified/int8" in ln or "fp32-raw/int8" in ln for ln in tail) and any(CI_RE.search(ln) for ln in tail)
    for r in data["latency"]:
        assert r["bytes"]["fp32/int8"] > 1 and r["cells"] and r["cells"][0]["baseline"] in ("fp32-raw", "fp32-simplified")
        assert all(q["sessions"] == data["settings"]["sessions"] >= 2 for q in r["cells"][0]["speedups"].values())
    packages = data["coreml_sizes"]["packages"]
    assert set(packages) == {"fp16", "w8", "palette4", "palette6", "w8a8"}
    assert all(p["smaller_than_fp16"] > 1 for k, p in packages.items() if k != "fp16")
    assert any(ln.startswith("  target palette4 >=") for ln in tail)
    assert len(data["fixtures"]) == 1  # --quick: one trained fixture
    for name, acc in data["fixtures"].items():
        assert set(acc) >= {"fp32", "int8", "coreml-w8", "coreml-palette4", "coreml-palette6", "coreml-w8a8"}
        for v in acc.values():
            lo, hi = v["wilson95"]
            assert lo <= v["top1"] <= hi and v["n"] == 364


@pytest.mark.benchmarks
def test_compressed_profiles_quick(runs):
    """The thresholds' evidence: every correct artifact passes its profile, every planted-broken one fails."""
    lines, data = _result(runs, "compressed_profiles")
    tail = _tail_after(lines, "profiles (")
    assert {ln.split(":")[0].strip() for ln in tail} >= {"int8", "w8", "palette", "w8a8"}
    cases = data["cases"]
    assert {c["kind"] for c in cases} >= {"int8", "w8", "palette4", "w8a8"} and any(c["planted"] for c in cases)
    for c in cases:
        if not c["detection_limit"]:
            assert c["passed"] != c["planted"], (c["case"], c["set"], c["problems"])
    for entry in data["summary"].values():
        assert entry["correct_failed"] == [] and entry["planted_passed"] == []


@pytest.mark.benchmarks
def test_fp16_verdicts_quick(runs):
    """The fp16 rule's evidence: correct fp16 artifacts of a trained model pass, plants in the saved ones fail."""
    lines, data = _result(runs, "fp16_verdicts")
    tail = _tail_after(lines, "fp16 rule (")
    assert {ln.split(":")[0].strip() for ln in tail} == {"zero_layer", "sign_flip", "x10"}
    cases = data["cases"]
    assert {c["artifact"] for c in cases} == {"coreml", "onnx-fp16"}
    for c in cases:
        assert c["caught"] == (c["plant"] is not None), c
    assert data["summary"]["correct_failed"] == [] and data["summary"]["worst_correct_ratio"] < data["summary"]["k"]


@pytest.mark.benchmarks
def test_compressed_verdicts_quick(runs):
    """The compressed rule's and the weights check's evidence: correct int8 / w8 artifacts of a trained model pass,
    a zeroed layer, a sign-flipped channel and a x1.1 channel planted in the saved int8 scales / weight.bin fail."""
    lines, data = _result(runs, "compressed_verdicts")
    tail = _tail_after(lines, "compressed rule (")
    assert [ln.split(" (K")[0].strip() for ln in tail] == ["int8", "w8"]
    cases = data["cases"]
    assert {(c["kind"], c["plant"]) for c in cases} == {(k, p) for k in ("int8", "w8")
                                                         for p in (None, "zero_layer", "sign_flip", "x1.1")}
    for c in cases:
        assert c["caught"] == (c["plant"] is not None), c
    assert data["summary"]["correct_failed"] == []


@pytest.mark.benchmarks
def test_trained_verdicts_quick(runs):
    """A trained model's correct artifacts pass on its labelled digits, and plants in the saved ONNX fail."""
    lines, data = _result(runs, "trained_verdicts")
    tail = _tail_after(lines, "trained models (")
    assert tail[-1].endswith("zero_layer caught, sign_flip caught, x1.01 caught")
    (row,) = data["models"]
    assert [h["hop"] for h in row["hops"]] == ["deploy-form", "onnx", "onnx-simplified", "coreml"]
    assert all(h["status"] == "passed" and h["top1_accuracy"] is not None for h in row["hops"])
    assert data["summary"] == {"correct_passed": True, "caught": {"zero_layer": 1, "sign_flip": 1, "x1.01": 1},
                               "of": 1, "not_measured": []}


def _export_all_time(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "export_all_time.py"), *args], cwd=BENCH, capture_output=True,
                          text=True, timeout=TIMEOUT_S)


@pytest.mark.benchmarks
def test_export_all_time_quick(tmp_path):
    # every registered model's default export, timed in a fresh process each (here: two reduced configs)
    out = tmp_path / "e.json"
    r = _export_all_time("--quick", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["script"] == "export_all_time" and data["complete"] and MACHINE_KEYS <= set(data["machine"])
    assert {m["model"] for m in data["models"]} == {"swiftformer_xs", "sima_nano_12_p16"}
    for m in data["models"]:
        assert m["exit_code"] == 0 and m["status"] == "passed" and m["samples"] == 8 and m["cache"] == "stored"
        assert m["wall_s"] > 0 and m["load_before"] and set(m["hops"]) == {"deploy-form", "onnx", "onnx-simplified"}
    tail = _tail_after([ln for ln in r.stdout.splitlines() if ln.strip()], "slowest exports")
    assert tail[-1] == "within 300 s and exit 0: 2/2"


@pytest.mark.benchmarks
def test_export_all_time_compares_the_code_of_two_commits(tmp_path):
    # before and after in one run: each commit's code unpacked and imported by fresh processes (here HEAD twice)
    out = tmp_path / "c.json"
    argv = ["--quick", "--models", "swiftformer_xs", "--out", str(out)]
    r = _export_all_time(*argv, "--compare", "HEAD")
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads(out.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=BENCH, capture_output=True, text=True, check=True)
    assert data["revisions"] == {side: {"rev": "HEAD", "commit": head.stdout.strip()} for side in ("before", "after")}
    for side in ("before", "after"):
        (row,) = data[side]
        assert (row["model"], row["exit_code"], row["status"], row["samples"]) == ("swiftformer_xs", 0, "passed", 8)
    s = data["summary"]
    assert s["before"]["slowest"] == {"model": "swiftformer_xs", "wall_s": data["before"][0]["wall_s"]}
    assert s["per_model"]["swiftformer_xs"] == round(data["before"][0]["wall_s"] / data["after"][0]["wall_s"], 3)
    tail = _tail_after([ln for ln in r.stdout.splitlines() if ln.strip()], "ratios (before / after")
    assert CI_RE.search(tail[0]) and tail[0].strip().startswith("median model's time")
    bad = _export_all_time(*argv, "--compare", "no-such-revision")
    assert bad.returncode != 0 and "not a commit of this repository" in bad.stderr and "Traceback" not in bad.stderr
    # --update resumes the stopped run: its row kept, only the model it lacks exported, its session recorded
    more = [a if a != "swiftformer_xs" else "swiftformer_xs,sima_nano_12_p16" for a in argv]
    r = _export_all_time(*more, "--compare", "HEAD", "--update")
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = json.loads(out.read_text())
    # the after side is the commit the stopped run measured, named by its hash
    assert {k: v["commit"] for k, v in resumed["revisions"].items()} == {
        k: v["commit"] for k, v in data["revisions"].items()}
    assert resumed["revisions"]["after"]["rev"] == data["revisions"]["after"]["commit"]
    for side in ("before", "after"):
        assert resumed[side][0] == data[side][0] and [x["model"] for x in resumed[side]] == [
            "swiftformer_xs", "sima_nano_12_p16"]
    (first,) = resumed["earlier_sessions"]
    assert first["models"] == ["swiftformer_xs"] and first["machine"] == data["machine"]
    sys.path.insert(0, str(BENCH))
    try:
        from export_all_time import _sessions_line
    finally:
        sys.path.remove(str(BENCH))
    line = _sessions_line(resumed)
    assert line.startswith("2 sessions on the same two commits: ") and " 1 model; " in line
    # a file compared against another commit is not resumed
    data["revisions"]["before"]["commit"] = "0" * 40
    out.write_text(json.dumps(data))
    bad = _export_all_time(*more, "--compare", "HEAD", "--update")
    assert bad.returncode != 0 and "compared against 0000000000, not HEAD" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("n", [1, 2, 3, 8, 35])
def test_compare_order_spans_the_sizes_at_every_prefix(n):
    """--compare's model order: a permutation, the largest then the smallest first, and every prefix a spread (no
    gap between measured sizes more than twice the smallest one possible), so that a stopped run is a sample."""
    sys.path.insert(0, str(BENCH))
    try:
        from export_all_time import spread
    finally:
        sys.path.remove(str(BENCH))
    order = spread(list(range(n)))
    assert sorted(order) == list(range(n)) and order[0] == n - 1 and order[-1 if n == 1 else 1] == 0
    for k in range(2, n + 1):
        done = sorted(order[:k])
        assert done[0] == 0 and done[-1] == n - 1
        assert max(b - a for a, b in zip(done, done[1:])) <= max(1, 2 * -(-(n - 1) // (k - 1)))
