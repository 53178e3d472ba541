"""Matrix plans: the plan document (YAML, TOML or JSON; read without torch) and the cells it resolves to.

`read_plan(path)` parses the document; `canonical(doc)` names its content, so that the resolution (resolve.py,
which imports the registry and the TARGETS table) is memoized in the cache and a fully cached re-run never
imports torch. A bad plan raises PlanError (exit 2): one line naming the key and the fix, nothing written.

Schema (README "Plan format"): top level `models` (required), `defaults`, `targets`, `precisions`, `trt_arch`;
a model entry `name` (required), `label`, `checkpoint`, `imgsz`, `set`, `targets`, `precisions`, `trt_arch`
and any setting; `defaults` holds settings, `imgsz` and `set`. A `targets` item is a target (crossed with
`precisions`) or an explicit `target-precision` pair.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...errors import VitedgeError
from ...models.input_size import canonical as canonical_size
from ..core.settings import as_size, size_text
from ..onnx.onnx_choice import DEFAULT_EXPORTER, DEFAULT_OPSET


class PlanError(VitedgeError):
    """A plan that cannot run: exit 2, nothing written."""


@dataclass
class Cell:
    """One export: one model at one size to one target and precision (a TensorRT cell also names its GPU arch)."""
    model: str
    label: str                      # folder name of the model entry (default: the model name)
    imgsz: tuple                    # (H, W); a plan or a cached resolution may say S
    target: str
    precision: str
    hop: str                        # the parity hop this cell's target writes (e.g. onnx-fp16, coreml)
    trt_arch: str | None = None
    checkpoint: str | None = None   # absolute path
    overrides: dict = field(default_factory=dict)
    samples: int | None = None      # None: export's GMACs rule (exporter/verdict/parity_cost.py)
    batch: int = 1
    opset: int = DEFAULT_OPSET
    rewrites: object = True         # True (all) | False (none) | [names]
    attn_order: str = "auto"
    tolerances: dict = field(default_factory=dict)  # {profile: {key: value}} overrides of the defaults
    options: dict = field(default_factory=dict)     # this target's options only (labels: absolute path)
    coreml_mode: str | None = None  # "device": only a real CoreML prediction (a Mac) verifies the cell
    tensorrt_version: str | None = None             # pins TensorRT cells' cache keys
    exporter: str = DEFAULT_EXPORTER                # the ONNX exporter of the cell's base graph

    def __post_init__(self):
        self.imgsz = as_size(self.imgsz)

    @property
    def size(self):
        """S for a square cell, (H, W) otherwise: what its records and cache keys hold (square ones unchanged)."""
        return canonical_size(self.imgsz)

    @property
    def id(self) -> str:
        return f"{self.label}/{size_text(self.imgsz)}/{self.folder}"  # (a square size's folder: 224, as it was)

    @property
    def folder(self) -> str:
        return f"{self.target}-{self.precision}" + (f"-{self.trt_arch}" if self.trt_arch else "")

    def to_dict(self) -> dict:
        return {**asdict(self), "imgsz": self.size}

    @classmethod
    def from_dict(cls, d: dict) -> "Cell":
        return cls(**d)


@dataclass
class ResolvedPlan:
    cells: list
    skipped: list  # [{"model", "target", "precision", "why"}]: cross-product pairs a target does not support

    def to_dict(self) -> dict:
        return {"cells": [c.to_dict() for c in self.cells], "skipped": self.skipped}

    @classmethod
    def from_dict(cls, d: dict) -> "ResolvedPlan":
        return cls([Cell.from_dict(c) for c in d["cells"]], d["skipped"])


# ---- reading (no torch) ------------------------------------------------------------------------------

def read_plan(path: str | Path) -> dict:
    """The plan document as plain data (YAML, or TOML / JSON by suffix)."""
    path = Path(path)
    if not path.is_file():
        raise PlanError(f"plan {path} not found; give the path of a YAML or TOML plan file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib
            doc = tomllib.loads(text)
        elif path.suffix == ".json":
            doc = json.loads(text)
        else:
            doc = _yaml(text)
    except PlanError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise PlanError(f"plan {path} does not parse ({type(e).__name__}: {first}); fix its syntax") from None
    if not isinstance(doc, dict):
        raise PlanError(f"plan {path} must be a mapping with a `models` list at the top level")
    return doc


def _yaml(text: str):
    try:
        import yaml
    except ImportError:
        raise PlanError("YAML plans need PyYAML (pip install pyyaml), or write the plan as .toml") from None

    class Loader(yaml.SafeLoader):  # a repeated key would silently win in plain YAML: refuse it
        pass

    def mapping(loader, node, deep=False):
        seen = set()
        for k, _ in node.value:
            key = loader.construct_object(k, deep=deep)
            if key in seen:
                raise PlanError(f"plan key {key!r} appears twice in one mapping (line {k.start_mark.line + 1}); "
                                "keep one")
            seen.add(key)
        return loader.construct_mapping(node, deep=deep)

    Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    return yaml.load(text, Loader=Loader)


def canonical(doc: dict) -> str:
    """The document's content as canonical JSON (the resolution memo's name in the cache)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
