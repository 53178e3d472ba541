"""The `tensorrt` target: a plain serialized engine (`NAME.engine`) plus a `NAME.engine.json` sidecar.

This module is the only place that calls TensorRT (building, inspecting, running), so it is longer
than most: every call it makes is listed, per major version, in `tensorrt_api.py` and checked by the tests.

Built from the pipeline's simplified, verified fp32 ONNX through the `tensorrt` Python API:
- fp16 (10.x and 11.x alike): a strongly typed network built from the fp16-cast ONNX (targets/graph/onnx_fp16.py:
  fp16 everywhere except the precision policy's fp32 islands, fp32 inputs/outputs), so the casts in the graph fix
  what runs in which precision. 10.x takes the STRONGLY_TYPED creation flag (there since 10.0), 11.x is always so.
  The builder-flag path (`BuilderFlag.FP16` plus per-layer `precision` / `set_output_type`) is not used: those
  calls are deprecated since 10.12 ("superseded by strong typing") and are ignored inside Myelin-fused regions
  (NVIDIA/TensorRT#4505, #3889), so an island pinned that way could silently run in fp16. After the build the
  inspector says which island nodes really run in fp32; the sidecar records that verified count.
- int8 (10.x and 11.x): explicit quantization from the QDQ graph the pipeline wrote (`spec.qdq_path`, the
  "tensorrt" encoding of targets/graph/qdq.py: int8 Q/DQ with zero points 0, the only kind TensorRT's parser
  takes), built strongly typed too: Q/DQ fix what runs in int8, the policy's islands were never quantized and
  stay fp32. The inspector must show int8 layers to confirm it.
Precision truth (tensorrt_precision.py): visible layers counted, Myelin "{ForeignNode[...]}" layers unknown;
when they hide the compute, an fp32 engine of the same ONNX (TF32 off) is built and run beside the fp16 one.
Refuted -> EngineBuildError; inconclusive -> said so in the sidecar, never a pass or a failure.
One optimization profile per batch range, a persisted timing cache, a workspace limit. Nothing is prepended to
the plan (trtexec / DeepStream / Triton load it as is). `available()` / `runnable()` say what is missing.

Length: one backend, the only module that calls TensorRT (see the second paragraph).
"""
from __future__ import annotations

import ctypes
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch.nn as nn

from ...models.outputs import pack_arrays
from ..base import Artifact, LowerSpec, Runner, Target, UnavailableError, pad_batch, reraise_interrupt, sha256_file
from ..rows import TENSORRT_ROW
from ...models.input_size import as_hw
from .cuda_memory import memory_backend, open_memory
from ..graph.onnx_fp16 import prepare_fp16
from ..graph.precision import default_policy
from .precision import (MIN_FP16_SHARE, check_outcome, compare_outputs, layer_precisions, precision_verdict,
                        verify_pinned)

DEFAULT_MAX_BATCH = 8
GIB = 1 << 30
STRONG_FP16, FP32 = "strongly-typed-fp16-onnx", "fp32"
STRONG_INT8 = "strongly-typed-int8-qdq"
PROBE_SAMPLES = 4  # inputs the fp16 and fp32 reference engines both run when the inspector cannot decide
# ONNX ops that only move data: an island passes through them, but no layer of theirs computes anything to verify
MOVE_OPS = frozenset({"Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast", "Expand"})


class EngineBuildError(RuntimeError):
    """The ONNX parser or the builder failed, or the engine does not run in the precision asked for."""


class TensorRTCallError(RuntimeError):
    """A TensorRT call reported failure by its return value (False, -1, None) instead of raising."""


def checked(result, call: str, why: str, error: type = TensorRTCallError):
    """`result` of a TensorRT call that reports failure by returning False / None (set_input_shape,
    set_tensor_address, set_timing_cache, create_execution_context, ...: Polygraphy checks each one), or raises
    `error` naming the call with its arguments, the value it returned and what that means."""
    if result is None or result is False:
        raise error(f"TensorRT {call} returned {result!r}: {why}")
    return result


def _addr(ptr) -> str:
    return hex(ptr) if isinstance(ptr, int) else repr(ptr)


# ---- what is here: package, GPU, CUDA memory ---------------------------------------------------------

def import_tensorrt():
    """The `tensorrt` module, or UnavailableError saying it is not installed."""
    try:
        import tensorrt
    except (ImportError, OSError) as e:  # OSError: the wheel is there but its CUDA/TensorRT libraries are not
        reraise_interrupt(e)
        raise UnavailableError(f"the tensorrt Python package is not installed ({e}); {install_hint()}") from None
    return tensorrt


def install_hint(python: tuple | None = None) -> str:
    """What to pip install for TensorRT on this Python (`python`: (major, minor), default this one).
    tensorrt-cu12-bindings has no 10.x wheel for Python 3.14 (its first 3.14 wheel is 11.1), so there
    `vitedge[tensorrt10]` cannot install."""
    python = tuple(python or sys.version_info[:2])
    if python >= (3, 14):
        return (f"on Python {python[0]}.{python[1]} pip install 'vitedge[tensorrt11]' (CUDA 13, driver r580+): "
                "TensorRT 10 (vitedge[tensorrt10]) has no wheel for Python 3.14, use Python 3.10-3.13 for it")
    return ("pip install 'vitedge[tensorrt10]' (CUDA 12, driver r525+) or 'vitedge[tensorrt11]' (CUDA 13, "
            "driver r580+) on a machine with an NVIDIA GPU")


def trt_major(trt) -> int:
    return int(str(trt.__version__).split(".")[0])


def cuda_device() -> tuple[dict | None, str | None]:
    """(info, None) for CUDA device 0 through the driver API, or (None, why there is no usable GPU)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "no NVIDIA driver here (libcuda.so.1 not found), so no GPU to build or run engines on"
    rc = lib.cuInit(0)
    if rc != 0:
        return None, f"the NVIDIA driver found no usable GPU (cuInit error {rc})"
    n = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        return None, "the NVIDIA driver reports 0 CUDA devices"
    name = ctypes.create_string_buffer(256)
    lib.cuDeviceGetName(name, 256, 0)
    ver, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(ver))
    lib.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)  # ..._MINOR
    return {"gpu": name.value.decode(errors="replace"), "compute_capability": f"{major.value}.{minor.value}",
            "cuda_driver": f"{ver.value // 1000}.{ver.value % 1000 // 10}", "devices": n.value}, None


def cuda_memory_backend() -> tuple[str | None, str | None]:
    """Which library moves buffers to the GPU for the runner: "torch" (torch.cuda) or "cuda-python"."""
    return memory_backend()


# ---- profiles ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchProfile:
    min: int
    opt: int
    max: int

    def shapes(self, imgsz: int) -> tuple[tuple, tuple, tuple]:
        return tuple((b, 3, *as_hw(imgsz)) for b in (self.min, self.opt, self.max))


def batch_profiles(batch: int | None, max_batch: int | None = None,
                   ranges: list[tuple[int, int]] | None = None) -> list[BatchProfile]:
    """One profile per batch range. Static `batch` gives (b, b, b); a dynamic batch gives (1, 1, max_batch)
    or one profile per `ranges` entry (lo, hi). opt is the range's low end: latency first (bench batch 1)."""
    if batch is not None:
        if ranges:
            raise ValueError("batch ranges need a dynamic batch")
        return [BatchProfile(batch, batch, batch)]
    ranges = list(ranges or [(1, max_batch or DEFAULT_MAX_BATCH)])
    out = []
    for lo, hi in ranges:
        if not 1 <= lo <= hi:
            raise ValueError(f"bad batch range {lo}..{hi}: need 1 <= min <= max")
        out.append(BatchProfile(lo, lo, hi))
    return out


def build_path(major: int, precision: str) -> str:
    """How an engine of `precision` is built on TensorRT `major` (the 10.x / 11.x dispatch)."""
    if precision == "fp32":
        return FP32
    if precision == "int8":
        return STRONG_INT8
    if precision != "fp16":
        raise ValueError(f"tensorrt precision must be fp32, fp16 or int8; got {precision!r}")
    return STRONG_FP16  # 10.x too: the STRONGLY_TYPED flag exists from 10.0 (see the module doc)


def check_engine_precision(requested: str, precisions: dict) -> str:
    """The precision an engine was built in, judged on the inspector alone (kept for callers of the old API):
    raises EngineBuildError when refuted or when it cannot be confirmed from the inspector."""
    v = precision_verdict(requested, precisions, outputs_unavailable="judged on the inspector alone")
    if v["status"] != "confirmed":
        raise EngineBuildError(v["reason"])
    return v["built"]


# ---- fp32 islands -------------------------------------------------------------------------------------

def island_compute_nodes(model: onnx.ModelProto, islands) -> dict[str, str]:
    """{node: node} for the island nodes of `model` that compute something (the form verify_pinned takes: the
    ONNX parser names a node's first layer after it and tags every layer "[ONNX Layer: NODE]")."""
    ops = {n.name: n.op_type for n in model.graph.node}
    return {n: n for n in sorted(islands) if ops.get(n) not in MOVE_OPS}


# ---- build -------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    plan: bytes
    inspector: dict
    timing_cache_bytes: int
    seconds: float


def build_engine(trt, onnx_bytes: bytes, *, input_name: str, imgsz: int, profiles: list[BatchProfile],
                 path: str, workspace_bytes: int | None = None, timing_cache: Path | None = None) -> BuildResult:
    """Parse `onnx_bytes`, configure and build a serialized engine with `trt` (the tensorrt module).

    TF32 is always off: fp32 means fp32 (and the fp32 reference engine must differ from an fp16 one only by fp16)."""
    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # 10.x: explicit batch is the default, strong typing a flag (the fp16 and int8 paths); 11.x: always so
    strong = path in (STRONG_FP16, STRONG_INT8) and trt_major(trt) < 11
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strong else 0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT's ONNX parser rejected the graph: {errors or 'no details'}")
    config = builder.create_builder_config()
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector then lists layer formats
    config.clear_flag(trt.BuilderFlag.TF32)
    for prof in profiles:
        profile = builder.create_optimization_profile()
        profile.set_shape(input_name, *prof.shapes(imgsz))  # raises on inconsistent shapes itself
        index = config.add_optimization_profile(profile)
        if not isinstance(index, int) or index < 0:
            raise EngineBuildError(f"TensorRT add_optimization_profile returned {index!r} for input {input_name!r} "
                                   f"min/opt/max {prof.shapes(imgsz)}: the profile is invalid for this network")
    blob = timing_cache.read_bytes() if timing_cache is not None and timing_cache.exists() else b""
    cache = checked(config.create_timing_cache(blob), f"create_timing_cache({len(blob)} bytes)",
                    f"the timing cache {timing_cache} is unreadable: delete it (it is rebuilt) or pass another "
                    "--timing-cache", EngineBuildError)
    checked(config.set_timing_cache(cache, False), f"set_timing_cache(cache of {timing_cache or 'none'}, "
            "ignore_mismatch=False)", "the cache was made by another TensorRT version or GPU: delete it (it is "
            "rebuilt) or pass another --timing-cache", EngineBuildError)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError("TensorRT's builder returned no engine (see the TensorRT log above)")
    cache_bytes = 0
    if timing_cache is not None:
        cache = config.get_timing_cache()
        data = bytes(cache.serialize())
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        timing_cache.write_bytes(data)
        cache_bytes = len(data)
    plan = bytes(plan)
    runtime = trt.Runtime(logger)
    engine = checked(runtime.deserialize_cuda_engine(plan), f"deserialize_cuda_engine({len(plan)}-byte plan)",
                     "the engine it just built does not load (see the TensorRT log above)", EngineBuildError)
    inspector = checked(engine.create_engine_inspector(), "create_engine_inspector()",
                        "no inspector for the engine it just built", EngineBuildError)
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return BuildResult(plan, info, cache_bytes, time.perf_counter() - t0)


def _io_specs(model: onnx.ModelProto) -> tuple[list[dict], list[dict]]:
    def spec(vi):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in
                vi.type.tensor_type.shape.dim]
        return {"name": vi.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
            vi.type.tensor_type.elem_type).name}
    inits = {i.name for i in model.graph.initializer}
    return [spec(i) for i in model.graph.input if i.name not in inits], [spec(o) for o in model.graph.output]




def probe_inputs(batches: BatchProfile, imgsz: int) -> np.ndarray:
    """Seeded normalized-image-like inputs for the fp16-vs-fp32 engine comparison (within the profile)."""
    n = min(max(PROBE_SAMPLES, batches.min), batches.max)
    return np.random.default_rng(0).standard_normal((n, 3, *as_hw(imgsz))).astype(np.float32)


class TensorRTTarget(Target):
    row = TENSORRT_ROW
    qdq_encoding = "tensorrt"  # int8: the QDQ graph the engine is built from (targets/graph/qdq.py ENCODINGS)

    def __init__(self, trt=None, device=None, memory=None):
        # Injection points for tests only: a fake module here proves the 10.x/11.x dispatch, never parity.
        self._trt = trt
        self._device = device    # callable -> (info | None, reason | None)
        self._memory = memory    # callable -> (backend | None, reason | None)

    def _module(self):
        return self._trt if self._trt is not None else import_tensorrt()

    def _device_info(self) -> tuple[dict | None, str | None]:
        return (self._device or cuda_device)()

    def available(self) -> tuple[bool, str | None]:
        missing = []
        try:
            self._module()
        except UnavailableError as e:
            missing.append(str(e))
        info, why = self._device_info()
        if info is None:
            missing.append(why)
        return (False, "; ".join(missing)) if missing else (True, None)

    def runnable(self) -> tuple[bool, str | None]:
        ok, why = self.available()
        backend, mem_why = (self._memory or cuda_memory_backend)()
        if backend is None:
            why = f"{why}; {mem_why}" if why else mem_why
            ok = False
        return ok, why

    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        if spec.onnx_path is None:
            raise ValueError("the tensorrt target builds from the pipeline's simplified fp32 ONNX (spec.onnx_path)")
        trt = self._module()
        precision = spec.precision or self.default_precision
        path = build_path(trt_major(trt), precision)
        if precision == "int8" and spec.qdq_path is None:
            raise ValueError("a tensorrt int8 engine is built from the pipeline's QDQ graph (spec.qdq_path)")
        src = Path(spec.qdq_path if precision == "int8" else spec.onnx_path)
        fp32_model = onnx.load(str(src))
        inputs, outputs = _io_specs(fp32_model)
        opts = {k: v for k, v in (spec.options or {}).items() if v is not None}
        profiles = batch_profiles(spec.batch, opts.get("max_batch"), opts.get("batch_ranges"))
        workspace = int(float(opts["workspace"]) * GIB) if "workspace" in opts else None
        cache = Path(opts["timing_cache"]) if "timing_cache" in opts else None
        build = dict(input_name=inputs[0]["name"], imgsz=spec.imgsz, profiles=profiles, workspace_bytes=workspace,
                     timing_cache=cache)

        policy = default_policy()
        fp16_graph, islands, n_islands, fp32_bytes = None, None, None, src.read_bytes()
        if path == STRONG_FP16:
            prepared = prepare_fp16(fp32_model, policy)
            onnx_bytes, fp16_graph = prepared.model.SerializeToString(), prepared.summary()
            fp16_graph.pop("fp32_islands", None)
            islands = island_compute_nodes(prepared.model, prepared.fp32_nodes)
            n_islands = len(prepared.fp32_nodes)
        else:  # fp32, or int8 from the QDQ graph (its islands were never quantized)
            onnx_bytes = fp32_bytes
        res = build_engine(trt, onnx_bytes, path=path, **build)
        precisions = layer_precisions(res.inspector)
        outputs_cmp, why_not = None, None
        # the inspector alone cannot decide (ForeignNodes, Myelin kernels): an fp32 engine's outputs will
        needs_outputs = precision == "fp16" and precision_verdict(precision, precisions)["status"] == "inconclusive"
        if needs_outputs:
            outputs_cmp, why_not = self._compare_with_fp32(trt, res.plan, fp32_bytes, build, profiles[0], spec.imgsz)
        verdict = precision_verdict(precision, precisions, outputs_cmp, why_not)
        if check_outcome(verdict) == "fail":  # inconclusive is kept, said so in the sidecar: the parity hop judges
            raise EngineBuildError(verdict["reason"])
        # the island nodes the inspector finds in fp32 (the casts asked for it; Myelin may hide it)
        pinning = verify_pinned(res.inspector, islands) if islands else None

        out_dir = Path(spec.out_dir)
        engine_path = out_dir / f"{spec.name}{self.suffix}"
        engine_path.write_bytes(res.plan)  # a plain plan: nothing prepended
        device, _ = self._device_info()
        sidecar = {
            "format": "TensorRT serialized engine (plain plan)", "engine": engine_path.name,
            "inputs": inputs, "outputs": outputs, "imgsz": spec.imgsz,
            "profiles": [{"input": inputs[0]["name"], "min": list(p.shapes(spec.imgsz)[0]),
                          "opt": list(p.shapes(spec.imgsz)[1]), "max": list(p.shapes(spec.imgsz)[2])}
                         for p in profiles],
            "precision_requested": precision, "precision_built": verdict["built"], "build_path": path,
            "precision_check": verdict, "layer_precisions": precisions, "tf32": False,
            "fp32_policy": {"policy": policy.to_dict(), "islands": n_islands,
                            # the island nodes the inspector confirms in fp32, not the count requested
                            "pinned_layers": pinning["verified"] if pinning else (0 if islands is not None else None),
                            "pinning": pinning,
                            "fp16_graph": fp16_graph},
            "workspace_bytes": workspace, "timing_cache": {"path": str(cache) if cache else None,
                                                           "bytes": res.timing_cache_bytes},
            "build_seconds": round(res.seconds, 3),
            "versions": {"tensorrt": str(trt.__version__), "cuda_driver": (device or {}).get("cuda_driver"),
                         "gpu": (device or {}).get("gpu"),
                         "compute_capability": (device or {}).get("compute_capability")},
            "source_onnx": {"file": src.name, "sha256": sha256_file(src)},
            "metadata": spec.metadata,
        }
        side = out_dir / f"{spec.name}{self.suffix}.json"
        side.write_text(json.dumps(sidecar, indent=2, default=str))
        info = {k: sidecar[k] for k in ("precision_built", "precision_check", "build_path", "layer_precisions",
                                        "profiles", "versions")}
        info["fp32_pinned_layers"] = sidecar["fp32_policy"]["pinned_layers"]
        return Artifact(self.name, engine_path, precision, extra_files=[side], info=info)

    def _compare_with_fp32(self, trt, fp16_plan: bytes, fp32_bytes: bytes, build: dict, batches: BatchProfile,
                           imgsz: int) -> tuple[dict | None, str | None]:
        """Build an fp32 engine (TF32 off) of the same ONNX and run both on probe inputs."""
        backend, why = (self._memory or cuda_memory_backend)()
        if backend is None:
            return None, f"no fp32 reference engine was run: {why}"
        ref = build_engine(trt, fp32_bytes, path=FP32, **build)
        x = probe_inputs(batches, imgsz)
        with TensorRTRunner(fp16_plan, trt=trt, memory=backend) as a, TensorRTRunner(ref.plan, trt=trt,
                                                                                       memory=backend) as b:
            return compare_outputs(a.run(x), b.run(x)), None

    def read_metadata(self, path: str | Path) -> dict:
        """The export metadata the engine's sidecar (`NAME.engine.json`) records; {} without a readable one (an
        engine built elsewhere)."""
        try:
            meta = json.loads(Path(f"{path}.json").read_text()).get("metadata")
        except (OSError, ValueError, AttributeError):
            return {}
        return dict(meta) if isinstance(meta, dict) else {}

    def runner(self, artifact: Artifact, mode: str | None = None, **kw) -> Runner:
        ok, why = self.runnable()
        if not ok:
            raise UnavailableError(why)
        kw.setdefault("memory", (self._memory or cuda_memory_backend)()[0])
        return TensorRTRunner(Path(artifact.path), trt=self._module(), **kw)


# ---- runner ------------------------------------------------------------------------------------------

class TensorRTRunner(Runner):
    """Runs float32 NCHW batches through an engine with the tensor-address API (10.x / 11.x).

    Holds its engine, execution context, stream and device buffers for its lifetime (a context manager;
    `close()` releases them). Buffers are allocated once per batch size, so `run` (end-to-end: upload, execute,
    download) and `execute` (the staged batch only, timed with CUDA events: trtexec's "GPU Compute Time") do
    no allocation."""
    mode = "device"

    def __init__(self, engine_path: Path | bytes, trt=None, memory=None):
        # engine_path: the .engine file, or the plan's bytes
        trt = trt or import_tensorrt()
        self.trt = trt
        kind = memory if memory is not None else cuda_memory_backend()[0]
        if kind is None:
            raise UnavailableError(cuda_memory_backend()[1])
        self.mem = open_memory(kind) if isinstance(kind, str) else kind
        self._bound: dict[int, dict] = {}
        self._current = None
        plan = engine_path if isinstance(engine_path, (bytes, bytearray)) else Path(engine_path).read_bytes()
        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine (built by another TensorRT or GPU?)")
        self.runtime, self.engine = runtime, engine
        context = checked(engine.create_execution_context(), "create_execution_context()",
                          "no execution context (out of GPU memory?)")
        self.context = context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        inp = self.inputs[0]
        self.profiles = [tuple(s[0] for s in engine.get_tensor_profile_shape(inp, i))
                         for i in range(engine.num_optimization_profiles)]  # (min, opt, max) batch
        self._profile = 0
        self._dtypes = {n: np.dtype(trt.nptype(engine.get_tensor_dtype(n))) for n in names}
        device, _ = cuda_device()
        self.backend = f"tensorrt {trt.__version__} ({(device or {}).get('gpu', 'GPU')})"
        self._events = (self.mem.event(), self.mem.event())

    # -- lifetime ------------------------------------------------------------------------------------
    def __enter__(self) -> "TensorRTRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Release the context, engine, device buffers, events and stream (idempotent)."""
        if getattr(self, "mem", None) is None:
            return
        if getattr(self, "context", None) is not None:
            self.mem.sync()
        self.context = None   # the context goes before the engine it came from
        self.engine = None
        self.runtime = None
        for b in self._bound.values():
            for buf in [b["input"], *b["outputs"].values()]:
                self.mem.free(buf)
        self._bound.clear()
        for ev in getattr(self, "_events", ()):
            self.mem.free_event(ev)
        self._events = ()
        self.mem.close()
        self.mem = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: CUDA may already be gone
            pass

    # -- running -------------------------------------------------------------------------------------
    def max_batch(self) -> int | None:
        return max(p[2] for p in self.profiles)

    def _select_profile(self, b: int) -> int:
        """Activate the profile covering batch `b` (or the smallest one above it); returns the batch to run."""
        fits = [i for i, (lo, _, hi) in enumerate(self.profiles) if lo <= b <= hi]
        above = sorted((lo, i) for i, (lo, _, hi) in enumerate(self.profiles) if lo > b)
        if not fits and not above:
            raise ValueError(f"batch {b} is outside the engine's profiles {self.profiles}")
        i = fits[0] if fits else above[0][1]
        if i != self._profile:
            stream = self.mem.handle()
            call = f"set_optimization_profile_async({i}, stream {_addr(stream)}) for input {self.inputs[0]!r}"
            why = f"cannot switch to optimization profile {i} (min, opt, max batch {self.profiles[i]})"
            try:
                ok = self.context.set_optimization_profile_async(i, stream)
            except RuntimeError as e:  # the binding raises on failure (pyCore.cpp: PY_ASSERT_RUNTIME_ERROR)
                raise TensorRTCallError(f"TensorRT {call} raised {e!r}: {why}") from None
            checked(ok, call, why)  # a False is refused too, should a binding return one
            self._profile = i
            self._current = None
        return max(b, self.profiles[i][0])

    def _bind(self, shape: tuple) -> dict:
        """Device and host buffers for a batch of `shape` (allocated on first use), bound to the context."""
        padded = self._select_profile(shape[0])
        full = (padded,) + tuple(shape[1:])
        if self._current == full:
            return self._bound[full]
        context, inp = self.context, self.inputs[0]
        checked(context.set_input_shape(inp, full), f"set_input_shape({inp!r}, {full})",
                f"the engine does not take this shape for input {inp!r} in optimization profile {self._profile} "
                f"(min, opt, max batch {self.profiles[self._profile]}) or its image size")
        b = self._bound.get(full)
        if b is None:
            b = {"batch": padded, "input": self.mem.empty(full, self._dtypes[inp]), "outputs": {}, "host": {}}
            for name in self.outputs:
                out_shape = tuple(context.get_tensor_shape(name))
                b["outputs"][name] = self.mem.empty(out_shape, self._dtypes[name])
                b["host"][name] = np.empty(out_shape, self._dtypes[name])
            self._bound[full] = b
        for name, buf in [(inp, b["input"]), *b["outputs"].items()]:
            ptr = self.mem.ptr(buf)
            checked(context.set_tensor_address(name, ptr), f"set_tensor_address({name!r}, {_addr(ptr)})",
                    f"tensor {name!r} refused its device address (not a tensor of this engine, or a null or "
                    "misaligned pointer)")
        self._current = full
        return b

    def _stage(self, x: np.ndarray) -> tuple[dict, int]:
        n = x.shape[0]
        b = self._bind(x.shape)
        x = pad_batch(x, b["batch"])  # a static engine's last, short batch: padded, the first n rows kept
        self.mem.upload(b["input"], x.astype(self._dtypes[self.inputs[0]], copy=False))
        return b, n

    def _execute(self) -> None:
        stream = self.mem.handle()
        checked(self.context.execute_async_v3(stream), f"execute_async_v3(stream {_addr(stream)})",
                f"the enqueue failed for inputs {self.inputs} / outputs {self.outputs} (see the TensorRT log)")

    def _run_one(self, x: np.ndarray) -> np.ndarray:
        b, n = self._stage(x)
        self._execute()
        for name in self.outputs:  # every output binding (feature maps: several), in the engine's order
            self.mem.download(b["outputs"][name], b["host"][name])
        self.mem.sync()
        return pack_arrays([b["host"][name][:n].astype(np.float32, copy=True) for name in self.outputs])

    def run(self, x: np.ndarray) -> np.ndarray:
        """End to end: host -> device, execute, device -> host (trtexec's "Latency")."""
        if self.mem is None:
            raise RuntimeError("this TensorRT runner was closed")
        step = self.max_batch()
        return np.concatenate([self._run_one(x[i:i + step]) for i in range(0, len(x), step)])

    def prepare(self, x: np.ndarray) -> None:
        """Stage one batch on the device for `execute` (at most max_batch rows)."""
        self._stage(np.asarray(x[:self.max_batch()], np.float32))
        self.mem.sync()

    def execute(self) -> float:
        """Run the staged batch; returns the GPU time in ms between CUDA events around the enqueue."""
        start, end = self._events
        self.mem.record(start)
        self._execute()
        self.mem.record(end)
        return self.mem.elapsed_ms(start, end)


__all__ = ["TensorRTTarget", "TensorRTRunner", "EngineBuildError", "TensorRTCallError", "checked", "BatchProfile",
           "batch_profiles", "build_path", "build_engine", "island_compute_nodes", "layer_precisions",
           "check_engine_precision", "precision_verdict", "check_outcome", "verify_pinned", "cuda_device",
           "cuda_memory_backend", "import_tensorrt", "install_hint", "trt_major", "probe_inputs", "MIN_FP16_SHARE",
           "DEFAULT_MAX_BATCH", "MOVE_OPS"]
