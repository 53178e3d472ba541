"""The fp16 precision policy shared by CoreML, TensorRT and the fp16 ONNX graph: which ops stay fp32.

Graph level only (ONNX and MIL graphs, no torch): the torch-side range analysis that checks a model against this
policy before an fp16 export is `vitedge.exporter.verdict.fp16_ranges`.

One policy decides which operations stay in fp32 ("fp32 islands") for every backend:
- ONNX (`onnx_fp32_nodes`): drives the fp16-cast graph that ONNX Runtime and TensorRT 11 run
  (targets/graph/onnx_fp16.py), like AutoCast's `nodes_to_exclude`;
- MIL (`mil_op_selector`): coremltools' `FP16ComputePrecision(op_selector=...)`, True = op may run in fp16.

Islands are found structurally, the same way on both graphs: a *seed* (a reduction such as ReduceL2 /
reduce_sum, a LayerNorm or Softmax, or an elementwise op with a tiny scalar eps) plus the square/abs
that feeds a reduction, plus the chain of elementwise/shape ops downstream of it, up to and including
the op where the chain rejoins the main tensor (the rescale `x / ||x||`, `x * rsqrt(.)`, `out * z`).

The hazards come from MODELS.md: l2 normalize in SwiftFormer (and its deploy rewrite
`x * rsqrt(max(sum(x^2), eps^2))`), SimA's l1 normalize over tokens (eps 1e-12 flushes to 0 in fp16)
and class attention (eps 1e-6), SLA's normalizer `1/(q . sum k + 1e-6)` (1/1e-6 overflows fp16).

Each rule also names the torch ops (as the range analysis reports them) whose hazards its islands cover
(`PrecisionPolicy.covers`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

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
        name_nodes(model)
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


def name_nodes(model) -> None:
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


def seed_of(op: str) -> str:
    """The op whose fp32 island an analysis op belongs to: "matmul<sum" -> "sum", "linear" -> "linear"."""
    return op.rsplit("<", 1)[-1]


__all__ = ["PolicyRule", "PrecisionPolicy", "default_policy", "name_nodes", "seed_of", "FP16_MAX", "FP16_MIN_NORMAL",
           "is_tiny_eps", "fp16_flushes_to_zero"]
