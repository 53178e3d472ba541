"""The settings of a parsed command line: one ExportSettings (exporter/core/settings.py) from the flags the
command has. A `--config` file's keys are already the flags' defaults (config_file.py), so this is the one place
where the command line becomes settings. Torch-free."""
from __future__ import annotations

import argparse
from dataclasses import fields

from ..core.settings import ExportSettings
from .flags import target_options

# settings whose flag has another dest, and the switches that turn a setting off
_DESTS = {"targets": "target", "tolerances": "tol"}
_NEGATED = {"reparam": "no_reparam", "truth_cache": "no_truth_cache"}
_PREPROCESS = ("crop_pct", "interpolation", "mean", "std")


def settings_of(args: argparse.Namespace, **fixed) -> ExportSettings:
    """The ExportSettings of `args`: every field whose flag this command has, else the field's default; `fixed`:
    fields the command sets itself (e.g. `out=None` where --out names another file than the export folder)."""
    given = {}
    for f in fields(ExportSettings):
        if f.name in _NEGATED:
            if hasattr(args, _NEGATED[f.name]):
                given[f.name] = not getattr(args, _NEGATED[f.name])
        elif hasattr(args, _DESTS.get(f.name, f.name)):
            given[f.name] = getattr(args, _DESTS.get(f.name, f.name))
    given["overrides"] = dict(given.get("overrides") or ()) or None  # --set KEY=VALUE pairs
    given["tolerances"] = given.get("tolerances") or None            # --tol items
    preprocess = {k: getattr(args, k) for k in _PREPROCESS if getattr(args, k, None) is not None}
    given["preprocess"] = preprocess or None
    options = {k: getattr(args, k) for k in target_options() if hasattr(args, k)}  # each target's own flags
    given["options"] = options or None
    return ExportSettings(**{**given, **fixed})
