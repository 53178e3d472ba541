"""numpy kernels for the ops `coremltools.optimize.coreml` puts into compressed ML Programs.

Registered in the interpreter's op table through `mil_ops.op` (mil_interpreter.py imports this module). Which op
appears where (measured by compressing the trained reference models, docs/quantization_spike.md):

| compression | iOS 16 / 17 | iOS 18 |
|---|---|---|
| w8 (8-bit linear weights) | `constexpr_affine_dequantize` | `constexpr_blockwise_shift_scale` |
| palette4/6 (k-means LUT) | `constexpr_lut_to_dense` (packed indices, one LUT) | `constexpr_lut_to_dense` (uintN indices, grouped LUTs) |
| w8a8 activations (iOS 17+) | `quantize` / `dequantize` | same |

Semantics follow the op definitions in coremltools (`mil/ops/defs/iOS16/constexpr_ops.py`, `iOS17/quantization_ops.py`,
`iOS18/compression.py`) and are implemented here independently of coremltools' own numpy helpers, against which
tests/test_mil_compressed.py checks them. Every kernel computes in float32 (the interpreter's convention); the
interpreter rounds each output to its declared dtype (fp16 weights come out fp16-exact, `quantize` outputs int8 /
uint8). iOS 16 constexpr ops carry their constant parameters as op attributes, which the loader passes as inputs.
"""
from __future__ import annotations

import numpy as np

from .mil_ops import F32, OpArgs, op


def _along(param, rank: int, axis: int | None) -> np.ndarray:
    """A scalar or a per-`axis` vector, shaped to broadcast against a rank-`rank` tensor."""
    p = np.asarray(param, F32)
    if p.ndim == 0 or p.ndim == rank:
        return p
    if axis is None:
        raise ValueError(f"a vector parameter of shape {p.shape} needs an axis")
    shape = [1] * rank
    shape[int(axis) % rank] = p.size
    return p.reshape(shape)


def _axis(a: OpArgs) -> int | None:
    v = a.get("axis")
    return None if v is None else int(np.asarray(v).item())


@op("constexpr_affine_dequantize")
def _affine_dequantize(a: OpArgs):
    """iOS 16: `scale * (quantized_data - zero_point)`, scale/zero_point scalars or vectors along `axis`."""
    q = np.asarray(a["quantized_data"]).astype(F32)
    axis = _axis(a)
    return (_along(a["scale"], q.ndim, axis) * (q - _along(a["zero_point"], q.ndim, axis)),)


def unpack_bits(packed: np.ndarray, nbits: int, count: int) -> np.ndarray:
    """`count` unsigned `nbits`-bit integers packed LSB-first, byte by byte (an element may straddle bytes)."""
    bits = np.unpackbits(np.asarray(packed, np.uint8).reshape(-1), bitorder="little")
    if bits.size < count * nbits:
        raise ValueError(f"{np.asarray(packed).size} packed bytes hold fewer than {count} {nbits}-bit indices")
    weights = (1 << np.arange(nbits)).astype(np.int64)
    return bits[:count * nbits].reshape(count, nbits).astype(np.int64) @ weights


def _block_index(data_shape: tuple, group_shape: tuple) -> np.ndarray:
    """Per element of a `data_shape` tensor, the flat index of its block in a `group_shape` grid (each data
    dimension split into group_shape[m] equal blocks)."""
    gid = np.zeros((1,) * len(data_shape), np.int64)
    stride = 1
    for m in range(len(data_shape) - 1, -1, -1):
        n, g = int(data_shape[m]), int(group_shape[m])
        if g <= 0 or n % g:
            raise ValueError(f"dimension {m}: size {n} is not a multiple of {g} groups")
        coord = (np.arange(n) // (n // g)).reshape([-1 if k == m else 1 for k in range(len(data_shape))])
        gid = gid + coord * stride
        stride *= g
    return np.broadcast_to(gid, tuple(int(s) for s in data_shape))


@op("constexpr_lut_to_dense")
def _lut_to_dense(a: OpArgs):
    lut = np.asarray(a["lut"], F32)
    if a.get("shape") is not None:
        # iOS 16: one LUT of 2^nbits entries; indices bit-packed into a uint8 vector.
        shape = tuple(int(s) for s in np.asarray(a["shape"]).reshape(-1))
        nbits = int(round(np.log2(lut.size)))
        if 2 ** nbits != lut.size:
            raise ValueError(f"LUT of {lut.size} entries is not a power of two")
        idx = unpack_bits(a["indices"], nbits, int(np.prod(shape)))
        return (lut.reshape(-1)[idx].reshape(shape),)
    # iOS 18: indices of the (pre-vector) output shape; lut [groups per axis..., palette, vector_size].
    idx = np.asarray(a["indices"]).astype(np.int64)
    rank = idx.ndim
    palette, vsize = lut.shape[-2], lut.shape[-1]
    gid = _block_index(idx.shape, lut.shape[:rank])
    out = lut.reshape(-1, palette, vsize)[gid, idx]          # (*idx.shape, vsize)
    if vsize == 1:
        return (out[..., 0],)
    axis = int(np.asarray(a["vector_axis"]).item()) % rank
    out = np.moveaxis(out, -1, axis + 1)                     # the vector elements follow their index's axis
    shape = list(idx.shape)
    shape[axis] *= vsize
    return (out.reshape(shape),)


@op("constexpr_blockwise_shift_scale")
def _blockwise_shift_scale(a: OpArgs):
    """iOS 18: `scale * (data - offset)` with scale/offset constant over blocks (data.shape / scale.shape)."""
    data = np.asarray(a["data"]).astype(F32)
    scale = np.asarray(a["scale"], F32)
    if scale.ndim != data.ndim:
        raise ValueError(f"scale rank {scale.ndim} differs from data rank {data.ndim}")
    # View data as (s0, b0, s1, b1, ...) so a (s0, 1, s1, 1, ...) scale broadcasts over each block.
    split = []
    for n, s in zip(data.shape, scale.shape):
        if s <= 0 or n % s:
            raise ValueError(f"data shape {data.shape} is not a whole number of {scale.shape} blocks")
        split += [s, n // s]
    blocks = data.reshape(split)
    per_block = [d for s in scale.shape for d in (s, 1)]
    offset = a.get("offset")
    if offset is not None:
        blocks = blocks - np.asarray(offset).astype(F32).reshape(per_block)
    return ((blocks * scale.reshape(per_block)).reshape(data.shape),)


_INT_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


@op("quantize")
def _quantize(a: OpArgs):
    """iOS 17: `clip(round(x / scale) + zero_point)` to int8/uint8, rounding half to even (numpy's around)."""
    x = np.asarray(a["input"], F32)
    dtype = str(np.asarray(a["output_dtype"]).item())
    if dtype not in _INT_RANGE:
        raise ValueError(f"quantize output_dtype must be int8 or uint8; got {dtype!r}")
    axis = _axis(a)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        q = np.around(x / _along(a["scale"], x.ndim, axis))
    zp = a.get("zero_point")
    if zp is not None:
        q = q + _along(zp, x.ndim, axis)
    lo, hi = _INT_RANGE[dtype]
    return (np.clip(q, lo, hi).astype(np.int8 if dtype == "int8" else np.uint8),)


@op("dequantize")
def _dequantize(a: OpArgs):
    """iOS 17: `(input - zero_point) * scale`."""
    q = np.asarray(a["input"]).astype(F32)
    axis = _axis(a)
    zp = a.get("zero_point")
    if zp is not None:
        q = q - _along(zp, q.ndim, axis)
    return (q * _along(a["scale"], q.ndim, axis),)
