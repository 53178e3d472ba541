"""Backends, one module or package each, behind the interface declared in base.py; graph/ is the torch-free
ONNX/MIL level they share with the pipeline.

TARGETS is the one table of export formats: name -> its TargetRow (rows.py: suffixes, precisions, options,
packages, ... and the Target class, imported lazily so a backend whose package is missing never breaks the
others). `register(row)` adds one. An entry may also be a bare "module:Class" string: its row then comes from the
class's attributes (`row_of`).
"""
from __future__ import annotations

import importlib

from .base import Artifact, LowerSpec, Runner, Target, UnavailableError, reraise_interrupt
from .rows import ROWS, Option, TargetRow, row_from_class

TARGETS: dict[str, TargetRow | str] = {r.name: r for r in ROWS}

ALIASES = {a: r.name for r in ROWS for a in r.aliases}


def register(row: TargetRow) -> TargetRow:
    """Add a target (or replace the one of that name): its row in TARGETS, its aliases in ALIASES. A row whose
    `impl` is the class itself gives that class its facts (Target.use_row)."""
    if isinstance(row.impl, type):
        row.impl.use_row(row)
    TARGETS[row.name] = row
    ALIASES.update({a: row.name for a in row.aliases})
    return row


def unregister(name: str) -> None:
    row = TARGETS.pop(name, None)
    for a in getattr(row, "aliases", ()):
        ALIASES.pop(a, None)


def _target_class(impl: str | type) -> type:
    if isinstance(impl, type):
        return impl
    mod, cls = impl.split(":")
    return getattr(importlib.import_module(mod), cls)


def get_target(name: str) -> Target:
    name = ALIASES.get(name, name)
    entry = TARGETS[name]
    return _target_class(entry.impl if isinstance(entry, TargetRow) else entry)()


def usable_target(name: str, lowers: bool = True) -> Target:
    """The target `name`, able to run its artifacts here and, with `lowers`, to lower them; UnavailableError saying
    why not (`vitedge bench` lowers and times; `bench --artifact` only times)."""
    try:
        target = get_target(name)
    except ImportError as e:
        reraise_interrupt(e)
        raise UnavailableError(f"the {name} target is not installed here ({e})") from None
    if lowers:
        ok, why = target.available()
        if not ok:
            raise UnavailableError(why or f"{name} is unavailable here")
    ok, why = target.runnable()
    if not ok:
        raise UnavailableError(why or f"{name} cannot run here")
    return target


def row_of(name: str) -> TargetRow:
    """The row of target `name` (an alias too). A bare "module:Class" entry imports its class (ImportError when it
    cannot); KeyError for a name not in TARGETS."""
    name = ALIASES.get(name, name)
    entry = TARGETS[name]
    return entry if isinstance(entry, TargetRow) else row_from_class(name, entry, _target_class(entry))


def rows() -> list[TargetRow]:
    """The declared rows (bare "module:Class" entries are not imported for this: they declare nothing)."""
    return [r for r in TARGETS.values() if isinstance(r, TargetRow)]


def row_for_suffix(filename: str) -> TargetRow | None:
    """The row whose suffixes end `filename`: every target's own suffix first, then the others it recognizes (a
    bare "module:Class" entry whose module cannot be imported here is skipped)."""
    known = []
    for name in list(TARGETS):
        try:
            known.append(row_of(name))
        except ImportError:
            continue
    for own in (True, False):
        for r in known:
            if any(filename.endswith(s) for s in (r.suffixes[:1] if own else r.suffixes[1:])):
                return r
    return None


def target_for_file(path) -> Target | None:
    """The target whose row's suffixes name the artifact at `path` (as `parity --artifact` finds it); None where
    none does or its backend cannot be imported here."""
    from pathlib import Path

    row = row_for_suffix(Path(path).name)
    if row is None:
        return None
    try:
        return get_target(row.name)
    except ImportError:
        return None


__all__ = ["TARGETS", "ALIASES", "get_target", "usable_target", "register", "unregister", "row_of", "rows", "row_for_suffix",
           "target_for_file",
           "TargetRow", "Option", "Artifact", "LowerSpec", "Runner", "Target", "UnavailableError"]
