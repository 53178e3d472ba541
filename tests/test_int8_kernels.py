"""ONNX Runtime's fused int8 kernels on x86 CPUs without VNNI (targets/graph/int8_kernels.py): which CPUs saturate,
and that vitedge's runner then computes a QDQ graph's own arithmetic, and says so."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitedge.targets.graph import int8_kernels
from vitedge.targets.graph.runtime import OnnxRuntimeRunner

K = 64  # products per output: 32 pairs of 255 x 127 (64770 each) clip at int16's 32767 where the kernels saturate


@pytest.mark.parametrize("machine,flags,expected", [
    ("x86_64", {"avx2", "fma"}, True),                      # AVX2 only (a Zen 3 EPYC, Haswell...)
    ("x86_64", {"avx2", "avx512f", "avx512bw"}, True),      # AVX-512 without VNNI (Skylake-SP)
    ("x86_64", {"avx2", "avx512f", "avx512_vnni"}, False),  # Cascade Lake and later, Zen 4
    ("x86_64", {"avx2", "avx_vnni"}, False),                # Alder Lake and later
    ("AMD64", {"avx2", "amx_int8"}, False),
    ("x86_64", None, True),                                 # flags unreadable: the safe side
    ("aarch64", {"asimd"}, False),                          # ARM's int8 kernels accumulate in int32
    ("arm64", None, False),
])
def test_which_cpus_saturate(machine, flags, expected):
    assert int8_kernels.saturates(machine, None if flags is None else frozenset(flags)) is expected


def test_cpu_flags_reads_the_first_processors_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
                    "processor\t: 1\nflags\t\t: fpu avx2 fma avx512_vnni\n")
    assert int8_kernels.cpu_flags(info) == frozenset({"fpu", "avx2", "fma"})
    assert int8_kernels.cpu_flags(tmp_path / "absent") is None


def _qdq_matmul() -> onnx.ModelProto:
    """x (1, K) float -> QuantizeLinear uint8 (scale 1) -> DequantizeLinear -> MatMul with int8 weights of 127 (scale
    1): every output is sum(x) * 127 exactly in the graph's arithmetic."""
    w = numpy_helper.from_array(np.full((K, 4), 127, np.int8), "w_q")
    one, zu, zs = (numpy_helper.from_array(np.array(1.0, np.float32), "one"),
                   numpy_helper.from_array(np.array(0, np.uint8), "zu"), numpy_helper.from_array(np.array(0, np.int8), "zs"))
    nodes = [helper.make_node("QuantizeLinear", ["x", "one", "zu"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "one", "zu"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w_q", "one", "zs"], ["wd"]),
             helper.make_node("MatMul", ["xd", "wd"], ["y"])]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, one, zu, zs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _float_matmul() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((K, 4), np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "f32",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


X = np.full((1, K), 255.0, np.float32)
EXACT = K * 255.0 * 127.0  # 2,072,640: in float32 exactly


@pytest.mark.parametrize("cpu_saturates", [True, False])
def test_the_runner_unfuses_a_qdq_graph_only_where_the_kernels_saturate(cpu_saturates, monkeypatch):
    monkeypatch.setattr(int8_kernels, "this_cpu_saturates", lambda: cpu_saturates)
    qdq, f32 = _qdq_matmul(), _float_matmul()
    with OnnxRuntimeRunner(qdq, threads=1) as r:
        assert r.int8_unfused is cpu_saturates
        assert (int8_kernels.NOTE in r.backend) is cpu_saturates
        assert (r.info().get("int8_kernels") == int8_kernels.NOTE) is cpu_saturates
        if cpu_saturates:  # run as written: the graph's own arithmetic
            np.testing.assert_array_equal(r.run(X), np.full((1, 4), EXACT, np.float32))
    gpu_first = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    with pytest.warns(UserWarning, match="not in available provider names"):  # this build has no GPU provider
        fallback = OnnxRuntimeRunner(qdq, providers=gpu_first, threads=1)
    with fallback as r:  # ONNX Runtime falls back to the CPU provider, whose kernels then run the graph
        assert r.session.get_providers()[0] == "CPUExecutionProvider"
        assert r.int8_unfused is cpu_saturates and (int8_kernels.NOTE in r.backend) is cpu_saturates
        if cpu_saturates:
            np.testing.assert_array_equal(r.run(X), np.full((1, 4), EXACT, np.float32))
    # where the build has the GPU provider, it takes the Q/DQ nodes itself: never unfused (the session itself
    # still falls back here, as this build cannot run CUDA; only the runner's decision is under test)
    monkeypatch.setattr(ort, "get_available_providers", lambda: gpu_first)
    with pytest.warns(UserWarning, match="not in available provider names"):
        gpu = OnnxRuntimeRunner(qdq, providers=gpu_first, threads=1)
    with gpu as r:
        assert not r.int8_unfused and int8_kernels.NOTE not in r.backend
    for model in (f32, f32.SerializeToString()):  # a float graph never: nothing to unfuse
        with OnnxRuntimeRunner(model, threads=1) as r:
            assert not r.int8_unfused and int8_kernels.NOTE not in r.backend


def test_on_this_cpu_the_runner_computes_the_graphs_arithmetic(tmp_path):
    """Whatever this CPU is, vitedge's runner gives the QDQ graph's exact outputs (from a file, as `parity` reads
    one); ONNX Runtime's defaults give them too on a CPU with VNNI, and clip them without (checked where it does)."""
    path = tmp_path / "qdq.onnx"
    onnx.save(_qdq_matmul(), str(path))
    with OnnxRuntimeRunner(path, threads=1) as r:
        got = r.run(X)
        assert r.int8_unfused is int8_kernels.this_cpu_saturates()
    np.testing.assert_array_equal(got, np.full((1, 4), EXACT, np.float32))
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    fused = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    if not int8_kernels.this_cpu_saturates():
        np.testing.assert_array_equal(fused, got)


def test_a_file_that_is_not_a_graph_is_left_to_onnx_runtime_to_refuse(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a protobuf at all")
    assert int8_kernels.has_qdq(bad) is False and int8_kernels.has_qdq(b"\x00garbage") is False
    assert int8_kernels.has_qdq(_qdq_matmul()) and int8_kernels.has_qdq(_qdq_matmul().SerializeToString())
