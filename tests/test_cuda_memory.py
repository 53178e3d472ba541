"""The TensorRT runner's buffer backends (torch.cuda and cuda-python) on a real GPU: what is uploaded downloads
bit for bit, in every dtype the runner binds, and the stream's events time the copy. Skipped without a GPU, except
under VITEDGE_GPU_CHECK=1 (scripts/gpu_check.sh), where a backend that cannot run fails instead."""
from __future__ import annotations

import numpy as np
import pytest

from vitedge.targets.tensorrt.cuda_memory import cudart, open_memory
from vitedge.tests._ci import gpu_unavailable


def _unavailable(kind: str) -> str | None:
    try:
        if kind == "torch":
            import torch
            return None if torch.cuda.is_available() else f"torch {torch.__version__} sees no CUDA device"
        err, count = cudart().cudaGetDeviceCount()
        return None if int(err) == 0 and count > 0 else f"cuda-python: cudaGetDeviceCount -> {err}, {count}"
    except ImportError as e:
        return f"{kind} is not installed ({e})"


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["torch", "cuda-python"])
def test_buffers_round_trip_and_events_time_on_a_gpu(kind):
    why = _unavailable(kind)
    if why:
        gpu_unavailable(why)
    mem = open_memory(kind)
    assert mem.name == kind
    rng = np.random.default_rng(0)
    try:
        for dtype in (np.float32, np.float16, np.int32):
            host = (rng.standard_normal((4, 3, 64, 64)) * 100).astype(dtype)
            buf = mem.empty(host.shape, host.dtype)
            assert mem.ptr(buf) != 0
            out = np.zeros_like(host)
            start, end = mem.event(), mem.event()
            mem.record(start)
            mem.upload(buf, host)
            mem.download(buf, out)
            mem.record(end)
            mem.sync()
            assert out.tobytes() == host.tobytes(), dtype
            assert mem.elapsed_ms(start, end) > 0
            mem.free(buf)
            mem.free_event(start)
            mem.free_event(end)
    finally:
        mem.close()
