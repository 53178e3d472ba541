"""The coreml target's options (--ios, --input, --labels): their values and their checks (--labels is read by
targets/labels.py, the one reader every command uses).

Torch- and coremltools-free, so the CLI builds its parsers from IOS_TARGETS / INPUT_KINDS without importing either.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import VitedgeError
from ..labels import read_labels  # noqa: F401  (one reader for every target; re-exported)
from ..rows import DEFAULT_IOS, INPUT_KINDS, IOS_TARGETS  # noqa: F401  (declared with the target's row)


@dataclass
class CoreMLOptions:
    ios: int = DEFAULT_IOS
    input: str = "tensor"
    labels: list | None = None
    labels_path: str | None = None


def parse_ios(value) -> int:
    s = str(value).strip().lower().removeprefix("ios")
    if not s.isdigit() or int(s) not in IOS_TARGETS:
        raise VitedgeError(f"--ios must be one of {', '.join(map(str, IOS_TARGETS))}; got {value!r}")
    return int(s)


def parse_options(options: dict, num_classes: int | None = None) -> CoreMLOptions:
    opts = CoreMLOptions()
    if options.get("ios") is not None:
        opts.ios = parse_ios(options["ios"])
    if options.get("input") is not None:
        if options["input"] not in INPUT_KINDS:
            raise VitedgeError(f"--input must be one of {', '.join(INPUT_KINDS)}; got {options['input']!r}")
        opts.input = options["input"]
    if options.get("labels") is not None:
        opts.labels_path = str(options["labels"])
        opts.labels = read_labels(options["labels"], num_classes)
    return opts


def check_input(opts: CoreMLOptions, batch: int | None, channels: int | None = None) -> None:
    """What coremltools would reject in the package's input, checked before any conversion: a dynamic batch, an
    image input (RGB images are (1, 3, H, W) to coremltools) or a classifier (its classify op labels one
    probability vector) at batch > 1, and a model that does not read 3 channels (`channels`, when known)."""
    if batch is None:
        raise VitedgeError("--dynamic-batch is not supported by coreml (static shapes keep the Neural Engine "
                           "usable); export coreml in a separate run without it")
    if opts.input == "image" and batch != 1:
        raise VitedgeError(f"--input image makes CoreML's RGB image input, one image per prediction (coremltools "
                           f"takes image inputs of shape (1, 3, H, W)); got --batch {batch}: drop --batch, or use "
                           "--input tensor for a batched package")
    if opts.labels_path is not None and batch != 1:
        raise VitedgeError(f"--labels makes a CoreML classifier, which labels one image per prediction; got --batch "
                           f"{batch}: drop --batch, or drop --labels for a batched package of logits")
    if channels is not None and channels != 3:
        raise VitedgeError(f"coreml declares an RGB input of 3 channels ((batch, 3, H, W), {opts.input} input), but "
                           f"this model's first layer reads {channels}: build the model with in_chans=3")
