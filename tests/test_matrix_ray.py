"""`vitedge matrix --ray` with a real local Ray instance (one per module, 2 CPUs), not a mock: cells run as Ray
tasks and come back through the object store; a cell needing a resource the cluster lacks (a GPU with its
architecture label, a Mac) is reported unverified after the bounded --resource-timeout, never hangs."""
from __future__ import annotations

import os
import time

import pytest

from vitedge.tests._ci import require

ray = require("ray", "the Ray tests need `pip install vitedge[ray]` (.ci/run installs it)", module_level=True)

from vitedge.exporter.matrix import matrix  # noqa: E402
from vitedge.exporter.matrix.ray_engine import LABEL_SHARE, missing_resources, resources_for  # noqa: E402

from vitedge.targets.base import sha256_file  # noqa: E402
from vitedge.tests._matrix import XS, built, plan_of, save_checkpoint, statuses, write_plan  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def ray_instance():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


def test_cells_run_as_ray_tasks_and_reuse_the_cache(tmp_path):
    (tmp_path / "plan").mkdir()
    ckpt = save_checkpoint(tmp_path / "plan" / "xs.pth", 4)  # sent as bytes: nodes need not see the driver's files
    plan = write_plan(tmp_path / "plan", plan_of([{**XS, "checkpoint": "xs.pth"}], precisions=["fp32", "fp16"]))
    out = tmp_path / "out"
    r = matrix(plan, out=out, ray=True, progress=False)
    assert r.exit_code == 0 and set(statuses(r).values()) == {"passed"}, [(c.id, c.reason) for c in r.cells]
    assert r.engine.startswith("Ray (local instance") and ray.is_initialized()  # the module's instance, kept
    for c in r.cells:  # ran in a Ray worker (the task sets `node`), asked for one CPU, came back packed
        assert c.node == os.uname().nodename and c.resources == {"CPU": 1.0}
        report = out / c.report_path
        assert report.is_file() and (out / c.id / "swiftformer_xs.onnx").is_file()
    fp32, fp16 = (r.cell(f"swiftformer_xs/32/onnx-{p}").report for p in ("fp32", "fp16"))
    assert fp32["weights"] == "checkpoint" and fp32["checkpoint_sha256"] == sha256_file(ckpt)
    assert fp16["artifacts"]["onnx-fp16"]["path"] == "swiftformer_xs.fp16.onnx"
    # the first cell's verified base came back through the object store into the cache and went out to the second
    assert len(list((out / ".cache" / "hubs").glob("*/*/hub.json"))) == 1 and fp16["parity"][:3] == fp32["parity"]

    again = matrix(plan, out=out, ray=True, progress=False)
    assert built(again) == set() and again.exit_code == 0


def test_missing_resources_come_back_unverified_in_bounded_time(tmp_path):
    plan = write_plan(tmp_path / "plan", plan_of(
        [{**XS, "targets": ["onnx", "coreml-fp32", "tensorrt-fp16"], "coreml_mode": "device"}],
        trt_arch=["sm_80"]))
    timeout = 3.0
    t0 = time.monotonic()
    r = matrix(plan, out=tmp_path / "out", ray=True, resource_timeout=timeout, progress=False)
    took = time.monotonic() - t0
    st = statuses(r)
    assert st == {"swiftformer_xs/32/onnx-fp32": "passed", "swiftformer_xs/32/coreml-fp32": "unverified",
                  "swiftformer_xs/32/tensorrt-fp16-sm_80": "unverified"}
    mac, gpu = r.cell("swiftformer_xs/32/coreml-fp32"), r.cell("swiftformer_xs/32/tensorrt-fp16-sm_80")
    assert "no live node of the Ray cluster has macos" in mac.reason and "--resource-timeout 3" in mac.reason
    assert "no live node of the Ray cluster has GPU, sm_80" in gpu.reason
    assert mac.resources == {"CPU": 1.0, "macos": LABEL_SHARE} and gpu.report is None
    assert gpu.resources == {"CPU": 1.0, "GPU": 1.0, "sm_80": LABEL_SHARE}
    assert r.exit_code == 0 and took < 120  # unverified is not a failure; bounded: no hang
    strict = matrix(plan, out=tmp_path / "out", ray=True, resource_timeout=timeout, require_verified=True,
                    progress=False)
    assert strict.exit_code == 1 and built(strict) == {"swiftformer_xs/32/coreml-fp32",
                                                       "swiftformer_xs/32/tensorrt-fp16-sm_80"}


def test_resource_matching_against_node_tables():
    from vitedge.exporter.matrix.plan import Cell

    gpu = Cell("m", "m", 32, "tensorrt", "fp16", "tensorrt", trt_arch="sm_89")
    nodes = [{"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0, "sm_80": 1.0}},
             {"Alive": False, "Resources": {"CPU": 8.0, "GPU": 1.0, "sm_89": 1.0}},
             {"Alive": True, "Resources": {"CPU": 4.0, "sm_89": 1.0}}]
    assert missing_resources(resources_for(gpu), nodes) == "no single live node has all of CPU, GPU, sm_89"
    nodes[1]["Alive"] = True
    assert missing_resources(resources_for(gpu), nodes) is None
    mac = Cell("m", "m", 32, "coreml", "fp16", "coreml", coreml_mode="device")
    assert missing_resources(resources_for(mac), nodes) == "no live node of the Ray cluster has macos"
