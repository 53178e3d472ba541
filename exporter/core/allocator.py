"""Keep freed tensor memory in the process instead of handing it back to the OS after every op.

glibc's malloc serves blocks above 128 KiB (its dynamic threshold grows only to 32 MiB) with a fresh mmap and
unmaps them on free, so every large activation torch allocates is page-faulted in again, zero-filled by the
kernel. The float64 ground truth and the hops allocate tens of MiB per op: on the README's main job that was
8-10 s of system time of ~70 CPU-s (benchmarks/export_time.py). Raising the mmap and trim thresholds makes freed
blocks reusable; peak memory is unchanged, since what is kept was in use a moment before. Done by the `vitedge`
command line (a process vitedge owns), never on import: a library must not change its host's allocator.
`VITEDGE_KEEP_FREED_MEMORY=0` leaves glibc's defaults in place.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (glibc's malloc.h)
KEEP_BYTES = 1 << 30   # blocks up to 1 GiB come from the heap; free heap above this much is returned to the OS
ENV = "VITEDGE_KEEP_FREED_MEMORY"  # "0": leave the allocator alone


def keep_freed_memory(keep_bytes: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to `keep_bytes`; True when applied. A no-op (False) off Linux
    or on a C library without mallopt (musl), where the allocator is left as it is, and when $VITEDGE_KEEP_FREED_MEMORY
    is 0."""
    if not sys.platform.startswith("linux") or os.environ.get(ENV, "").strip() == "0":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    value = min(int(keep_bytes), 2**31 - 1)
    return bool(mallopt(_M_MMAP_THRESHOLD, value)) and bool(mallopt(_M_TRIM_THRESHOLD, value))
