"""The `coreml` target: an ML Program `.mlpackage` for iPhone, and a runner for it on every platform.

lower(): checks, then convert.py (trace -> coremltools -> deterministic package). runner(): on macOS
`MLModel.predict` (CPU_AND_NE, cross-checked against CPU_ONLY; ALL aborts on some hosts) with mode "device";
elsewhere the numpy MIL interpreter on the saved package with mode "emulated", on the first
DEFAULT_EMULATED_SAMPLES parity inputs (`runner.max_samples`).
"""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch.nn as nn

from ...errors import VitedgeError
from ..base import Artifact, LowerSpec, Runner, Target, UnavailableError
from .convert import convert, num_classes
from .mil_interpreter import quiet_coremltools
from .mlpackage import read_metadata
from .options import parse_options
from .framework import CoreMLFramework, coreml_framework_status
from .runners import DEFAULT_EMULATED_SAMPLES, DEVICE_COMPUTE_UNITS, DeviceCoreMLRunner, EmulatedCoreMLRunner


class CoreMLTarget(Target):
    name = "coreml"
    suffix = ".mlpackage"
    default_precision = "fp16"
    precisions = ("fp16", "fp32")
    options = ("ios", "input", "labels")
    dynamic_batch = False

    def __init__(self, framework=None, system: str | None = None):
        # `framework`/`system` are injectable so the macOS dispatch is testable on Linux.
        self.framework = framework
        self.system = system

    # -- capability --------------------------------------------------------------------------------
    def available(self) -> tuple[bool, str | None]:
        try:
            with quiet_coremltools():
                import coremltools  # noqa: F401
        except Exception as e:
            return False, f"coremltools is not installed ({type(e).__name__}: {e}); pip install coremltools"
        return True, None

    def device_status(self) -> tuple[bool, str | None]:
        system = self.system or sys.platform
        if self.framework is not None:  # an injected framework stands in for CoreML.framework on "darwin"
            return (True, None) if system == "darwin" else (False, "CoreML predictions need macOS")
        return coreml_framework_status(system)

    def validate_options(self, options: dict) -> None:
        """Check --ios/--input/--labels before any work (the label count is checked against the model later)."""
        parse_options(options)

    def run_mode(self) -> tuple[str, str | None]:
        """("device", None) where CoreML itself predicts, else ("emulated", why not device)."""
        ok, why = self.device_status()
        return ("device", None) if ok else ("emulated", why)

    def runnable(self) -> tuple[bool, str | None]:
        # Natively on macOS, else emulated by the numpy MIL interpreter (reported mode "emulated"); both read the
        # package with coremltools' libraries.
        return self.available()

    # -- lowering ----------------------------------------------------------------------------------
    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        if spec.batch is None:
            raise VitedgeError("--dynamic-batch is not supported by coreml (static shapes keep the Neural Engine "
                               "usable); export coreml in a separate run without it")
        if spec.precision not in self.precisions:
            raise VitedgeError(f"coreml precision must be one of {', '.join(self.precisions)}; got {spec.precision!r}")
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        deploy_model = copy.deepcopy(deploy_model).float().eval()
        opts = parse_options(spec.options, num_classes(deploy_model, spec.imgsz))
        path = Path(spec.out_dir) / f"{spec.name}{self.suffix}"
        info = convert(deploy_model, spec, opts, path)
        return Artifact(self.name, path, spec.precision, info=info)

    def read_metadata(self, path) -> dict:
        """What the package says about itself (model, imgsz, precision, ...)."""
        return read_metadata(Path(path))

    # -- running -----------------------------------------------------------------------------------
    def runner(self, artifact: Artifact, mode: str | None = None, **kw) -> Runner:
        """Device runner on macOS, emulated runner elsewhere; `mode` forces one ("device" fails off macOS)."""
        path = Path(artifact.path)
        if mode not in (None, "device", "emulated"):
            raise ValueError(f"mode must be 'device' or 'emulated'; got {mode!r}")
        if mode != "emulated":
            ok, why = self.device_status()
            if ok:
                return DeviceCoreMLRunner(path, self.framework or CoreMLFramework(),
                                          kw.get("compute_units", DEVICE_COMPUTE_UNITS))
            if mode == "device":
                raise UnavailableError(why)
        return EmulatedCoreMLRunner(path, kw.get("max_samples", DEFAULT_EMULATED_SAMPLES))
