"""The TensorRT API table (targets/tensorrt/api.py) and the code that uses it.

TensorRT cannot be installed here, so the table is the reference: it was checked against NVIDIA's pybind11
sources with scripts/check_tensorrt_api.py (docs/tensorrt_api.md). These tests make sure the code calls nothing
outside it (an AST walk of targets/tensorrt/target.py), that nothing else in vitedge imports tensorrt, and that the
spec_set fake built from it (tests/trt_fake.py) refuses what the real module would refuse.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from vitedge.targets.tensorrt.api import CHECKED_AGAINST, ROWS, VARIABLES, members, owners

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "targets" / "tensorrt" / "target.py"
SELF_ATTRS = {"trt": "tensorrt", "engine": "ICudaEngine", "context": "IExecutionContext", "runtime": "Runtime"}


def _chain(node: ast.AST) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; `self.engine.x` -> ["self.engine", "x"]; None when not a plain chain."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.append(node.id)
        return names[::-1]
    return None


def api_violations(source: str) -> list[str]:
    """Attribute chains on TensorRT objects (by the VARIABLES naming convention) that the table lacks."""
    known = {o: set(members(o, 10)) | set(members(o, 11)) for o in owners()}
    bad = []
    for node in ast.walk(_parents(ast.parse(source))):
        if not isinstance(node, ast.Attribute) or isinstance(getattr(node, "_parent", None), ast.Attribute):
            continue
        chain = _chain(node)
        if not chain:
            continue
        if chain[0] == "self" and len(chain) > 1 and chain[1] in SELF_ATTRS:
            owner, rest = SELF_ATTRS[chain[1]], chain[2:]
        elif chain[0] in VARIABLES:
            owner, rest = VARIABLES[chain[0]], chain[1:]
        else:
            continue
        for attr in rest:
            if attr not in known.get(owner, set()):
                bad.append(f"line {node.lineno}: {'.'.join(chain)} ({owner}.{attr} is not in the table)")
                break
            row = members(owner, 10).get(attr) or members(owner, 11).get(attr)
            if row.kind != "class":
                break
            owner = attr  # trt.BuilderFlag.FP16 -> BuilderFlag.FP16
    return bad


def _parents(tree: ast.AST) -> ast.AST:
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            child._parent = parent
    return tree


def test_the_code_calls_nothing_outside_the_table():
    src = SOURCE.read_text()
    assert api_violations(src) == []
    # the walk sees what it must: the calls of both build paths and of the runner
    used = {".".join(c) for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Attribute) and (c := _chain(n))}
    for expected in ("trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED", "config.clear_flag", "trt.BuilderFlag.TF32",
                     "self.context.execute_async_v3", "engine.get_tensor_profile_shape",
                     "self.context.set_optimization_profile_async"):
        assert expected in used, expected


def test_the_walk_catches_calls_outside_the_table():
    bad = api_violations("def f(trt, config, network, self):\n"
                         "    config.set_flag(trt.BuilderFlag.FP16X)\n"
                         "    network.get_layer(0)\n"
                         "    self.engine.get_binding_shape(0)\n"
                         "    trt.Builder(None).build_engine(None, None)\n")
    assert [b.split(" (")[0] for b in bad] == ["line 2: trt.BuilderFlag.FP16X", "line 3: network.get_layer",
                                                "line 4: self.engine.get_binding_shape"]
    # chained calls through a call result are out of the walk's reach: the code names its objects instead
    assert "build_engine" not in " ".join(bad)


def test_only_the_tensorrt_module_imports_tensorrt():
    offenders = []
    for path in REPO.rglob("*.py"):
        if "tests" in path.parts or path == SOURCE or ".git" in path.parts:
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "tensorrt" or n.startswith("tensorrt.") for n in names):
                offenders.append(str(path.relative_to(REPO)))
    assert offenders == [], offenders


def test_table_rows_are_well_formed_and_versioned():
    assert {10, 11} == set(CHECKED_AGAINST)
    seen = set()
    for r in ROWS:
        assert (r.owner, r.member) not in seen, r
        seen.add((r.owner, r.member))
        assert r.kind in ("method", "property", "readonly", "value", "function", "class")
        assert set(r.majors) <= {10, 11} and r.majors
        assert (r.params is not None) == (r.kind in ("method", "function")), r
    # one build path on both majors (strong typing): nothing that 11.x removed is used on 10.x either
    assert all(r.majors == (10, 11) for r in ROWS)
    # every variable's class has rows, but the network: an opaque handle (created, parsed into, built)
    assert set(VARIABLES.values()) - set(owners()) == {"INetworkDefinition"}


def _cap(spec: str) -> tuple[int, int]:
    """The exclusive upper bound "<10.17" of a requirement's specifier, as (10, 17)."""
    import re
    m = re.search(r"<(\d+)\.(\d+)", spec)
    assert m, f"{spec}: no minor-version cap"
    return int(m.group(1)), int(m.group(2))


def test_every_minor_version_the_extras_install_was_checked():
    """The extras are capped at what scripts/check_tensorrt_api.py ran against: each minor version from the lower
    bound up to the cap has a release branch in CHECKED_AGAINST (an uncapped `<12` let pip install 11.4 while the
    table stopped at 11.1)."""
    import tomllib
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("tensorrt10", "tensorrt11", "tensorrt"):
        req = next(r for r in extras[extra] if r.startswith("tensorrt-cu"))
        major, cap = _cap(req)
        lo = int(req.split(">=")[1].split(".")[1].split(",")[0])
        checked = {int(ref.split(".")[1]) for ref in CHECKED_AGAINST[major]}
        missing = [f"{major}.{m}" for m in range(lo, cap) if m not in checked]
        assert not missing, f"{extra} ({req}) can install {missing}, which were never checked"


@pytest.mark.parametrize("major", [10, 11])
def test_fake_module_is_as_strict_as_the_table(trt_fake, major):
    fake = trt_fake.FakeTRT(f"{major}.1.0")
    trt = fake.module
    config = trt.Builder(trt.Logger(trt.Logger.WARNING)).create_builder_config()
    with pytest.raises(AttributeError):
        config.set_max_workspace_size  # noqa: B018 - removed in TensorRT 10, not in the table
    with pytest.raises(TypeError):
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE)  # pool_size missing
    with pytest.raises(AttributeError):
        config.no_such_attribute = 1  # spec_set: no new attributes
    with pytest.raises(AttributeError):
        trt.BuilderFlag.FP16  # noqa: B018 - the builder-flag fp16 path is not vitedge's on either major
    with pytest.raises(AttributeError):
        fake.instance("INetworkDefinition").get_layer(0)  # noqa: B018 - the network is an opaque handle


# ---- scripts/check_tensorrt_api.py: arguments are matched in each member's own signature ------------------------

# IExecutionContext's binding as NVIDIA's python/src/infer/pyCore.cpp writes it (release/10.13, lines 1332-1341,
# shortened), plus a raw-string docstring with unbalanced parentheses the parser must skip
CONTEXT_BINDING = '''
    py::class_<IExecutionContext>(m, "IExecutionContext", IExecutionContextDoc::descr, py::module_local())
        .def("set_input_shape", lambdas::setInputShape<py::tuple>, "name"_a, "shape"_a,
            IExecutionContextDoc::set_input_shape)
        .def("get_tensor_shape", &IExecutionContext::getTensorShape, "name"_a, R"trtdoc(a shape ((like this)trtdoc")
        .def("set_tensor_address", lambdas::set_tensor_address, "name"_a, "memory"_a,
            IExecutionContextDoc::set_tensor_address)
        .def("execute_async_v3", lambdas::execute_async_v3, "stream_handle"_a, "wait"_a = true);
'''


def _checker():
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_tensorrt_api", REPO / "scripts" / "check_tensorrt_api.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_api_checker_matches_arguments_in_the_members_own_signature():
    from vitedge.targets.tensorrt.api import Api
    chk = _checker()
    classes = chk.blocks(CONTEXT_BINDING)
    assert set(classes) == {"IExecutionContext"}
    assert chk.signatures(classes["IExecutionContext"], "execute_async_v3") == [[("stream_handle", False),
                                                                                 ("wait", True)]]

    def verdict(*params, member="set_tensor_address"):
        return chk.present(Api("IExecutionContext", member, "method", params), {"core": CONTEXT_BINDING}, classes)

    assert verdict("name", "memory") == (True, "")
    assert verdict("stream_handle", member="execute_async_v3") == (True, "")  # "wait" has a default
    # planted: "shape" is bound in the class (set_input_shape), but not in set_tensor_address's own signature: the
    # old check (the name anywhere in the class's binding text) passed it
    assert '"shape"_a' in classes["IExecutionContext"]
    ok, why = verdict("name", "shape")
    assert not ok and "match no overload's own signature" in why and "(name, memory)" in why
    assert not verdict("memory", "name")[0]                    # right names, wrong order
    assert not verdict("name")[0]                              # "memory" is required there
    assert not verdict("name", "memory=0")[0]                  # a default the binding does not have
    assert not verdict("name", member="get_tensor_shape2")[0]  # no such member
