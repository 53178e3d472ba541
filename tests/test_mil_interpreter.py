"""The numpy MIL interpreter, op by op against PyTorch/numpy references, and its fp16 semantics.

Two layers: the kernels (mil_ops.OPS) called directly against PyTorch, and programs written with coremltools'
MIL builder, saved as .mlpackage and read back through the interpreter's loader (proto + weight.bin), fp16 ops
included.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitedge.targets.coreml.mil_interpreter import (MILProgramError, UnsupportedOpError, as_declared, load_program,
                                             quiet_coremltools, round_fp16)
from vitedge.targets.coreml.mil_ops import OPS, OpArgs

with quiet_coremltools():
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

RNG = np.random.default_rng(0)


def run_op(op_type: str, out_dtypes=("fp32",), **inputs):
    return OPS[op_type](OpArgs(op_type, "t", inputs, list(out_dtypes)))


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)


def t(x):
    return torch.from_numpy(np.asarray(x, np.float32))


# -------------------------------------------------------------------------------------------- kernels vs PyTorch

@pytest.mark.parametrize("groups,stride,pad,dil", [(1, 1, 1, 1), (1, 2, 1, 1), (3, 1, 2, 2), (6, 2, 2, 1), (2, 1, 0, 1)])
def test_conv_matches_torch(groups, stride, pad, dil):
    x = RNG.standard_normal((2, 6, 11, 9)).astype(np.float32)
    w = RNG.standard_normal((12, 6 // groups, 3, 5)).astype(np.float32)
    b = RNG.standard_normal(12).astype(np.float32)
    ref = F.conv2d(t(x), t(w), t(b), stride=stride, padding=(pad, pad + 1), dilation=dil, groups=groups).numpy()
    (y,) = run_op("conv", x=x, weight=w, bias=b, strides=np.array([stride, stride]), pad_type="custom",
                  pad=np.array([pad, pad, pad + 1, pad + 1]), dilations=np.array([dil, dil]), groups=groups)
    close(y, ref, rtol=1e-4, atol=1e-4)


def test_conv_same_padding_and_1x1():
    x = RNG.standard_normal((1, 4, 7, 8)).astype(np.float32)
    w = RNG.standard_normal((5, 4, 3, 3)).astype(np.float32)
    (y,) = run_op("conv", x=x, weight=w, pad_type="same", strides=np.array([1, 1]))
    close(y, F.conv2d(t(x), t(w), padding=1).numpy(), rtol=1e-4, atol=1e-4)
    w1 = RNG.standard_normal((5, 4, 1, 1)).astype(np.float32)
    (y,) = run_op("conv", x=x, weight=w1, pad_type="valid")
    close(y, F.conv2d(t(x), t(w1)).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride,pad,dil", [(2, 0, 1), (2, 1, 1), (1, 1, 2), (3, 0, 1)])
def test_conv_transpose_matches_torch(stride, pad, dil):
    x = RNG.standard_normal((2, 6, 5, 7)).astype(np.float32)
    w = RNG.standard_normal((6, 4, 2, 3)).astype(np.float32)  # (C_in, C_out, kh, kw)
    b = RNG.standard_normal(4).astype(np.float32)
    ref = F.conv_transpose2d(t(x), t(w), t(b), stride=stride, padding=pad, dilation=dil).numpy()
    (y,) = run_op("conv_transpose", x=x, weight=w, bias=b, strides=np.array([stride, stride]), pad_type="custom",
                  pad=np.array([pad] * 4), dilations=np.array([dil, dil]))
    close(y, ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="output_shape"):
        run_op("conv_transpose", x=x, weight=w, output_shape=np.array([2, 4, 99, 99]))


def test_linear_matmul_softmax_layer_norm():
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    w, b = RNG.standard_normal((3, 8)).astype(np.float32), RNG.standard_normal(3).astype(np.float32)
    close(run_op("linear", x=x, weight=w, bias=b)[0], F.linear(t(x), t(w), t(b)).numpy(), rtol=1e-5, atol=1e-5)
    y = RNG.standard_normal((2, 8, 5)).astype(np.float32)
    close(run_op("matmul", x=x, y=y, transpose_x=False, transpose_y=False)[0], (t(x) @ t(y)).numpy(), atol=1e-5)
    close(run_op("matmul", x=x, y=x, transpose_x=False, transpose_y=True)[0], (t(x) @ t(x).transpose(1, 2)).numpy(),
          atol=1e-5)
    close(run_op("softmax", x=x, axis=1)[0], torch.softmax(t(x), 1).numpy())
    g, be = RNG.standard_normal(8).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    ref = F.layer_norm(t(x), (8,), t(g), t(be), 1e-6).numpy()
    close(run_op("layer_norm", x=x, axes=np.array([-1]), gamma=g, beta=be, epsilon=np.float32(1e-6))[0], ref,
          rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,approx", [("EXACT", "none"), ("TANH_APPROXIMATION", "tanh")])
def test_gelu_matches_torch(mode, approx):
    x = np.linspace(-8, 8, 1001, dtype=np.float32)
    # float64 reference: float32 GELU loses the tail to cancellation in 1 + erf(x) for x < -3
    ref = F.gelu(torch.from_numpy(x.astype(np.float64)), approximate=approx).numpy()
    close(run_op("gelu", x=x, mode=mode)[0], ref, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("op_type,mode", [("gelu", "EXACT"), ("gelu", "TANH_APPROXIMATION"),
                                          ("gelu", "SIGMOID_APPROXIMATION"), ("erf", None)])
def test_fp16_lookup_tables_are_bit_identical_to_the_direct_kernels(op_type, mode):
    """gelu/erf of an fp16-exact tensor come from a table over all 65536 fp16 values: every result must be the
    direct float64 kernel's, bit for bit; a tensor that is not fp16-exact is computed directly."""
    from vitedge.targets.coreml import mil_ops

    def direct(x):
        a = OpArgs(op_type, "t", {"x": x, "mode": mode}, ["fp16"])
        with np.errstate(all="ignore"):
            return mil_ops._gelu(x, a) if op_type == "gelu" else mil_ops._erf(x).astype(np.float32)

    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    x = RNG.permutation(every).reshape(16, 64, 64)  # every fp16 value (inf, subnormals, NaN included), shuffled
    kw = {"mode": mode} if mode else {}
    got, want = run_op(op_type, ("fp16",), x=x, **kw)[0], direct(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))

    off_grid = (RNG.standard_normal((8, 1024)) * 3).astype(np.float32)  # not fp16-exact: the direct path
    np.testing.assert_array_equal(run_op(op_type, ("fp32",), x=off_grid, **kw)[0].view(np.uint32),
                                  direct(off_grid).view(np.uint32))


def test_unary_defaults_follow_mil():
    x = np.abs(RNG.standard_normal(50)).astype(np.float32) + 0.1
    close(run_op("rsqrt", x=x)[0], 1 / np.sqrt(x + 1e-12), rtol=1e-6)
    close(run_op("inverse", x=x)[0], 1 / (x + 1e-4), rtol=1e-6)  # MIL's inverse default epsilon is 1e-4
    close(run_op("inverse", x=x, epsilon=np.float32(0))[0], 1 / x, rtol=1e-6)
    close(run_op("relu", x=x - 1)[0], np.maximum(x - 1, 0))
    close(run_op("sigmoid", x=x)[0], torch.sigmoid(t(x)).numpy())


@pytest.mark.parametrize("op,ref", [
    ("reduce_sum", lambda x: x.sum((1, 2), keepdims=True)),
    ("reduce_mean", lambda x: x.mean((1, 2), keepdims=True)),
    ("reduce_max", lambda x: x.max((1, 2), keepdims=True)),
    ("reduce_l1_norm", lambda x: np.abs(x).sum((1, 2), keepdims=True)),
    ("reduce_l2_norm", lambda x: np.sqrt((x ** 2).sum((1, 2), keepdims=True))),
    ("reduce_sum_square", lambda x: (x ** 2).sum((1, 2), keepdims=True)),
])
def test_reductions(op, ref):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    close(run_op(op, x=x, axes=np.array([1, -1]), keep_dims=True)[0], ref(x.astype(np.float64)), rtol=1e-5)


def test_shape_ops():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    close(run_op("reshape", x=x, shape=np.array([2, -1, 5]))[0], x.reshape(2, 12, 5))
    close(run_op("transpose", x=x, perm=np.array([0, 2, 3, 1]))[0], x.transpose(0, 2, 3, 1))
    a, b = run_op("split", x=x, axis=np.int32(1), split_sizes=np.array([1, 2]))
    close(a, x[:, :1]), close(b, x[:, 1:])
    parts = run_op("split", x=x, axis=np.int32(3), num_splits=np.int32(5))
    assert len(parts) == 5 and parts[4].shape == (2, 3, 4, 1)
    close(run_op("concat", values=[x, x], axis=np.int32(2), interleave=False)[0], np.concatenate([x, x], 2))
    close(run_op("squeeze", x=x[:, :1], axes=np.array([1]))[0], x[:, 0])
    close(run_op("expand_dims", x=x, axes=np.array([-1]))[0], x[..., None])
    (s,) = run_op("slice_by_index", x=x, begin=np.array([0, 1, 0, 0]), end=np.array([0, 3, 4, 5]),
                  stride=np.array([1, 1, 2, 1]), begin_mask=np.array([True, False, False, False]),
                  end_mask=np.array([True, False, False, True]), squeeze_mask=np.array([False, False, False, False]))
    close(s, x[:, 1:3, 0:4:2, :])
    (s,) = run_op("slice_by_index", x=x, begin=np.array([0, 2, 0, 0]), end=np.array([0, 3, 0, 0]),
                  begin_mask=np.array([True, False, True, True]), end_mask=np.array([True, False, True, True]),
                  squeeze_mask=np.array([False, True, False, False]))
    close(s, x[:, 2])
    # torch.roll lowers to gather with constant indices
    idx = (np.arange(4) - 1) % 4
    close(run_op("gather", x=x, indices=idx.astype(np.int32), axis=np.int32(2), batch_dims=np.int32(0))[0],
          torch.roll(t(x), 1, 2).numpy())
    close(run_op("tile", x=x[:, :1], reps=np.array([1, 3, 1, 1]))[0], np.tile(x[:, :1], (1, 3, 1, 1)))


def test_classify_picks_the_most_probable_label():
    label, probs = run_op("classify", out_dtypes=("string", "dict"), probabilities=np.array([[0.1, 0.7, 0.2]]),
                          classes=["a", "b", "c"])
    assert label == "b" and probs == pytest.approx({"a": 0.1, "b": 0.7, "c": 0.2})


# -------------------------------------------------------------------------------------------- fp16 semantics

def test_fp16_rounding_and_overflow_to_inf():
    assert round_fp16(np.float32(65504.0)) == 65504.0
    assert np.isinf(round_fp16(np.float32(65520.0)))            # the first value that rounds past the max
    assert round_fp16(np.float32(65519.0)) == 65504.0
    assert np.isneginf(round_fp16(np.float32(-1e5)))
    assert round_fp16(np.float32(1e-8)) == 0.0                  # below half the smallest subnormal: flushes
    assert round_fp16(np.float32(1.0 + 2 ** -12)) == 1.0          # fp16 has 10 mantissa bits
    np.testing.assert_array_equal(as_declared(np.array([1.5, 2.5]), "int32"), [1, 2])


def test_fp16_casts_through_torch_give_numpy_s_bits():
    """round_fp16 / to_fp16 cast big arrays through torch (fp16_cast.py): the same bits as numpy's IEEE cast, on
    every magnitude from fp16 subnormals to overflow, signed zeros, infinities, NaN and a strided view."""
    from vitedge.targets.coreml.fp16_cast import TORCH_MIN, from_fp16, to_fp16

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(TORCH_MIN).astype(np.float32) * s for s in (1e-7, 3e-5, 1.0, 900.0, 7e4)]
                       + [np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 65504, 65519.99, 65520, -65520, 2 ** -24,
                                    2 ** -25, 3 * 2 ** -26, 2 ** -14, 1 + 2 ** -11, 1 + 3 * 2 ** -11], np.float32)])
    with np.errstate(over="ignore", invalid="ignore"):
        want16 = x.astype(np.float16)
    assert x.size >= TORCH_MIN and np.isinf(want16).sum() > 10 and (want16 == 0).sum() > 10  # both ends reached
    np.testing.assert_array_equal(to_fp16(x).view(np.uint16), want16.view(np.uint16))
    np.testing.assert_array_equal(round_fp16(x).view(np.uint32), want16.astype(np.float32).view(np.uint32))
    np.testing.assert_array_equal(from_fp16(want16).view(np.uint32), want16.astype(np.float32).view(np.uint32))
    strided = x.reshape(5, -1)[:, ::3][:, :TORCH_MIN]  # non-contiguous, still above TORCH_MIN elements
    assert not strided.flags.c_contiguous and strided.size >= TORCH_MIN
    with np.errstate(over="ignore", invalid="ignore"):
        np.testing.assert_array_equal(round_fp16(strided), strided.astype(np.float16).astype(np.float32))


def test_fp16_reduce_l2_norm_overflows_inside_the_op():
    # sqrt(300^2 * 4) = 600 fits fp16, but the op's own sum of squares (360000) does not
    x = np.full((1, 4), 300.0, np.float32)
    assert run_op("reduce_l2_norm", x=x, axes=np.array([-1]), keep_dims=True)[0][0, 0] == pytest.approx(600.0)
    assert np.isinf(run_op("reduce_l2_norm", out_dtypes=("fp16",), x=x, axes=np.array([-1]), keep_dims=True)[0]).all()


# -------------------------------------------------------------------------------------------- saved programs

def _save(prog, path, precision=None):
    with quiet_coremltools():
        ml = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS16,
                        compute_precision=precision or ct.precision.FLOAT32, skip_model_load=True)
        ml.save(str(path))
    return path


W = RNG.standard_normal((16, 8, 3, 3)).astype(np.float32) * 0.2   # large enough to live in weight.bin
B = RNG.standard_normal(16).astype(np.float32)


@pytest.fixture(scope="module")
def mixed_program(tmp_path_factory):
    """fp32 and explicit fp16 ops side by side: conv (weights in weight.bin), an overflowing fp16 mul, a
    reduction whose fp16 sum overflows while the fp32 one does not."""

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8, 6, 6))], opset_version=ct.target.iOS16)
    def prog(x):
        c32 = mb.conv(x=x, weight=W, bias=B, pad_type="same", name="conv32")
        x16 = mb.cast(x=x, dtype="fp16")
        c16 = mb.conv(x=x16, weight=W.astype(np.float16), bias=B.astype(np.float16), pad_type="same")
        big = mb.mul(x=x16, y=np.float16(30000.0))                  # |x| > 2.2 overflows fp16
        s16 = mb.reduce_sum(x=mb.mul(x=x16, y=np.float16(4000.0)), axes=[1, 2, 3])
        s32 = mb.reduce_sum(x=mb.mul(x=x, y=np.float32(4000.0)), axes=[1, 2, 3])
        return (c32, mb.cast(x=c16, dtype="fp32", name="conv16"), mb.cast(x=big, dtype="fp32", name="big16"),
                mb.cast(x=s16, dtype="fp32", name="sum16"), mb.identity(x=s32, name="sum32"))

    path = _save(prog, tmp_path_factory.mktemp("mil") / "mixed.mlpackage")
    x = np.abs(RNG.standard_normal((1, 8, 6, 6))).astype(np.float32) + 0.5
    return path, x


def test_saved_program_honours_each_ops_dtype(mixed_program):
    path, x = mixed_program
    prog = load_program(path)
    assert (path / "Data/com.apple.CoreML/weights/weight.bin").stat().st_size > W.size * 2  # weights are in the blob
    outs = dict(zip(["conv32", "conv16", "big16", "sum16", "sum32"], prog.run({prog_input(prog): x}).values()))
    ref = F.conv2d(t(x), t(W), t(B), padding=1).numpy()
    close(outs["conv32"], ref, rtol=1e-4, atol=1e-4)
    # the fp16 conv is fp16-rounded (differs measurably from fp32) yet close
    rel16 = np.abs(outs["conv16"] - ref).max() / np.abs(ref).max()
    assert 1e-5 < rel16 < 3e-3
    np.testing.assert_array_equal(outs["conv16"], round_fp16(outs["conv16"]))
    big_ref = x.astype(np.float64) * 30000.0
    assert np.array_equal(np.isinf(outs["big16"]), big_ref > 65504 * (1 + 2 ** -11))
    assert np.isinf(outs["sum16"]).all()                   # 4000*sum(x) > 65504 in fp16
    assert np.isfinite(outs["sum32"]).all() and outs["sum32"][0] == pytest.approx(4000 * x.sum(), rel=1e-5)


def prog_input(prog) -> str:
    return next(iter(prog.inputs))


def test_dtype_counts_show_fp16_and_fp32_ops(mixed_program):
    counts = load_program(mixed_program[0]).dtype_counts()
    assert counts["conv"] == {"fp32": 1, "fp16": 1}


def test_unknown_op_raises_naming_it(mixed_program, tmp_path):
    import shutil

    from coremltools.proto import Model_pb2

    path = tmp_path / "unknown.mlpackage"
    shutil.copytree(mixed_program[0], path)
    spec_file = path / "Data/com.apple.CoreML/model.mlmodel"
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    block = spec.mlProgram.functions["main"].block_specializations["CoreML6"]
    op = next(o for o in block.operations if o.type == "mul")
    op.type = "frobnicate"
    spec_file.write_bytes(spec.SerializeToString())
    prog = load_program(path)
    assert prog.unknown_ops() == ["frobnicate"]
    with pytest.raises(UnsupportedOpError, match="frobnicate"):
        prog.run({prog_input(prog): mixed_program[1]})


def test_not_a_package_is_a_clear_error(tmp_path):
    with pytest.raises(MILProgramError, match="not an .mlpackage"):
        load_program(tmp_path)


def test_fp16_compute_precision_program_matches_torch_within_fp16(tmp_path):
    """A whole program converted with coremltools' FLOAT16 pass (casts inserted by coremltools, not by us)."""
    g = RNG.standard_normal(8).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 5, 8))], opset_version=ct.target.iOS16)
    def prog(x):
        h = mb.layer_norm(x=x, axes=[-1], gamma=g, epsilon=1e-5)
        h = mb.gelu(x=mb.linear(x=h, weight=np.eye(8, dtype=np.float32) * 2.0), mode="EXACT")
        return mb.softmax(x=mb.matmul(x=h, y=h, transpose_y=True), axis=-1)

    path = _save(prog, tmp_path / "p16.mlpackage", ct.precision.FLOAT16)
    p = load_program(path)
    assert any(dt == "fp16" for o in p.ops for _, dt in o.outputs)
    x = RNG.standard_normal((2, 5, 8)).astype(np.float32)
    (y,) = p.run({prog_input(p): x}).values()
    h = F.gelu(F.linear(F.layer_norm(t(x), (8,), t(g), None, 1e-5), torch.eye(8) * 2.0))
    ref = torch.softmax(h @ h.transpose(1, 2), -1).numpy()
    err = np.abs(y - ref).max()
    assert 0 < err < 5e-3  # fp16 rounding is present (not 0) and bounded
