"""The fp16 precision policy shared by CoreML and TensorRT, and the fp16 range analysis behind it.

One policy decides which operations stay in fp32 ("fp32 islands") for every backend:
- ONNX (`onnx_fp32_nodes`): drives the fp16-cast graph that ONNX Runtime and TensorRT 11 run
  (exporter/onnx_fp16.py), like AutoCast's `nodes_to_exclude`;
- MIL (`mil_op_selector`): coremltools' `FP16ComputePrecision(op_selector=...)`, True = op may run in fp16.

Islands are found structurally, the same way on both graphs: a *seed* (a reduction such as ReduceL2 /
reduce_sum, a LayerNorm or Softmax, or an elementwise op with a tiny scalar eps) plus the square/abs
that feeds a reduction, plus the chain of elementwise/shape ops downstream of it, up to and including
the op where the chain rejoins the main tensor (the rescale `x / ||x||`, `x * rsqrt(.)`, `out * z`).

The hazards come from MODELS.md: l2 normalize in SwiftFormer (and its deploy rewrite
`x * rsqrt(max(sum(x^2), eps^2))`), SimA's l1 normalize over tokens (eps 1e-12 flushes to 0 in fp16)
and class attention (eps 1e-6), SLA's normalizer `1/(q . sum k + 1e-6)` (1/1e-6 overflows fp16).

`analyze_fp16_ranges` runs calibration inputs through the deploy-form model in fp32 and records
per-module and per-op max|x| and the eps constants in use; `check_fp16_safe` fails an fp16 export when
a hazard falls outside the policy's islands, naming the module.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

import weakref

import numpy as np
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode

from ..errors import VitedgeError

FP16_MAX = 65504.0
FP16_MIN_NORMAL = 2.0 ** -14        # 6.1e-5: below this fp16 is subnormal (precision lost)


def fp16_flushes_to_zero(value: float) -> bool:
    return value != 0.0 and float(np.float16(value)) == 0.0


def is_tiny_eps(value: float) -> bool:
    """A non-zero constant below fp16's normal range: an eps that fp16 loses or whose reciprocal overflows."""
    return 0.0 < abs(value) < FP16_MIN_NORMAL


@dataclass
class PolicyRule:
    name: str
    why: str
    onnx_op_types: tuple[str, ...]
    mil_op_types: tuple[str, ...]
    # torch functions (as analyze_fp16_ranges names them) whose hazards this rule's islands cover
    torch_ops: tuple[str, ...] = ()
    # seed only when the op has a scalar constant input with 0 < |c| < 2^-14 (an eps)
    needs_tiny_const: bool = False


# Ops an island extends through downstream of a reduction or eps seed (a matmul only ends a chain, where it
# meets the other operand: SLA's q . sum k), and ops feeding a reduction that square/abs its input.
# LayerNorm/Softmax seeds are self-contained: their outputs are bounded.
_ONNX_PASS = frozenset({"Clip", "Max", "Min", "Add", "Sub", "Mul", "Div", "Sqrt", "Reciprocal", "Pow", "Expand",
                        "Transpose", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Cast", "Neg", "Abs",
                        "Sum"})
_MIL_PASS = frozenset({"clip", "maximum", "minimum", "add", "sub", "mul", "real_div", "sqrt", "rsqrt", "inverse",
                       "pow", "tile", "transpose", "reshape", "expand_dims", "squeeze", "identity", "cast", "abs",
                       "square"})
_JOIN_ONLY = frozenset({"MatMul", "matmul"})
# At the rescale `num * z` / `num / den`, a numerator made of activation x activation products (SLA's
# q (k^T v), the official code's fp32 block) joins the island: it grows with the same token sums as den.
_RESCALE = frozenset({"Mul", "Div", "mul", "real_div"})
_PRODUCT_PASS = frozenset({"Transpose", "transpose"})
_ONNX_SQUARE = frozenset({"Pow", "Mul", "Abs"})
_MIL_SQUARE = frozenset({"pow", "mul", "abs", "square"})
_ONNX_REDUCE = frozenset({"ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceSum", "ReduceMean", "ReduceLogSumExp"})
_MIL_REDUCE = frozenset({"reduce_l1_norm", "reduce_l2_norm", "reduce_sum_square", "reduce_sum", "reduce_mean",
                         "reduce_log_sum_exp"})


# --------------------------------------------------------------------------------------------------
# One island finder for both graph kinds, behind a tiny adapter.
# --------------------------------------------------------------------------------------------------
@dataclass
class _Port:
    """One input of a node: its producer (None for graph inputs / constants) and what it is."""
    producer: Any
    is_const: bool
    value: np.ndarray | None
    is_float: bool
    key: Any  # identity of the tensor (name / var), to recognise x * x


class _Graph:
    def key(self, n) -> str:
        return n.name

    def nodes(self) -> list: ...
    def op_type(self, n) -> str: ...
    def ports(self, n) -> list[_Port]: ...
    def consumers(self, n) -> list: ...


def _tiny_const(ports: list[_Port]) -> bool:
    for p in ports:
        if p.is_const and p.value is not None and np.issubdtype(np.asarray(p.value).dtype, np.floating):
            v = np.asarray(p.value)
            if v.size == 1 and is_tiny_eps(float(v.reshape(-1)[0])):
                return True
    return False


def _find_islands(g: _Graph, rules: list[PolicyRule], pass_ops: frozenset, square_ops: frozenset,
                  reduce_ops: frozenset, attr: str) -> dict[str, str]:
    """{node name: rule name} for every node kept in fp32."""
    island: dict = {}
    key = g.key
    seeds = []
    for n in g.nodes():
        t = g.op_type(n)
        for r in rules:
            if t in getattr(r, attr) and (not r.needs_tiny_const or _tiny_const(g.ports(n))):
                island[key(n)] = r.name
                seeds.append((n, r))
                break
    for n, r in seeds:
        # upstream: the square / abs that feeds a reduction (x^2 overflows for |x| > 256)
        if g.op_type(n) in reduce_ops:
            cur = n
            while True:
                ports = [p for p in g.ports(cur) if not p.is_const and p.is_float]
                if len(ports) != 1 or ports[0].producer is None:
                    break
                prod = ports[0].producer
                pt = g.op_type(prod)
                if pt not in square_ops or key(prod) in island:
                    break
                pports = [p for p in g.ports(prod) if not p.is_const]
                if pt in ("Mul", "mul") and not (len(pports) == 2 and pports[0].key == pports[1].key):
                    break  # a Mul that is not x * x
                island[key(prod)] = r.name
                cur = prod
        if not (g.op_type(n) in reduce_ops or r.needs_tiny_const):
            continue
        # downstream: through elementwise/shape ops until the chain rejoins a tensor from outside the island
        frontier = [n]
        while frontier:
            cur = frontier.pop()
            for c in g.consumers(cur):
                t = g.op_type(c)
                if key(c) in island or (t not in pass_ops and t not in _JOIN_ONLY):
                    continue
                outside = [p for p in g.ports(c) if p.is_float and not p.is_const
                           and (p.producer is None or key(p.producer) not in island)]
                if t in _JOIN_ONLY and not outside:
                    continue  # a matmul with a constant weight is a Linear layer, not part of the chain
                island[key(c)] = r.name
                if not outside:  # still the reduced side chain: keep walking
                    frontier.append(c)
                elif t in _RESCALE:
                    _claim_products(g, [p.producer for p in outside], island, r.name)
    return island


def _claim_products(g: _Graph, nodes: list, island: dict, rule: str) -> None:
    """Add the matmuls of two activations (through transposes) that produce a rescaled numerator."""
    while nodes:
        n = nodes.pop()
        if n is None or g.key(n) in island:
            continue
        t = g.op_type(n)
        acts = [p for p in g.ports(n) if p.is_float and not p.is_const]
        if t in _JOIN_ONLY and len(acts) == 2 or t in _PRODUCT_PASS and any(
                g.op_type(c) in _JOIN_ONLY and g.key(c) in island for c in g.consumers(n)):
            island[g.key(n)] = rule
            nodes.extend(p.producer for p in acts)


class _OnnxGraph(_Graph):
    def __init__(self, model):
        import onnx
        from onnx import numpy_helper
        graph = model.graph
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph
        except Exception:  # shape inference is only used for dtypes; fall back to what is declared
            inferred = graph
        self._dtype = {}
        for vi in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
            self._dtype[vi.name] = vi.type.tensor_type.elem_type
        self._const = {}
        for init in graph.initializer:
            self._const[init.name] = numpy_helper.to_array(init)
            self._dtype[init.name] = init.data_type
        self._producer = {}
        self._consumers: dict[str, list] = {}
        for node in graph.node:
            if node.op_type == "Constant":
                for a in node.attribute:
                    if a.name == "value":
                        self._const[node.output[0]] = numpy_helper.to_array(a.t)
                        self._dtype[node.output[0]] = a.t.data_type
                continue
            for o in node.output:
                self._producer[o] = node
            for i in node.input:
                self._consumers.setdefault(i, []).append(node)
        self._nodes = [n for n in graph.node if n.op_type != "Constant"]
        self._float = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                       onnx.TensorProto.BFLOAT16}

    def nodes(self):
        return self._nodes

    def op_type(self, n):
        return n.op_type

    def ports(self, n):
        out = []
        for name in n.input:
            if not name:
                continue
            is_const = name in self._const
            dt = self._dtype.get(name)
            out.append(_Port(self._producer.get(name), is_const, self._const.get(name),
                             dt in self._float if dt is not None else True, name))
        return out

    def consumers(self, n):
        return [c for o in n.output for c in self._consumers.get(o, [])]


class _MilGraph(_Graph):
    def __init__(self, block):
        self._ops = list(block.operations)

    def nodes(self):
        return [op for op in self._ops if op.op_type != "const"]

    def op_type(self, op):
        return op.op_type

    def ports(self, op):
        out = []
        for v in op.inputs.values():
            for var in (v if isinstance(v, (list, tuple)) else [v]):
                prod = var.op
                is_const = prod is not None and prod.op_type == "const"
                is_float = var.is_tensor_or_scalar_of(dtype="fp32") or var.is_tensor_or_scalar_of(dtype="fp16")
                out.append(_Port(None if is_const else prod, is_const, var.val if is_const else None, is_float, var))
        return out

    def consumers(self, op):
        return [c for o in op.outputs for c in o.child_ops]


@dataclass
class PrecisionPolicy:
    rules: list[PolicyRule]
    _mil_cache: list = field(default_factory=list, repr=False, compare=False)  # [(block, {op name: rule})]

    def onnx_fp32_islands(self, model) -> dict[str, str]:
        """{node name: rule name} for every ONNX node kept in fp32 (nodes without a name are named first)."""
        _name_nodes(model)
        return _find_islands(_OnnxGraph(model), self.rules, _ONNX_PASS, _ONNX_SQUARE, _ONNX_REDUCE, "onnx_op_types")

    def onnx_fp32_nodes(self, model) -> set[str]:
        """Names of the ONNX nodes to keep in fp32."""
        return set(self.onnx_fp32_islands(model))

    def mil_fp32_ops(self, block) -> dict[str, str]:
        """{op name: rule name} for the MIL ops of `block` kept in fp32 (computed once per block, before the
        fp16 pass inserts its casts)."""
        for b, names in self._mil_cache:
            if b is block:
                return names
        names = _find_islands(_MilGraph(block), self.rules, _MIL_PASS, _MIL_SQUARE, _MIL_REDUCE, "mil_op_types")
        self._mil_cache.append((block, names))
        return names

    def mil_op_selector(self, op) -> bool:
        """coremltools `FP16ComputePrecision(op_selector=...)`: True = `op` may run in fp16."""
        return op.name not in self.mil_fp32_ops(op.enclosing_block)

    def covers(self, torch_op: str) -> str | None:
        """The rule whose islands cover a hazard at torch op `torch_op` (as analyze_fp16_ranges names it)."""
        seed = seed_of(torch_op)
        for r in self.rules:
            if seed in r.torch_ops:
                return r.name
        return None

    def to_dict(self) -> dict:
        return {"rules": [asdict(r) for r in self.rules],
                "tiny_eps_below": FP16_MIN_NORMAL, "fp16_max": FP16_MAX}


def _name_nodes(model) -> None:
    """Give every unnamed node a unique name (islands are reported and excluded by name)."""
    used = {n.name for n in model.graph.node if n.name}
    for i, n in enumerate(model.graph.node):
        if not n.name:
            name = f"{n.op_type}_{i}"
            while name in used:
                name += "_"
            n.name = name
            used.add(name)


def default_policy() -> PrecisionPolicy:
    return PrecisionPolicy(rules=[
        PolicyRule(
            "lp_normalize",
            "l1/l2 normalizations (SwiftFormer F.normalize and its rsqrt rewrite, SimA l1 over tokens and class "
            "attention): sums of squares overflow for |x| > 256 and eps 1e-12 flushes to 0 in fp16",
            ("ReduceL1", "ReduceL2", "ReduceSumSquare", "LpNormalization"),
            ("reduce_l1_norm", "reduce_l2_norm", "reduce_sum_square", "l2_norm"),
            torch_ops=("normalize", "norm")),
        PolicyRule(
            "token_sums",
            "sums over tokens/channels (SLA's sum_j k_j, SwiftFormer's global query, the sum(x^2) of the "
            "normalize rewrite) grow with the token count and feed divisions",
            ("ReduceSum",), ("reduce_sum",), torch_ops=("sum",)),
        PolicyRule(
            "layernorm",
            "LayerNorm's mean/variance reductions (ReduceMean/Pow/Sqrt chains) overflow on large activations",
            ("ReduceMean", "LayerNormalization", "GroupNormalization", "InstanceNormalization"),
            ("reduce_mean", "layer_norm", "instance_norm"), torch_ops=("mean", "layer_norm", "group_norm")),
        PolicyRule(
            "softmax", "exp/sum in Softmax is cheap to keep exact",
            ("Softmax", "LogSoftmax"), ("softmax",), torch_ops=("softmax", "log_softmax")),
        PolicyRule(
            "tiny_eps",
            "scalar eps below fp16's normal range: SLA's 1/(q . sum k + 1e-6) overflows (1/1e-6 > 65504), "
            "eps 1e-12 flushes to 0; the op and what follows it up to the rescale stay fp32",
            ("Add", "Sub", "Max", "Min", "Clip", "Div", "Mul", "Sum"),
            ("add", "sub", "maximum", "minimum", "clip", "real_div", "mul"),
            torch_ops=("add_eps", "clamp_eps"), needs_tiny_const=True),
    ])


# --------------------------------------------------------------------------------------------------
# fp16 range analysis on the deploy-form model
# --------------------------------------------------------------------------------------------------
@dataclass
class EpsUse:
    module: str
    op: str            # "normalize", "layer_norm", "add_eps", "clamp_eps", ... or "attr" (a module's eps)
    value: float
    fp16_value: float
    flushes_to_zero: bool
    reciprocal_overflows: bool  # 1/eps > 65504 (matters where eps guards a division)
    hazard: bool


@dataclass
class Fp16Hazard:
    module: str
    op: str
    kind: str          # "overflow" | "eps_underflow" | "eps_reciprocal_overflow"
    value: float
    covered_by: str | None  # policy rule keeping it in fp32, or None

    def describe(self) -> str:
        if self.kind == "overflow":
            return f"module '{self.module}' ({self.op}) reaches max|x| = {self.value:.4g} > {FP16_MAX:g}"
        if self.kind == "eps_underflow":
            return f"module '{self.module}' ({self.op}) uses eps {self.value:.3g}, which is 0 in fp16"
        return f"module '{self.module}' ({self.op}) adds eps {self.value:.3g}; 1/eps overflows fp16"


@dataclass
class Fp16Analysis:
    samples: int
    modules: dict[str, dict]            # name -> {"type", "max_abs", "ops": {op: max_abs}}
    eps: list[EpsUse]
    hazards: list[Fp16Hazard]

    @property
    def overflowing_modules(self) -> list[str]:
        return sorted({h.module for h in self.hazards if h.kind == "overflow"})

    @property
    def eps_underflows(self) -> list[EpsUse]:
        return [e for e in self.eps if e.hazard]

    def uncovered(self) -> list[Fp16Hazard]:
        return [h for h in self.hazards if h.covered_by is None]

    def to_dict(self) -> dict:
        return {"samples": self.samples, "fp16_max": FP16_MAX,
                "max_abs": {k: v["max_abs"] for k, v in self.modules.items()},
                "overflowing_modules": self.overflowing_modules,
                "eps": [asdict(e) for e in self.eps],
                "hazards": [asdict(h) for h in self.hazards]}


# torch function name -> the op name the analysis reports (functional forms and tensor methods alike).
_OP_NAMES = {"normalize": "normalize", "layer_norm": "layer_norm", "group_norm": "group_norm",
             "softmax": "softmax", "log_softmax": "log_softmax", "rsqrt": "rsqrt", "sqrt": "sqrt",
             "reciprocal": "reciprocal", "__rtruediv__": "reciprocal", "__rdiv__": "reciprocal", "sum": "sum", "mean": "mean",
             "norm": "norm", "linalg_vector_norm": "norm", "square": "square", "matmul": "matmul",
             "__matmul__": "matmul", "bmm": "matmul", "linear": "linear", "conv2d": "conv2d", "conv1d": "conv1d",
             "einsum": "einsum", "gelu": "gelu", "batch_norm": "batch_norm", "add": "add", "__add__": "add",
             "__radd__": "add", "mul": "mul", "__mul__": "mul", "__rmul__": "mul", "div": "div",
             "__truediv__": "div", "pow": "pow", "__pow__": "pow", "sub": "sub", "__sub__": "sub", "__rsub__": "sub",
             "exp": "exp", "relu": "relu", "clamp": "clamp", "clamp_min": "clamp", "maximum": "clamp",
             "transpose": "transpose", "permute": "permute", "reshape": "reshape", "view": "reshape",
             "expand": "expand", "expand_as": "expand", "flatten": "reshape", "unsqueeze": "reshape",
             "squeeze": "reshape", "neg": "neg", "__neg__": "neg", "abs": "abs", "minimum": "clamp"}
# Seeds of an fp32 island (as the ONNX/MIL walk seeds them); normalize & co. are self-contained.
_CHAIN_SEEDS = frozenset({"sum", "mean", "norm", "add_eps", "clamp_eps"})
_SELF_CONTAINED = frozenset({"normalize", "layer_norm", "group_norm", "softmax", "log_softmax"})
# Ops a chain extends through, and matmul which only ends one where it meets the other operand.
_CHAIN_PASS = frozenset({"add", "sub", "mul", "div", "reciprocal", "rsqrt", "sqrt", "pow", "clamp", "transpose",
                         "permute", "reshape", "expand", "neg", "abs", "square"})
_CHAIN_JOIN = frozenset({"matmul"})
_EPS_ARG_OPS = {"normalize": 3, "layer_norm": 4, "group_norm": 3, "batch_norm": 7}  # positional index of eps
_EPS_DEFAULTS = {"normalize": 1e-12, "layer_norm": 1e-5, "group_norm": 1e-5, "batch_norm": 1e-5}


def _max_abs(t) -> float | None:
    if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
        return float(t.detach().abs().amax())
    if isinstance(t, (tuple, list)):
        vals = [v for v in (_max_abs(x) for x in t) if v is not None]
        return max(vals) if vals else None
    return None


def _live(table: dict, t) -> bool:
    """`t` is the tensor recorded in `table` under its id (ids of freed tensors get reused)."""
    ent = table.get(id(t))
    return ent is not None and ent[0]() is t


def seed_of(op: str) -> str:
    """The op whose fp32 island an analysis op belongs to: "matmul<sum" -> "sum", "linear" -> "linear"."""
    return op.rsplit("<", 1)[-1]


class _Recorder(TorchFunctionMode):
    """Records max|out| of every torch op inside each module's forward, and the eps constants used.

    It mirrors the island walk of the graphs: outputs of seed ops (sums, means, eps adds) are tagged, an
    elementwise/shape op on a tagged tensor is reported as "op<seed" (inside that island) and stays tagged
    unless it also takes a non-constant tensor from outside (the rescale, where the chain ends).
    """

    def __init__(self, constants: set[int]):
        super().__init__()
        self.stack: list[str] = [""]
        self.ops: dict[str, dict[str, float]] = {}
        self.eps: dict[tuple[str, str, float], None] = {}
        self.constants = constants                   # ids of parameters and buffers
        self.paused = False                          # set while the hooks measure (not model ops)
        self._tags: dict[int, tuple[Any, str]] = {}    # id -> (weakref, seed) of tensors inside an island chain
        self._squares: dict[int, tuple[Any, str, float]] = {}  # pending x*x: id -> (weakref, module, max)
        # pending activation x activation matmuls: id -> (weakref, module, max, operand ids)
        self._products: dict[int, tuple[Any, str, float, list[int]]] = {}

    def _note(self, mod: str, op: str, value: float | None) -> None:
        if value is not None:
            d = self.ops.setdefault(mod, {})
            d[op] = max(d.get(op, 0.0), value)

    def _tag(self, t) -> str | None:
        return self._tags[id(t)][1] if _live(self._tags, t) else None

    def _set_tag(self, t, seed: str) -> None:
        if isinstance(t, torch.Tensor):
            self._tags[id(t)] = (weakref.ref(t), seed)

    def _claim_products(self, t, seed: str) -> None:
        """A rescaled numerator made of matmuls of activations belongs to the island (as in the graphs)."""
        if not _live(self._products, t):
            return
        todo = [id(t)]
        while todo:
            ent = self._products.pop(todo.pop(), None)
            if ent is not None:
                self._note(ent[1], f"matmul<{seed}", ent[2])
                todo.extend(ent[3])

    def flush(self) -> None:
        """After a batch: squares no reduction consumed and products no rescale claimed are plain fp16 ops."""
        for ref, mod, v in self._squares.values():
            self._note(mod, "mul", v)
        for ref, mod, v, _ in self._products.values():
            self._note(mod, "matmul", v)
        self._squares.clear()
        self._products.clear()
        self._tags.clear()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        op = _OP_NAMES.get(getattr(func, "__name__", ""))
        if op is None or self.paused:
            return out
        mod = self.stack[-1]
        scalars = [a for a in args[1:] if isinstance(a, float)] + [v for v in kwargs.values() if isinstance(v, float)]
        tensors = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if op in _EPS_ARG_OPS:
            idx = _EPS_ARG_OPS[op]
            eps = kwargs.get("eps", args[idx] if len(args) > idx else _EPS_DEFAULTS[op])
            self.eps[(mod, op, float(eps))] = None
        if op == "normalize":  # the sum of |x|^p inside it runs in the backend's reduction
            p = float(kwargs.get("p", args[1] if len(args) > 1 else 2.0))
            dim = kwargs.get("dim", args[2] if len(args) > 2 else 1)
            self._note(mod, "sum_of_powers<normalize", float(args[0].detach().abs().pow(p).sum(dim).amax()))
        elif op in ("add", "clamp") and any(is_tiny_eps(c) for c in scalars):
            op = f"{op}_eps"
            self.eps[(mod, op, next(c for c in scalars if is_tiny_eps(c)))] = None
        elif op == "mul" and len(tensors) == 2 and tensors[0] is tensors[1] or op == "pow" and 2.0 in scalars + [
                a for a in args[1:] if isinstance(a, int)]:
            op = "square"
        value = _max_abs(out)
        if op == "square":  # reported when a reduction consumes it (inside the island) or at the end
            self._squares[id(out)] = (weakref.ref(out), mod, value or 0.0)
            return out
        if op in ("sum", "mean", "norm") and tensors and _live(self._squares, tensors[0]):
            _, smod, sv = self._squares.pop(id(tensors[0]))
            self._note(smod, f"square<{op}", sv)
        seeds = [s for s in (self._tag(t) for t in tensors) if s]
        if op in _CHAIN_SEEDS:
            self._set_tag(out, op)
        elif seeds and (op in _CHAIN_PASS or op in _CHAIN_JOIN):
            outside = [t for t in tensors if self._tag(t) is None and id(t) not in self.constants]
            if not (op in _CHAIN_JOIN and not outside):
                op = f"{op}<{seeds[0]}"
                if not outside:
                    self._set_tag(out, seeds[0])
                elif op.split("<")[0] in ("mul", "div"):
                    for t in outside:
                        self._claim_products(t, seeds[0])
        elif op == "matmul" and len(tensors) == 2 and not any(id(t) in self.constants for t in tensors):
            self._products[id(out)] = (weakref.ref(out), mod, value or 0.0,
                                       [id(t) for t in tensors if _live(self._products, t)])
            return out
        self._note(mod, op, value)
        return out


@torch.no_grad()
def analyze_fp16_ranges(deploy_model: nn.Module, inputs: torch.Tensor | Iterable[torch.Tensor],
                        policy: PrecisionPolicy | None = None, batch_size: int = 16) -> Fp16Analysis:
    """Run `inputs` (fp32 NCHW, a tensor or an iterable of batches) through `deploy_model` in fp32 and record
    per-module and per-op activation max|x| and the eps constants in use; hazards are matched to `policy`."""
    policy = policy or default_policy()
    batches = inputs.split(batch_size) if isinstance(inputs, torch.Tensor) else inputs
    rec = _Recorder({id(t) for t in list(deploy_model.parameters()) + list(deploy_model.buffers())})
    module_max: dict[str, float] = {}
    types: dict[str, str] = {}
    handles = []

    def pre(name):
        def hook(_m, _inp):
            rec.stack.append(name)
        return hook

    def post(name):
        def hook(_m, _inp, out):
            rec.stack.pop()
            rec.paused = True
            v = _max_abs(out)
            rec.paused = False
            if v is not None:
                module_max[name] = max(module_max.get(name, 0.0), v)
        return hook

    for name, m in deploy_model.named_modules():
        types[name or "<model>"] = type(m).__name__
        handles.append(m.register_forward_pre_hook(pre(name or "<model>")))
        handles.append(m.register_forward_hook(post(name or "<model>")))
    was_training = deploy_model.training
    deploy_model.eval()
    n = 0
    try:
        with rec:
            for xb in batches:
                deploy_model(xb.float())
                n += xb.shape[0]
                rec.flush()
    finally:
        for h in handles:
            h.remove()
        deploy_model.train(was_training)

    eps_uses = []
    for (mod, op, value) in rec.eps:
        f16 = float(np.float16(value))
        flush = fp16_flushes_to_zero(value)
        recip = value != 0 and (f16 == 0 or 1.0 / f16 > FP16_MAX)
        hazard = flush or (op == "add_eps" and recip)
        eps_uses.append(EpsUse(mod, op, value, f16, flush, recip, hazard))
    for name, m in deploy_model.named_modules():  # eps held as attributes (informational: usage unknown)
        v = getattr(m, "eps", None)
        if isinstance(v, float):
            f16 = float(np.float16(v))
            eps_uses.append(EpsUse(name, "attr", v, f16, fp16_flushes_to_zero(v), 1.0 / max(f16, 1e-45) > FP16_MAX,
                                   False))

    hazards = []
    for mod, ops in rec.ops.items():
        for op, v in ops.items():
            if v > FP16_MAX or not np.isfinite(v):
                hazards.append(Fp16Hazard(mod, op, "overflow", v, policy.covers(op)))
    for e in eps_uses:
        if e.hazard:
            kind = "eps_underflow" if e.flushes_to_zero else "eps_reciprocal_overflow"
            hazards.append(Fp16Hazard(e.module, e.op, kind, e.value, policy.covers(e.op)))
    modules = {name: {"type": types.get(name, ""), "max_abs": v, "ops": rec.ops.get(name, {})}
               for name, v in module_max.items()}
    return Fp16Analysis(n, modules, eps_uses, hazards)


def check_fp16_safe(analysis: Fp16Analysis, policy: PrecisionPolicy | None = None) -> None:
    """Raise VitedgeError naming the first module that would produce inf/NaN in fp16 outside the policy's
    fp32 islands."""
    policy = policy or default_policy()
    bad = [h for h in analysis.hazards if policy.covers(h.op) is None]
    if bad:
        more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
        raise VitedgeError(f"fp16 is unsafe: {bad[0].describe()} outside the precision policy's fp32 islands"
                           f"{more}; export with --precision fp32 (or fix the weights' scale)")


__all__ = ["PolicyRule", "PrecisionPolicy", "default_policy", "Fp16Analysis", "Fp16Hazard", "EpsUse",
           "analyze_fp16_ranges", "check_fp16_safe", "FP16_MAX", "is_tiny_eps", "fp16_flushes_to_zero"]
