"""One row per target: everything the rest of vitedge needs to know about a target without importing it.

A TargetRow declares a target's artifact suffixes, precisions (a selection of the precision table) and default,
whether it takes a dynamic batch, what it lowers from (the ONNX graph or the torch deploy-form), its command-line
options (flag, type, choices, default, help), the packages it needs (its extra, the pip hint; their versions key
the matrix cache and are reported), the Ray resources a matrix cell of it takes, its `bench` backend name, its
aliases, and the checks it adds to the pipeline's hops. The CLI's flag groups, `bench`, `bench --artifact`, the
matrix, the report's versions and `parity` read these rows; the Target class itself (imported lazily through
`impl`) does the work. `register(row)` adds a target from anywhere (tests/test_fake_target.py registers one from a
test file alone).

Torch-free: the CLI builds its parsers from these rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..precisions import pick

ONNX, TORCH = "onnx", "torch"  # what a target lowers: the simplified fp32 ONNX graph, or the torch deploy-form
ANE = "ane"                    # a hop check: --require-ane (where CoreML runs the model)
IOS_TARGETS = (16, 17, 18)     # coreml --ios values (declared with its row; targets/coreml/options.py checks them)
DEFAULT_IOS = 16               # coreml's --ios when none is given
INPUT_KINDS = ("tensor", "image")  # coreml --input values


@dataclass(frozen=True)
class Option:
    """One target-specific command-line option: `flag` (--workspace), its argparse type, choices, default and help;
    `dest` defaults to the flag's name with underscores (the key in LowerSpec.options)."""
    flag: str
    help: str
    type: Callable | None = None
    choices: tuple | None = None
    default: object = None
    metavar: str | None = None
    dest: str | None = None

    @property
    def key(self) -> str:
        return self.dest or self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class TargetRow:
    name: str
    impl: str | type                     # "module:Class" (imported on first use) or the Target class itself
    suffixes: tuple[str, ...]            # the artifact's own suffix first, then others recognized as this target's
    precisions: tuple[str, ...]          # names in the precision table (precisions.py)
    default_precision: str
    source: str = ONNX                   # ONNX: built from the simplified fp32 graph; TORCH: from the deploy-form
    dynamic_batch: bool = False          # whether --dynamic-batch applies
    options: tuple[Option, ...] = ()     # its own flags (a CLI group named after the target)
    shared_options: tuple[str, ...] = ()  # general flags it also consumes (e.g. labels: a CoreML classifier)
    precision_help: str = ""             # what --precision's help says of its artifacts
    extra: str | None = None             # the vitedge extra that installs what it needs (None: the core install)
    packages: tuple[str, ...] = ()       # distributions that shape its artifacts (cache keys, report versions)
    bench: str | None = None             # its `vitedge bench --backends` name (None: not benchable)
    aliases: tuple[str, ...] = ()        # other --target names for it
    artifact_format: str = ""            # `bench --artifact`'s "format" (default: the suffix without its dot)
    onnx_graph: bool = False             # its artifact is a plain ONNX graph (read with onnx; timed on ORT providers)
    devices: tuple[str, ...] = ()        # `bench --device` kinds that time its artifacts (e.g. iphone)
    checks: tuple[str, ...] = ()         # checks its hops add (ANE: --require-ane)
    ray_resources: dict = field(default_factory=dict)    # whole Ray resources a matrix cell takes, e.g. {"GPU": 1}
    ray_labels: Callable | None = None   # cell -> custom Ray resource tags it needs (its GPU arch, "macos")
    matrix_settings: tuple[str, ...] = ()  # plan settings that apply to its cells only
    per_arch: bool = False               # a plan's trt_arch list makes one cell per GPU architecture
    cache_pin: Callable | None = None    # (cell, versions) -> ({what the key pins}, why not cacheable | None)
    bundle: str | None = None            # "module:function" making its app bundle (`vitedge package --target`),
    #                                      called (model_or_name, out, **the package settings); None: no bundle
    entries: str | None = None           # what one artifact of several sizes holds per size ("function" of a CoreML
    #                                      package, "method" of a .pte: `Target.lower_sizes`); None: a file per size

    @property
    def suffix(self) -> str:
        return self.suffixes[0] if self.suffixes else ""

    @property
    def format(self) -> str:
        return self.artifact_format or self.suffix.lstrip(".")

    @property
    def option_keys(self) -> tuple[str, ...]:
        return tuple(o.key for o in self.options) + self.shared_options

    @property
    def pip(self) -> str:
        return f"pip install 'vitedge[{self.extra}]'" if self.extra else "pip install vitedge"

    def option(self, key: str) -> Option:
        return next(o for o in self.options if o.key == key)


def positive(cast: type, what: str) -> Callable:
    """An argparse type: `cast(text)`, which must be > 0 (the rows' options and the CLI's flags share it)."""
    def parse(text: str):
        import argparse

        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}")
        return v
    return parse


positive_int = positive(int, "integer")
positive_float = positive(float, "number")


# ---- the four targets ------------------------------------------------------------------------------------------

ONNX_ROW = TargetRow(
    "onnx", "vitedge.targets.onnx.target:OnnxTarget", suffixes=(".onnx",), precisions=pick("fp32", "fp16", "int8"),
    default_precision="fp32", dynamic_batch=True, onnx_graph=True, bench="onnxruntime", aliases=("onnxruntime",),
    precision_help="(OUT/NAME.fp16.onnx, OUT/NAME.int8.onnx)")


def _coreml_labels(cell) -> tuple:
    return ("macos",) if getattr(cell, "coreml_mode", None) == "device" else ()


COREML_ROW = TargetRow(
    "coreml", "vitedge.targets.coreml.target:CoreMLTarget", suffixes=(".mlpackage", ".mlmodel"),
    precisions=pick("fp16", "fp32", "w8", "palette4", "palette6", "w8a8"), default_precision="fp16",
    source=TORCH, options=(
        Option("--ios", "minimum deployment target", type=int, choices=IOS_TARGETS),
        Option("--input", "input type (image: RGB pixels, normalization built in)", choices=INPUT_KINDS)),
    shared_options=("labels",), packages=("coremltools",), bench="coreml", aliases=("mlpackage", "ios"),
    bundle="vitedge.exporter.packaging.package:package_coreml", entries="function",
    devices=("iphone",), checks=(ANE,), ray_labels=_coreml_labels, matrix_settings=("coreml_mode",))


def _trt_labels(cell) -> tuple:
    return (cell.trt_arch,) if getattr(cell, "trt_arch", None) else ()


def _trt_pin(cell, versions: dict) -> tuple[dict, str | None]:
    """A TensorRT engine is specific to a GPU architecture and a TensorRT version: both pin its key, and a cell
    with either unknown is not cached."""
    pin = {"arch": cell.trt_arch, "tensorrt": cell.tensorrt_version or versions.get("tensorrt")}
    why = None
    if pin["arch"] is None or pin["tensorrt"] is None:
        why = ("TensorRT cell without a pinned GPU architecture (trt_arch) and TensorRT version (tensorrt_version, "
               "or tensorrt installed where the matrix runs): not cached")
    return pin, why


TENSORRT_ROW = TargetRow(
    "tensorrt", "vitedge.targets.tensorrt.target:TensorRTTarget", suffixes=(".engine", ".plan"),
    precisions=pick("fp32", "fp16", "int8"), default_precision="fp16", dynamic_batch=True, options=(
        Option("--max-batch", "largest batch of the dynamic-batch profile", type=positive_int),
        Option("--workspace", "builder workspace in GiB", type=float),
        Option("--timing-cache", "timing cache file (read and updated)")),
    precision_help="(built from OUT/NAME.int8.tensorrt.onnx)", extra="tensorrt", packages=("tensorrt",),
    bench="tensorrt", aliases=("trt", "engine"), artifact_format="engine", ray_resources={"GPU": 1.0},
    ray_labels=_trt_labels, matrix_settings=("tensorrt_version",), per_arch=True, cache_pin=_trt_pin)

EXECUTORCH_ROW = TargetRow(
    "executorch", "vitedge.targets.executorch.target:ExecuTorchTarget", suffixes=(".pte",),
    bundle="vitedge.exporter.packaging.package_android:package_executorch", entries="method",
    precisions=pick("fp32", "int8"), default_precision="fp32", source=TORCH, options=(
        Option("--executorch-backend", "delegate (default xnnpack; portable: ExecuTorch's own kernels, fp32 only)",
               choices=("xnnpack", "portable")),
        Option("--executorch-rewrites", "rewrite ops XNNPACK does not take into ones it does (default on; exact, "
                                        "gated in float64)", choices=("on", "off"))),
    precision_help="(OUT/NAME.pte, OUT/NAME.int8.pte)", extra="executorch", packages=("executorch", "torchao"),
    bench="executorch", aliases=("pte", "android"))

ROWS = (ONNX_ROW, COREML_ROW, TENSORRT_ROW, EXECUTORCH_ROW)


def row_from_class(name: str, impl: str | type, cls: type) -> TargetRow:
    """The row of a Target registered as "module:Class" alone: its facts from the class's attributes, no options
    of its own on the command line (they are passed through the API)."""
    return TargetRow(name, impl, suffixes=(cls.suffix,) if cls.suffix else (), precisions=tuple(cls.precisions),
                     default_precision=cls.default_precision, dynamic_batch=cls.dynamic_batch,
                     shared_options=tuple(cls.options))
