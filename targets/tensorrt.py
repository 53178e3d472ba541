"""The `tensorrt` target: a plain serialized engine (`NAME.engine`) plus a `NAME.engine.json` sidecar.

Built from the pipeline's simplified, verified fp32 ONNX through the `tensorrt` Python API:
- TensorRT 10.x: weakly typed network, fp16 through `BuilderFlag.FP16`; the precision policy's fp32
  islands are pinned on the matching layers (`layer.precision`, PREFER_PRECISION_CONSTRAINTS);
- TensorRT 11.x: strongly typed only (no FP16 flag), so fp16 means building from the fp16-cast ONNX
  (exporter/onnx_fp16.py: fp16 everywhere except the policy's islands, fp32 inputs/outputs).
One optimization profile per batch range, a persisted timing cache, a workspace limit. After the build the
engine inspector says which precision each layer really runs in; an "fp16" engine that is mostly fp32 fails.

Nothing is prepended to the plan (trtexec / DeepStream / Triton load it as is); metadata lives in the sidecar.
`available()` / `runnable()` say exactly what is missing (the package, the GPU/driver, a CUDA memory library).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch.nn as nn

from .base import Artifact, LowerSpec, Runner, Target, UnavailableError

DEFAULT_MAX_BATCH = 8
MIN_FP16_SHARE = 0.5  # an fp16 engine with fewer fp16 layers than this is reported as a failed build
GIB = 1 << 30
WEAK_FP16, STRONG_FP16, FP32 = "builder-flag-fp16", "strongly-typed-fp16-onnx", "fp32"


class EngineBuildError(RuntimeError):
    """The ONNX parser or the builder failed, or the engine does not run in the precision asked for."""


# ---- what is here: package, GPU, CUDA memory ---------------------------------------------------------

def import_tensorrt():
    """The `tensorrt` module, or UnavailableError saying it is not installed."""
    try:
        import tensorrt
    except (ImportError, OSError) as e:  # OSError: the wheel is there but its CUDA/TensorRT libraries are not
        raise UnavailableError(f"the tensorrt Python package is not installed ({e}); "
                               "pip install 'vitedge[tensorrt]' on a machine with an NVIDIA GPU") from None
    return tensorrt


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
    try:
        import torch
        if torch.cuda.is_available():
            return "torch", None
    except ImportError:
        pass
    try:
        _cudart()
        return "cuda-python", None
    except ImportError:
        return None, "no CUDA memory library: install cuda-python (pip install cuda-python) or a CUDA build of torch"


def _cudart():
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6
    except ImportError:
        from cuda import cudart  # older cuda-python
    return cudart


# ---- profiles, inspector ---------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchProfile:
    min: int
    opt: int
    max: int

    def shapes(self, imgsz: int) -> tuple[tuple, tuple, tuple]:
        return tuple((b, 3, imgsz, imgsz) for b in (self.min, self.opt, self.max))


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


def _precision_of(desc: str) -> str | None:
    d = desc.lower()
    for key, tokens in (("fp16", ("fp16", "half")), ("bf16", ("bf16",)), ("fp8", ("fp8",)), ("int8", ("int8",)),
                        ("fp32", ("fp32", "float"))):
        if any(t in d for t in tokens):
            return key
    return None


def layer_precisions(info: dict) -> dict:
    """Per-precision layer counts from the engine inspector's JSON (profiling verbosity DETAILED).

    A layer's precision is that of its outputs' "Format/Datatype" (10.x) or data type fields (11.x);
    layers with no float output (shape arithmetic) are not counted."""
    counts: dict[str, int] = {}
    for layer in info.get("Layers", []):
        if not isinstance(layer, dict):
            continue
        kinds = set()
        for out in layer.get("Outputs", []):
            for key, val in (out.items() if isinstance(out, dict) else []):
                if isinstance(val, str) and ("Format" in key or "Datatype" in key or "DataType" in key):
                    p = _precision_of(val)
                    if p:
                        kinds.add(p)
        if kinds:
            p = "fp16" if "fp16" in kinds else sorted(kinds)[0]
            counts[p] = counts.get(p, 0) + 1
    total = sum(counts.values())
    return {"layers": counts, "float_layers": total, "fp16_share": counts.get("fp16", 0) / total if total else 0.0}


def check_engine_precision(requested: str, precisions: dict) -> str:
    """The precision the engine was really built in; raises EngineBuildError for an fp16 request built mostly fp32."""
    share = precisions["fp16_share"]
    if requested == "fp16":
        if precisions["float_layers"] == 0:
            raise EngineBuildError("the engine inspector reported no layer precisions, so fp16 cannot be confirmed "
                                   "(profiling verbosity DETAILED is needed)")
        if share < MIN_FP16_SHARE:
            raise EngineBuildError(f"fp16 was asked but the engine is mostly fp32: {share:.0%} of "
                                   f"{precisions['float_layers']} layers run in fp16 (layers: {precisions['layers']})")
        return "fp16" if share == 1.0 else "mixed-fp16"
    return "fp32" if share == 0.0 else "mixed"


def build_path(major: int, precision: str) -> str:
    """How an engine of `precision` is built on TensorRT `major` (the 10.x / 11.x dispatch)."""
    if precision == "fp32":
        return FP32
    if precision != "fp16":
        raise ValueError(f"tensorrt precision must be fp32 or fp16; got {precision!r}")
    return WEAK_FP16 if major < 11 else STRONG_FP16


# ---- build -------------------------------------------------------------------------------------------

@dataclass
class BuildResult:
    plan: bytes
    inspector: dict
    pinned_fp32: int
    timing_cache_bytes: int
    seconds: float


def build_engine(trt, onnx_bytes: bytes, *, input_name: str, imgsz: int, profiles: list[BatchProfile],
                 path: str, workspace_bytes: int | None = None, timing_cache: Path | None = None,
                 fp32_layers: set[str] | None = None) -> BuildResult:
    """Parse `onnx_bytes`, configure and build a serialized engine with `trt` (the tensorrt module)."""
    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # 10.x: explicit batch is the default; 11.x: always strongly typed
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT's ONNX parser rejected the graph: {errors or 'no details'}")
    config = builder.create_builder_config()
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # the inspector then lists layer formats
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # fp32 means fp32 (TF32 would miss the fp32 tolerance)
    pinned = 0
    if path == WEAK_FP16:
        config.set_flag(trt.BuilderFlag.FP16)
        if fp32_layers:
            for i in range(network.num_layers):
                layer = network.get_layer(i)
                if layer.name in fp32_layers:
                    layer.precision = trt.float32
                    for j in range(layer.num_outputs):
                        layer.set_output_type(j, trt.float32)
                    pinned += 1
            if pinned:
                config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    for prof in profiles:
        p = builder.create_optimization_profile()
        p.set_shape(input_name, *prof.shapes(imgsz))
        config.add_optimization_profile(p)
    blob = timing_cache.read_bytes() if timing_cache is not None and timing_cache.exists() else b""
    cache = config.create_timing_cache(blob)
    config.set_timing_cache(cache, False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineBuildError("TensorRT's builder returned no engine (see the TensorRT log above)")
    cache_bytes = 0
    if timing_cache is not None:
        data = bytes(config.get_timing_cache().serialize())
        timing_cache.parent.mkdir(parents=True, exist_ok=True)
        timing_cache.write_bytes(data)
        cache_bytes = len(data)
    plan = bytes(plan)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
    inspector = engine.create_engine_inspector()
    info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return BuildResult(plan, info, pinned, cache_bytes, time.perf_counter() - t0)


def _io_specs(model: onnx.ModelProto) -> tuple[list[dict], list[dict]]:
    def spec(vi):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in
                vi.type.tensor_type.shape.dim]
        return {"name": vi.name, "shape": dims, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
            vi.type.tensor_type.elem_type).name}
    inits = {i.name for i in model.graph.initializer}
    return [spec(i) for i in model.graph.input if i.name not in inits], [spec(o) for o in model.graph.output]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class TensorRTTarget(Target):
    name = "tensorrt"
    suffix = ".engine"
    default_precision = "fp16"
    precisions = ("fp32", "fp16")
    options = ("workspace", "max_batch", "timing_cache")
    dynamic_batch = True

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
        src = Path(spec.onnx_path)
        fp32_model = onnx.load(str(src))
        inputs, outputs = _io_specs(fp32_model)
        opts = {k: v for k, v in (spec.options or {}).items() if v is not None}
        profiles = batch_profiles(spec.batch, opts.get("max_batch"), opts.get("batch_ranges"))
        workspace = int(float(opts["workspace"]) * GIB) if "workspace" in opts else None
        cache = Path(opts["timing_cache"]) if "timing_cache" in opts else None

        from ..exporter.precision import default_policy
        policy = default_policy()
        fp16_graph, islands = None, None
        if path == STRONG_FP16:
            from ..exporter.onnx_fp16 import prepare_fp16
            prepared = prepare_fp16(fp32_model, policy)
            onnx_bytes, fp16_graph = prepared.model.SerializeToString(), prepared.summary()
            fp16_graph.pop("fp32_islands", None)
        else:
            onnx_bytes = src.read_bytes()
            if path == WEAK_FP16:
                islands = policy.onnx_fp32_nodes(fp32_model)
        res = build_engine(trt, onnx_bytes, input_name=inputs[0]["name"], imgsz=spec.imgsz, profiles=profiles,
                           path=path, workspace_bytes=workspace, timing_cache=cache, fp32_layers=islands)
        precisions = layer_precisions(res.inspector)
        built = check_engine_precision(precision, precisions)

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
            "precision_requested": precision, "precision_built": built, "build_path": path,
            "layer_precisions": precisions, "tf32": False,
            "fp32_policy": {"policy": policy.to_dict(), "islands": len(islands) if islands is not None else None,
                            "pinned_layers": res.pinned_fp32 if path == WEAK_FP16 else None,
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
        info = {k: sidecar[k] for k in ("precision_built", "build_path", "layer_precisions", "profiles", "versions")}
        return Artifact(self.name, engine_path, precision, extra_files=[side], info=info)

    def runner(self, artifact: Artifact, **kw) -> Runner:
        ok, why = self.runnable()
        if not ok:
            raise UnavailableError(why)
        return TensorRTRunner(Path(artifact.path), trt=self._module(), **kw)


# ---- runner ------------------------------------------------------------------------------------------

class _TorchMemory:
    """Device buffers and a stream through torch.cuda."""

    def __init__(self):
        import torch
        self.torch = torch
        self.stream = torch.cuda.Stream()

    def to_device(self, x: np.ndarray):
        with self.torch.cuda.stream(self.stream):  # copies and kernels on the one stream TensorRT uses
            return self.torch.from_numpy(np.ascontiguousarray(x)).cuda(non_blocking=False)

    def empty(self, shape, dtype: np.dtype):
        with self.torch.cuda.stream(self.stream):
            return self.torch.empty(tuple(shape), dtype=getattr(self.torch, np.dtype(dtype).name), device="cuda")

    def ptr(self, buf) -> int:
        return buf.data_ptr()

    def handle(self) -> int:
        return self.stream.cuda_stream

    def sync(self) -> None:
        self.stream.synchronize()

    def to_host(self, buf) -> np.ndarray:
        return buf.cpu().numpy()

    def free(self, buf) -> None:
        pass  # torch's caching allocator reclaims it


class _CudaPythonMemory:
    """Device buffers and a stream through cuda-python's runtime bindings."""

    def __init__(self):
        self.rt = _cudart()
        self.stream = self._ok(self.rt.cudaStreamCreate())

    def _ok(self, res):
        err, *rest = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA runtime error {err}")
        return rest[0] if rest else None

    def to_device(self, x: np.ndarray):
        x = np.ascontiguousarray(x)
        buf = self.empty(x.shape, x.dtype)
        self._ok(self.rt.cudaMemcpy(buf[0], x.ctypes.data, x.nbytes, self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice))
        return buf

    def empty(self, shape, dtype: np.dtype):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return (self._ok(self.rt.cudaMalloc(max(nbytes, 1))), tuple(shape), np.dtype(dtype))

    def ptr(self, buf) -> int:
        return int(buf[0])

    def handle(self) -> int:
        return int(self.stream)

    def sync(self) -> None:
        self._ok(self.rt.cudaStreamSynchronize(self.stream))

    def to_host(self, buf) -> np.ndarray:
        out = np.empty(buf[1], buf[2])
        self._ok(self.rt.cudaMemcpy(out.ctypes.data, buf[0], out.nbytes,
                                    self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost))
        return out

    def free(self, buf) -> None:
        self._ok(self.rt.cudaFree(buf[0]))


class TensorRTRunner(Runner):
    """Deserializes an engine and runs float32 NCHW batches through the tensor-address API (10.x / 11.x)."""
    mode = "device"

    def __init__(self, engine_path: Path, trt=None, memory: str | None = None):
        trt = trt or import_tensorrt()
        self.trt = trt
        kind = memory or cuda_memory_backend()[0]
        if kind is None:
            raise UnavailableError(cuda_memory_backend()[1])
        self.mem = _TorchMemory() if kind == "torch" else _CudaPythonMemory()
        self.engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(
            Path(engine_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not deserialize {engine_path} (built by another TensorRT or GPU?)")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        inp = self.inputs[0]
        self.profiles = [tuple(s[0] for s in self.engine.get_tensor_profile_shape(inp, i))
                         for i in range(self.engine.num_optimization_profiles)]  # (min, opt, max) batch
        self._profile = 0
        device, _ = cuda_device()
        self.backend = f"tensorrt {trt.__version__} ({(device or {}).get('gpu', 'GPU')})"

    def max_batch(self) -> int | None:
        return max(p[2] for p in self.profiles)

    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name)))

    def _select_profile(self, b: int) -> int:
        """Activate the profile covering batch `b` (or the smallest one above it); returns the batch to run."""
        fits = [i for i, (lo, _, hi) in enumerate(self.profiles) if lo <= b <= hi]
        above = sorted((lo, i) for i, (lo, _, hi) in enumerate(self.profiles) if lo > b)
        if not fits and not above:
            raise ValueError(f"batch {b} is outside the engine's profiles {self.profiles}")
        i = fits[0] if fits else above[0][1]
        if i != self._profile:
            self.context.set_optimization_profile_async(i, self.mem.handle())
            self._profile = i
        return max(b, self.profiles[i][0])

    def _run_one(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        padded = self._select_profile(n)
        if padded > n:  # a static engine's last, short batch: pad with zeros, keep the first n rows
            x = np.concatenate([x, np.zeros((padded - n,) + x.shape[1:], x.dtype)])
        inp = self.inputs[0]
        self.context.set_input_shape(inp, tuple(x.shape))
        src = self.mem.to_device(x.astype(self._dtype(inp), copy=False))
        self.context.set_tensor_address(inp, self.mem.ptr(src))
        outs = {}
        for name in self.outputs:
            outs[name] = self.mem.empty(tuple(self.context.get_tensor_shape(name)), self._dtype(name))
            self.context.set_tensor_address(name, self.mem.ptr(outs[name]))
        if not self.context.execute_async_v3(self.mem.handle()):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        self.mem.sync()
        y = self.mem.to_host(outs[self.outputs[0]])
        for buf in [src, *outs.values()]:
            self.mem.free(buf)
        return y[:n].astype(np.float32, copy=False)

    def run(self, x: np.ndarray) -> np.ndarray:
        step = self.max_batch()
        return np.concatenate([self._run_one(x[i:i + step]) for i in range(0, len(x), step)])


__all__ = ["TensorRTTarget", "TensorRTRunner", "EngineBuildError", "BatchProfile", "batch_profiles", "build_path",
           "build_engine", "layer_precisions", "check_engine_precision", "cuda_device", "cuda_memory_backend",
           "import_tensorrt", "trt_major", "MIN_FP16_SHARE", "DEFAULT_MAX_BATCH"]
