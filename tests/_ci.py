"""What the tests may skip: outside CI, a test whose reference library or installed entry point is missing skips
with the reason; in CI (.ci/run exports CI=1; hosted CI services set CI=true), where .ci/run installs all of
them, the same test fails, so a cross-check that did not run is never counted as one that passed. GPU tests skip
everywhere but on the GPU check's machine (scripts/gpu_check.sh sets VITEDGE_GPU_CHECK=1), where they fail instead:
CI has no GPU, that machine has one."""
from __future__ import annotations

import importlib
import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str, module_level: bool = False):
    """Skip the calling test (or module) with `reason`; in CI, fail it instead."""
    if in_ci():
        pytest.fail(f"{reason}; CI installs it (.ci/run), so this test must run there, not skip", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def gpu_unavailable(reason: str):
    """Skip the calling GPU test with `reason`; on the GPU check's machine, fail it instead."""
    if os.environ.get("VITEDGE_GPU_CHECK") == "1":
        pytest.fail(f"{reason}; scripts/gpu_check.sh runs this test on a GPU, so it must run there, not skip",
                    pytrace=False)
    pytest.skip(reason)


def require(name: str, reason: str, module_level: bool = False):
    """importorskip that fails in CI: the module `name`, or unavailable(reason)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        unavailable(f"{reason} ({e})", module_level)
