"""The coreml target's options (--ios, --input, --labels): their values and their checks (--labels is read by
targets/labels.py, the one reader every command uses).

Torch- and coremltools-free, so the CLI builds its parsers from IOS_TARGETS / INPUT_KINDS without importing either.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import VitedgeError
from ..labels import read_labels  # noqa: F401  (one reader for every target; re-exported)

IOS_TARGETS = (16, 17, 18)
DEFAULT_IOS = 16
INPUT_KINDS = ("tensor", "image")


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
