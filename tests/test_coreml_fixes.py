"""Every coremltools patch in targets/coreml/fixes.py is still needed, and works.

Each test converts a small probe module twice: without the patch (`fixes.without(name)`, or without the extra
pass) the installed coremltools shows the bug the patch is for; with it, the conversion is right. When a "without"
half fails, the installed coremltools no longer has that bug: drop the patch (and its test) after checking the
release notes. Probes are tiny, so each conversion takes a second or two.
"""
from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ct = pytest.importorskip("coremltools")

from vitedge.targets.coreml import fixes  # noqa: E402
from vitedge.targets.coreml.convert import _no_progress_bars  # noqa: E402
from vitedge.targets.coreml.coremltools_import import quiet_coremltools  # noqa: E402

EXAMPLE = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(0))


class _ShapeArithmetic(nn.Module):
    def forward(self, x):
        b, c, h, w = x.shape  # traced as aten::Int on 1-element tensors
        return x.reshape(b, c // 1, h * w).mean(-1)


class _LayerNormBiasOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.bias = nn.Parameter(torch.linspace(-1, 1, 4))

    def forward(self, x):
        return F.layer_norm(x.flatten(1)[:, :4], (4,), None, self.bias)


class _Reciprocal(nn.Module):
    def forward(self, x):
        return torch.reciprocal(x.abs().flatten(1) * 1e-2 + 1e-4)


class _TwoOutputs(nn.Module):
    def forward(self, x):
        y = x.flatten(1)[:, :3]
        return y, torch.softmax(y, -1)


def _convert(module: nn.Module, classifier: bool = False, pass_pipeline=None):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(module.eval(), EXAMPLE, check_trace=False)
    outputs = [ct.TensorType(name="logits", dtype=np.float32)]
    kwargs = {}
    if classifier:
        outputs.append(ct.TensorType(name="probabilities", dtype=np.float32))
        kwargs["classifier_config"] = ct.ClassifierConfig(["a", "b", "c"], predicted_probabilities_output="probabilities")
    if pass_pipeline is not None:
        kwargs["pass_pipeline"] = pass_pipeline
    with quiet_coremltools(), _no_progress_bars():
        return ct.convert(traced, inputs=[ct.TensorType(name="image", shape=EXAMPLE.shape, dtype=np.float32)],
                          outputs=outputs, convert_to="mlprogram", compute_precision=ct.precision.FLOAT32,
                          skip_model_load=True, **kwargs)


def _ops(ml, op_type: str) -> list:
    return [op for op in ml._mil_program.functions["main"].operations if op.op_type == op_type]


def test_every_fix_names_its_coremltools_version_and_is_tested():
    tested = {"scalar_int_bool", "layer_norm_bias_only", "reciprocal_exact", "classifier_output_types"}
    assert {f.name for f in fixes.FIXES} == tested
    for f in fixes.FIXES:
        assert re.fullmatch(r"\d+\.\d+(\.\d+)?", f.for_coremltools) and f.why
        assert bool(f.torch_ops) != bool(f.graph_pass)  # a converter override or a pass, one of the two


def test_scalar_int_bool_is_still_needed():
    with fixes.without("scalar_int_bool"), pytest.raises(TypeError, match="0-dimensional"):
        _convert(_ShapeArithmetic())
    fixes.install()
    assert _ops(_convert(_ShapeArithmetic()), "reduce_mean")


def test_layer_norm_bias_only_is_still_needed():
    with fixes.without("layer_norm_bias_only"), pytest.raises(AttributeError, match="NoneType"):
        _convert(_LayerNormBiasOnly())
    fixes.install()
    (ln,) = _ops(_convert(_LayerNormBiasOnly()), "layer_norm")
    assert np.array_equal(ln.gamma.val, np.ones(4, np.float32))


def test_reciprocal_exact_is_still_needed():
    with fixes.without("reciprocal_exact"):
        (inv,) = _ops(_convert(_Reciprocal()), "inverse")
    assert float(inv.epsilon.val) == pytest.approx(1e-4)  # coremltools' default: 1/(x + 1e-4), 10% off at x ~ 1e-3
    fixes.install()
    (inv,) = _ops(_convert(_Reciprocal()), "inverse")
    assert float(inv.epsilon.val) == 0.0


def test_classifier_output_types_is_still_needed():
    fixes.install()
    with pytest.raises(IndexError):
        _convert(_TwoOutputs(), classifier=True)  # coremltools' default pipeline, without our pass
    ml = _convert(_TwoOutputs(), classifier=True, pass_pipeline=fixes.classifier_pipeline())
    assert {"classLabel", "logits"} <= {o.name for o in ml.get_spec().description.output}
