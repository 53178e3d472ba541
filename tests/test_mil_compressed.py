"""The MIL interpreter's kernels for compressed programs, each against coremltools' own numpy semantics (the op
classes' `decompress` / value inference helpers) and against a hand computation."""
from __future__ import annotations

import numpy as np
import pytest

from vitedge.targets.coreml.coremltools_import import quiet_coremltools
from vitedge.targets.coreml.mil_ops import OPS, OpArgs
from vitedge.targets.coreml.mil_ops_compressed import unpack_bits

with quiet_coremltools():
    from coremltools.converters.mil.mil.ops.defs.iOS16 import constexpr_ops as ios16
    from coremltools.converters.mil.mil.ops.defs.iOS18 import compression as ios18
    from coremltools.optimize import _utils as ct_utils

RNG = np.random.default_rng(0)


def run(op: str, out_dtype: str = "fp32", **inputs):
    (out,) = OPS[op](OpArgs(op, "test", inputs, [out_dtype]))
    return out


@pytest.mark.parametrize("nbits", [1, 2, 3, 4, 6, 8])
def test_unpack_bits_matches_coremltools(nbits):
    values = RNG.integers(0, 2 ** nbits, size=37).astype(np.uint8)  # 37: elements straddle bytes
    packed = ct_utils.pack_elements_into_bits(values, nbits)
    np.testing.assert_array_equal(unpack_bits(packed, nbits, 37), values)
    np.testing.assert_array_equal(unpack_bits(packed, nbits, 37),
                                  ct_utils.restore_elements_from_packed_bits(packed, nbits, 37))


def test_unpack_bits_by_hand():
    # The op doc's example: n_bits = 2, shape (5,): byte 0 = i3 i2 i1 i0 (MSB..LSB) = 01 10 11 00, byte 1 = .. 11
    packed = np.array([0b01101100, 0b00000011], np.uint8)
    np.testing.assert_array_equal(unpack_bits(packed, 2, 5), [0, 3, 2, 1, 3])


def test_ios16_lut_to_dense_matches_coremltools():
    shape = np.array([6, 4, 3, 3], np.uint32)
    lut = RNG.standard_normal(16).astype(np.float16)
    idx = RNG.integers(0, 16, size=int(np.prod(shape))).astype(np.uint8)
    packed = ct_utils.pack_elements_into_bits(idx, 4)
    out = run("constexpr_lut_to_dense", "fp16", indices=packed, lut=lut.astype(np.float32), shape=shape)
    np.testing.assert_array_equal(out, ios16.constexpr_lut_to_dense.decompress(lut, packed, shape).astype(np.float32))
    np.testing.assert_array_equal(out.reshape(-1), lut.astype(np.float32)[idx])  # by hand: entry idx[i] of the LUT


def test_ios18_lut_to_dense_grouped_matches_coremltools():
    # 8 output channels, 2 groups of 4 channels, 4-bit (16-entry) LUTs
    idx = RNG.integers(0, 16, size=(8, 3, 2, 2)).astype(np.uint8)
    lut = RNG.standard_normal((2, 1, 1, 1, 16, 1)).astype(np.float32)
    out = run("constexpr_lut_to_dense", indices=idx, lut=lut)
    np.testing.assert_array_equal(out, ios18.constexpr_lut_to_dense.decompress(idx, lut, None))
    assert out[5, 1, 0, 1] == lut[1, 0, 0, 0, idx[5, 1, 0, 1], 0]  # channel 5 is in the second group


def test_ios18_lut_to_dense_by_hand_and_vector():
    # The op doc's Case 1: indices [6, 2] with 2-bit LUTs per 3 rows
    idx = np.array([2, 3, 3, 0, 1, 0, 3, 0, 2, 1, 0, 3], np.uint8).reshape(6, 2)
    lut = np.array([1, 5, 9, 13, 2, 10, 18, 26], np.float32).reshape(2, 1, 4, 1)
    expected = [[9, 13], [13, 1], [5, 1], [26, 2], [18, 10], [2, 26]]
    np.testing.assert_array_equal(run("constexpr_lut_to_dense", indices=idx, lut=lut), expected)
    # vector palettization: 3-element centroids laid along axis 1
    vidx = RNG.integers(0, 4, size=(2, 2, 2)).astype(np.uint8)
    vlut = RNG.standard_normal((1, 1, 1, 4, 3)).astype(np.float32)
    for axis in (1, 2):
        out = run("constexpr_lut_to_dense", indices=vidx, lut=vlut, vector_axis=np.int32(axis))
        np.testing.assert_array_equal(out, ios18.constexpr_lut_to_dense.decompress(vidx, vlut, np.int32(axis)))


@pytest.mark.parametrize("dtype,offset", [(np.int8, False), (np.uint8, True), (np.int8, True)])
def test_blockwise_shift_scale_matches_coremltools(dtype, offset):
    info = np.iinfo(dtype)
    data = RNG.integers(info.min, info.max + 1, size=(8, 6, 3, 3)).astype(dtype)
    scale = RNG.uniform(0.01, 0.1, size=(4, 2, 1, 1)).astype(np.float32)  # blocks of 2 x 3 x 3 x 3
    off = RNG.integers(info.min, info.max + 1, size=scale.shape).astype(dtype) if offset else None
    out = run("constexpr_blockwise_shift_scale", data=data, scale=scale, offset=off)
    ref = ios18.constexpr_blockwise_shift_scale.decompress(data, scale, off)
    np.testing.assert_allclose(out, ref, rtol=1e-6)
    # by hand: element (5, 4, 2, 1) sits in block (2, 1)
    o = 0.0 if off is None else float(off[2, 1, 0, 0])
    assert out[5, 4, 2, 1] == pytest.approx(float(scale[2, 1, 0, 0]) * (float(data[5, 4, 2, 1]) - o), rel=1e-6)


@pytest.mark.parametrize("axis", [0, 1])
def test_affine_dequantize_matches_coremltools(axis):
    q = RNG.integers(-128, 128, size=(6, 5, 3)).astype(np.int8)
    n = q.shape[axis]
    scale = RNG.uniform(0.01, 0.2, size=n).astype(np.float32)
    zp = RNG.integers(-5, 5, size=n).astype(np.int8)
    out = run("constexpr_affine_dequantize", quantized_data=q, zero_point=zp, scale=scale, axis=np.int32(axis))
    np.testing.assert_allclose(out, ios16.constexpr_affine_dequantize.decompress(q, zp, scale, axis), rtol=1e-6)
    # scalar scale and zero point, by hand
    out = run("constexpr_affine_dequantize", quantized_data=q, zero_point=np.uint8(0).astype(np.int8),
              scale=np.float32(0.5), axis=np.int32(0))
    np.testing.assert_array_equal(out, q.astype(np.float32) * 0.5)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_and_dequantize_match_coremltools(dtype):
    x = RNG.standard_normal((2, 4, 5, 5)).astype(np.float32) * 3
    scale = np.float32(0.03)
    zp = np.array(0 if dtype == "int8" else 128, dtype=dtype)
    q = run("quantize", dtype, input=x, scale=scale, zero_point=zp, output_dtype=np.str_(dtype))
    ref = ct_utils.quantize_by_scale_and_zp(x, np.array(scale), zp, dtype)
    np.testing.assert_array_equal(q, ref)
    assert (q == np.iinfo(dtype).max).any() and (q == np.iinfo(dtype).min).any()  # x reaches past both ends: clipped
    dq = run("dequantize", input=q, scale=scale, zero_point=zp)
    np.testing.assert_allclose(dq, ct_utils.dequantize_by_scale_and_zp(q, np.array(scale), zp), rtol=1e-6)
    # per-channel along axis 1
    vscale = RNG.uniform(0.01, 0.05, size=4).astype(np.float32)
    qv = run("quantize", dtype, input=x, scale=vscale, zero_point=np.full(4, zp, dtype), axis=np.int32(1),
             output_dtype=np.str_(dtype))
    np.testing.assert_array_equal(qv, ct_utils.quantize_by_scale_and_zp(
        x, vscale.reshape(1, 4, 1, 1), np.full((1, 4, 1, 1), zp, dtype), dtype))


def test_quantize_rounds_half_to_even_by_hand():
    x = np.array([0.25, 0.75, -0.25, 1.25, 100.0], np.float32)  # / 0.5 = 0.5, 1.5, -0.5, 2.5, 200
    q = run("quantize", "int8", input=x, scale=np.float32(0.5), output_dtype=np.str_("int8"))
    np.testing.assert_array_equal(q, [0, 2, 0, 2, 127])
