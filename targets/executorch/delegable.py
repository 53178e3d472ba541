"""Rewrites of an exported deploy-form graph into ops XNNPACK delegates, each exact in real arithmetic.

XNNPACK leaves some core ATen ops to ExecuTorch's portable kernels (slower, and every boundary copies): sums and
non-spatial means (SwiftFormer's l2 normalization, SimA's l1), LayerNorm (SimA, SLAB's final norms), `pow` other
than 2, `reciprocal`, `select`/`squeeze`/`expand` views, and scalars that become 0-d float64 constants behind a
dtype copy. Each rule below swaps one for delegable ops:

- an l2 / l1 vector norm -> the sum below of x * x (then sqrt) / of |x|;
- sum / mean over any dims -> (permute) view (1, kept, reduced, 1), mean over (2, 3) with keepdim (XNNPACK's
  global average pool), times the count for a sum, view to the output shape; a channel sum of NCHW is a 1x1
  convolution with ones;
- layer_norm / native_layer_norm -> mean, subtract, mean of squares, + eps, rsqrt, scale, shift;
- pow(x, 2) -> x * x, pow(x, 0.5) -> sqrt, pow(x, -0.5) -> rsqrt; a * reciprocal(b) -> a / b;
- select and unbind -> slice + view; squeeze -> view; an expand that keeps the shape -> nothing;
- roll (Swin's shifted windows) -> slices and a concatenation;
- a batched matmul -> bmm on 3-D views (its decomposition would expand and copy both operands);
- a Python scalar operand -> a float32 constant tensor.

`make_delegable(gm)` applies them to the unlifted GraphModule of an exported program (`ep.module()`, before
decomposition: the XNNPACK quantizer matches `linear` and `conv2d` as written, which decomposition would turn into
`addmm`/`convolution` it leaves in float) and returns it; the caller re-exports it. `gate(before, after, x)` compares the two in float64: a rewrite that changed the function
(not only its float32 rounding) is refused there, as the deploy-form's own rewrites are (exporter/reparam).
"""
from __future__ import annotations

import copy
import math
import operator

import torch
import torch.fx as fx
import torch.nn as nn

aten = torch.ops.aten
GATE_RTOL = 1e-10  # float64: the rules only reorder sums; a real change of function is many orders larger


class _Graph:
    """Node factories on one graph, with constants registered as float32 buffers of the module."""

    def __init__(self, gm: fx.GraphModule):
        self.gm, self.g, self.n = gm, gm.graph, 0

    def const(self, value) -> fx.Node:
        name = f"_delegable_const{self.n}"
        self.n += 1
        t = value if isinstance(value, torch.Tensor) else torch.tensor([float(value)])
        self.gm.register_buffer(name, t.to(torch.float32))
        return self.g.get_attr(name)

    def op(self, target, *args) -> fx.Node:
        return self.g.call_function(target, tuple(args))


def _shape(n) -> tuple:
    return tuple(n.meta["val"].shape)


def _reduce(G: _Graph, x: fx.Node, dims, keepdim: bool, total: bool, shape: tuple | None = None) -> fx.Node:
    """sum (total) or mean of x (of `shape`, where x is a new node) over `dims`, in ops XNNPACK delegates."""
    shape = shape or _shape(x)
    r = len(shape)
    dims = sorted({d % r for d in (dims if dims else range(r))})
    kept = [d for d in range(r) if d not in dims]
    count = math.prod(shape[d] for d in dims)
    out_shape = [1 if d in dims else shape[d] for d in range(r)] if keepdim else [shape[d] for d in kept]
    if total and r == 4 and dims == [1]:  # channel sum of NCHW: a 1x1 convolution with ones
        w = G.const(torch.ones(1, shape[1], 1, 1))
        y = G.op(aten.convolution.default, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        return G.op(aten.reshape.default, y, out_shape)
    if dims != list(range(r - len(dims), r)):  # the reduced dims last, the kept ones in their order
        x = G.op(aten.permute.default, x, kept + dims)
    v = G.op(aten.reshape.default, x, [1, math.prod(shape[d] for d in kept), count, 1])
    m = G.op(aten.mean.dim, v, [2, 3], True)
    if total:
        m = G.op(aten.mul.Tensor, m, G.const(count))
    return G.op(aten.reshape.default, m, out_shape)


def _layer_norm(G: _Graph, node: fx.Node) -> fx.Node:
    x, normalized, w, b, eps = (list(node.args) + [None] * 5)[:5]
    dims = list(range(-len(normalized), 0))
    mu = _reduce(G, x, dims, True, False)
    xc = G.op(aten.sub.Tensor, x, mu)
    var = _reduce(G, G.op(aten.mul.Tensor, xc, xc), dims, True, False, _shape(x))
    y = G.op(aten.mul.Tensor, xc, G.op(aten.rsqrt.default, G.op(aten.add.Tensor, var, G.const(eps))))
    if w is not None:
        y = G.op(aten.mul.Tensor, y, w)
    if b is not None:
        y = G.op(aten.add.Tensor, y, b)
    return y


_SCALAR_OPS = {aten.mul.Tensor, aten.add.Tensor, aten.sub.Tensor, aten.div.Tensor, aten.mul.Scalar,
               aten.add.Scalar, aten.sub.Scalar, aten.div.Scalar}
_TENSOR_FORM = {aten.mul.Scalar: aten.mul.Tensor, aten.add.Scalar: aten.add.Tensor, aten.sub.Scalar: aten.sub.Tensor,
                aten.div.Scalar: aten.div.Tensor}


def _rewrite(G: _Graph, node: fx.Node) -> fx.Node | None:
    """The delegable replacement of `node` (inserted before it), or None to keep it."""
    t, a = node.target, node.args
    if t == aten.layer_norm.default:
        return _layer_norm(G, node)
    if t == aten.roll.default:  # Swin's shifted windows: two slices and a concatenation per rolled dim
        x, shifts, dims = a[0], list(a[1]), list(a[2]) if len(a) > 2 else []
        if len(shifts) != len(dims):
            return None  # a roll of the flattened tensor: left as it is
        shape = _shape(x)
        for s, d in zip(shifts, dims):
            n = shape[d]
            s %= n
            if s:
                x = G.op(aten.cat.default, [G.op(aten.slice.Tensor, x, d, n - s, n),
                                            G.op(aten.slice.Tensor, x, d, 0, n - s)], d)
        return x
    if t == aten.matmul.default:
        sa, sb, so = _shape(a[0]), _shape(a[1]), _shape(node)
        if len(sa) < 3 or len(sb) != len(sa) or sa[:-2] != sb[:-2]:
            return None  # a broadcasting or 2-D product: left to the decomposition
        batch = math.prod(sa[:-2])
        y = G.op(aten.bmm.default, G.op(aten.reshape.default, a[0], [batch, *sa[-2:]]),
                 G.op(aten.reshape.default, a[1], [batch, *sb[-2:]]))
        return G.op(aten.reshape.default, y, list(so))
    if t in (aten.sum.dim_IntList, aten.mean.dim):
        x, dims = a[0], a[1]
        keepdim = bool(a[2]) if len(a) > 2 else bool(node.kwargs.get("keepdim", False))
        shape = _shape(x)
        dn = sorted(d % len(shape) for d in dims) if dims else list(range(len(shape)))
        if t == aten.mean.dim and len(shape) == 4 and dn == [2, 3] and keepdim:
            return None  # already XNNPACK's form
        return _reduce(G, x, dims, keepdim, t == aten.sum.dim_IntList)
    if t == aten.linalg_vector_norm.default:
        x = a[0]
        order = a[1] if len(a) > 1 else node.kwargs.get("ord", 2)
        dims = a[2] if len(a) > 2 else node.kwargs.get("dim")
        keepdim = bool(a[3]) if len(a) > 3 else bool(node.kwargs.get("keepdim", False))
        if order in (2, 2.0):
            return G.op(aten.sqrt.default, _reduce(G, G.op(aten.mul.Tensor, x, x), dims, keepdim, True, _shape(x)))
        if order in (1, 1.0):
            return _reduce(G, G.op(aten.abs.default, x), dims, keepdim, True, _shape(x))
        return None
    if t == aten.pow.Tensor_Scalar and a[1] in (2, 2.0):
        return G.op(aten.mul.Tensor, a[0], a[0])
    if t == aten.pow.Tensor_Scalar and a[1] == 0.5:
        return G.op(aten.sqrt.default, a[0])
    if t == aten.pow.Tensor_Scalar and a[1] == -0.5:
        return G.op(aten.rsqrt.default, a[0])
    if t == aten.select.int:
        x, dim, i = a
        i = i % _shape(x)[dim]
        return G.op(aten.reshape.default, G.op(aten.slice.Tensor, x, dim, i, i + 1), list(_shape(node)))
    if t in (aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default, aten.unsqueeze.default):
        return G.op(aten.reshape.default, a[0], list(_shape(node)))
    if t == aten.expand.default and _shape(a[0]) == _shape(node):
        return a[0]
    if t in _SCALAR_OPS and len(a) >= 2 and isinstance(a[1], (int, float)) and not isinstance(a[1], bool):
        return G.op(_TENSOR_FORM.get(t, t), a[0], G.const(a[1]))
    if t in _SCALAR_OPS and isinstance(a[0], (int, float)) and isinstance(a[1], fx.Node):
        return G.op(_TENSOR_FORM.get(t, t), G.const(a[0]), a[1])
    return None


def make_delegable(gm: fx.GraphModule) -> tuple[fx.GraphModule, dict]:
    """`gm` (unlifted, core ATen, with shape metadata) rewritten in place; {rule target: count} of what changed."""
    G = _Graph(gm)
    done: dict[str, int] = {}
    for node in gm.graph.nodes:  # parameters and constants read as attributes carry no shape metadata
        if node.op == "get_attr" and "val" not in node.meta:
            node.meta["val"] = torch.fx.graph_module._get_attr(gm, node.target)
    erased: set = set()  # users replaced with their node (a getitem, a mul by a reciprocal): not visited again
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node in erased:
            continue
        with gm.graph.inserting_before(node):
            if node.target == aten.native_layer_norm.default:
                if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
                    continue  # its mean / rstd outputs are used: keep the fused op
                new = _layer_norm(G, node)
                new.meta["val"] = node.meta["val"][0]
                for u in list(node.users):
                    u.replace_all_uses_with(new)
                    gm.graph.erase_node(u)
                    erased.add(u)
            elif node.target == aten.unbind.int:  # each piece a slice and a view, not select + squeeze copies
                x, dim = node.args[0], (node.args[1] if len(node.args) > 1 else 0)
                if any(u.target is not operator.getitem for u in node.users):
                    continue
                for u in list(node.users):
                    i = u.args[1]
                    with gm.graph.inserting_before(u):
                        v = G.op(aten.reshape.default, G.op(aten.slice.Tensor, x, dim, i, i + 1), list(_shape(u)))
                    v.meta["val"] = u.meta["val"]
                    u.replace_all_uses_with(v)
                    gm.graph.erase_node(u)
                    erased.add(u)
            elif node.target == aten.reciprocal.default:
                muls = [u for u in node.users if u.target == aten.mul.Tensor]
                if not muls or len(muls) != len(node.users):
                    continue
                for u in muls:
                    other = u.args[0] if u.args[1] is node else u.args[1]
                    with gm.graph.inserting_before(u):
                        other = other if isinstance(other, fx.Node) else G.const(other)
                        div = G.op(aten.div.Tensor, other, node.args[0])
                    div.meta["val"] = u.meta["val"]  # later rules read its shape (a sum of a / b: softmax's)
                    u.replace_all_uses_with(div)
                    gm.graph.erase_node(u)
                    erased.add(u)
                new = None
            else:
                new = _rewrite(G, node)
                if new is None:
                    continue
                if "val" in node.meta and "val" not in new.meta:  # the same value: later rules read its shape
                    new.meta["val"] = node.meta["val"]
                node.replace_all_uses_with(new)
        key = str(node.target).replace("aten.", "")
        done[key] = done.get(key, 0) + 1
        if not node.users:
            gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm, done


def gate(before: fx.GraphModule, after: fx.GraphModule, x: torch.Tensor) -> float:
    """The relative max difference of the two graphs in float64 on `x` (both copied, never changed)."""
    with torch.no_grad():
        y0 = _float64(before)(x.double())
        y1 = _float64(after)(x.double())
    y0 = y0[0] if isinstance(y0, (tuple, list)) else y0
    y1 = y1[0] if isinstance(y1, (tuple, list)) else y1
    return float((y1 - y0).abs().max() / y0.abs().max().clamp_min(1e-300))


def _float64(gm: fx.GraphModule) -> fx.GraphModule:
    """A float64 copy: parameters, buffers and the plain tensor attributes the graph reads (lifted constants)."""
    gm = copy.deepcopy(gm).double()
    for node in list(gm.graph.nodes):
        if node.target == aten._assert_tensor_metadata.default:  # asserts float32 where the copy is float64
            gm.graph.erase_node(node)
            continue
        if node.op == "call_function":  # casts to float32 (`.float()`, `.to(x.dtype)`) cast to float64 instead
            node.args = tuple(torch.float64 if a is torch.float32 else a for a in node.args)
            node.kwargs = {k: torch.float64 if v is torch.float32 else v for k, v in node.kwargs.items()}
        if node.op == "get_attr":
            owner, _, name = node.target.rpartition(".")
            mod = gm.get_submodule(owner) if owner else gm
            value = getattr(mod, name)
            if (isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter)
                    and value.is_floating_point() and value.dtype != torch.float64):
                setattr(mod, name, value.double())
    gm.recompile()
    return gm
