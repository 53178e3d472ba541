"""GELU as x * sigmoid(1.702 x) for the int8 graph (targets/graph/sigmoid_gelu.py): its error bound and the two
graph edits. The int8 graphs that use it are tested in test_qdq.py (ops, accuracy, the folded gain)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from vitedge.targets.graph import sigmoid_gelu as sg
from vitedge.targets.graph.gelu import MS_DOMAIN


def gelu_graph() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096])
    node = helper.make_node("Gelu", ["x"], ["y"], name="g", domain=MS_DOMAIN)
    return helper.make_model(helper.make_graph([node], "gelu", [x], [y]),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def test_the_documented_error_bound_is_the_measured_one():
    err = sg.max_abs_error()
    assert sg.MAX_ABS_ERROR - 1e-4 <= err <= sg.MAX_ABS_ERROR


def test_gelu_becomes_x_times_sigmoid_of_its_gain_within_the_bound():
    model = gelu_graph()
    out, n = sg.gelu_as_sigmoid(model)
    assert n == 1 and [x.op_type for x in model.graph.node] == ["Gelu"]  # the input model is not changed
    assert [(x.op_type, x.name) for x in out.graph.node] == [("Mul", "g_kx"), ("Sigmoid", "g_sig"), ("Mul", "g_mul")]
    x = np.linspace(-8, 8, 4096, dtype=np.float32)
    diff = np.abs(run(out, x) - run(model, x))
    assert 0.01 < diff.max() <= sg.MAX_ABS_ERROR + 1e-6  # an approximation, as close as documented


def test_the_gain_is_folded_only_where_the_mul_runs_int8():
    out, _ = sg.gelu_as_sigmoid(gelu_graph())
    same, folded = sg.fold_sigmoid_gain(out)  # float graph: no Q -> DQ pair before the Sigmoid
    assert folded == 0 and [n.name for n in same.graph.node] == [n.name for n in out.graph.node]
