"""The `onnx` target: the simplified fp32 graph (built by the pipeline as the base graph), an optional fp16 graph or
static int8 QDQ graph (`NAME.int8.onnx`, targets/graph/qdq.py), and ONNX Runtime runners for them."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import torch.nn as nn

from ..base import Artifact, LowerSpec, Runner, Target, UnavailableError, reraise_interrupt
from ..rows import ONNX_ROW
from ..graph.metadata import read_metadata, set_metadata
from ..graph.onnx_fp16 import convert_onnx_fp16
from ..graph.precision import default_policy
from ..graph.runtime import THREADS_ENV, OnnxRuntimeRunner  # noqa: F401  (the base graph's runtime, shared)

class OnnxTarget(Target):
    row = ONNX_ROW
    # The fp32 artifact IS the pipeline's simplified base graph, whose hop is "onnx-simplified".
    hop_names = {p: f"onnx-{p}" for p in ONNX_ROW.precisions} | {"fp32": "onnx-simplified"}
    existing_hop_names = {"fp32": "onnx"}  # `parity --artifact X.onnx`: the graph as given, simplified or not
    qdq_encoding = "onnxruntime"

    def available(self) -> tuple[bool, str | None]:
        try:
            import onnxruntime  # noqa: F401
        except ImportError as e:
            reraise_interrupt(e)
            return False, f"onnxruntime is not installed ({e})"
        return True, None

    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        if spec.onnx_path is None:
            raise ValueError("the onnx target lowers from the pipeline's simplified fp32 ONNX (spec.onnx_path)")
        if spec.precision == "fp32":
            return Artifact(self.name, Path(spec.onnx_path), "fp32")
        if spec.precision == "int8":
            if spec.qdq_path is None:
                raise ValueError("the onnx int8 artifact is the pipeline's QDQ graph (spec.qdq_path)")
            return Artifact(self.name, Path(spec.qdq_path), "int8", info=dict(read_metadata(spec.qdq_path)
                                                                              .get("int8") or {}))
        if spec.precision != "fp16":
            raise ValueError(f"onnx precision must be one of {self.precisions}; got {spec.precision!r}")
        policy = default_policy()
        fp32 = onnx.load(str(spec.onnx_path))
        fp16 = set_metadata(convert_onnx_fp16(fp32, policy), {**read_metadata(fp32), "precision": "fp16"})
        path = Path(spec.out_dir) / f"{spec.name}.fp16.onnx"
        onnx.save(fp16, str(path))
        return Artifact(self.name, path, "fp16", info={"policy": policy.to_dict()})

    def runner(self, artifact: Artifact, mode: str | None = None, **kw) -> Runner:
        return OnnxRuntimeRunner(artifact.path, **kw)  # ONNX Runtime is the format's own runtime: "device"

    def read_metadata(self, path: str | Path) -> dict:
        """The vitedge metadata an exported graph carries (model, imgsz, precision, overrides, ...)."""
        return read_metadata(path)
