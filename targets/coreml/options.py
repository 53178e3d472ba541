"""The coreml target's options (--ios, --input, --labels): their values and their checks.

Torch- and coremltools-free, so the CLI builds its parsers from IOS_TARGETS / INPUT_KINDS without importing either.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import VitedgeError

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


def read_labels(path, num_classes: int | None = None) -> list[str]:
    """One label per line (trailing blank lines ignored); the count must match the model's classes."""
    p = Path(path)
    if not p.is_file():
        raise VitedgeError(f"--labels file {p} not found; give a text file with one class label per line")
    lines = p.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    labels = [ln.strip() for ln in lines]
    if not labels or any(not lb for lb in labels):
        raise VitedgeError(f"--labels file {p} has empty lines; write exactly one non-empty label per line")
    dup = sorted({lb for lb in labels if labels.count(lb) > 1})
    if dup:
        raise VitedgeError(f"--labels file {p} repeats {dup[:3]}; class labels must be unique")
    if num_classes is not None and len(labels) != num_classes:
        raise VitedgeError(f"--labels file {p} has {len(labels)} labels but the model has {num_classes} classes; "
                           "give one label per class")
    return labels


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
