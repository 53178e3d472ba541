"""The TensorRT Python API that vitedge uses: one table, per major version, checked against NVIDIA's sources.

TensorRT cannot be installed here (no GPU; gigabyte wheels), so this table is what keeps the code honest:
- `tests/test_tensorrt_api.py` builds a `spec_set` fake `tensorrt` module for 10.x and 11.x from it and runs
  `targets/tensorrt/target.py` against it, and walks the AST of `targets/tensorrt/target.py` to check that it touches nothing
  outside it;
- `scripts/check_tensorrt_api.py TENSORRT_GIT_DIR` re-checks every row against the pybind11 sources of each
  branch in CHECKED_AGAINST (`python/src/infer/pyCore.cpp`, `pyGraph.cpp`, `python/src/parsers/pyOnnx.cpp`,
  `pyFoundationalTypes.cpp`, `python/packaging/bindings_wheel/tensorrt/__init__.py`); docs/tensorrt_api.md records the last run.

A row: (owner, member, kind, parameters, majors, source). `owner` is the Python class name (or "tensorrt" for
the module); kinds: "method" (parameters are the pybind11 argument names after self, `name=` marks a default),
"property" (read/write), "readonly", "value" (an enum value or module constant), "function", "class".
"""
from __future__ import annotations

from typing import NamedTuple

BOTH, ONLY_10 = (10, 11), (10,)
SOURCES = {
    "core": "python/src/infer/pyCore.cpp",
    "graph": "python/src/infer/pyGraph.cpp",
    "onnx": "python/src/parsers/pyOnnx.cpp",
    "types": "python/src/infer/pyFoundationalTypes.cpp",
    "init": "python/packaging/bindings_wheel/tensorrt/__init__.py",
}
# git refs of github.com/NVIDIA/TensorRT the table was checked against: every release branch of each minor version
# that the extras can install (pyproject.toml caps them here: tensorrt10 < 10.17, tensorrt11 < 11.2, the last
# branches published; raise a cap only with the new branch added and checked)
CHECKED_AGAINST = {
    10: tuple(f"release/10.{m}" for m in range(17)) + ("release/10.13.2", "release/10.13.3"),
    11: ("release/11.0", "release/11.1"),
}


class Api(NamedTuple):
    owner: str
    member: str
    kind: str
    params: tuple | None = None
    majors: tuple = BOTH
    source: str = "core"


ROWS: tuple[Api, ...] = (
    # module level
    Api("tensorrt", "__version__", "value", source="init"),
    Api("tensorrt", "nptype", "function", ("trt_type",), source="init"),
    Api("tensorrt", "float32", "value", source="types"),
    *(Api("tensorrt", c, "class", source=s) for c, s in (
        ("Logger", "core"), ("Builder", "core"), ("Runtime", "core"), ("OnnxParser", "onnx"),
        ("BuilderFlag", "core"), ("MemoryPoolType", "core"), ("ProfilingVerbosity", "core"),
        ("LayerInformationFormat", "core"), ("TensorIOMode", "core"), ("NetworkDefinitionCreationFlag", "core"))),
    # logging
    Api("Logger", "__init__", "method", ("min_severity=Logger.WARNING",)),
    Api("Logger", "WARNING", "value"),
    # building
    Api("Builder", "__init__", "method", ("logger",)),
    Api("Builder", "create_network", "method", ("flags=0",)),
    # fp16 (from the fp16-cast ONNX) and int8 (from a QDQ graph) are built strongly typed: a flag on 10.x (there
    # since 10.0), always so on 11.x (where the value stays, documented as ignored; vitedge passes it on 10.x only)
    Api("NetworkDefinitionCreationFlag", "STRONGLY_TYPED", "value"),
    Api("Builder", "create_builder_config", "method", ()),
    Api("Builder", "create_optimization_profile", "method", ()),
    Api("Builder", "build_serialized_network", "method", ("network", "config")),
    Api("OnnxParser", "__init__", "method", ("network", "logger"), source="onnx"),
    Api("OnnxParser", "parse", "method", ("model", "path=None"), source="onnx"),
    Api("OnnxParser", "num_errors", "readonly", source="onnx"),
    Api("OnnxParser", "get_error", "method", ("index",), source="onnx"),
    Api("IBuilderConfig", "set_memory_pool_limit", "method", ("pool", "pool_size")),
    Api("IBuilderConfig", "profiling_verbosity", "property"),
    Api("IBuilderConfig", "set_flag", "method", ("flag",)),
    Api("IBuilderConfig", "clear_flag", "method", ("flag",)),
    Api("IBuilderConfig", "add_optimization_profile", "method", ("profile",)),
    Api("IBuilderConfig", "create_timing_cache", "method", ("serialized_timing_cache",)),
    Api("IBuilderConfig", "set_timing_cache", "method", ("cache", "ignore_mismatch")),
    Api("IBuilderConfig", "get_timing_cache", "method", ()),
    Api("IOptimizationProfile", "set_shape", "method", ("input", "min", "opt", "max")),
    Api("ITimingCache", "serialize", "method", ()),
    Api("BuilderFlag", "TF32", "value"),
    Api("MemoryPoolType", "WORKSPACE", "value"),
    Api("ProfilingVerbosity", "DETAILED", "value"),
    # running and inspecting
    Api("Runtime", "__init__", "method", ("logger",)),
    Api("Runtime", "deserialize_cuda_engine", "method", ("serialized_engine",)),
    Api("ICudaEngine", "create_engine_inspector", "method", ()),
    Api("ICudaEngine", "create_execution_context", "method", ("strategy=ExecutionContextAllocationStrategy.STATIC",)),
    Api("ICudaEngine", "num_io_tensors", "readonly"),
    Api("ICudaEngine", "get_tensor_name", "method", ("index",)),
    Api("ICudaEngine", "get_tensor_mode", "method", ("name",)),
    Api("ICudaEngine", "get_tensor_dtype", "method", ("name",)),
    Api("ICudaEngine", "get_tensor_profile_shape", "method", ("name", "profile_index")),
    Api("ICudaEngine", "num_optimization_profiles", "readonly"),
    Api("EngineInspector", "get_engine_information", "method", ("format",)),
    Api("LayerInformationFormat", "JSON", "value"),
    Api("TensorIOMode", "INPUT", "value"),
    Api("IExecutionContext", "set_optimization_profile_async", "method", ("profile_index", "stream_handle")),
    Api("IExecutionContext", "set_input_shape", "method", ("name", "shape")),
    Api("IExecutionContext", "get_tensor_shape", "method", ("name",)),
    Api("IExecutionContext", "set_tensor_address", "method", ("name", "memory")),
    Api("IExecutionContext", "execute_async_v3", "method", ("stream_handle",)),
)

# What each conventional variable name in targets/tensorrt/target.py holds (the AST test resolves attribute chains
# through it): a TensorRT object of that class, never anything else. A class with no rows (INetworkDefinition: the
# network is created, parsed into and built, never touched) is an opaque handle: any member use fails the walk.
VARIABLES = {
    "trt": "tensorrt", "logger": "Logger", "builder": "Builder", "parser": "OnnxParser", "network": "INetworkDefinition",
    "config": "IBuilderConfig", "profile": "IOptimizationProfile", "cache": "ITimingCache",
    "runtime": "Runtime", "engine": "ICudaEngine", "inspector": "EngineInspector", "context": "IExecutionContext",
}


def members(owner: str, major: int) -> dict[str, Api]:
    """The rows of `owner` that exist in TensorRT `major`."""
    return {r.member: r for r in ROWS if r.owner == owner and major in r.majors}


def owners() -> list[str]:
    return sorted({r.owner for r in ROWS})


__all__ = ["Api", "ROWS", "VARIABLES", "SOURCES", "CHECKED_AGAINST", "members", "owners", "BOTH", "ONLY_10"]
