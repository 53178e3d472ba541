"""The house's shape, checked: every import points down the order errors <- models <- targets <- exporter <- cli
(a module may import its own layer or one to its left, nothing to its right), no import cycle between modules,
and source files short enough to read (> 400 lines only with a `Length:` line in the module docstring saying why
one job needs more).

Inside the layers, rooms: exporter/ is grouped by job, in an order of its own (EXPORTER_GROUPS: a group imports
its own modules and the groups to its left, and no module sits loose beside the groups); in targets/, each backend
(a module or package) imports only what the backends share (TARGETS_SHARED), never another backend; what works
across the backends (TARGETS_ACROSS: the one-thread pin, the planted errors) may import them, and no backend imports it.

Imports are read from the source (AST), function-level ones included, so a lazy import cannot hide an arrow that
points up. No module outside a target's own home compares anything with that target's name (`== "coreml"`, `in ("onnx",
"tensorrt")`): what differs between targets is read from their rows (targets/rows.py). No module but precisions.py
lists precision names or keys a dict by them: a per-precision number or fact lives in its row there. exporter/
imports no backend (targets/coreml, targets/executorch, ...: only what the backends share, and the registry) and
compares nothing with an artifact suffix: what it needs from a backend are its Target's hooks (targets/base.py).

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
TARGETS_ACROSS = ("threads", "plants")  # above the backends: the one-thread pin (packaging uses it), the planted errors
TARGETS_REFERENCE = ("pytorch",)  # the torch runners of the train- and deploy-form: the ladder's reference, no backend
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


def backend_imports(graph: dict[str, set[str]]) -> list[str]:
    """Arrows from exporter/ into a backend of targets/ (anything but what the backends share and what spans them):
    what the verdict, quantization, packaging and timing need from a backend goes through its Target's hooks."""
    bad = []
    for m in sorted(graph):
        if not m.startswith(f"{PACKAGE}.exporter."):
            continue
        for t in sorted(graph[m]):
            s = room(t)
            if s and s[0] == "targets" and s[1] not in TARGETS_SHARED + TARGETS_ACROSS + TARGETS_REFERENCE:
                bad.append(f"{m} -> {t}: read the backend through its Target's hooks (targets/base.py)")
    return bad


def suffix_dispatch(files: list[Path], suffixes) -> list[str]:
    """`path:line: suffix` for each comparison with, `endswith` of, or literal collection of an artifact suffix
    (a target row's `.onnx`, `.pte`, ...): which backend an artifact belongs to is its target's to say."""
    bad = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            found = []
            if isinstance(node, ast.Compare):
                for operand in [node.left, *node.comparators]:
                    found += _names_in(operand, suffixes)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "endswith":
                found += [n for a in node.args for n in _names_in(a, suffixes)]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                found += _names_in(node, suffixes)
            where = p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name
            bad += [f"{where}:{node.lineno}: {s}" for s in found]
    return sorted(set(bad))


def precision_copies(files: list[Path], names, table: Path = ROOT / "precisions.py") -> list[str]:
    """`path:line: names` for each literal tuple / list / set of two or more strings, or dict with two or more
    string keys, all precision (or tolerance profile) names, outside the table's own file: a per-precision fact kept
    outside its row. A name among others (MIL's dtypes "fp32", "int8", ...) is another vocabulary, not a copy."""
    bad = []
    for p in files:
        if p == table:
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            listed = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                      else node.keys if isinstance(node, ast.Dict) else [])
            if len(listed) >= 2 and all(isinstance(e, ast.Constant) and e.value in names for e in listed):
                where = p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name
                bad.append((str(where), node.lineno, ", ".join(e.value for e in listed)))
    return [f"{w}:{line}: {names}" for w, line, names in sorted(bad)]


def bound_precision_lists(files: list[Path], views=None) -> list[str]:
    """`path:line: name` for each `from ...precisions import NAMES` (or another list the table derives): bound at
    the importer's import, it misses a precision registered later; read the table when it runs (names(), TABLE)."""
    if views is None:
        from vitedge.precisions import _VIEWS as views
    bad = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "precisions":
                where = p.relative_to(ROOT) if p.is_relative_to(ROOT) else p.name
                bad += [f"{where}:{node.lineno}: {a.name}" for a in node.names if a.name in views]
    return sorted(bad)


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
    assert "vitedge.targets.graph.precision" in graph and "vitedge.exporter.reparam.build_forms" in graph


def test_no_target_name_is_compared_outside_its_own_home():
    from vitedge.targets import TARGETS

    files = [p for p in package_modules().values() if p.relative_to(ROOT).parts[0] in ("exporter", "targets", "cli.py")]
    assert target_comparisons(files, tuple(TARGETS), target_home) == [], \
        "read what differs from the target's row (targets/rows.py) instead of naming the target"


def test_exporter_reaches_backends_only_through_their_targets():
    assert backend_imports(package_graph()) == []


def test_exporter_never_dispatches_on_an_artifact_suffix():
    from vitedge.targets import rows

    suffixes = tuple({s for r in rows() for s in r.suffixes})
    files = [p for p in package_modules().values() if p.relative_to(ROOT).parts[0] == "exporter"]
    assert suffix_dispatch(files, suffixes) == [], "ask the artifact's target (targets.target_for_file, its hooks)"


def test_no_precision_names_are_listed_or_keyed_outside_the_table():
    from vitedge.precisions import names, profiles

    assert precision_copies(list(package_modules().values()), names() + tuple(profiles())) == [], \
        "a per-precision fact belongs in its row of precisions.py; read the table (names(), TABLE[p].field) instead"


def test_no_precision_list_is_bound_at_import():
    assert bound_precision_lists(list(package_modules().values())) == [], \
        "read the precision table when it runs (precisions.names(), TABLE[p]), so a registered precision counts"


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
        "exporter/build_forms.py": "",
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


def test_a_backend_import_and_a_suffix_dispatch_are_caught(tmp_path):
    graph = {"vitedge.exporter.verdict.a": {"vitedge.targets.coreml.mil_interpreter", "vitedge.targets.base",
                                            "vitedge.targets.graph.weights", "vitedge.targets"},
             "vitedge.exporter.timing.b": {"vitedge.targets.onnx.target"},
             "vitedge.targets.threads": {"vitedge.targets.coreml.mil_interpreter"}}
    assert [line.split(":")[0] for line in backend_imports(graph)] == [
        "vitedge.exporter.timing.b -> vitedge.targets.onnx.target",
        "vitedge.exporter.verdict.a -> vitedge.targets.coreml.mil_interpreter"]
    planted = tmp_path / "read.py"
    planted.write_text('def f(p):\n    if p.suffix == ".onnx":\n        return 1\n    READERS = (".pte", ".zip")\n'
                       '    return str(p).endswith(".mlpackage") or p.name == "model.onnx"\n')
    assert suffix_dispatch([planted], (".onnx", ".pte", ".mlpackage")) == [
        "read.py:2: .onnx", "read.py:4: .pte", "read.py:5: .mlpackage"]


def test_a_precision_copy_is_caught(tmp_path):
    planted = tmp_path / "plans.py"
    planted.write_text('PRECISIONS = ("fp32", "fp16", "int8")\nOK = ("fp16", "bf16")\nONE = ("int8",)\n'
                       'def f(p):\n    return p in {"w8", "w8a8"}\n'
                       'K = {"int8": 32.0, "palette": 8.0}\nDTYPES = {"fp32": 4, "int32": 4}\nHOP = {"fp32": "x"}\n')
    names = ("fp32", "fp16", "int8", "w8", "w8a8", "palette")
    assert precision_copies([planted], names) == ["plans.py:1: fp32, fp16, int8", "plans.py:5: w8, w8a8",
                                                  "plans.py:6: int8, palette"]


def test_a_precision_list_bound_at_import_is_caught(tmp_path):
    planted = tmp_path / "plans.py"
    planted.write_text("from ..precisions import NAMES, TABLE\nfrom vitedge.precisions import CALIBRATED as C\n"
                       "def f():\n    from ...precisions import names\n    return names()\n")
    assert bound_precision_lists([planted], ("NAMES", "CALIBRATED")) == ["plans.py:1: NAMES", "plans.py:2: CALIBRATED"]


def test_a_long_file_needs_its_reason(tmp_path):
    long = tmp_path / "long.py"
    long.write_text('"""A module."""\n' + "x = 1\n" * MAX_LINES)
    explained = tmp_path / "explained.py"
    explained.write_text('"""A module.\n\nLength: one table of kernels.\n"""\n' + "x = 1\n" * MAX_LINES)
    assert too_long([long, explained]) == [f"{long}: {MAX_LINES + 1} lines"]

