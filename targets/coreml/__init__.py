"""The `coreml` target as a package, one job per module:

options.py          --ios / --input / --labels values and checks (torch-free: the CLI reads IOS_TARGETS)
convert.py          deploy-form -> torch.jit.trace -> coremltools -> a saved ML Program, and its report facts
fixes.py            the coremltools patches, each with the coremltools version it is for (tests prove each is needed)
validate_once.py    one MIL validation per pass pipeline instead of one per pass (conversion time, same program)
mlpackage.py        the package on disk: deterministic bytes, its spec and user metadata
runners.py          CoreML itself on macOS ("device"), the MIL interpreter elsewhere ("emulated")
framework.py        CoreML.framework (macOS): loading, the compute plan, the Neural Engine residency check
target.py           CoreMLTarget, the Target behind get_target("coreml")
coremltools_import.py  coremltools' first import: quiet, and in the CLI without the converters vitedge never calls
mil_interpreter.py  reads a saved ML Program and runs it with numpy, op by op, honouring each op's dtype
mil_ops.py          the numpy kernel of every MIL op the emulator knows
mil_ops_compressed.py  the kernels of compressed programs (constexpr dequantize / LUT ops, quantize / dequantize)
compress.py         w8 / palette4|6 / w8a8 through coremltools.optimize on a saved package, and what it did
iphone.py           the tethered iPhone (`bench --device iphone`): devicectl through coremltools, the transport twin

Names are imported lazily from here (`from vitedge.targets.coreml import CoreMLTarget`), so importing the options
does not import torch or coremltools.
"""
from __future__ import annotations

import importlib

_NAMES = {
    "CoreMLTarget": "target",
    "CoreMLOptions": "options", "IOS_TARGETS": "options", "DEFAULT_IOS": "options", "INPUT_KINDS": "options",
    "parse_ios": "options", "parse_options": "options", "read_labels": "options",
    "DEFAULT_EMULATED_SAMPLES": "runners", "DEVICE_COMPUTE_UNITS": "runners", "EmulatedCoreMLRunner": "runners",
    "DeviceCoreMLRunner": "runners", "quantized_pixels": "runners",
    "CoreMLFramework": "framework", "coreml_framework_status": "framework", "ComputePlanUnavailable": "framework",
    "MIN_ANE_SHARE": "framework", "summarize_compute_plan": "framework", "ane_residency": "framework",
    "manifest_item_id": "mlpackage", "make_package_deterministic": "mlpackage", "load_program_spec": "mlpackage",
    "read_metadata": "mlpackage", "check_package_loads": "mlpackage",
    "fold_input_std": "convert", "PIXEL_SCALE": "convert",
    "CONVERSION_FIXES": "fixes",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
