"""A fake `tensorrt` module built from vitedge's API table (targets/tensorrt/api.py), strict like the real one.

Every class is generated with exactly the table's members for one major version (methods with the pybind11
argument names) and faked with `create_autospec(..., spec_set=True)`: a member that the table does not list
for that version, or a wrong argument, raises here as it would on a GPU machine. Behaviour is added on top:
the parser records the ONNX bytes it was given (the network is an opaque handle, as it is to vitedge), an
inspector answer may be computed from that ONNX model, and an engine "runs" on host numpy buffers: output = a
fixed linear map of the input, computed in float16 for an fp16 plan (one built from a graph with fp16
initializers), so the fp16-vs-fp32 comparison sees real fp16 rounding. It proves dispatch and wiring only.
"""
from __future__ import annotations

import json
import types
from unittest.mock import create_autospec

import numpy as np
import onnx

from vitedge.targets.tensorrt.api import members

CLASS_OWNERS = ("Logger", "Builder", "OnnxParser", "INetworkDefinition", "IBuilderConfig",
                "IOptimizationProfile", "ITimingCache", "Runtime", "ICudaEngine", "EngineInspector",
                "IExecutionContext")
ENUM_OWNERS = ("BuilderFlag", "MemoryPoolType", "ProfilingVerbosity", "LayerInformationFormat", "TensorIOMode",
               "NetworkDefinitionCreationFlag")
# enum values the code does arithmetic on (pybind11 enums convert with int()): NvInfer.h's values
INT_VALUES = {"NetworkDefinitionCreationFlag": {"STRONGLY_TYPED": 1}}


def api_class(owner: str, major: int) -> type:
    """A class with exactly the table's members of `owner` for TensorRT `major`."""
    ns: dict = {}
    for row in members(owner, major).values():
        if row.kind == "method":
            params = [p.split("=")[0] + ("=None" if "=" in p else "") for p in row.params]
            src = f"def {row.member}(self{''.join(', ' + p for p in params)}):\n    raise NotImplementedError"
            exec(src, {}, ns)  # noqa: S102 - generated from our own table
        else:
            ns[row.member] = None if row.kind != "value" else f"{owner}.{row.member}"
    return type(owner, (), ns)


def enum_class(owner: str, major: int) -> type:
    ints = INT_VALUES.get(owner, {})
    return type(owner, (), {m: ints.get(m, f"{owner}.{m}") for m in members(owner, major)})


def _linear(x: np.ndarray, dtype) -> np.ndarray:
    """The fake network: per-channel means mixed into 10 logits (fp16 plans compute it in float16)."""
    w = np.random.default_rng(7).standard_normal((x.shape[1], 10)).astype(dtype)
    feats = x.astype(dtype).reshape(x.shape[0], x.shape[1], -1).mean(axis=2, dtype=dtype)
    return (feats @ w).astype(np.float32)


class HostMemory:
    """The runner's memory interface over host numpy arrays (pointers are keys into a registry)."""
    name = "host"

    def __init__(self):
        self.buffers: dict[int, np.ndarray] = {}
        self.freed: list[int] = []
        self.closed = False
        self._next = 0x1000

    def empty(self, shape, dtype):
        self._next += 0x100
        self.buffers[self._next] = np.zeros(shape, dtype)
        return self._next

    def ptr(self, buf) -> int:
        return buf

    def handle(self) -> int:
        return 7

    def upload(self, buf, host) -> None:
        self.buffers[buf][...] = host

    def download(self, buf, out) -> None:
        out[...] = self.buffers[buf]

    def sync(self) -> None:
        pass

    def event(self):
        return [0.0]

    def record(self, ev) -> None:
        import time
        ev[0] = time.perf_counter()

    def elapsed_ms(self, start, end) -> float:
        return (end[0] - start[0]) * 1e3

    def free(self, buf) -> None:
        self.freed.append(buf)
        del self.buffers[buf]

    def free_event(self, ev) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeTRT:
    """Builds the spec_set module for `version` and records what the code did with it."""

    def __init__(self, version: str, inspector: dict | None = None):
        self.version, self.major = version, int(version.split(".")[0])
        self.inspector = inspector or {"Layers": [], "Bindings": []}  # a dict, or f(parsed onnx.ModelProto) -> dict
        self.fp32_inspector = None  # what the fp32 reference engine's inspector says (default: self.inspector)
        self.parsed: list[bytes] = []
        self.networks: list = []
        self.configs: list = []
        self.memory = HostMemory()
        self.plans: dict[bytes, str] = {}
        self.plan_onnx: dict[bytes, bytes] = {}  # plan -> the ONNX bytes it was built from
        self.contexts: list = []
        self.network_flags: list[int] = []  # create_network(flags) of every network
        self.module = self._module()

    # ---- the module -----------------------------------------------------------------------------
    def _module(self):
        mod = types.ModuleType("tensorrt")
        mod.__version__ = self.version
        classes = {o: create_autospec(api_class(o, self.major), spec_set=True) for o in CLASS_OWNERS}
        enums = {o: enum_class(o, self.major) for o in ENUM_OWNERS}
        self.classes, self.enums = classes, enums
        for name, obj in {**classes, **enums}.items():
            if name in members("tensorrt", self.major):
                setattr(mod, name, obj)
        mod.float32 = "DataType.FLOAT"

        def nptype(trt_type):
            return {"DataType.FLOAT": np.float32, "DataType.HALF": np.float16}[trt_type]
        mod.nptype = create_autospec(nptype, spec_set=True, side_effect=nptype)
        extra = set(vars(mod)) - set(members("tensorrt", self.major)) - {"__name__", "__doc__", "__package__",
                                                                         "__loader__", "__spec__"}
        assert not extra, extra
        classes["Builder"].side_effect = lambda logger: self._builder()
        classes["OnnxParser"].side_effect = lambda network, logger: self._parser(network)
        classes["Runtime"].side_effect = lambda logger: self._runtime()
        return mod

    def instance(self, owner: str):
        return create_autospec(api_class(owner, self.major), spec_set=True, instance=True)

    # ---- building -------------------------------------------------------------------------------
    def _builder(self):
        b = self.instance("Builder")
        b.create_network.side_effect = lambda flags=0: self.network_flags.append(flags) or self._network()
        b.create_builder_config.side_effect = self._config
        b.create_optimization_profile.side_effect = lambda: self.instance("IOptimizationProfile")
        b.build_serialized_network.side_effect = self._build
        return b

    def _network(self):
        net = self.instance("INetworkDefinition")  # no member: vitedge creates, parses into and builds it only
        self.networks.append(net)
        return net

    def _config(self):
        c = self.instance("IBuilderConfig")
        cache = self.instance("ITimingCache")
        cache.serialize.return_value = b"CACHE"
        c.create_timing_cache.return_value = cache
        c.set_timing_cache.return_value = True
        c.get_timing_cache.return_value = cache
        profiles: list = []
        c.add_optimization_profile.side_effect = lambda profile: profiles.append(profile) or len(profiles) - 1
        self.configs.append(c)
        return c

    def _parser(self, network):
        p = self.instance("OnnxParser")
        p.num_errors = 0

        def parse(model, path=None):
            self.parsed.append(bytes(model))
            return True
        p.parse.side_effect = parse
        return p

    def _build(self, network, config):
        precision = "fp16" if self._strong_fp16() else "fp32"
        plan = f"PLAN-{precision}-{len(self.plans)}".encode()
        self.plans[plan] = precision
        self.plan_onnx[plan] = self.parsed[-1]
        return plan

    def _strong_fp16(self) -> bool:
        data = self.parsed[-1]
        m = onnx.load_from_string(data)
        return any(i.data_type == onnx.TensorProto.FLOAT16 for i in m.graph.initializer)

    # ---- running --------------------------------------------------------------------------------
    def _runtime(self):
        r = self.instance("Runtime")
        r.deserialize_cuda_engine.side_effect = self._engine
        return r

    def _engine(self, serialized_engine):
        plan = bytes(serialized_engine)
        precision = self.plans.get(plan, "fp32")
        e = self.instance("ICudaEngine")
        inspector = self.instance("EngineInspector")
        info = self.inspector if precision == "fp16" or self.fp32_inspector is None else self.fp32_inspector
        if callable(info):  # computed from the ONNX graph the plan was built from
            info = info(onnx.load_from_string(self.plan_onnx.get(plan, self.parsed[-1])))
        inspector.get_engine_information.side_effect = lambda format: json.dumps(info)
        e.create_engine_inspector.return_value = inspector
        # the graph's outputs as the engine's output bindings, in order (one `logits`; several feature maps)
        graph = onnx.load_from_string(self.plan_onnx.get(plan, self.parsed[-1])) if self.parsed else None
        outs = [o.name for o in graph.graph.output] if graph is not None else ["logits"]
        names = ["image", *outs]
        e.num_io_tensors = len(names)
        e.num_optimization_profiles = 1
        e.get_tensor_name.side_effect = lambda index: names[index]
        io = self.enums["TensorIOMode"]
        e.get_tensor_mode.side_effect = lambda name: io.INPUT if name == "image" else "TensorIOMode.OUTPUT"
        e.get_tensor_dtype.side_effect = lambda name: "DataType.FLOAT"
        e.get_tensor_profile_shape.side_effect = lambda name, profile_index: [(1, 3, 8, 8), (1, 3, 8, 8),
                                                                              (8, 3, 8, 8)]
        e.create_execution_context.side_effect = lambda strategy=None: self._context(precision)
        return e

    def _context(self, precision: str):
        ctx = self.instance("IExecutionContext")
        state: dict = {"addr": {}}
        ctx.set_input_shape.side_effect = lambda name, shape: state.update(shape=tuple(shape)) or True
        ctx.get_tensor_shape.side_effect = lambda name: (state["shape"][0], 10)
        ctx.set_tensor_address.side_effect = lambda name, memory: state["addr"].update({name: memory}) or True
        ctx.set_optimization_profile_async.return_value = True

        def execute(stream_handle):  # output k: (k + 1) x the fixed linear map, so their order is visible
            bufs = self.memory.buffers
            x = bufs[state["addr"]["image"]]
            y = _linear(x, np.float16 if precision == "fp16" else np.float32)
            for k, name in enumerate(n for n in state["addr"] if n != "image"):
                bufs[state["addr"][name]][...] = y * (k + 1)
            return True
        ctx.execute_async_v3.side_effect = execute
        self.contexts.append(ctx)
        return ctx

    # ---- what happened --------------------------------------------------------------------------
    def flags(self, which: str = "set_flag") -> list:
        return [c.args[0] for cfg in self.configs for c in getattr(cfg, which).call_args_list]
