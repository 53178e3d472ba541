"""The float64 ground truth's depthwise convolutions (float64_kernels.float64_depthwise): the same function as torch's
convolution to float64 rounding, for every stride, padding, dilation and kernel shape, with and without bias."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from vitedge.exporter.verdict.float64_kernels import float64_depthwise
from vitedge.exporter.verdict.parity import _in_dtype
from vitedge.models import create_model


@pytest.mark.parametrize("k,stride,padding,dilation,bias", [
    (3, 1, 1, 1, True), (3, 2, 1, 1, False), (5, 1, 2, 1, True), (7, 2, 3, 1, True), ((3, 5), (1, 2), (1, 2), 1, True),
    (3, 1, 2, 2, False), (3, 1, 0, 1, True), (1, 1, 0, 1, True)])
def test_depthwise_matches_torch(k, stride, padding, dilation, bias):
    torch.manual_seed(0)
    conv = nn.Conv2d(12, 12, k, stride, padding, dilation, groups=12, bias=bias).double().eval()
    x = torch.randn(3, 12, 17, 19, dtype=torch.float64)
    with torch.no_grad():
        ref = conv(x)
        fast = float64_depthwise(copy.deepcopy(conv))
        y = fast(x)
    assert fast._conv_forward is not conv._conv_forward  # the fast path really ran
    assert y.shape == ref.shape
    assert float((y - ref).abs().max()) <= 1e-13 * float(ref.abs().max())


def test_other_convolutions_are_left_alone():
    grouped = nn.Conv2d(8, 16, 3, groups=4).double()   # grouped, not depthwise
    dense = nn.Conv2d(8, 8, 3).double()
    reflect = nn.Conv2d(8, 8, 3, padding=1, groups=8, padding_mode="reflect").double()
    same = nn.Conv2d(8, 8, 3, padding="same", groups=8).double()
    for m in (grouped, dense, reflect, same):
        assert "_conv_forward" not in vars(float64_depthwise(m))


def test_float64_copy_of_a_model_uses_it_and_keeps_the_function():
    m = create_model("sima_nano_12_p16", img_size=64, depth=2, num_classes=10).eval()
    fast = _in_dtype(m, torch.float64)
    assert any("_conv_forward" in vars(c) for c in fast.modules())
    assert not any("_conv_forward" in vars(c) for c in m.modules())  # the caller's model is untouched
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        ref = copy.deepcopy(m).double()(x)
        y = fast(x)
    assert float((y - ref).abs().max()) <= 1e-12 * float(ref.abs().max())
