"""`vitedge matrix` on the local process pool (issue 19): plans validated before any work (exit 2, nothing
written), the content-addressed cache (hit, miss, a changed checkpoint invalidating only its cells, --rebuild,
never a failed cell reused), one cell's failure or crash not stopping the others (exit 1), resume after a
SIGKILL with no cell half-written, and a fully cached re-run that imports no torch.

Tiny SwiftFormer configurations (`set` overrides, 32 px, 2 parity samples) keep every cell about a second.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import vitedge
from vitedge.cli import main
from vitedge.exporter.flow import pipeline
from vitedge.exporter.matrix import matrix
from vitedge.exporter.matrix.folders import KEY_FILE, TRACEBACK
from vitedge.exporter.matrix.base_folder import FolderBaseStore
from vitedge.targets.base import sha256_file
from vitedge.targets import TARGETS
from vitedge.targets.onnx.target import OnnxTarget
from vitedge.tests._matrix import TINY, XS, built, plan_of, save_checkpoint, statuses, write_plan
from vitedge.tests._signals import sigint_default

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
TIMEOUT = 300


def visible(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


# ---- bad plans: exit 2, one line naming the key, nothing written --------------------------------------

class Int8Target(OnnxTarget):
    """A target with a precision the others lack (int4: in no built-in target): resolution only."""
    name, precisions, default_precision = "q8", ("fp32", "int4"), "fp32"


@pytest.fixture
def int8_target(monkeypatch):
    mod = types.ModuleType("vitedge_test_matrix_targets")
    mod.Int8Target = Int8Target
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    monkeypatch.setitem(TARGETS, "q8", f"{mod.__name__}:Int8Target")


BAD_PLANS = {
    "unknown top-level key": (plan_of([XS], extra_key=1), "plan: unknown key 'extra_key'"),
    "unknown model key (typo)": (plan_of([{**XS, "imgsize": 32}]), "models[0]: unknown key 'imgsize' (did you mean "
                                                                   "'imgsz'?)"),
    "unknown defaults key": (plan_of([XS], defaults={"samples_n": 4}), "defaults: unknown key 'samples_n'"),
    "targets in defaults": (plan_of([XS], defaults={"targets": ["onnx"]}), "put it at the top level"),
    "unknown model": (plan_of([{"name": "swiftformer_xxl"}]), "models[0].name: unknown model 'swiftformer_xxl'"),
    "unknown target": (plan_of([XS], targets=["onnx", "tflite"]), "targets[1]: unknown target 'tflite'"),
    "unknown precision": (plan_of([XS], precisions=["fp32", "bf16"]), "precisions[1]: unknown precision 'bf16'"),
    "explicit unsupported pair": (plan_of([{**XS, "targets": ["onnx-int4"]}], targets=["onnx", "q8"]),
                                  "models[0].targets: onnx-int4 is not supported"),
    "model precision none of its targets supports": (
        plan_of([{**XS, "targets": ["onnx"], "precisions": ["int4"]}], targets=["q8"]),
        "models[0].precisions: int4 is supported by none of onnx"),
    "plan precision no target supports": (plan_of([XS], targets=["onnx"], precisions=["fp32", "int4"]),
                                          "precisions: int4 is supported by none of onnx"),
    "empty models": (plan_of([]), "`models` must be a non-empty list"),
    "option no target takes": (plan_of([XS], defaults={"ios": 17}), "defaults.ios applies to coreml only"),
    "size the model cannot take": (plan_of([{**XS, "imgsz": [32, 50]}]), "divisible by 32"),
    "override that does not build": (plan_of([{**XS, "set": {"layers": "x"}}]), "models[0].set: layers"),
    "missing checkpoint": (plan_of([{**XS, "checkpoint": "nope.pth"}]), "models[0].checkpoint:"),
    "bad tolerance": (plan_of([XS], defaults={"tol": ["fp32.max_rell=1"]}), "defaults.tol[0]: --tol key must be"),
    "duplicate cell": (plan_of([XS, XS]), "give one entry a distinct `label`"),
    "trt_arch without tensorrt": (plan_of([XS], trt_arch=["sm_80"]), "trt_arch: the plan exports no tensorrt"),
    "bad arch": (plan_of([XS], targets=["tensorrt"], trt_arch=["ampere"]), "not a GPU architecture label"),
}


@pytest.mark.parametrize("case", list(BAD_PLANS))
def test_bad_plan_exits_2_naming_the_key_and_writes_nothing(case, tmp_path, capsys, int8_target):
    plan, message = BAD_PLANS[case]
    path = write_plan(tmp_path / "plan", plan)
    out = tmp_path / "out"
    assert main(["-q", "matrix", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitedge: error: ") and "\n" not in err and message in err, err
    assert not out.exists()


def test_yaml_repeated_key_and_unparsable_plan_exit_2(tmp_path, capsys):
    for text, message in (("models: [{name: swiftformer_xs}]\nmodels: []\n", "appears twice"),
                          ("models: [{name: swiftformer_xs\n", "does not parse")):
        path = tmp_path / "plan.yaml"
        path.write_text(text)
        assert main(["-q", "matrix", str(path), "--out", str(tmp_path / "out")]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cross_product_pairs_a_target_lacks_are_skipped_and_listed(tmp_path, int8_target):
    plan = plan_of([XS, {"name": "swiftformer_xs", "label": "xs_fp32", "precisions": ["fp32"]}],
                   targets=["onnx", "q8"], precisions=["fp32", "int4"])
    r = matrix(plan, out=tmp_path / "out", dry_run=True)
    assert [c.id for c in r.cells] == ["swiftformer_xs/32/onnx-fp32", "swiftformer_xs/32/q8-fp32",
                                       "swiftformer_xs/32/q8-int4", "xs_fp32/32/onnx-fp32", "xs_fp32/32/q8-fp32"]
    assert r.skipped == [{"model": "swiftformer_xs", "target": "onnx", "precision": "int4",
                          "why": "onnx does not support int4 (it supports fp32, fp16, int8)"}]
    assert all(c.status == "pending" and c.cached is False for c in r.cells)
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_precision_support_comes_from_the_targets_table(tmp_path, monkeypatch):
    """A precision a target gains (as onnx gained int8 with issue 18) is accepted with no change to the plan code."""
    monkeypatch.setattr(OnnxTarget, "precisions", ("fp32", "fp16", "int8", "int4"))
    r = matrix(plan_of([XS], precisions=["int4", "int8"]), out=tmp_path / "out", dry_run=True)
    assert [c.id for c in r.cells] == ["swiftformer_xs/32/onnx-int4", "swiftformer_xs/32/onnx-int8"]
    assert r.skipped == []


# ---- the cache --------------------------------------------------------------------------------------

def test_cache_hit_miss_changed_checkpoint_dry_run_and_rebuild(tmp_path, capsys):
    ckpts = tmp_path / "plan"
    ckpts.mkdir()
    save_checkpoint(ckpts / "a.pth", 1)
    save_checkpoint(ckpts / "b.pth", 2)
    plan = write_plan(ckpts, plan_of([{**XS, "label": "a", "checkpoint": "a.pth"},
                                      {**XS, "label": "b", "checkpoint": "b.pth"}]))
    out = tmp_path / "out"
    ids = {"a/32/onnx-fp32", "b/32/onnx-fp32"}
    assert main(["-q", "matrix", str(plan), "--out", str(out), "--dry-run"]) == 0
    assert "2 cells (0 in the cache" in capsys.readouterr().out and not out.exists()  # a dry run writes nothing

    first = matrix(plan, out=out, workers=1, progress=False)
    assert first.exit_code == 0 and set(statuses(first).values()) == {"passed"} and built(first) == ids
    assert all(c.report["weights"] == "checkpoint" for c in first.cells)
    keys = {c.id: c.cache_key for c in first.cells}
    assert len(set(keys.values())) == 2

    (out / "b/32/onnx-fp32/report.json").unlink()  # a damaged DIR copy: the cache still holds the cell
    assert main(["-q", "matrix", str(plan), "--out", str(out), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "2 cells (2 in the cache" in text and text.count("cached") == 2
    assert not (out / "b/32/onnx-fp32/report.json").exists()

    second = matrix(plan, out=out, workers=1, progress=False)  # everything from the cache, b's copy restored
    assert built(second) == set() and {c.id: c.cache_key for c in second.cells} == keys
    assert second.engine.startswith("none") and second.exit_code == 0
    assert (out / "b/32/onnx-fp32/report.json").is_file()

    save_checkpoint(ckpts / "a.pth", 3)  # new weights for a: only a's cell is rebuilt
    third = matrix(plan, out=out, workers=1, progress=False)
    assert built(third) == {"a/32/onnx-fp32"} and third.cell("a/32/onnx-fp32").cache_key != keys["a/32/onnx-fp32"]
    assert third.cell("b/32/onnx-fp32").cache_key == keys["b/32/onnx-fp32"]
    assert (out / "a/32/onnx-fp32" / KEY_FILE).read_text().strip() == third.cell("a/32/onnx-fp32").cache_key
    sha = json.loads((out / "a/32/onnx-fp32/report.json").read_text())["checkpoint_sha256"]
    assert sha == sha256_file(ckpts / "a.pth")

    fourth = matrix(plan, out=out, workers=1, rebuild=True, progress=False)  # --rebuild ignores the cache
    assert built(fourth) == ids and fourth.exit_code == 0

    saved = json.loads((out / "matrix.json").read_text())
    assert [c["id"] for c in saved["cells"]] == [c.id for c in fourth.cells]
    assert all(c["cache_key"] and c["from_cache"] is False and c["report"]["status"] == "passed"
               for c in saved["cells"])
    assert "| a | 32 | [passed](a/32/onnx-fp32/report.json)" in (out / "matrix.md").read_text()

    # a fully cached re-run imports no torch (the driver alone: no worker starts)
    code = ("import sys; from vitedge.cli import main; rc = main(['-q', 'matrix', sys.argv[1], '--out', sys.argv[2]]);"
            " print('torch' in sys.modules, rc)")
    p = subprocess.run([sys.executable, "-c", code, str(plan), str(out)], env=ENV, capture_output=True, text=True,
                       timeout=TIMEOUT)
    assert p.stdout.strip().splitlines()[-1] == "False 0", p.stdout + p.stderr
    assert "(2 from the cache)" in p.stdout


def test_failed_and_crashed_cells_do_not_stop_the_others(tmp_path):
    """A parity failure (a tolerance no export can meet) and a crash (the worker running it is SIGKILLed):
    both recorded, the rest still runs, exit code 1, a failed cell is never reused as passed."""
    plan = write_plan(tmp_path / "plan", plan_of([
        {**XS, "label": "crash", "imgsz": 64},  # the first job: the worker the pool spawns for it is killed
        {**XS, "label": "strict", "tol": ["fp32.max_rel=1e-15"]},
        {**XS, "label": "ok"},
        {**XS, "label": "ok_twin"}]))  # the same export under another label: built once, copied to both
    out = tmp_path / "out"
    killed = []

    def kill_first_worker():  # the pool spawns a worker at its first job: that worker is running a cell
        deadline = time.monotonic() + TIMEOUT
        while not multiprocessing.active_children() and time.monotonic() < deadline:
            time.sleep(0.01)
        for p in multiprocessing.active_children()[:1]:
            os.kill(p.pid, signal.SIGKILL)
            killed.append(p.pid)

    t = threading.Thread(target=kill_first_worker, daemon=True)
    t.start()
    r = matrix(plan, out=out, workers=1, progress=False)
    t.join()
    assert killed and r.exit_code == 1
    st = statuses(r)
    assert st["strict/32/onnx-fp32"] == "failed" and st["ok/32/onnx-fp32"] == st["ok_twin/32/onnx-fp32"] == "passed"
    ok, twin = r.cell("ok/32/onnx-fp32"), r.cell("ok_twin/32/onnx-fp32")
    assert ok.cache_key == twin.cache_key and twin.report["out_dir"] == str(out / twin.id)
    assert (out / twin.id / "swiftformer_xs.onnx").read_bytes() == (out / ok.id / "swiftformer_xs.onnx").read_bytes()
    crashed = [c for c in r.cells if c.status == "error"]
    assert [c.id for c in crashed] == ["crash/64/onnx-fp32"] and "died (signal SIGKILL)" in crashed[0].reason
    assert (out / crashed[0].traceback).read_text().startswith("the worker process died")
    assert crashed[0].traceback == f"{crashed[0].id}/{TRACEBACK}" and crashed[0].report is None
    strict = r.cell("strict/32/onnx-fp32")
    assert "max_rel" in strict.reason and strict.worst["ratio"] > 1
    assert (out / "strict/32/onnx-fp32/quarantine").is_dir()
    assert json.loads((out / "matrix.json").read_text())["exit_code"] == 1

    again = matrix(plan, out=out, workers=1, progress=False)  # the failure and the crash are rebuilt, not reused
    assert built(again) == {"strict/32/onnx-fp32", crashed[0].id} and statuses(again)[crashed[0].id] == "passed"
    assert again.cell("strict/32/onnx-fp32").status == "failed" and again.exit_code == 1


def _start(plan: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "cli.py", "matrix", str(plan), "--out", str(out), "--workers", "1"],
                            cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)


def _signal_after(proc: subprocess.Popen, line_start: str, sig: int) -> int:
    """Send `sig` once the progress display prints a line starting with `line_start`; the exit code."""
    try:
        for line in proc.stderr:
            if line.startswith(line_start):
                break
        proc.send_signal(sig)
        return proc.wait(TIMEOUT)
    finally:
        proc.kill()
        proc.stderr.close()


def _leftovers(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def test_ctrl_c_and_sigkill_leave_no_half_written_cell_and_a_rerun_resumes(tmp_path):
    plan = write_plan(tmp_path / "plan", plan_of([{**XS, "imgsz": [32, 64, 96]}]))
    out = tmp_path / "out"
    assert _signal_after(_start(plan, out), "[1/3]", signal.SIGINT) == 130  # Ctrl-C: stops cleanly
    assert _leftovers(out) == [] and not (out / "matrix.json").exists()  # nor in the cache: workers cleaned up

    assert _signal_after(_start(plan, out), "[2/3]", signal.SIGKILL) == -signal.SIGKILL  # resumed, then killed
    cells = [p.parent for p in out.rglob("report.json") if ".cache" not in p.parts]
    assert 2 <= len(cells) < 3 and not (out / "matrix.json").exists()
    for folder in cells:  # every cell folder in DIR is complete: its key, report and artifacts
        report = json.loads((folder / "report.json").read_text())
        assert report["status"] == "passed" and (folder / KEY_FILE).is_file()
        assert all((folder / a["path"]).is_file() for a in report["artifacts"].values())
    done = {str(f.relative_to(out)) for f in cells}
    assert [v for v in visible(out) if v.count("/") == 2] == sorted(done)  # no visible half-made cell folder

    r = matrix(plan, out=out, workers=1, progress=False)  # only the missing cell is built
    assert r.exit_code == 0 and {c.id for c in r.cells if c.from_cache} == done and len(built(r)) == 1
    assert _leftovers(out / "swiftformer_xs") == []


# ---- one verified base (deploy-form, base graph, ground truth) per model and size ----------------------

def test_export_reuses_a_stored_verified_base_and_never_stores_a_failed_one(tmp_path, monkeypatch):
    store, kw = FolderBaseStore(tmp_path / "base"), dict(imgsz=32, samples=2, overrides=TINY)
    first = pipeline.export("swiftformer_xs", "onnx", out=tmp_path / "a", base_store=store, **kw)
    assert first.exit_code == 0 and (tmp_path / "base" / "hub.json").is_file()

    def boom(*a, **k):
        raise AssertionError("rebuilt although the store holds it")

    for step in ("build_train_form", "build_deploy_form", "export_onnx_info", "simplify_keeping_fusions"):
        monkeypatch.setattr(pipeline, step, boom)
    second = pipeline.export("swiftformer_xs", "onnx", precision="fp16", out=tmp_path / "b", base_store=store, **kw)
    assert second.exit_code == 0 and second.hop("onnx-fp16").status == "passed"
    assert [h.hop for h in second.parity] == ["deploy-form", "onnx", "onnx-simplified", "onnx-fp16"]
    assert [vars(h) for h in second.parity[:3]] == [vars(h) for h in first.parity]
    assert second.reparam.equivalence == first.reparam.equivalence and second.reparam.fp16 is not None
    assert second.artifacts["onnx"].sha256 == first.artifacts["onnx"].sha256
    assert second.artifacts["onnx"].info == first.artifacts["onnx"].info  # fused-op counts travel with the base
    assert first.artifacts["onnx"].info["simplify"]["ort_fused_ops"]["written"]
    assert second.checkpoint_sha256 is None and second.weights == "untrained"
    assert (second.exporter, second.exporter_fallback, second.opset) == (first.exporter, None, first.opset)
    monkeypatch.undo()

    (tmp_path / "base" / "deploy.pth").write_bytes(b"damaged")  # a damaged base is dropped, never trusted
    assert store.get() is None and not (tmp_path / "base").exists()

    strict = FolderBaseStore(tmp_path / "strict")  # a base whose hops failed is not shared
    bad = pipeline.export("swiftformer_xs", "onnx", out=tmp_path / "c", base_store=strict, tolerances=["fp32.max_rel=1e-15"],
                          **kw)
    assert bad.exit_code == 1 and not (tmp_path / "strict").exists()


def test_cells_of_one_model_and_size_share_one_verified_base(tmp_path):
    plan = write_plan(tmp_path / "plan", plan_of([XS], precisions=["fp32", "fp16"]))
    r = matrix(plan, out=tmp_path / "out", workers=2, bench=True, progress=False)
    assert r.exit_code == 0
    for c in r.cells:  # --bench: each artifact timed on its own runtime
        assert c.latency["p50_ms"] > 0 and c.latency["iters"] >= 20 and c.latency["backend"].startswith("onnxruntime")
    assert " ms" in (tmp_path / "out" / "matrix.md").read_text()
    bases = list((tmp_path / "out" / ".cache" / "hubs").glob("*/*/hub.json"))  # (the folders' former name)
    assert len(bases) == 1
    fp32, fp16 = (r.cell(f"swiftformer_xs/32/onnx-{p}").report for p in ("fp32", "fp16"))
    assert fp16["parity"][:3] == fp32["parity"] and fp16["artifacts"]["onnx"] == fp32["artifacts"]["onnx"]


def test_keys_hold_what_shapes_a_cell_and_foreign_builds_are_not_cached_under_them(tmp_path):
    from vitedge.exporter.matrix.cache import Env, base_key, cell_key, toolchain_drift, trt_mismatch
    from vitedge.exporter.matrix.plan import Cell
    from vitedge.exporter.verdict.parity_cost import SAMPLES_RULE

    env = Env(versions={"vitedge": "0.1.0", "torch": "2.13.0", "numpy": "2", "onnx": "1.23", "onnxruntime": "1.32",
                        "onnxsim": "0.8", "coremltools": "9.0", "tensorrt": None}, source="src")
    onnx32 = Cell("swiftformer_xs", "xs", 224, "onnx", "fp32", "onnx-simplified")
    key, inputs, why = cell_key(onnx32, env)
    assert why is None and "coremltools" not in inputs["toolchain"] and inputs["vitedge_source"] == "src"
    changed = [cell_key(Cell(**{**onnx32.to_dict(), **d}), env)[0] for d in
               ({"imgsz": 256}, {"precision": "fp16"}, {"samples": 64}, {"tolerances": {"fp32": {"max_rel": 1e-3}}},
                {"overrides": {"depth": 2}}, {"rewrites": False}, {"opset": 18}, {"options": {"x": 1}})]
    assert len({key, *changed}) == 9  # every input moves the key
    assert cell_key(onnx32, Env(versions={**env.versions, "onnx": "1.24"}, source="src"))[0] != key
    assert cell_key(onnx32, Env(versions=env.versions, source="edited"))[0] != key
    assert cell_key(onnx32, env, bench=True)[0] != key
    assert inputs["samples"] == SAMPLES_RULE  # no planned count: the key names the rule that picks it (stable)
    assert base_key(onnx32, env)[0] == base_key(Cell(**{**onnx32.to_dict(), "precision": "fp16"}), env)[0]

    trt = Cell("swiftformer_xs", "xs", 224, "tensorrt", "fp16", "tensorrt", trt_arch="sm_80")
    assert "not cached" in cell_key(trt, env)[2]  # no TensorRT version known: never cached
    pinned = Cell(**{**trt.to_dict(), "tensorrt_version": "10.13"})
    k80, inputs, why = cell_key(pinned, env)
    assert why is None and inputs["tensorrt"] == {"arch": "sm_80", "tensorrt": "10.13"}
    assert k80 != cell_key(Cell(**{**pinned.to_dict(), "trt_arch": "sm_89"}), env)[0]

    def report(cc, ver, onnx="1.23"):
        return {"versions": {"vitedge": "0.1.0", "onnx": onnx, "tensorrt": ver},
                "artifacts": {"tensorrt": {"info": {"versions": {"tensorrt": ver, "compute_capability": cc}}}}}

    assert trt_mismatch(pinned, inputs, report("8.0", "10.13.0.35")) is None
    assert "compute capability 8.9" in trt_mismatch(pinned, inputs, report("8.9", "10.13.0.35"))
    assert "TensorRT 11.0" in trt_mismatch(pinned, inputs, report("8.0", "11.0"))
    assert toolchain_drift(inputs, report("8.0", "10.13.0.35")) is None
    drift = toolchain_drift(inputs, report("8.0", "10.13", onnx="1.24"))
    assert drift == "not cached: built with onnx 1.24 (here 1.23)"


def test_toml_plans_read_like_yaml(tmp_path):
    (tmp_path / "plan.toml").write_text('targets = ["onnx", "coreml-fp32"]\nprecisions = ["fp16"]\n\n'
                                        '[defaults]\nsamples = 2\nios = 17\n\n[defaults.set]\nlayers = [1, 1, 1, 1]\n'
                                        'embed_dims = [8, 8, 16, 16]\nnum_classes = 5\n\n'
                                        '[[models]]\nname = "swiftformer_xs"\nimgsz = [32, 64]\n')
    r = matrix(tmp_path / "plan.toml", out=tmp_path / "out", dry_run=True)
    assert [c.id for c in r.cells] == ["swiftformer_xs/32/onnx-fp16", "swiftformer_xs/64/onnx-fp16",
                                       "swiftformer_xs/32/coreml-fp32", "swiftformer_xs/64/coreml-fp32"]
    assert r.cells[2].cached is False and not (tmp_path / "out").exists()
    assert vitedge.matrix is matrix  # the public API


def test_the_matrix_plans_executorch_cells_keyed_by_its_version(tmp_path):
    """The executorch target joins plans like any row of the targets table; its cells' keys hold the executorch
    and torchao versions that lowered them."""
    from vitedge.exporter.matrix.cache import Env, cell_key
    from vitedge.exporter.matrix.plan import Cell

    r = matrix(plan_of([XS], targets=["onnx", "executorch"], precisions=["fp16", "int8"]), out=tmp_path / "out",
               dry_run=True)
    assert [c.id for c in r.cells] == ["swiftformer_xs/32/onnx-fp16", "swiftformer_xs/32/onnx-int8",
                                       "swiftformer_xs/32/executorch-int8"]
    assert [(s["target"], s["precision"]) for s in r.skipped] == [("executorch", "fp16")]
    versions = {"vitedge": "0.1.0", "torch": "2.13.0", "executorch": "1.5.1", "torchao": "0.18.0"}
    cell = Cell("swiftformer_xs", "xs", 224, "executorch", "fp32", "executorch")
    key, inputs, why = cell_key(cell, Env(versions=versions, source="src"))
    assert why is None and inputs["toolchain"]["executorch"] == "1.5.1" and inputs["toolchain"]["torchao"] == "0.18.0"
    assert cell_key(cell, Env(versions={**versions, "executorch": "1.6.0"}, source="src"))[0] != key
