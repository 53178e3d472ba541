"""One precision table (precisions.py): every other place reads it (tests/test_architecture.py fails on a copy of its
names, or a dict keyed by them, anywhere else), and a table row that the tolerance profiles, the targets or the
extras do not know fails here."""
from __future__ import annotations

import tomllib
from pathlib import Path

from vitedge import precisions
from vitedge.precisions import TABLE, names

ROOT = Path(__file__).resolve().parents[1]


def test_every_reader_takes_the_table():
    from vitedge import cli
    from vitedge.targets import rows

    for command in ("export", "parity", "package"):
        action = next(a for a in cli._subparsers(cli.build_parser())[command]._actions if a.dest == "precision")
        assert tuple(action.choices) == names(), command
    for row in rows():
        assert set(row.precisions) <= set(names()) and row.default_precision in row.precisions, row.name


def test_each_precision_has_its_profile_and_its_extra():
    from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, profile_for

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, p in TABLE.items():
        assert profile_for(name) in FLOAT64_TOLERANCES, name
        assert p.extra is None or p.extra in extras, name
        assert p.calibrates <= p.compressed  # only quantized activations are calibrated
    assert profile_for("palette4") == profile_for("palette6") == "palette"
    assert precisions.weight_only() == ("w8", "palette4", "palette6")
    assert precisions.WEIGHT_ONLY == precisions.weight_only()   # the old import-time name, now read when asked
