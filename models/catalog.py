"""The model catalog behind `vitedge models`: name, family, parameters, GMACs, input sizes.

Counting MACs builds every model on the meta device and traces one forward: 10-20 s for the whole zoo,
plus torch's import. So the table is computed once and shipped beside this file (`catalog.json`), keyed
by a hash of vitedge's version and of the sources that decide it (the registry, the counter, this
module, every family and layer module). `model_table()` reads it (no torch import) while the key matches
and computes live otherwise, so an edited model is never listed with stale figures; the test suite
checks that the shipped table is current and equals the live computation for every model.

Regenerate after changing a model:  python -m vitedge.models.catalog --write
"""
from __future__ import annotations

import functools
import hashlib
import json
import sys
from pathlib import Path

from ..errors import VitedgeError

COLUMNS = ("name", "family", "params", "gmacs", "default_imgsz", "accepted_sizes")
HERE = Path(__file__).resolve().parent
TABLE_FILE = HERE / "catalog.json"
# The files whose content decides the table (trained_like, checkpoint loading etc. do not).
SOURCES = ("registry.py", "flops.py", "catalog.py", "swiftformer.py", "slab_*.py", "sima_*.py", "layers/*.py")


def table_key() -> str:
    """sha256 over vitedge's version and the SOURCES' contents (sorted by path)."""
    from .. import __version__

    h = hashlib.sha256(f"vitedge {__version__}\n".encode())
    for path in sorted({p for pattern in SOURCES for p in HERE.glob(pattern)}):
        h.update(path.relative_to(HERE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _row(name: str) -> tuple:
    """One row counted live: the model built with parameters on `meta` (no weights, no real arithmetic)."""
    from .flops import count_macs, count_params, meta_model
    from .registry import get_spec

    spec = get_spec(name)
    model = meta_model(name)
    params = count_params(model)
    macs = count_macs(model, spec.default_imgsz)
    return name, spec.family, params, macs / 1e9, spec.default_imgsz, spec.accepted_sizes()


@functools.lru_cache(maxsize=1)
def stored_table() -> dict[str, dict] | None:
    """The shipped table by name when its key matches the sources here, else None."""
    try:
        data = json.loads(TABLE_FILE.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != table_key():
        return None
    return {row["name"]: row for row in data["rows"]}


def _registered() -> list[str]:
    from .registry import list_models as registered  # imports every model module (and torch)

    return registered()


def list_models() -> list[str]:
    """The names `vitedge models` lists: the shipped table's while it is current (no torch import), else the
    registry's."""
    stored = stored_table()
    return sorted(stored) if stored is not None else _registered()


def live_table() -> list[dict]:
    """Every registered model counted now (what `catalog.json` must equal)."""
    return [dict(zip(COLUMNS, _row(n))) for n in _registered()]


def model_table(names: list[str] | None = None, live: bool = False) -> list[dict]:
    """One dict per registered model (or per name in `names`), sorted by name.

    Keys: name, family, params (int), gmacs (float, multiply-accumulates of one 1x3xHxW eval forward at
    `default_imgsz`, counting matmul/conv/linear only), default_imgsz (int), accepted_sizes (str, e.g.
    "multiples of 32" or "224 only (...why...)"). From the shipped table when it is current, unless `live`.
    """
    stored = None if live else stored_table()
    if names is None:
        names = _registered() if live else list_models()
    if stored is not None:
        return [dict(stored[n]) if n in stored else dict(zip(COLUMNS, _row(n))) for n in sorted(names)]
    return [dict(zip(COLUMNS, _row(n))) for n in sorted(names)]


def write_table(path: Path = TABLE_FILE) -> Path:
    """Compute the table live and write it with the current key."""
    rows = live_table()
    path.write_text(json.dumps({"key": table_key(), "columns": list(COLUMNS), "rows": rows}, indent=1) + "\n")
    stored_table.cache_clear()
    return path


def families() -> list[str]:
    """The family names of the catalog's `family` column (`vitedge models --family NAME`)."""
    return sorted({row["family"] for row in model_table()})


def models(family: str | None = None) -> list[dict]:
    """`vitedge models` as data (also `vitedge.models()` and `vitedge models --json`): one dict per registered
    model, sorted by name, with the keys name, family, params (int), gmacs (float: multiply-accumulates of one
    1x3xHxW eval forward at `default_imgsz`, matmul/conv/linear only), default_imgsz (int) and accepted_sizes
    (str). `family` keeps that family's models only; an unknown one raises VitedgeError listing the families."""
    rows = model_table()
    if family is not None:
        known = sorted({row["family"] for row in rows})
        if family not in known:
            raise VitedgeError(f"unknown family {family!r}; choose one of {', '.join(known)}")
        rows = [row for row in rows if row["family"] == family]
    return rows


if __name__ == "__main__":  # python -m vitedge.models.catalog --write
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m vitedge.models.catalog --write   (recomputes models/catalog.json)")
    print(f"wrote {write_table()}")
