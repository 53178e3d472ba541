"""Class names, in one place: `--labels FILE` (one name per line, in index order), the names an artifact carries
(its `labels` metadata) and the model's class count they are checked against.

One reader for every command and target: the CoreML classifier and the package's labels.txt, the ONNX graph's
`vitedge.labels` metadata, and the class index of an ImageFolder `--images` folder all come from it.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import VitedgeError
from ..models.input_size import as_hw


class CarriedLabels(tuple):
    """Class names that came with the checkpoint (a transformers config.json's id2label), standing in for a --labels
    file wherever one is accepted; `str()` says where they came from."""

    def __new__(cls, names, source: str):
        self = super().__new__(cls, names)
        self.source = source
        return self

    def __str__(self) -> str:
        return self.source


def read_labels(path: str | Path | CarriedLabels, num_classes: int | None = None) -> list[str]:
    """The class names in `path`, in index order: one per line, surrounding whitespace and trailing blank lines
    dropped. An unreadable or empty file, an empty line, a repeated name or (with `num_classes`) a count other
    than the model's classes is a VitedgeError naming the file. CarriedLabels are checked alike."""
    if isinstance(path, CarriedLabels):
        return _checked([str(x).strip() for x in path], path.source, num_classes)
    p = Path(path)
    if not p.is_file():
        raise VitedgeError(f"--labels file {p} not found; give a text file with one class label per line")
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise VitedgeError(f"cannot read --labels file {p}: {e}; pass a UTF-8 text file, one class name a line") \
            from None
    while lines and not lines[-1].strip():
        lines.pop()
    return _checked([ln.strip() for ln in lines], f"--labels file {p}", num_classes)


def labels_of(meta: dict) -> list[str] | None:
    """The class names in an artifact's decoded metadata (None when it carries none)."""
    labels = meta.get("labels")
    if isinstance(labels, list) and labels and all(isinstance(x, (str, int)) for x in labels):
        return [str(x) for x in labels]
    return None


def model_classes(model, imgsz: int) -> int:
    """How many classes `model` (a torch module) predicts: the last axis of one forward on a zero image, in the
    model's own float dtype."""
    import torch  # here only: the CLI reads labels files torch-free

    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    with torch.no_grad():
        out = model.eval()(torch.zeros(1, 3, *as_hw(imgsz), dtype=dtype))
    return int((out[0] if isinstance(out, (tuple, list)) else out).shape[-1])  # a classifier's first output


def class_names(labels: str | Path | CarriedLabels | None, model, imgsz: int) -> list[str] | None:
    """--labels read and checked against the model's class count (one forward); None without it."""
    if labels is None:
        return None
    read_labels(labels)  # the file's own problems first, before any forward
    return read_labels(labels, model_classes(model, imgsz))


def _checked(labels: list[str], p: str, num_classes: int | None) -> list[str]:
    if not labels:
        raise VitedgeError(f"{p} is empty; it needs one class name per line, in index order")
    if any(not lb for lb in labels):
        raise VitedgeError(f"{p} has empty lines; write exactly one non-empty label per line")
    dup = sorted({lb for lb in labels if labels.count(lb) > 1})
    if dup:
        raise VitedgeError(f"{p} repeats {dup[:3]}; class labels must be unique")
    if num_classes is not None and len(labels) != num_classes:
        raise VitedgeError(f"{p} has {len(labels)} labels but the model has {num_classes} classes; "
                           "give one label per class")
    return labels
