"""Shared test fixtures: the official golden fixtures and small helpers."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Two test workers on two cores, each with 2-thread float32 references and benchmark scripts in subprocesses
# beside them: OpenMP threads that spin-wait between ops take cores from the others (12 quick benchmark scripts at
# once: 363 CPU s passive against 424 s spinning, measured here). Set before torch loads its OpenMP runtime; the
# workers and subprocesses inherit it. It changes how idle threads wait, not what any op computes.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# Many tiny float64 ops: one intra-op thread is several times faster than two on small CI machines.
torch.set_num_threads(1)
# The float64 ground-truth cache (exporter/verdict/truth_cache.py) in a folder of this test session's own, shared by the CLI
# subprocesses it starts: tests never read a developer's cache or leave entries in it.
_CACHE = tempfile.mkdtemp(prefix="vitedge-test-cache-")
os.environ["VITEDGE_CACHE_DIR"] = _CACHE
os.environ.pop("VITEDGE_TRUTH_CACHE", None)
atexit.register(shutil.rmtree, _CACHE, True)

GOLDEN = Path(os.environ.get("VITEDGE_GOLDEN", REPO.parent / "shared" / "golden"))


def golden_path(name: str) -> Path:
    """The official golden fixture `name`. A missing fixture FAILS the test: the official outputs are the ground
    truth, and a test that silently skips them proves nothing."""
    p = GOLDEN / name
    if not p.exists():
        pytest.fail(f"official golden fixture {p} not found: the golden fixtures are expected in {GOLDEN} "
                    f"(by default ../shared/golden beside the repository); point VITEDGE_GOLDEN at the folder "
                    f"holding them (e.g. VITEDGE_GOLDEN=/path/to/shared/golden)", pytrace=False)
    return p


def load_golden(name: str) -> dict:
    return torch.load(golden_path(name), weights_only=True)


def assert_close_rel(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """max|y - ref| <= rel * max|ref| (the golden fixtures' tolerance form)."""
    err = float((y.double() - ref.double()).abs().max())
    scale = float(ref.double().abs().max())
    assert err <= rel * scale, f"max|diff| {err:.3e} > {rel:.0e} * max|ref| ({scale:.3e})"


@pytest.fixture
def golden():
    return load_golden


def onnx_parity(train_model, deploy_model, imgsz: int, samples: int = 4, seed: int = 0):
    """Export `deploy_model` to ONNX (checked, simplified), run it in ONNX Runtime (CPU) on the parity inputs and
    compare it in fp32 with the train-form eval model; returns (metrics, node counts of the simplified graph)."""
    import copy

    from vitedge.exporter.verdict.inputs import parity_inputs
    from vitedge.exporter.onnx.onnx_export import check_onnx, export_onnx, node_counts, simplify_onnx
    from vitedge.exporter.verdict.parity import compute_metrics, run_batched
    from vitedge.targets.onnx.target import OnnxRuntimeRunner

    graph = simplify_onnx(check_onnx(export_onnx(copy.deepcopy(deploy_model), imgsz, batch=None)))
    x = parity_inputs(samples, imgsz, seed=seed)
    with torch.no_grad():
        ref = copy.deepcopy(train_model).float().eval()(x).numpy()
    out = run_batched(OnnxRuntimeRunner(graph, threads=1), x.numpy())
    return compute_metrics(ref, out), node_counts(graph)


def load_test_helper(name: str):
    """A helper module from this folder (tests are collected with --import-mode=importlib: not on sys.path)."""
    import importlib.util
    import sys
    key = f"vitedge_test_helpers.{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


@pytest.fixture(scope="session")
def trt_fake():
    """tests/trt_fake.py: the spec_set fake `tensorrt` module built from targets/tensorrt/api.py."""
    return load_test_helper("trt_fake")
