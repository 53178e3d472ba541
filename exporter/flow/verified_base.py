"""The verified base of an export: what every target of one model at one size builds from, reusable across exports.

A `VerifiedBase` is the part of the parity ladder before any target: the deploy-form (folded, through the float64
gate), the simplified fp32 ONNX graph every target is lowered from (the "base graph"; ONNX Runtime runs it as the
`onnx` target), the train-form's float64 ground truth on the parity set, and the hop records that verified them.
It depends on the model, its weights, the size and the parity set, not on the target or precision: one base
serves every target of an export, and `vitedge matrix` reuses it across the cells of one model and size.

`export(base_store=store)` asks the store (a `BaseStore`) for a VerifiedBase first. When it holds one, the export
skips the train-form, the fold, the float64 gate, the ONNX export and onnxsim and their hops: the base's verified
deploy-form, simplified ONNX, ground truth and hop records take their place, and only the target hops run. The
train-form itself is rebuilt only if a hop needs it (a runner that changes its inputs, `Runner.reference_inputs`).
When the store holds none, the export builds the base as usual and puts it there once every hop so far passed, so
a failed base is never shared. The caller keys the store by everything the base depends on (`vitedge matrix`:
exporter/matrix/cache.py `base_key`). (Earlier versions called it the "hub": `export(hub=...)` still works,
deprecated, and the matrix cache's folders keep that name on disk: hubs/, hub.json, hub.onnx.)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import onnx
import torch.nn as nn

from ..verdict.criteria import GroundTruth
from ..reparam.build_forms import Loaded
from ..verdict.inputs import ParitySet
from ..core.report import Hop, ReparamInfo


@dataclass
class VerifiedBase:
    """The verified deploy-form, the simplified base ONNX (a file, with metadata) and the raw graph, the
    train-form's ground truth on the parity set (float64 and float32: criteria.GroundTruth) and how that set was
    made, the hops that verified them (deploy-form, onnx, onnx-simplified) and the train-form facts."""
    deploy: nn.Module
    imgsz: int                       # the size the deploy-form was folded for and the truth computed at
    onnx_path: Path
    raw: onnx.ModelProto | None
    truth: GroundTruth
    inputs: str                      # the parity set's note (ParitySet.note): which inputs the truth is on
    hops: list                       # [Hop]
    reparam: ReparamInfo
    attn_order: str
    weights: str
    checkpoint_sha256: str | None
    overrides: dict
    # How the base ONNX was made (onnx_export.OnnxExport.info(): exporter, exporter_requested, opset, fallback)
    export: dict = field(default_factory=lambda: {"exporter": None, "exporter_requested": None, "opset": None,
                                                  "exporter_fallback": None})
    resized: list = field(default_factory=list)  # what the train-form changed to run at `imgsz` (report.resized)

    def loaded(self, name: str) -> Loaded:
        """The train-form facts of the export, with the deploy-form standing in for the train-form module (whose
        input statistics it carries; its default size is the base's); the train-form is not built."""
        return Loaded(self.deploy, name, self.weights, self.checkpoint_sha256, dict(self.overrides),
                      checkpoint_imgsz=self.imgsz, resized=list(self.resized))

    def check_fits(self, imgsz: int, inputs: ParitySet, exporter: str | None = None) -> None:
        """A store keyed wrongly would pass off another export's verdicts: refuse it loudly."""
        size = self.imgsz
        if size != imgsz or len(self.truth.y64) != len(inputs) or self.inputs != inputs.note:
            raise ValueError(f"the verified base was built for size {size} and {len(self.truth.y64)} parity "
                             f"inputs ({self.inputs}), not {imgsz} and {len(inputs)} ({inputs.note})")
        if exporter is not None and self.export.get("exporter_requested") != exporter:
            raise ValueError(f"the verified base's ONNX was exported with "
                             f"{self.export.get('exporter_requested')}, not {exporter}")

    def hop_records(self) -> list[Hop]:
        return copy.deepcopy(self.hops)


class BaseStore(Protocol):
    """Where export(base_store=...) finds a VerifiedBase to reuse (`get`; None: build it) and leaves the one it
    built (`put`, called only when every hop so far passed). The VerifiedBase given to `put` points at the
    export's build folder, which is renamed or removed when the export ends: a store copies the files it keeps
    during the call."""
    def get(self) -> VerifiedBase | None: ...

    def put(self, base: VerifiedBase) -> None: ...
