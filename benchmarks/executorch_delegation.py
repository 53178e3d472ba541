"""ExecuTorch delegation per family: which ops each family's program leaves outside XNNPACK, fp32 and int8, with
and without vitedge's delegable rewrites.

For every family's reduced config (the test suite's, tests/_families.py) it lowers the deploy-form four ways
(fp32 / int8 x rewrites on / off; int8 calibrated on 8 views of the shipped photos) and records the ops outside
the delegate, the delegate calls, the rewrites applied and their float64 gate, the lowering time, and what the
program computes: its largest difference from the deploy-form on 2 of the views, relative to the largest output
(fp32 within 1e-4). The default test run lowers two families live (SwiftFormer and SLAB DeiT) and checks this
file for every family; `python -m pytest -m benchmarks` lowers each family live.

    python benchmarks/executorch_delegation.py [--quick] [--out FILE]
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

import _script
from vitedge.exporter.reparam.build_forms import build_deploy_form, build_train_form
from vitedge.exporter.verdict.inputs import natural_inputs
from vitedge.exporter.verdict.metrics import compute_metrics
from vitedge.models.registry import input_stats
from vitedge.targets import get_target
from vitedge.targets.base import LowerSpec
from vitedge.targets.calibration import Calibration
from vitedge.tests._families import CASES

QUICK = ("swiftformer",)
FP32_REL_ERR = 1e-4  # an fp32 program computes the deploy-form's function (tests/test_executorch_delegation.py)


def main(argv=None) -> int:
    ap = _script.parser("executorch_delegation", __doc__)
    args = ap.parse_args(argv)
    started, info = _script.begin("executorch_delegation", args.quick)
    target = get_target("executorch")
    rows = []
    for family in (QUICK if args.quick else sorted(CASES)):
        name, overrides, imgsz = CASES[family]
        train = build_train_form(name, overrides=overrides).model
        deploy, _ = build_deploy_form(train, imgsz)
        mean, std = input_stats(train)
        x, ids = natural_inputs(8, imgsz, seed=5, mean=mean, std=std)
        calib = Calibration(x.numpy(), ids, "natural")
        with torch.no_grad():
            ref = deploy(x[:2]).numpy()  # what every program of this family must compute
        for precision in ("fp32", "int8"):
            for rewrites in ("on", "off"):
                t0 = time.perf_counter()
                art = target.lower(deploy, LowerSpec(name, imgsz, 1, precision, Path(tempfile.mkdtemp()), None,
                                                     metadata={"mean": list(mean)},
                                                     options={"executorch_rewrites": rewrites},
                                                     calibration=calib if precision == "int8" else None))
                row = {"family": family, "model": name, "overrides": overrides, "imgsz": imgsz,
                       "precision": precision, "rewrites": rewrites,
                       "outside_delegate": art.info["outside_delegate"], "delegate_calls": art.info["delegate_calls"],
                       "fully_delegated": art.info["fully_delegated"], "rewrite_record": art.info.get("rewrites"),
                       "lower_s": round(time.perf_counter() - t0, 1)}
                with target.runner(art) as runner:
                    row["max_rel_err"] = compute_metrics(ref, runner.run(x[:2].numpy())).max_rel
                rows.append(row)
                left = ", ".join(f"{k} x{v}" for k, v in row["outside_delegate"].items()) or "none"
                print(f"  {family:<12} {precision} rewrites {rewrites:<3}: outside XNNPACK: {left}", flush=True)
    body = {"settings": {"configs": "tests/_families.py CASES", "calibration": "8 natural views",
                         "max_rel_err": "max|program - deploy-form| / max|deploy-form| on 2 views",
                         "fp32_rel_err_at_most": FP32_REL_ERR}, "rows": rows}
    path = _script.write_results(_script.out_path("executorch_delegation", args), "executorch_delegation",
                                 info, args, body, started)
    whole = [r for r in rows if r["rewrites"] == "on"]
    print(f"\nresults: {path}\nwith the rewrites: {sum(r['fully_delegated'] for r in whole)} of {len(whole)} "
          "(family, precision) programs delegated whole")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
