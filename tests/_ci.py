"""What the tests may skip: outside CI, a test whose reference library or installed entry point is missing skips
with the reason; in CI (.ci/run exports CI=1; hosted CI services set CI=true), where .ci/run installs all of
them, the same test fails, so a cross-check that did not run is never counted as one that passed."""
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


def require(name: str, reason: str, module_level: bool = False):
    """importorskip that fails in CI: the module `name`, or unavailable(reason)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        unavailable(f"{reason} ({e})", module_level)
