"""One precision table (precisions.py): every other place reads it. A copy of its names anywhere in the package (a
literal tuple, list or set made only of precision names) fails here, and so does a table row that the tolerance
profiles, the targets or the extras do not know."""
from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from vitedge import precisions
from vitedge.precisions import NAMES, TABLE

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("models", "targets", "exporter")


def package_files(root: Path = ROOT) -> list[Path]:
    return sorted(root.glob("*.py")) + [p for d in LAYERS for p in sorted((root / d).rglob("*.py"))]


def precision_copies(files: list[Path], names=NAMES, table_file: str = "precisions.py") -> list[str]:
    """`path:line: names` for each literal tuple / list / set of two or more strings, all precision names, outside
    the table's own file."""
    bad = []
    for p in files:
        if p.name == table_file and p.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and len(node.elts) >= 2:
                if all(isinstance(e, ast.Constant) and e.value in names for e in node.elts):
                    where = p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name
                    bad.append(f"{where}:{node.lineno}: {', '.join(e.value for e in node.elts)}")
    return bad


def test_no_copy_of_the_precision_names_outside_the_table():
    assert precision_copies(package_files()) == [], "read precisions.py (NAMES, CALIBRATED, ...) instead"


def test_a_copy_is_caught(tmp_path):
    planted = tmp_path / "plans.py"
    planted.write_text('PRECISIONS = ("fp32", "fp16", "int8")\nOK = ("fp16", "bf16")\nONE = ("int8",)\n'
                       'def f(p):\n    return p in {"w8", "w8a8"}\n')
    assert precision_copies([planted]) == ["plans.py:1: fp32, fp16, int8", "plans.py:5: w8, w8a8"]


def test_every_reader_takes_the_table():
    from vitedge import cli
    from vitedge.exporter.quantize import calibrate
    from vitedge.exporter.core import target_plans
    from vitedge.targets import rows

    assert target_plans.PRECISIONS == NAMES
    assert calibrate.COMPRESSED == precisions.COMPRESSED_NAMES and calibrate.ACTIVATION_KINDS == precisions.CALIBRATED
    for command in ("export", "parity", "package"):
        action = next(a for a in cli._subparsers(cli.build_parser())[command]._actions if a.dest == "precision")
        assert tuple(action.choices) == NAMES, command
    for row in rows():
        assert set(row.precisions) <= set(NAMES) and row.default_precision in row.precisions, row.name


def test_each_precision_has_its_profile_and_its_extra():
    from vitedge.exporter.verdict.parity import FLOAT64_TOLERANCES, profile_for

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, p in TABLE.items():
        assert profile_for(name) in FLOAT64_TOLERANCES, name
        assert p.extra is None or p.extra in extras, name
        assert p.calibrates <= p.compressed  # only quantized activations are calibrated
    assert profile_for("palette4") == profile_for("palette6") == "palette"
    assert precisions.WEIGHT_ONLY == ("w8", "palette4", "palette6")
