"""numpy kernels for the ML Program (MIL) ops our models produce, one small function per op.

Each kernel takes an `OpArgs` (the op's inputs by name, already decoded) and returns a tuple of outputs computed
in float32 (or the input's integer/bool type). The interpreter then casts every output to the dtype the program
declares for it, which is where fp16 rounding (and overflow to inf) happens. Semantics follow the op definitions of
coremltools' MIL (`coremltools/converters/mil/mil/ops/defs/iOS15..iOS18`), including their defaults: e.g. `inverse`
is `1 / (x + epsilon)` with epsilon 1e-4 and `rsqrt` is `1 / sqrt(x + epsilon)` with epsilon 1e-12 when the program
does not pass one.

Length: one job, the table of MIL op kernels (about 60 small functions); split by op kind it would only
scatter the registry the interpreter reads.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .fp16_cast import from_fp16, round_fp16, to_fp16

F32 = np.float32


class OpArgs:
    """The inputs of one op: `args["x"]`, `args.get("bias")`, plus its name and declared output dtypes."""

    def __init__(self, op_type: str, name: str, values: dict, out_dtypes: list[str]):
        self.op_type, self.name, self.values, self.out_dtypes = op_type, name, values, out_dtypes

    def __getitem__(self, key: str):
        if key not in self.values:
            raise KeyError(f"op {self.op_type} ({self.name}) has no input {key!r}")
        return self.values[key]

    def get(self, key: str, default=None):
        v = self.values.get(key)
        return default if v is None else v

    def scalar(self, key: str, default=None):
        v = self.get(key)
        return default if v is None else np.asarray(v).item()

    def ints(self, key: str, default=None) -> list[int] | None:
        v = self.get(key)
        return default if v is None else [int(i) for i in np.asarray(v).reshape(-1)]

    def bools(self, key: str, rank: int) -> list[bool]:
        v = self.get(key)
        return [False] * rank if v is None else [bool(b) for b in np.asarray(v).reshape(-1)]


OPS: dict[str, Callable[[OpArgs], tuple]] = {}


def op(*names: str):
    def deco(fn):
        for n in names:
            OPS[n] = fn
        return fn
    return deco


def _f(x) -> np.ndarray:
    """Float inputs are computed in float32 (fp16 values are exact in float32)."""
    return np.asarray(x, dtype=F32)


# ------------------------------------------------------------------------------------------------ elementwise

_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "real_div": np.divide, "maximum": np.maximum,
    "minimum": np.minimum, "pow": np.power, "floor_div": np.floor_divide, "mod": np.mod,
}
_COMPARE = {
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
}


def _binary(fn):
    def run(a: OpArgs):
        x, y = np.asarray(a["x"]), np.asarray(a["y"])
        if x.dtype.kind == "f" or y.dtype.kind == "f":
            x, y = _f(x), _f(y)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return (fn(x, y),)
    return run


for _n, _fn in {**_BINARY, **_COMPARE}.items():
    OPS[_n] = _binary(_fn)


def _unary(fn):
    def run(a: OpArgs):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return (fn(_f(a["x"]), a),)
    return run


# fp16 inputs take only 65536 values, so a costly element-wise function of an fp16-exact input is a table
# lookup: the table holds the same kernel's float32 results for every fp16 value, so the output is bit for bit
# the direct computation's (checked by the tests), at a fraction of the float64 arithmetic.
_FP16_ALL = None
_TABLES: dict = {}


def _tabulated(key, fn):
    """`fn(x, args)` through a per-(op, mode) table of all fp16 values when `x` is fp16-exact, else directly."""
    def run(x: np.ndarray, a: OpArgs) -> np.ndarray:
        global _FP16_ALL
        if x.dtype != F32 or x.size < 4096:  # small tensors: the direct computation is as quick
            return fn(x, a)
        x16 = to_fp16(x)
        if not np.array_equal(from_fp16(x16), x):
            return fn(x, a)  # not fp16-exact (an fp32 island, or NaN): compute it
        k = key(a)
        table = _TABLES.get(k)
        if table is None:
            if _FP16_ALL is None:
                _FP16_ALL = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(F32)
            table = _TABLES[k] = np.asarray(fn(_FP16_ALL, a), F32)
        return table.take(x16.view(np.uint16))
    return run


def _erf(x: np.ndarray) -> np.ndarray:
    """erf to ~1.2e-7 relative (Numerical Recipes' erfc, computed in float64): numpy has no erf."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = (-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0)


def _gelu(x: np.ndarray, a: OpArgs) -> np.ndarray:
    # float64 inside: the float32 formula loses the negative tail to cancellation in 1 + erf / 1 + tanh
    mode = a.scalar("mode", "EXACT")
    z = x.astype(np.float64)
    if mode == "EXACT":
        y = 0.5 * z * (1.0 + _erf(z / math.sqrt(2.0)))
    elif mode == "TANH_APPROXIMATION":
        y = 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z ** 3)))
    elif mode == "SIGMOID_APPROXIMATION":
        y = z / (1.0 + np.exp(-1.702 * z))
    else:
        raise ValueError(f"gelu mode {mode!r} is not a MIL gelu mode")
    return y.astype(F32)


_UNARY = {
    "relu": lambda x, a: np.maximum(x, F32(0)),
    "gelu": _tabulated(lambda a: ("gelu", a.scalar("mode", "EXACT")), _gelu),
    "sigmoid": lambda x, a: 1 / (1 + np.exp(-x)),
    "silu": lambda x, a: x / (1 + np.exp(-x)),
    "tanh": lambda x, a: np.tanh(x),
    "exp": lambda x, a: np.exp(x),
    "erf": _tabulated(lambda a: ("erf",), lambda x, a: _erf(x).astype(F32)),
    "abs": lambda x, a: np.abs(x),
    "square": lambda x, a: x * x,
    "sqrt": lambda x, a: np.sqrt(x),
    "rsqrt": lambda x, a: 1 / np.sqrt(x + F32(a.scalar("epsilon", 1e-12))),
    "inverse": lambda x, a: 1 / (x + F32(a.scalar("epsilon", 1e-4))),
    "log": lambda x, a: np.log(x + F32(a.scalar("epsilon", 1e-45))),
    "sign": lambda x, a: np.sign(x),
    "floor": lambda x, a: np.floor(x),
    "ceil": lambda x, a: np.ceil(x),
    "round": lambda x, a: np.round(x),
    "leaky_relu": lambda x, a: np.where(x >= 0, x, x * F32(a.scalar("alpha", 0.01))),
    "clip": lambda x, a: np.clip(x, F32(a.scalar("alpha")), F32(a.scalar("beta"))),
    "relu6": lambda x, a: np.clip(x, F32(0), F32(6)),
}
for _n, _fn in _UNARY.items():
    OPS[_n] = _unary(_fn)


@op("identity")
def _identity(a: OpArgs):
    return (np.asarray(a["x"]),)


@op("cast")
def _cast(a: OpArgs):
    # The declared output dtype does the conversion (fp16 rounding included); float->int truncates as MIL does.
    return (np.asarray(a["x"]),)


@op("select")
def _select(a: OpArgs):
    return (np.where(np.asarray(a["cond"]).astype(bool), a["a"], a["b"]),)


# ------------------------------------------------------------------------------------------------ reductions

def _axes(a: OpArgs, rank: int):
    ax = a.ints("axes")
    return None if ax is None else tuple(int(i) % rank for i in ax)


def _reduce(fn):
    def run(a: OpArgs):
        x = np.asarray(a["x"])
        x = _f(x) if x.dtype.kind == "f" else x
        keep = bool(a.scalar("keep_dims", False))
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return (np.asarray(fn(x, _axes(a, x.ndim), keep, a)),)
    return run


def _sum_square(x, ax, keep, a):
    s = np.sum(x * x, axis=ax, keepdims=keep)
    # The sum of squares is the op's own intermediate: in an fp16 op it lives in fp16 too (overflow included).
    return round_fp16(s) if a.out_dtypes[0] == "fp16" else s


_REDUCTIONS = {
    "reduce_sum": lambda x, ax, keep, a: np.sum(x, axis=ax, keepdims=keep),
    "reduce_mean": lambda x, ax, keep, a: np.mean(x, axis=ax, keepdims=keep),
    "reduce_max": lambda x, ax, keep, a: np.max(x, axis=ax, keepdims=keep),
    "reduce_min": lambda x, ax, keep, a: np.min(x, axis=ax, keepdims=keep),
    "reduce_prod": lambda x, ax, keep, a: np.prod(x, axis=ax, keepdims=keep),
    "reduce_l1_norm": lambda x, ax, keep, a: np.sum(np.abs(x), axis=ax, keepdims=keep),
    "reduce_sum_square": _sum_square,
    "reduce_l2_norm": lambda x, ax, keep, a: np.sqrt(_sum_square(x, ax, keep, a)),
    "reduce_log_sum_exp": lambda x, ax, keep, a: np.log(np.sum(np.exp(x), axis=ax, keepdims=keep)),
}
for _n, _fn in _REDUCTIONS.items():
    OPS[_n] = _reduce(_fn)


def _arg_reduce(fn):
    def run(a: OpArgs):
        x = np.asarray(a["x"])
        axis = int(a.scalar("axis", -1))
        out = fn(x, axis=axis)
        if bool(a.scalar("keep_dims", False)):
            out = np.expand_dims(out, axis)
        return (out.astype(np.int32),)
    return run


OPS["reduce_argmax"] = _arg_reduce(np.argmax)
OPS["reduce_argmin"] = _arg_reduce(np.argmin)


@op("softmax")
def _softmax(a: OpArgs):
    x = _f(a["x"])
    axis = int(a.scalar("axis", -1))
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return (e / np.sum(e, axis=axis, keepdims=True),)


# ------------------------------------------------------------------------------------------------ normalization

@op("layer_norm")
def _layer_norm(a: OpArgs):
    x = _f(a["x"])
    ax = _axes(a, x.ndim) or tuple(range(x.ndim))
    mu = np.mean(x, axis=ax, keepdims=True)
    var = np.mean((x - mu) ** 2, axis=ax, keepdims=True)
    y = (x - mu) / np.sqrt(var + F32(a.scalar("epsilon", 1e-5)))
    # gamma/beta have the shape of the normalized (trailing) axes, so they broadcast from the right.
    if a.get("gamma") is not None:
        y = y * _f(a["gamma"])
    if a.get("beta") is not None:
        y = y + _f(a["beta"])
    return (y,)


def _channel(v, rank: int) -> np.ndarray:
    return _f(v).reshape((1, -1) + (1,) * (rank - 2))


def _channel_affine(y: np.ndarray, a: "OpArgs") -> np.ndarray:
    """The optional per-channel (axis 1) `gamma` / `beta` of batch_norm and instance_norm."""
    if a.get("gamma") is not None:
        y = y * _channel(a["gamma"], y.ndim)
    if a.get("beta") is not None:
        y = y + _channel(a["beta"], y.ndim)
    return y


@op("batch_norm")
def _batch_norm(a: OpArgs):
    x = _f(a["x"])
    y = (x - _channel(a["mean"], x.ndim)) / np.sqrt(_channel(a["variance"], x.ndim) + F32(a.scalar("epsilon", 1e-5)))
    return (_channel_affine(y, a),)


@op("instance_norm")
def _instance_norm(a: OpArgs):
    x = _f(a["x"])
    ax = tuple(range(2, x.ndim))
    mu = np.mean(x, axis=ax, keepdims=True)
    y = (x - mu) / np.sqrt(np.var(x, axis=ax, keepdims=True) + F32(a.scalar("epsilon", 1e-5)))
    return (_channel_affine(y, a),)


@op("l2_norm")
def _l2_norm(a: OpArgs):
    x = _f(a["x"])
    ax = _axes(a, x.ndim) or tuple(range(max(x.ndim - 3, 0), x.ndim))
    s = np.sum(x * x, axis=ax, keepdims=True)
    if a.out_dtypes[0] == "fp16":
        s = round_fp16(s)
    return (x / np.sqrt(np.maximum(s, F32(a.scalar("epsilon", 1e-6)))),)


# ------------------------------------------------------------------------------------------------ linear algebra

@op("linear")
def _linear(a: OpArgs):
    x, w = _f(a["x"]), _f(a["weight"])
    # one 2-D GEMM: numpy's batched matmul does not reach BLAS for (b, n, k) @ (k, m) views
    y = (x.reshape(-1, x.shape[-1]) @ w.T).reshape(x.shape[:-1] + (w.shape[0],))
    if a.get("bias") is not None:
        y = y + _f(a["bias"])
    return (y,)


@op("matmul")
def _matmul(a: OpArgs):
    x, y = _f(a["x"]), _f(a["y"])
    if bool(a.scalar("transpose_x", False)):
        x = np.swapaxes(x, -1, -2)
    if bool(a.scalar("transpose_y", False)):
        y = np.swapaxes(y, -1, -2)
    return (np.matmul(x, y),)


@op("einsum")
def _einsum(a: OpArgs):
    vals = a["values"]
    return (np.einsum(str(a.scalar("equation")), *[_f(v) for v in vals]),)


# ------------------------------------------------------------------------------------------------ convolution, pooling

def _pads(a: OpArgs, spatial: tuple, kernel: tuple, strides: tuple, dilations: tuple) -> list[tuple[int, int]]:
    pad_type = str(a.scalar("pad_type", "valid")).lower()
    n = len(spatial)
    if pad_type == "valid":
        return [(0, 0)] * n
    if pad_type == "custom":
        p = a.ints("pad", [0] * (2 * n))
        return [(p[2 * i], p[2 * i + 1]) for i in range(n)]
    if pad_type in ("same", "same_lower"):
        out = []
        for size, k, s, d in zip(spatial, kernel, strides, dilations):
            total = max((math.ceil(size / s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            out.append((big, small) if pad_type == "same_lower" else (small, big))
        return out
    raise ValueError(f"pad_type {pad_type!r} is not a MIL pad type")


def _windows(xp: np.ndarray, kernel: tuple, strides: tuple, dilations: tuple, out_hw: tuple):
    """Yield (ki, kj, view) for every kernel tap: the strided input view that tap multiplies (2-D)."""
    (kh, kw), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilations, out_hw
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[..., i * dh: i * dh + sh * (oh - 1) + 1: sh, j * dw: j * dw + sw * (ow - 1) + 1: sw]


@op("conv")
def _conv(a: OpArgs):
    x, w = _f(a["x"]), _f(a["weight"])
    if x.ndim != 4:
        raise ValueError(f"conv on rank-{x.ndim} input: only 2-D convolutions are implemented")
    n, cin, h, wd = x.shape
    cout, cpg, kh, kw = w.shape
    groups = int(a.scalar("groups", 1))
    strides = tuple(a.ints("strides", [1, 1]))
    dil = tuple(a.ints("dilations", [1, 1]))
    (pt, pb), (pl, pr) = _pads(a, (h, wd), (kh, kw), strides, dil)
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if (pt or pb or pl or pr) else x
    oh = (h + pt + pb - dil[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (wd + pl + pr - dil[1] * (kw - 1) - 1) // strides[1] + 1
    if groups == cin and cpg == 1:  # depthwise (channel multiplier cout // cin): one multiply-add per tap
        mult = cout // cin
        src = np.repeat(xp, mult, axis=1) if mult > 1 else xp
        y = np.zeros((n, cout, oh, ow), F32)
        for i, j, view in _windows(src, (kh, kw), strides, dil, (oh, ow)):
            y += view * w[:, 0, i, j].reshape(1, cout, 1, 1)
    else:
        g_out = cout // groups
        ys = []
        for g in range(groups):
            xg = xp[:, g * cpg:(g + 1) * cpg]
            wg = w[g * g_out:(g + 1) * g_out]
            if (kh, kw) == (1, 1) and strides == (1, 1):
                cols = xg.reshape(n, cpg, h * wd)  # a 1x1 conv is one GEMM per image on the NCHW layout as is
            else:
                # im2col in (c, kh, kw) x (oh, ow) order: W (o, c*kh*kw) @ cols lands in NCHW, no transposes
                cols = np.stack([v for _, _, v in _windows(xg, (kh, kw), strides, dil, (oh, ow))], axis=2)
                cols = cols.reshape(n, cpg * kh * kw, oh * ow)
            ys.append(np.matmul(wg.reshape(g_out, cpg * kh * kw), cols).reshape(n, g_out, oh, ow))
        y = np.concatenate(ys, axis=1) if groups > 1 else ys[0]
    if a.get("bias") is not None:
        y += _f(a["bias"]).reshape(1, cout, 1, 1)  # y is this kernel's own fresh array
    return (np.ascontiguousarray(y, dtype=F32),)


@op("conv_transpose")
def _conv_transpose(a: OpArgs):
    """2-D transposed convolution, ungrouped (weight (C_in, C_out, kh, kw)): each kernel tap scatters its products
    stride apart into the full output, which `pad` (custom) then crops; `output_shape`, when given, must agree."""
    x, w = _f(a["x"]), _f(a["weight"])
    if x.ndim != 4 or int(a.scalar("groups", 1)) != 1:
        raise ValueError("conv_transpose: only 2-D ungrouped transposed convolutions are implemented")
    n, _, h, wd = x.shape
    _, cout, kh, kw = w.shape
    (sh, sw), (dh, dw) = a.ints("strides", [1, 1]), a.ints("dilations", [1, 1])
    y = np.zeros((n, cout, (h - 1) * sh + (kh - 1) * dh + 1, (wd - 1) * sw + (kw - 1) * dw + 1), F32)
    for i in range(kh):
        for j in range(kw):
            y[:, :, i * dh: i * dh + sh * (h - 1) + 1: sh, j * dw: j * dw + sw * (wd - 1) + 1: sw] += np.einsum(
                "nchw,co->nohw", x, w[:, :, i, j])
    pad_type = str(a.scalar("pad_type", "valid")).lower()
    if pad_type == "custom":
        pt, pb, pl, pr = a.ints("pad", [0, 0, 0, 0])
        y = y[:, :, pt: y.shape[2] - pb, pl: y.shape[3] - pr]
    elif pad_type != "valid":
        raise ValueError(f"conv_transpose with pad_type {pad_type!r} is not implemented (valid, custom)")
    want = a.ints("output_shape")
    if want is not None and tuple(want[2:]) != y.shape[2:]:
        raise ValueError(f"conv_transpose: output_shape {want} differs from the computed {list(y.shape)}")
    if a.get("bias") is not None:
        y += _f(a["bias"]).reshape(1, cout, 1, 1)
    return (np.ascontiguousarray(y, dtype=F32),)


def _pool(kind: str):
    def run(a: OpArgs):
        x = _f(a["x"])
        if x.ndim != 4:
            raise ValueError(f"{kind} on rank-{x.ndim} input: only 2-D pooling is implemented")
        if bool(a.scalar("ceil_mode", False)):
            raise ValueError(f"{kind} with ceil_mode=True is not implemented")
        k = tuple(a.ints("kernel_sizes"))
        s = tuple(a.ints("strides", [1, 1]))
        (pt, pb), (pl, pr) = _pads(a, x.shape[2:], k, s, (1, 1))
        h, w = x.shape[2:]
        oh, ow = (h + pt + pb - k[0]) // s[0] + 1, (w + pl + pr - k[1]) // s[1] + 1
        fill = -np.inf if kind == "max_pool" else 0.0
        xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
        taps = [v for _, _, v in _windows(xp, k, s, (1, 1), (oh, ow))]
        if kind == "max_pool":
            return (np.max(np.stack(taps), axis=0),)
        total = np.sum(np.stack(taps), axis=0)
        if bool(a.scalar("exclude_padding_from_average", False)):
            ones = np.pad(np.ones((1, 1, h, w), F32), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
            count = np.sum(np.stack([v for _, _, v in _windows(ones, k, s, (1, 1), (oh, ow))]), axis=0)
            return (total / count,)
        return (total / F32(k[0] * k[1]),)
    return run


OPS["avg_pool"] = _pool("avg_pool")
OPS["max_pool"] = _pool("max_pool")


# ------------------------------------------------------------------------------------------------ shapes and indexing

@op("reshape")
def _reshape(a: OpArgs):
    x = np.asarray(a["x"])
    shape = a.ints("shape")
    shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]  # iOS17: 0 copies the input dim
    return (x.reshape(shape),)


@op("transpose")
def _transpose(a: OpArgs):
    return (np.transpose(np.asarray(a["x"]), a.ints("perm")),)


@op("squeeze")
def _squeeze(a: OpArgs):
    x = np.asarray(a["x"])
    ax = a.ints("axes")
    return (np.squeeze(x, axis=None if ax is None else tuple(ax)),)


@op("expand_dims")
def _expand_dims(a: OpArgs):
    x = np.asarray(a["x"])
    rank = x.ndim + len(a.ints("axes"))
    for ax in sorted(i % rank for i in a.ints("axes")):
        x = np.expand_dims(x, ax)
    return (x,)


@op("concat")
def _concat(a: OpArgs):
    vals = [np.asarray(v) for v in a["values"]]
    axis = int(a.scalar("axis"))
    if bool(a.scalar("interleave", False)):
        stacked = np.stack(vals, axis=axis + 1 if axis >= 0 else axis)
        shape = list(vals[0].shape)
        shape[axis] *= len(vals)
        return (stacked.reshape(shape),)
    return (np.concatenate(vals, axis=axis),)


@op("stack")
def _stack(a: OpArgs):
    return (np.stack([np.asarray(v) for v in a["values"]], axis=int(a.scalar("axis"))),)


@op("split")
def _split(a: OpArgs):
    x = np.asarray(a["x"])
    axis = int(a.scalar("axis"))
    sizes = a.ints("split_sizes")
    if sizes is None:
        n = int(a.scalar("num_splits"))
        sizes = [x.shape[axis] // n] * n
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


@op("slice_by_index")
def _slice_by_index(a: OpArgs):
    x = np.asarray(a["x"])
    r = x.ndim
    begin, end = a.ints("begin"), a.ints("end")
    stride = a.ints("stride", [1] * r)
    bm, em, sm = a.bools("begin_mask", r), a.bools("end_mask", r), a.bools("squeeze_mask", r)
    idx = []
    for i in range(r):
        if sm[i]:
            idx.append(begin[i])
        else:
            idx.append(slice(None if bm[i] else begin[i], None if em[i] else end[i], stride[i]))
    return (x[tuple(idx)],)


@op("slice_by_size")
def _slice_by_size(a: OpArgs):
    x = np.asarray(a["x"])
    begin, size = a.ints("begin"), a.ints("size")
    return (x[tuple(slice(b, x.shape[i] if s == -1 else b + s) for i, (b, s) in enumerate(zip(begin, size)))],)


@op("gather")
def _gather(a: OpArgs):
    x, idx = np.asarray(a["x"]), np.asarray(a["indices"]).astype(np.int64)
    axis = int(a.scalar("axis", 0)) % x.ndim
    if int(a.scalar("batch_dims", 0)) != 0:
        raise ValueError("gather with batch_dims != 0 is not implemented")
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return (np.take(x, idx, axis=axis),)


@op("gather_along_axis")
def _gather_along_axis(a: OpArgs):
    x, idx = np.asarray(a["x"]), np.asarray(a["indices"]).astype(np.int64)
    axis = int(a.scalar("axis", 0)) % x.ndim
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return (np.take_along_axis(x, idx, axis=axis),)


@op("tile")
def _tile(a: OpArgs):
    return (np.tile(np.asarray(a["x"]), a.ints("reps")),)


@op("pad")
def _pad(a: OpArgs):
    x = np.asarray(a["x"])
    p = a.ints("pad")
    k = len(p) // 2
    widths = [(0, 0)] * (x.ndim - k) + [(p[2 * i], p[2 * i + 1]) for i in range(k)]
    mode = str(a.scalar("mode", "constant"))
    if mode == "constant":
        return (np.pad(x, widths, constant_values=a.scalar("constant_val", 0.0)),)
    return (np.pad(x, widths, mode={"reflect": "reflect", "replicate": "edge"}[mode]),)


@op("fill")
def _fill(a: OpArgs):
    return (np.full(a.ints("shape"), a.scalar("value", 0.0), dtype=F32),)


@op("shape")
def _shape(a: OpArgs):
    return (np.asarray(np.asarray(a["x"]).shape, dtype=np.int32),)


@op("classify")
def _classify(a: OpArgs):
    p = _f(a["probabilities"]).reshape(-1)
    classes = list(a["classes"])
    return classes[int(np.argmax(p))], {c: float(v) for c, v in zip(classes, p)}
