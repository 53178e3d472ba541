"""Shared helpers of the matrix tests: tiny plans (a one-block-per-stage SwiftFormer, 32 px, 2 parity samples)."""
from __future__ import annotations

from pathlib import Path

import yaml

XS = {"name": "swiftformer_xs"}
TINY = {"layers": [1, 1, 1, 1], "embed_dims": [8, 8, 16, 16], "num_classes": 5}
DEFAULTS = {"samples": 2, "imgsz": 32, "set": TINY}


def write_plan(folder: Path, plan: dict, name: str = "plan.yaml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(yaml.safe_dump(plan, sort_keys=False))
    return path


def plan_of(models: list, targets=("onnx",), precisions=("fp32",), **extra) -> dict:
    return {"defaults": {**DEFAULTS, **extra.pop("defaults", {})}, "models": models, "targets": list(targets),
            "precisions": list(precisions), **extra}


def save_checkpoint(path: Path, seed: int) -> Path:
    import torch

    import vitedge

    model = vitedge.create_model("swiftformer_xs", **TINY)
    vitedge.make_trained_like(model, seed)
    torch.save(model.state_dict(), path)
    return path


def statuses(result) -> dict:
    return {c.id: c.status for c in result.cells}


def built(result) -> set:
    return {c.id for c in result.cells if not c.from_cache}
