"""exporter/core/allocator.py: once the `vitedge` command line has raised glibc's thresholds, a 64 MiB block comes from
the heap, where a freed one is reused, instead of its own mmap, unmapped on free and page-faulted back (what cost
the main job 8-10 s of system time)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from vitedge.exporter.core.allocator import ENV

PROBE = r"""
import numpy as np
from vitedge.exporter.core.allocator import keep_freed_memory

def in_heap(a):
    # glibc serves a block from the [heap] (reused after free) or from its own mmap (unmapped on free)
    addr = a.__array_interface__["data"][0]
    for line in open("/proc/self/maps"):
        lo, hi = (int(v, 16) for v in line.split()[0].split("-"))
        if lo <= addr < hi:
            return line.rstrip().endswith("[heap]")
    return False

print(in_heap(np.ones(8 << 20)), keep_freed_memory(), in_heap(np.ones(8 << 20)))  # 64 MiB blocks
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_large_blocks_come_from_the_heap_after_keep_freed_memory():
    env = {k: v for k, v in os.environ.items() if k != ENV}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["False", "True", "True"]  # mmap'd by default; applied; then a reusable heap block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_the_environment_can_opt_out():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, ENV: "0"})
    assert out.stdout.split() == ["False", "False", "False"]


def test_the_command_line_applies_it(monkeypatch):
    import vitedge.cli as cli
    import vitedge.exporter.core.allocator as allocator

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda *a: calls.append(a) or True)
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert calls
