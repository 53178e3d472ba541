"""ONNX Runtime on an ONNX graph: the runtime of the base graph every run verifies (its hops, localization per
module, the feature probe, `bench`) and of every backend whose artifact is an ONNX graph. Torch-free."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from ...models.outputs import pack_arrays
from ..base import Runner, UnavailableError, reraise_interrupt
from . import int8_kernels

THREADS_ENV = "VITEDGE_THREADS"  # default intra-op threads of sessions not given `threads` (set by matrix workers)
_NP_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


class OnnxRuntimeRunner(Runner):
    """ONNX Runtime (CPU execution provider unless told otherwise) on a file, bytes or a ModelProto.

    `threads`: intra-op threads (0 = ONNX Runtime's default, every core). `spinning`: whether idle intra-op
    workers busy-wait for the next op (ONNX Runtime's default, None, is yes). Every session owns its pool, so
    when several multi-thread sessions take turns in one process (two models in an app, a benchmark
    alternating variants) the spinning workers of one compete with the next for the cores; turning spinning
    off steadies them (measured figures: README "vitedge bench" and docs/benchmarks/index.md).
    `threads=None` reads $VITEDGE_THREADS (0 when unset), so that processes running side by side (the
    `vitedge matrix` workers) keep workers x threads within the cores. On an x86 CPU without VNNI a QDQ graph runs
    with ONNX Runtime's int8 fusion off, and the backend says so (int8_kernels.py: the fused kernels saturate)."""
    mode = "device"

    def __init__(self, model: str | Path | bytes | onnx.ModelProto, providers: list[str] | None = None,
                 threads: int | None = None, spinning: bool | None = None):
        try:
            import onnxruntime as ort
        except ImportError as e:  # pragma: no cover - onnxruntime is a dependency
            reraise_interrupt(e)
            raise UnavailableError(f"onnxruntime is not installed ({e}); pip install onnxruntime") from e
        providers = providers or ["CPUExecutionProvider"]
        # the saturating kernels are the CPU provider's; a GPU provider takes the Q/DQ nodes as they are. The
        # provider that runs is the first one this build has: ONNX Runtime drops the missing ones and falls back
        # to the CPU, which then runs the graph.
        available = ort.get_available_providers()
        runs_on = next((p for p in providers if p in available), "CPUExecutionProvider")
        self.int8_unfused = runs_on == "CPUExecutionProvider" and int8_kernels.unfuse(model)
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        elif isinstance(model, Path):
            model = str(model)
        if threads is None:
            threads = int(os.environ.get(THREADS_ENV) or 0)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.log_severity_level = 3
        if spinning is not None:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        if self.int8_unfused:
            opts.add_session_config_entry(int8_kernels.SETTING, "1")
        self.threads, self.spinning = threads, spinning
        self.session = ort.InferenceSession(model, opts, providers=providers)
        self.input = self.session.get_inputs()[0]
        self.in_dtype = _NP_TYPES.get(self.input.type, np.float32)
        self.backend = f"onnxruntime {ort.__version__} ({self.session.get_providers()[0]})"
        if spinning is False:
            self.backend += ", no spinning"
        if self.int8_unfused:
            self.backend += f", {int8_kernels.NOTE}"

    def run(self, x: np.ndarray) -> np.ndarray:
        # several graph outputs (feature maps): side by side per sample, in graph order (models/outputs.py)
        y = pack_arrays(self.session.run(None, {self.input.name: x.astype(self.in_dtype, copy=False)}))
        return y.astype(np.float32, copy=False)

    def run_all(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Every graph output by name (localization adds intermediate tensors as outputs)."""
        names = [o.name for o in self.session.get_outputs()]
        return dict(zip(names, self.session.run(names, {self.input.name: x.astype(self.in_dtype, copy=False)})))

    def max_batch(self) -> int | None:
        b = self.input.shape[0]
        return b if isinstance(b, int) else None

    def info(self) -> dict:
        if self.session is None:
            return {}
        return {"providers": self.session.get_providers(), "intra_op_threads": self.threads,
                "spinning": {None: "default", True: "on", False: "off"}[self.spinning],
                **({"int8_kernels": int8_kernels.NOTE} if self.int8_unfused else {})}

    def close(self) -> None:
        self.session = None  # the session owns its thread pool and arena: freed with it
