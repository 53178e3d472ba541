"""The `coreml` target: an ML Program `.mlpackage` for iPhone, and a runner for it on every platform.

lower(): checks, then convert.py (trace -> coremltools -> deterministic package); for a compressed precision
(w8, palette4, palette6, w8a8) the fp16 package is converted beside it and compressed into NAME.mlpackage
(compress.py), which then carries `precision` = the kind and a `compression` entry. runner(): on macOS
`MLModel.predict` (CPU_AND_NE, cross-checked against CPU_ONLY; ALL aborts on some hosts) with mode "device";
elsewhere the numpy MIL interpreter on the saved package with mode "emulated", on the first
DEFAULT_EMULATED_SAMPLES parity inputs (`runner.max_samples`).
"""
from __future__ import annotations

import copy
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch.nn as nn

from ...errors import VitedgeError
from ...models.input_size import as_hw
from ..base import Artifact, LowerSpec, Runner, StoredWeights, Target, UnavailableError, listed_sizes, reraise_interrupt
from ..rows import COREML_ROW
from .compress import KINDS, MIN_IOS, compress_package, require_kmeans
from ..labels import model_classes
from .convert import convert, input_channels
from .coremltools_import import quiet_coremltools
from .mlpackage import read_metadata
from .multifunction import MULTIFUNCTION_IOS, merge_functions
from .weights import read_package
from .options import DEFAULT_IOS, check_input, parse_ios, parse_options
from .framework import CoreMLFramework, coreml_framework_status
from .runners import DEFAULT_EMULATED_SAMPLES, DEVICE_COMPUTE_UNITS, DeviceCoreMLRunner, EmulatedCoreMLRunner, _pixels


class PackageRunner(EmulatedCoreMLRunner):
    """The emulated package on the input an app feeds it (pixels 0-255 for an image input)."""

    def run(self, x):
        return self.run_raw(x)


class CoreMLTarget(Target):
    row = COREML_ROW

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
            reraise_interrupt(e)
            return False, f"coremltools is not installed ({type(e).__name__}: {e}); pip install coremltools"
        return True, None

    def device_status(self) -> tuple[bool, str | None]:
        system = self.system or sys.platform
        if self.framework is not None:  # an injected framework stands in for CoreML.framework on "darwin"
            return (True, None) if system == "darwin" else (False, "CoreML predictions need macOS")
        return coreml_framework_status(system)

    def require(self, precision: str) -> None:
        require_kmeans(precision)  # palette4/6: scikit-learn, the [compress] extra

    def read_weights(self, path, entry: str | None = None) -> StoredWeights:
        return read_package(path, entry)

    def device_bench(self, kind: str):
        """The tethered iPhone (coremltools' remote-device support, macOS): iphone.py."""
        if kind not in self.row.devices:
            return None
        from .iphone import IphoneBench

        return IphoneBench()

    def bundle_runner(self, path, entry: str | None = None) -> Runner:
        return PackageRunner(Path(path), max_samples=None, function=entry)

    def validate_options(self, options: dict) -> None:
        """Check --ios/--input/--labels before any work (the label count is checked against the model later)."""
        parse_options(options)

    def validate_input(self, batch: int | None, options: dict) -> None:
        """A dynamic batch, or --input image / --labels at batch > 1: coremltools would reject them (exit 2)."""
        check_input(parse_options(options), batch)

    def plan_precision(self, precision: str, options: dict) -> dict:
        """A compressed kind's needs before any work: w8a8 needs iOS 17+ (activation quantize/dequantize ops): with
        no --ios the target is raised to 17 and the options say so (`ios_raised`); an explicit lower --ios is a
        VitedgeError. (palette4/6's scikit-learn is checked where packages are compressed: `require_kmeans`.)"""
        need = MIN_IOS.get(precision)
        if need is not None:
            ios = options.get("ios")
            if ios is None and need > DEFAULT_IOS:
                options = {**options, "ios": need,
                           "ios_raised": f"--precision {precision} needs iOS {need}+: the deployment target was raised "
                                         f"from the default {DEFAULT_IOS} to {need}"}
            elif ios is not None and parse_ios(ios) < need:
                raise VitedgeError(f"--precision {precision} needs iOS {need}+ (activation quantize/dequantize ops) "
                                   f"but --ios {ios} was given: use --ios {need} or later, or --precision w8")
        return options

    def plan_sizes(self, sizes: int, options: dict) -> dict:
        """One package of several sizes is a multifunction package: iOS 18+. With no --ios the target is raised to
        18 and the options say so (`ios_raised`), as with a target a compressed precision raised (w8a8: 17); an
        explicit lower --ios is a VitedgeError naming the floor."""
        ios = options.get("ios")
        if ios is None or options.get("ios_raised"):
            return {**options, "ios": MULTIFUNCTION_IOS,
                    "ios_raised": f"{sizes} input sizes in one package (a multifunction .mlpackage) need iOS "
                                  f"{MULTIFUNCTION_IOS}+ / macOS 15+: the deployment target was raised from the "
                                  f"default {DEFAULT_IOS} to {MULTIFUNCTION_IOS}"}
        if parse_ios(ios) < MULTIFUNCTION_IOS:
            raise VitedgeError(f"--ios {ios}: {sizes} input sizes make one multifunction .mlpackage, which needs iOS "
                               f"{MULTIFUNCTION_IOS}+ (macOS 15+); use --ios {MULTIFUNCTION_IOS}, or export one size "
                               "per run for an older deployment target")
        return options

    def lower_sizes(self, parts: dict, path: Path) -> Artifact:
        """Each size converted on its own (its own trace, attention order and fp16 policy) beside `path`, then
        merged into one multifunction package, one function per size (multifunction.py)."""
        path, made, infos = Path(path), {}, {}
        scratch = path.parent / f"{path.stem}.functions"
        try:
            for entry, (deploy, spec) in parts.items():
                folder = scratch / entry
                folder.mkdir(parents=True, exist_ok=True)
                art = self.lower(deploy, replace(spec, out_dir=folder))
                made[entry], infos[entry] = art.path, art.info
            sizes = {e: list(as_hw(spec.imgsz)) for e, (_, spec) in parts.items()}
            merged = merge_functions(made, sizes, path)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        first = next(iter(parts.values()))[1]
        info = {**infos[next(iter(infos))], **merged, "function_info": infos}
        if first.options.get("ios_raised"):
            info["ios_raised"] = first.options["ios_raised"]
        return Artifact(self.name, path, first.precision, info=info)

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
        if spec.precision not in self.precisions:
            raise VitedgeError(f"coreml precision must be one of {', '.join(self.precisions)}; got {spec.precision!r}")
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        given = parse_options(spec.options)
        check_input(given, spec.batch)  # before the model is even copied
        deploy_model = copy.deepcopy(deploy_model).float().eval()
        check_input(given, spec.batch, input_channels(deploy_model, spec.imgsz))
        opts = parse_options(spec.options, model_classes(deploy_model, spec.imgsz))
        path = Path(spec.out_dir) / self.file_name(spec.name, spec.precision)
        if spec.precision not in KINDS:
            return Artifact(self.name, path, spec.precision, info=convert(deploy_model, spec, opts, path))
        # compressed: the fp16 program (policy islands in fp32) first, beside the artifact, then its compression
        source = Path(spec.out_dir) / f"{spec.name}.fp16-source{self.suffix}"
        shutil.rmtree(source, ignore_errors=True)
        try:
            info = convert(deploy_model, replace(spec, precision="fp16"), opts, source)
            calib = spec.calibration
            x = None
            if calib is not None and spec.precision == "w8a8":
                x = calib.x if opts.input != "image" else _pixels(calib.x, *_stats(info))
            done = compress_package(source, path, spec.precision, calibration=x,
                                    calibration_ids=calib.ids if x is not None else None)
        finally:
            shutil.rmtree(source, ignore_errors=True)
        if x is not None:
            done.info["calibration"] = {**done.info["calibration"], **calib.record()}
        info.update(compute_precision=f"{spec.precision} (fp16 compute, {spec.precision} compression)",
                    compression=done.info)
        if spec.options.get("ios_raised"):
            info["ios_raised"] = spec.options["ios_raised"]
        return Artifact(self.name, path, spec.precision, info=info)

    def held_sizes(self, meta: dict) -> dict:
        """The sizes of a multi-size artifact: {"functions": {entry: [H, W]}} written by `lower_sizes`."""
        return listed_sizes(meta, "functions")

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
                                          kw.get("compute_units", DEVICE_COMPUTE_UNITS), function=artifact.entry)
            if mode == "device":
                raise UnavailableError(why)
        return EmulatedCoreMLRunner(path, kw.get("max_samples", DEFAULT_EMULATED_SAMPLES), function=artifact.entry)


def _stats(info: dict) -> tuple[list, list]:
    """(mean, std) of the converted package's input (its input spec)."""
    spec = info["input_spec"]
    return spec["mean"], spec["std"]
