"""Device buffers, one stream and timing events for the TensorRT runner: torch.cuda or cuda-python.

Both give the same small interface (empty / upload / download on the stream, sync, events, free, close), so
the runner allocates its buffers once and the timed loop only copies and executes. cuda-python is what
`pip install 'vitedge[tensorrt]'` installs (`cuda.bindings.runtime`, cuda-python >= 12.6; NVIDIA's own TensorRT
samples use it the same way); a CUDA build of torch is used instead when one is installed.
"""
from __future__ import annotations

import numpy as np


def cudart():
    """cuda-python's runtime bindings (ImportError when cuda-python is not installed)."""
    try:
        from cuda.bindings import runtime  # cuda-python >= 12.6 (the [tensorrt] extra)
    except ImportError:
        from cuda import cudart as runtime  # older cuda-python
    return runtime


def memory_backend() -> tuple[str | None, str | None]:
    """Which library moves buffers to the GPU for the runner: "torch" (torch.cuda) or "cuda-python"."""
    try:
        import torch
        if torch.cuda.is_available():
            return "torch", None
    except ImportError:
        pass
    try:
        cudart()
        return "cuda-python", None
    except ImportError:
        return None, ("no CUDA memory library: pip install 'vitedge[tensorrt]' (cuda-python) or install a CUDA "
                      "build of torch")


def open_memory(kind: str):
    return TorchMemory() if kind == "torch" else CudaPythonMemory()


class TorchMemory:
    """Buffers, a stream and events through torch.cuda."""
    name = "torch"

    def __init__(self):
        import torch
        self.torch = torch
        self.stream = torch.cuda.Stream()

    def empty(self, shape, dtype: np.dtype):
        return self.torch.empty(tuple(shape), dtype=getattr(self.torch, np.dtype(dtype).name), device="cuda")

    def ptr(self, buf) -> int:
        return buf.data_ptr()

    def handle(self) -> int:
        return self.stream.cuda_stream

    def upload(self, buf, host: np.ndarray) -> None:
        with self.torch.cuda.stream(self.stream):
            buf.copy_(self.torch.from_numpy(np.ascontiguousarray(host)), non_blocking=True)

    def download(self, buf, out: np.ndarray) -> None:
        with self.torch.cuda.stream(self.stream):
            self.torch.from_numpy(out).copy_(buf, non_blocking=True)

    def sync(self) -> None:
        self.stream.synchronize()

    def event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def record(self, ev) -> None:
        ev.record(self.stream)

    def elapsed_ms(self, start, end) -> float:
        end.synchronize()
        return float(start.elapsed_time(end))

    def free(self, buf) -> None:
        pass  # torch's caching allocator reclaims it once the runner drops the tensor

    def free_event(self, ev) -> None:
        pass

    def close(self) -> None:
        self.stream = None


class CudaPythonMemory:
    """Buffers, a stream and events through cuda-python's runtime bindings (every call returns (err, ...))."""
    name = "cuda-python"

    def __init__(self):
        self.rt = cudart()
        self.stream = self._ok(self.rt.cudaStreamCreate())

    def _ok(self, res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA runtime error {err}")
        return rest[0] if rest else None

    def empty(self, shape, dtype: np.dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return (self._ok(self.rt.cudaMalloc(max(nbytes, 1))), tuple(shape), np.dtype(dtype))

    def ptr(self, buf) -> int:
        return int(buf[0])

    def handle(self) -> int:
        return int(self.stream)

    def upload(self, buf, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        self._ok(self.rt.cudaMemcpyAsync(buf[0], host.ctypes.data, host.nbytes,
                                         self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice, self.stream))

    def download(self, buf, out: np.ndarray) -> None:
        self._ok(self.rt.cudaMemcpyAsync(out.ctypes.data, buf[0], out.nbytes,
                                         self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, self.stream))

    def sync(self) -> None:
        self._ok(self.rt.cudaStreamSynchronize(self.stream))

    def event(self):
        return self._ok(self.rt.cudaEventCreate())

    def record(self, ev) -> None:
        self._ok(self.rt.cudaEventRecord(ev, self.stream))

    def elapsed_ms(self, start, end) -> float:
        self._ok(self.rt.cudaEventSynchronize(end))
        return float(self._ok(self.rt.cudaEventElapsedTime(start, end)))

    def free(self, buf) -> None:
        self._ok(self.rt.cudaFree(buf[0]))

    def free_event(self, ev) -> None:
        self._ok(self.rt.cudaEventDestroy(ev))

    def close(self) -> None:
        if self.stream is not None:
            self._ok(self.rt.cudaStreamDestroy(self.stream))
            self.stream = None


__all__ = ["cudart", "memory_backend", "open_memory", "TorchMemory", "CudaPythonMemory"]
