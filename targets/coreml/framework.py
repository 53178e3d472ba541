"""CoreML.framework itself (macOS only): loading a package, its compute plan (which device each op prefers), and
the Neural Engine residency check behind --require-ane.

`CoreMLFramework` is the one seam to Apple's framework: tests inject a stand-in with the same methods.
"""
from __future__ import annotations

import platform
import sys
from pathlib import Path

from .coremltools_import import quiet_coremltools


MIN_ANE_SHARE = 0.5  # --require-ane: at least this share of the estimated cost (else of the ops) on the ANE


class ComputePlanUnavailable(RuntimeError):
    """CoreML cannot give a compute plan here (macOS < 14.4, no CoreML framework, the framework refused)."""


def _device_kind(device) -> str:
    """"ane" | "gpu" | "cpu" | "unknown" for a coremltools MLComputeDevice."""
    from coremltools.models.compute_device import (MLCPUComputeDevice, MLGPUComputeDevice,
                                                   MLNeuralEngineComputeDevice)
    for cls, key in ((MLNeuralEngineComputeDevice, "ane"), (MLGPUComputeDevice, "gpu"), (MLCPUComputeDevice, "cpu")):
        if isinstance(device, cls):
            return key
    return "unknown"


def summarize_compute_plan(plan) -> dict:
    """Each main-function op's preferred device, with counts and the estimated-cost share per device."""
    program = plan.model_structure.program
    if program is None:
        raise ComputePlanUnavailable("the model is not an ML Program")
    counts = {"ane": 0, "gpu": 0, "cpu": 0, "unknown": 0}
    cost = dict.fromkeys(counts, 0.0)
    ops, weighed = [], 0
    for op in program.functions["main"].block.operations:
        if op.operator_name == "const":
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
        key = _device_kind(usage.preferred_compute_device) if usage is not None else "unknown"
        counts[key] += 1
        est = plan.get_estimated_cost_for_mlprogram_operation(op)
        if est is not None:
            cost[key] += float(est.weight)
            weighed += 1
        ops.append([op.operator_name, op.outputs[0].name if op.outputs else "", key])
    total = sum(counts.values())
    wsum = sum(cost.values())
    return {**counts, "ops": total, "ane_op_share": counts["ane"] / total if total else None,
            "cost_share": {k: v / wsum for k, v in cost.items()} if weighed and wsum > 0 else None,
            "per_op": ops}


def ane_residency(plan: dict, has_ane: bool | None, threshold: float | None = None,
                  precision: str | None = None) -> dict:
    """passed / failed / inconclusive: does a model meant for the Neural Engine mostly run there?

    The share is of the estimated cost (MLComputePlan's per-op weights) when CoreML gives it, else of the ops.
    Inconclusive, never passed or failed, where no Neural Engine exists (virtualized CI Macs) or it is unknown."""
    threshold = MIN_ANE_SHARE if threshold is None else threshold
    if has_ane is False:
        return {"status": "inconclusive", "threshold": threshold,
                "reason": "this Mac has no Neural Engine that CoreML can use (e.g. a virtualized CI Mac): where the "
                          "model would run on an iPhone cannot be told here"}
    if has_ane is None:
        return {"status": "inconclusive", "threshold": threshold,
                "reason": "CoreML did not list its compute devices (macOS 14+ needed)"}
    by_cost = plan.get("cost_share") is not None
    share = plan["cost_share"]["ane"] if by_cost else plan.get("ane_op_share")
    if share is None:
        return {"status": "inconclusive", "threshold": threshold, "reason": "the compute plan lists no op"}
    what = "estimated cost" if by_cost else "ops"
    off = [o for o in plan.get("per_op", []) if o[2] != "ane"][:10]
    out = {"status": "passed" if share >= threshold else "failed", "share": share, "measure": what,
           "threshold": threshold, "ops": {k: plan[k] for k in ("ane", "gpu", "cpu", "unknown")}, "not_on_ane": off}
    if out["status"] == "failed":
        hint = "; fp32 models never run on the Neural Engine: export fp16" if precision == "fp32" else ""
        out["reason"] = (f"{share:.0%} of the {what} prefers the Neural Engine ({plan['ane']} of {plan['ops']} ops), "
                         f"below --require-ane's {threshold:.0%}{hint}")
    else:
        out["reason"] = f"{share:.0%} of the {what} prefers the Neural Engine ({plan['ane']} of {plan['ops']} ops)"
    return out


class CoreMLFramework:
    """The real CoreML through coremltools (macOS only). Tests inject a stand-in with the same methods."""

    def load(self, path: Path, compute_unit: str, function: str | None = None):
        """The package's MLModel (of its `function`, in a multifunction package; None: the default one)."""
        with quiet_coremltools():
            import coremltools as ct
        extra = {"function_name": function} if function else {}
        return ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, compute_unit), **extra)

    def compute_plan(self, path: Path, compute_unit: str) -> dict:
        """Each op's preferred device (MLComputePlan, macOS 14.4+) for `compute_unit`; summarize_compute_plan."""
        with quiet_coremltools():
            import coremltools as ct
            from coremltools.models.compute_plan import MLComputePlan
        ver = tuple(int(v) for v in (platform.mac_ver()[0] or "0").split(".")[:2])
        if sys.platform == "darwin" and ver < (14, 4):
            raise ComputePlanUnavailable(f"MLComputePlan needs macOS 14.4+ (this is {platform.mac_ver()[0]})")
        units = getattr(ct.ComputeUnit, compute_unit)
        model = ct.models.MLModel(str(path), compute_units=units)
        try:
            plan = MLComputePlan.load_from_path(path=model.get_compiled_model_path(), compute_units=units)
        except ValueError as e:  # "MLComputePlan is not supported." (no CoreML framework proxy)
            raise ComputePlanUnavailable(str(e)) from None
        except RuntimeError as e:  # the framework's own error, passed through pybind11
            raise ComputePlanUnavailable(f"CoreML could not build the compute plan: {e}") from None
        return summarize_compute_plan(plan)

    def has_neural_engine(self) -> bool | None:
        """Whether CoreML can use a Neural Engine here (None: it cannot tell, macOS < 14)."""
        with quiet_coremltools():
            import coremltools as ct
            from coremltools.models.compute_device import MLNeuralEngineComputeDevice
        try:
            devices = ct.models.MLModel.get_available_compute_devices()
        except (AttributeError, RuntimeError):  # no framework proxy, or macOS < 14: the API is missing
            return None
        return any(isinstance(d, MLNeuralEngineComputeDevice) for d in devices)


def coreml_framework_status(system: str | None = None) -> tuple[bool, str | None]:
    """Can CoreML itself run predictions here? (macOS with coremltools' libcoremlpython)"""
    system = system or sys.platform
    if system != "darwin":
        return False, "CoreML predictions need macOS (coremltools ships libcoremlpython for macOS only)"
    try:
        with quiet_coremltools():
            from coremltools import libcoremlpython  # noqa: F401
    except Exception as e:
        return False, f"coremltools cannot load CoreML.framework here ({type(e).__name__}: {e})"
    return True, None
