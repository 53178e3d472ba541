"""Shared test fixtures: the official golden fixtures and small helpers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
# Many tiny float64 ops: one intra-op thread is several times faster than two on small CI machines.
torch.set_num_threads(1)

GOLDEN = Path(os.environ.get("VITEDGE_GOLDEN", REPO.parent / "shared" / "golden"))


def golden_path(name: str) -> Path:
    p = GOLDEN / name
    if not p.exists():
        pytest.skip(f"official golden fixture {p} not found (set VITEDGE_GOLDEN to the shared/golden folder)")
    return p


def load_golden(name: str) -> dict:
    return torch.load(golden_path(name), weights_only=True)


def assert_close_rel(y: torch.Tensor, ref: torch.Tensor, rel: float) -> None:
    """max|y - ref| <= rel * max|ref| (the golden fixtures' tolerance form)."""
    err = float((y.double() - ref.double()).abs().max())
    scale = float(ref.double().abs().max())
    assert err <= rel * scale, f"max|diff| {err:.3e} > {rel:.0e} * max|ref| ({scale:.3e})"


@pytest.fixture
def golden():
    return load_golden
