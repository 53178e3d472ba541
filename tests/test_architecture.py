"""The house's shape, checked: every import points down the order errors <- models <- targets <- exporter <- cli
(a module may import its own layer or one to its left, nothing to its right), no import cycle between modules,
and source files short enough to read (> 400 lines only with a `Length:` line in the module docstring saying why
one job needs more).

Inside the layers, rooms: exporter/ is grouped by job, in an order of its own (EXPORTER_GROUPS: a group imports
its own modules and the groups to its left, and no module sits loose beside the groups); in targets/, each backend
(a module or package) imports only what the backends share (TARGETS_SHARED), never another backend; what works
across the backends (TARGETS_ACROSS: the one-thread pin) may import them, and no backend imports it. Modules that
moved into the rooms keep their old import path for one release (vitedge._MOVED: same module, DeprecationWarning).

Imports are read from the source (AST), function-level ones included, so a lazy import cannot hide an arrow that
points up. No module outside a target's own home compares anything with that target's name (`== "coreml"`, `in ("onnx",
"tensorrt")`): what differs between targets is read from their rows (targets/rows.py).

The checkers are also run on small planted trees, so a violation is known to fail.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "vitedge"
ORDER = ("errors", "precisions", "models", "targets", "exporter", "cli")  # each imports only what is at or left of it
SUBPACKAGES = ("models", "targets", "exporter")            # the package's folders (tests/, benchmarks/ are not)
# exporter/'s job groups, in import order: each may import its own group or one to its left, nothing to its right
EXPORTER_GROUPS = ("core", "reparam", "onnx", "verdict", "quantize", "flow", "timing", "packaging", "matrix",
                   "command_line")
TARGETS_SHARED = ("base", "calibration", "labels", "graph", "rows")  # what targets/' backends share; the rest are backends
TARGETS_ACROSS = ("threads",)  # above the backends: settings that span them all (the exporter's packaging uses it)
MAX_LINES = 400


# ---- reading the package ----------------------------------------------------------------------------------

def package_modules(root: Path = ROOT, package: str = PACKAGE) -> dict[str, Path]:
    """module name -> file, for the root's .py files and every module under the layer folders."""
    files = [p for p in root.glob("*.py")]
    for sub in SUBPACKAGES:
        files += sorted((root / sub).rglob("*.py")) if (root / sub).is_dir() else []
    out = {}
    for p in files:
        parts = [package, *p.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, modules: dict[str, Path], package: str = PACKAGE) -> set[str]:
    """The package modules `name` imports anywhere in its file (`from . import x` names module x when it is one)."""
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                target = ".".join(anchor + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == package or t.startswith(package + "."))
    return found - {name}


def import_graph(root: Path = ROOT, package: str = PACKAGE) -> dict[str, set[str]]:
    modules = package_modules(root, package)
    return {name: imports_of(name, path, modules, package) for name, path in modules.items()}


@functools.lru_cache(maxsize=None)
def package_graph() -> dict[str, set[str]]:
    """The package's own import graph, read once per session (the tests below only read it)."""
    return import_graph()


def layer(module: str) -> int | None:
    """Position of a module's layer in ORDER; None for the package root (`vitedge/__init__.py`)."""
    parts = module.split(".")
    return None if len(parts) == 1 else ORDER.index(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            if t not in graph:
                bad.append(f"{m} -> {t}: no such module in the package")
            elif layer(m) is None and layer(t) is not None:
                bad.append(f"{m} -> {t}: the package root imports its layers lazily, by name, never statically")
            elif layer(t) is not None and layer(m) is not None and layer(t) > layer(m):
                bad.append(f"{m} -> {t}: {ORDER[layer(m)]} may not import {ORDER[layer(t)]}")
    return bad


def room(module: str) -> tuple[str, str] | None:
    """(layer, room) of a module below exporter/ or targets/: its job group, or its backend (or shared module)."""
    parts = module.split(".")
    return (parts[1], parts[2]) if len(parts) > 2 and parts[1] in ("exporter", "targets") else None


def room_imports(graph: dict[str, set[str]]) -> list[str]:
    """Arrows inside exporter/ or targets/ that break the rooms' rules, and exporter modules outside any group."""
    bad = []
    for m in sorted(graph):
        r = room(m)
        if r and r[0] == "exporter" and r[1] not in EXPORTER_GROUPS:
            bad.append(f"{m}: in none of exporter's groups {EXPORTER_GROUPS}: move it to its job's group")
        for t in sorted(graph[m]):
            s = room(t)
            if not r or not s or r[0] != s[0] or r[1] == s[1]:
                continue
            if r[0] == "exporter" and {r[1], s[1]} <= set(EXPORTER_GROUPS) \
                    and EXPORTER_GROUPS.index(s[1]) > EXPORTER_GROUPS.index(r[1]):
                bad.append(f"{m} -> {t}: exporter's {r[1]} may not import its {s[1]}")
            elif r[0] == "targets" and s[1] in TARGETS_ACROSS:
                bad.append(f"{m} -> {t}: targets' {r[1]} may not import {s[1]}, which spans the backends")
            elif r[0] == "targets" and s[1] not in TARGETS_SHARED and r[1] not in TARGETS_ACROSS:
                bad.append(f"{m} -> {t}: targets' {r[1]} may not import the {s[1]} backend")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def too_long(files: list[Path], limit: int = MAX_LINES) -> list[str]:
    bad = []
    for p in files:
        n = len(p.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(p.read_text())) or ""
        if n > limit and not any(line.startswith("Length:") for line in doc.splitlines()):
            bad.append(f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}: {n} lines")
    return bad


def _names_in(node: ast.AST, names) -> list[str]:
    if isinstance(node, ast.Constant) and node.value in names:
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and e.value in names]
    return []


def target_comparisons(files: list[Path], names, home) -> list[str]:
    """`path:line: name` for every ==, !=, in, not in whose operand is a target's name (or a literal tuple, list or
    set holding one) in a file that is not that target's home (`home(name, path)`)."""
    bad = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(node, ast.Compare) or not all(
                    isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
                continue
            for operand in [node.left, *node.comparators]:
                bad += [f"{p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}:{node.lineno}: {n}"
                        for n in _names_in(operand, names) if not home(n, p)]
    return bad


def target_home(name: str, path: Path, root: Path = ROOT) -> bool:
    """A target's home: targets/<name>* (its package or loose modules) and the module its row's class lives in."""
    from vitedge.targets import row_of

    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.as_posix()
    impl = row_of(name).impl
    module = impl.split(":")[0] if isinstance(impl, str) else impl.__module__
    own = "/".join(module.split(".")[1:]) + ".py"
    return rel.startswith(f"targets/{name}") or rel == own


# ---- the package ------------------------------------------------------------------------------------------

def test_every_import_points_down_the_layer_order():
    assert upward_imports(package_graph()) == []


def test_every_import_inside_a_layer_respects_its_rooms():
    assert room_imports(package_graph()) == []


def test_the_rooms_are_all_there():
    found = {p.name for p in (ROOT / "exporter").iterdir() if (p / "__init__.py").is_file()}
    assert found == set(EXPORTER_GROUPS)
    assert {room(m)[1] for m in package_graph() if room(m) and room(m)[0] == "targets"} >= {
        *TARGETS_SHARED, "onnx", "tensorrt", "coreml", "executorch", "pytorch"}


def test_no_import_cycles():
    assert cycles(package_graph()) == []


def test_the_layers_are_all_there():
    graph = package_graph()
    assert {layer(m) for m in graph} == {None, *range(len(ORDER))}
    assert "vitedge.targets.graph.precision" in graph and "vitedge.exporter.reparam.forms" in graph


def test_no_target_name_is_compared_outside_its_own_home():
    from vitedge.targets import TARGETS

    files = [p for p in package_modules().values() if p.relative_to(ROOT).parts[0] in ("exporter", "targets", "cli.py")]
    assert target_comparisons(files, tuple(TARGETS), target_home) == [], \
        "read what differs from the target's row (targets/rows.py) instead of naming the target"


def test_every_subpackage_is_packaged():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {m for m, p in package_modules().items() if p.name == "__init__.py"}
    assert found <= listed, f"add to pyproject.toml [tool.setuptools] packages: {sorted(found - listed)}"


def test_source_files_stay_short_or_say_why():
    files = list(package_modules().values()) + sorted((ROOT / "benchmarks").glob("*.py"))
    assert too_long(files) == [], f"over {MAX_LINES} lines without a 'Length:' line in the docstring saying why"


# ---- the checkers fail where they should ------------------------------------------------------------------

def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for sub in SUBPACKAGES:
        (root / sub).mkdir(exist_ok=True)
        (root / sub / "__init__.py").touch()
    return root


@pytest.mark.parametrize("files, expected", [
    ({"targets/ort.py": "def f():\n    from ..exporter import pipeline\n"}, "targets may not import exporter"),
    ({"models/trained_like.py": "from ..exporter.inputs import parity_inputs\n"}, "models may not import exporter"),
    ({"errors.py": "from .models import registry\n"}, "errors may not import models"),
    ({"exporter/x.py": "import vitedge.cli\n"}, "exporter may not import cli"),
    ({"models/a.py": "from .nowhere import thing\n"}, "no such module"),
    # the rooms inside exporter/ and targets/
    ({"exporter/verdict/parity.py": "from ..timing.bench import run\n"}, "exporter's verdict may not import its timing"),
    ({"exporter/core/report.py": "def f():\n    from ..flow import pipeline\n"}, "core may not import its flow"),
    ({"exporter/stray.py": ""}, "vitedge.exporter.stray: in none of exporter's groups"),
    ({"exporter/misc/x.py": ""}, "vitedge.exporter.misc.x: in none of exporter's groups"),
    ({"targets/onnx/target.py": "from ..tensorrt.target import X\n"}, "targets' onnx may not import the tensorrt"),
    ({"targets/graph/qdq.py": "from ..coreml import convert\n"}, "targets' graph may not import the coreml backend"),
    ({"targets/onnx/target.py": "from ..threads import one_thread\n"}, "may not import threads, which spans"),
])
def test_an_upward_import_is_caught(tmp_path, files, expected):
    base = {"errors.py": "", "cli.py": "", "exporter/pipeline.py": "", "exporter/inputs.py": "",
            "models/registry.py": "", "exporter/timing/bench.py": "", "exporter/flow/__init__.py": "",
            "exporter/flow/pipeline.py": "", "targets/tensorrt/target.py": "", "targets/coreml/__init__.py": ""}
    graph = import_graph(_tree(tmp_path, {**base, **files}))
    bad = upward_imports(graph) + room_imports(graph)
    assert any(expected in line for line in bad), bad


def test_imports_down_the_rooms_pass(tmp_path):
    graph = import_graph(_tree(tmp_path, {
        "exporter/timing/bench.py": "from ..verdict.parity import judge\nfrom ..core import report\n",
        "exporter/verdict/parity.py": "from .criteria import rule\nfrom ...targets.tensorrt import target\n",
        "exporter/verdict/criteria.py": "", "exporter/core/report.py": "",
        "targets/tensorrt/target.py": "from ..base import Target\nfrom ..graph.precision import islands\n",
        "targets/base.py": "from .calibration import CalibrationSet\n", "targets/calibration.py": "",
        "targets/graph/precision.py": "",
        "targets/threads.py": "from .tensorrt.target import pool\nfrom .coreml import convert\n",
        "targets/coreml/__init__.py": "", "targets/coreml/convert.py": "",
    }))
    assert room_imports(graph) == [] and upward_imports(graph) == []


def test_a_cycle_is_caught_also_through_a_function_level_import(tmp_path):
    graph = import_graph(_tree(tmp_path, {
        "exporter/pipeline.py": "from .deploy_checkpoint import save\n",
        "exporter/deploy_checkpoint.py": "def save():\n    from .pipeline import build\n",
        "exporter/forms.py": "",
    }))
    assert cycles(graph) == [["vitedge.exporter.deploy_checkpoint", "vitedge.exporter.pipeline"]]
    assert upward_imports(graph) == []  # same layer: allowed, but not in a circle


def test_a_target_name_comparison_is_caught(tmp_path):
    root = _tree(tmp_path, {
        "exporter/a.py": 'def f(t):\n    return t.name == "coreml"\n',
        "exporter/b.py": 'def f(t):\n    return t in ("onnx", "tensorrt") or "x" != t\n',
        "exporter/c.py": 'def f(t):\n    return t.hop == "deploy-form"\n',
        "targets/coreml/d.py": 'def f(t):\n    return t == "coreml"\n',
    })
    files = sorted(root.rglob("*.py"))
    home = lambda n, p: p.relative_to(root).as_posix().startswith(f"targets/{n}")  # noqa: E731
    found = [line.split("/")[-1] for line in target_comparisons(files, ("onnx", "coreml", "tensorrt"), home)]
    assert found == ["a.py:2: coreml", "b.py:2: onnx", "b.py:2: tensorrt"]


def test_a_long_file_needs_its_reason(tmp_path):
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * MAX_LINES)
    explained = tmp_path / "explained.py"
    explained.write_text('"""A module.\n\nLength: one table of kernels.\n"""\n' + "x = 1\n" * MAX_LINES)
    assert too_long([long, explained]) == [f"{long}: {MAX_LINES + 1} lines"]


# ---- moved import paths -----------------------------------------------------------------------------------

# modules written inside their group after the regrouping: they never had a top-level path to alias
BORN_IN_GROUP = {"vitedge.exporter.verdict.metrics", "vitedge.exporter.verdict.stored_biases",
                 "vitedge.exporter.core.writable"}


def _moved() -> dict[str, str]:
    import vitedge

    return vitedge._MOVED


def test_the_moved_table_names_real_modules_and_no_module_left_in_place():
    modules, moved = package_modules(), _moved()
    assert [new for new in moved.values() if new not in modules] == []
    assert [old for old in moved if old in modules] == []  # an old path never shadows (or hides) a module
    assert {old.rpartition(".")[2] for old in moved if ".exporter." in old} >= {
        m.rpartition(".")[2] for m in modules if m.count(".") == 3 and room(m) and room(m)[0] == "exporter"
        and room(m)[1] not in ("reparam", "matrix", "command_line")
        and m not in BORN_IN_GROUP}  # every module that left exporter/'s top level has its alias


def test_every_old_path_imports_warns_and_is_the_new_module():
    import importlib
    import sys
    import warnings

    for old, new in sorted(_moved().items()):
        module = importlib.import_module(new)
        sys.modules.pop(old, None)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                alias = importlib.import_module(old)
            assert alias is module and sys.modules[old] is module, old
            assert module.__spec__.name == new  # the alias leaves the module's own spec alone
            assert [str(w.message).split(";")[0] for w in caught if w.category is DeprecationWarning] == [
                f"{old} moved to {new}"]
        finally:
            sys.modules.pop(old, None)


def test_from_an_old_path_import_a_name():
    import sys

    sys.modules.pop("vitedge.exporter.parity", None)
    try:
        with pytest.warns(DeprecationWarning, match="vitedge.exporter.parity moved to vitedge.exporter.verdict.parity"
                          ) as record:
            from vitedge.exporter.parity import judge
        from vitedge.exporter.verdict.parity import judge as moved_judge

        assert judge is moved_judge
        assert record[0].filename == __file__  # the warning names the importing line, not the import system
    finally:
        sys.modules.pop("vitedge.exporter.parity", None)
    from vitedge.targets.tensorrt import TensorRTTarget  # the old module is now the package: its names resolve
    from vitedge.targets.tensorrt.target import TensorRTTarget as moved_target

    assert TensorRTTarget is moved_target
    with pytest.raises(ImportError, match="no_such_name"):
        from vitedge.targets.tensorrt import no_such_name  # noqa: F401
