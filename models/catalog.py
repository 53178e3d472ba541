"""The model catalog behind `vitedge models`: name, family, parameters, GMACs, input sizes."""
from __future__ import annotations

import functools

from ..errors import VitedgeError
from .flops import count_macs, count_params, meta_model
from .registry import get_spec, list_models

COLUMNS = ("name", "family", "params", "gmacs", "default_imgsz", "accepted_sizes")


@functools.lru_cache(maxsize=None)
def _row(name: str) -> tuple:
    spec = get_spec(name)
    model = meta_model(name)  # shapes only: no weights allocated, no real arithmetic
    params = count_params(model)
    macs = count_macs(model, spec.default_imgsz)
    return name, spec.family, params, macs / 1e9, spec.default_imgsz, spec.accepted_sizes()


def model_table(names: list[str] | None = None) -> list[dict]:
    """One dict per registered model (or per name in `names`), sorted by name.

    Keys: name, family, params (int), gmacs (float, multiply-accumulates of one 1x3xHxW eval forward at
    `default_imgsz`, counting matmul/conv/linear only), default_imgsz (int), accepted_sizes (str, e.g.
    "multiples of 32" or "224 only (...why...)").
    """
    names = sorted(names) if names is not None else list_models()
    return [dict(zip(COLUMNS, _row(n))) for n in names]


def families() -> list[str]:
    """The family names of the catalog's `family` column (`vitedge models --family NAME`)."""
    return sorted({get_spec(n).family for n in list_models()})


def models(family: str | None = None) -> list[dict]:
    """`vitedge models` as data (also `vitedge.models()` and `vitedge models --json`): one dict per registered
    model, sorted by name, with the keys name, family, params (int), gmacs (float: multiply-accumulates of one
    1x3xHxW eval forward at `default_imgsz`, matmul/conv/linear only), default_imgsz (int) and accepted_sizes
    (str). `family` keeps that family's models only; an unknown one raises VitedgeError listing the families."""
    names = None
    if family is not None:
        known = families()
        if family not in known:
            raise VitedgeError(f"unknown family {family!r}; choose one of {', '.join(known)}")
        names = [n for n in list_models() if get_spec(n).family == family]
    return model_table(names)
