"""Packaging: dependencies are ranges (installable beside any torch 2.x from 2.6 on, no pin), optional extras,
and CI's constraints pin versions inside those ranges."""
from __future__ import annotations

import importlib.metadata as md
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
LOWER, UPPER = {">=", ">", "~=", "=="}, {"<", "<=", "~=", "=="}
OPTIONAL = {"matplotlib": "plot", "huggingface-hub": "hub", "ray": "ray", "tensorrt-cu12": "tensorrt",
            "scikit-learn": "compress", "executorch": "executorch", "torchao": "executorch"}


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _core(reqs: list[str]) -> dict:
    """{canonical name: SpecifierSet} of the requirements without an `extra` marker."""
    out = {}
    for r in map(Requirement, reqs):
        if r.marker is None or "extra" not in str(r.marker):
            out[canonicalize_name(r.name)] = r.specifier
    return out


def _assert_ranges(core: dict, where: str) -> None:
    assert "torch" in core, where
    for name, spec in core.items():
        ops = {s.operator for s in spec}
        assert ops & LOWER and ops & UPPER, f"{where}: {name}{spec} needs a lower and an upper bound"
    assert not {s.operator for s in core["torch"]} & {"==", "==="}, f"{where}: torch is pinned ({core['torch']})"


def test_declared_dependencies_are_ranges_and_optional_features_are_extras():
    project = _project()
    core = _core(project["dependencies"])
    _assert_ranges(core, "pyproject.toml")
    extras = {k: _core(v) for k, v in project["optional-dependencies"].items()}
    for package, extra in OPTIONAL.items():
        assert package not in core and package in extras[extra], (package, extra)


def test_installed_metadata_declares_the_same_ranges():
    installed = _core(md.requires("vitedge") or [])
    _assert_ranges(installed, "installed vitedge metadata")
    assert installed == _core(_project()["dependencies"]), \
        "the installed vitedge metadata differs from pyproject.toml: re-install (pip install -e .)"
    extras = md.metadata("vitedge").get_all("Provides-Extra") or []
    assert set(OPTIONAL.values()) <= set(extras), \
        "the installed vitedge metadata lacks an extra pyproject.toml declares: re-install (pip install -e .)"


def test_ci_installs_pinned_versions_inside_the_declared_ranges():
    pins = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    assert pins["torch"] == "2.13.0"  # the CPU wheel CI installs
    for r in map(Requirement, _project()["dependencies"]):
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue  # e.g. tomli on Python < 3.11: not installed where CI runs
        name = canonicalize_name(r.name)
        assert name in pins and r.specifier.contains(pins[name], prereleases=True), (name, r.specifier, pins.get(name))
    extras = {k: _core(v) for k, v in _project()["optional-dependencies"].items()}
    for package, extra in OPTIONAL.items():
        if extra in ("hub", "plot", "compress", "executorch"):  # the extras CI installs (compress: through test)
            assert package in pins and extras[extra][package].contains(pins[package], prereleases=True), package
    run = (REPO / ".ci" / "run").read_text()
    assert "-c .ci/constraints.txt" in run and '-e ".[test,hub,plot,executorch]"' in run


def test_tensorrt_extras_name_their_major_and_cuda_build():
    """`tensorrt10`: TensorRT 10 built for CUDA 12 with a CUDA 12 cuda-python; `tensorrt11`: TensorRT 11 for CUDA 13;
    `tensorrt` stays, the same as `tensorrt10`. Never the bare `tensorrt` metapackage: from 10.13.3 on it installs
    the CUDA 13 build whatever the driver."""
    extras = {k: {canonicalize_name(r.name): r.specifier for r in map(Requirement, v)}
              for k, v in _project()["optional-dependencies"].items()}
    want = {"tensorrt10": ("tensorrt-cu12", "10.16.1.11", "11.0.0.114", "12.9.6", "13.0.0"),
            "tensorrt11": ("tensorrt-cu13", "11.1.0.106", "11.4.0.106", "13.0.0", "12.9.6")}  # capped at the checked 11.1
    for extra, (package, inside, outside, cuda_in, cuda_out) in want.items():
        assert set(extras[extra]) == {package, "cuda-python"}, extras[extra]
        assert extras[extra][package].contains(inside) and not extras[extra][package].contains(outside)
        assert extras[extra]["cuda-python"].contains(cuda_in) and not extras[extra]["cuda-python"].contains(cuda_out)
    assert extras["tensorrt"] == extras["tensorrt10"]
    install = (REPO / "docs" / "install.md").read_text()   # the dependencies page documents both extras
    assert "vitedge[tensorrt10]" in install and "vitedge[tensorrt11]" in install and "r580" in install
