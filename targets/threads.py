"""One thread for every computation whose numbers end up in a deterministic artifact (`vitedge package`).

A float32 sum split over another number of threads rounds differently: the same bundle built with torch on 1 and on
2 threads differed in its deploy-form hop's metrics (max_abs 3.85e-8 against 3.26e-8). Inside `one_thread()`
torch's intra-op pool, numpy's OpenBLAS (this thread), and the ONNX Runtime and ExecuTorch runners created inside
(through $VITEDGE_THREADS: they size their pools from it) all use one thread, whatever OMP_NUM_THREADS,
torch.set_num_threads or the environment said; on exit every setting is restored. (A computation that names its
own thread count keeps it: the float32 reference runs of exporter/verdict/parity.py use REFERENCE_THREADS, fixed too.)
"""
from __future__ import annotations

import contextlib
import os
import sys

from .graph.runtime import THREADS_ENV

_XNNPACK_POOL = "executorch.extension.pybindings.portable_lib"  # loaded only by the executorch target


@contextlib.contextmanager
def one_thread():
    import torch

    from .coreml.mil_interpreter import single_threaded_blas

    torch_before, env_before = torch.get_num_threads(), os.environ.get(THREADS_ENV)
    pool_before = _pool_threads()
    torch.set_num_threads(1)
    os.environ[THREADS_ENV] = "1"
    try:
        with single_threaded_blas():
            yield
    finally:
        torch.set_num_threads(torch_before)
        if env_before is None:
            os.environ.pop(THREADS_ENV, None)
        else:
            os.environ[THREADS_ENV] = env_before
        _restore_pool(pool_before)


def _pool_threads() -> int | None:
    """ExecuTorch's XNNPACK pool size, or None when ExecuTorch is not loaded (nothing to pin or restore)."""
    lib = sys.modules.get(_XNNPACK_POOL)
    return None if lib is None else int(lib._threadpool_get_thread_count())


def _restore_pool(before: int | None) -> None:
    """Put the pool back as it was; loaded inside the context, back to ExecuTorch's own default size."""
    if sys.modules.get(_XNNPACK_POOL) is None:
        return
    from .executorch.target import default_pool_threads, set_threads

    want = before if before is not None else default_pool_threads()
    if want and _pool_threads() != want:
        set_threads(want)
