"""The small interface every backend implements.

A Target lowers the verified deploy-form model (and/or its simplified fp32 ONNX) into an artifact, and
gives a Runner for an artifact. `available()` / `runnable()` are the only places that check platforms:
a backend that cannot run here says why, and the parity hop is reported "unverified" with that reason.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch.nn as nn


@dataclass
class LowerSpec:
    """Everything a target needs to lower one model."""
    name: str                 # model name (file stem)
    imgsz: int
    batch: int | None         # None = dynamic batch
    precision: str            # "fp32" | "fp16"
    out_dir: Path             # the temporary build folder (renamed into place by the pipeline)
    onnx_path: Path | None    # the simplified, verified fp32 ONNX
    metadata: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # target-specific flags (ios, input, labels, workspace, ...)


@dataclass
class Artifact:
    target: str
    path: Path
    precision: str
    extra_files: list = field(default_factory=list)  # sidecars written next to it
    info: dict = field(default_factory=dict)          # anything the report should carry (policy, node counts, ...)


class Runner(ABC):
    """Runs an artifact on float32 NCHW batches and returns float32 logits."""
    mode: str = "device"  # "reference" | "device" | "emulated"
    backend: str = ""

    @abstractmethod
    def run(self, x: np.ndarray) -> np.ndarray:
        ...

    def max_batch(self) -> int | None:
        """Largest batch the artifact accepts per call (None: any)."""
        return None


class Target(ABC):
    name: str = ""
    suffix: str = ""
    default_precision: str = "fp32"
    precisions: tuple = ("fp32",)
    options: tuple = ()          # target-specific CLI option names it accepts
    dynamic_batch: bool = False  # whether --dynamic-batch applies

    def available(self) -> tuple[bool, str | None]:
        """Can this target lower artifacts here? (ok, reason when not)."""
        return True, None

    def runnable(self) -> tuple[bool, str | None]:
        """Can this target execute its artifacts here (natively or emulated)? (ok, reason when not)."""
        return True, None

    @abstractmethod
    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        ...

    @abstractmethod
    def runner(self, artifact: Artifact, **kw) -> Runner:
        ...


class UnavailableError(RuntimeError):
    """Raised by a target or runner that cannot work on this machine; its message is the reason."""
