"""MAC counting (matmul + conv + linear, as MODELS.md's "measured" counts) without real arithmetic.

Models are built with their parameters on the `meta` device (shapes only: no memory, no init) and one
eval forward runs on a meta input under `torch.utils.flop_counter.FlopCounterMode`, which counts
mm/addmm/bmm/baddbmm/convolution/attention kernels from shapes. MACs = FLOPs / 2. Element-wise ops,
norms and softmax are not counted, exactly like the official "measured" figures.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from .registry import create_model, get_spec, set_input_size


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """While active, every parameter registered on a module is moved to the meta device.

    Unlike `with torch.device('meta')`, buffers and temporaries stay real, so constructors that read
    values (`torch.linspace(...).tolist()` for drop-path rates, index tables) still work; the parameter
    allocations are dropped right away and init functions run as no-ops on meta tensors.
    """
    original = nn.Module.register_parameter

    def register_parameter(self, name, param):
        if param is not None and param.device.type != "meta":
            param = nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
        original(self, name, param)

    nn.Module.register_parameter = register_parameter
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def meta_model(name: str, **overrides) -> nn.Module:
    """`create_model(name, **overrides)` in eval mode with parameters on `meta` (buffers stay on CPU)."""
    with params_on_meta():
        return create_model(name, **overrides).eval()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_macs(model: nn.Module, imgsz: int | tuple[int, int], batch: int = 1, in_chans: int = 3) -> int:
    """MACs of one eval forward at `imgsz` (matmul, conv, linear only).

    A model with meta parameters runs entirely on meta tensors (its buffers are moved there, in place);
    a real model runs for real.
    """
    h, w = (imgsz, imgsz) if isinstance(imgsz, int) else imgsz
    device = next(model.parameters(), torch.empty(0)).device
    if device.type == "meta":
        model.to("meta")
    x = torch.empty(batch, in_chans, h, w, device=device)
    was_training = model.training
    model.eval()
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() // 2


def model_macs(name: str, imgsz: int | None = None, **overrides) -> int:
    """MACs of registered model `name` at `imgsz` (default: its default size), batch 1."""
    spec = get_spec(name)
    model = meta_model(name, **overrides)
    if imgsz is not None:  # at another size, as the export runs it: position tables resampled, windows padded
        set_input_size(model, imgsz)
    return count_macs(model, imgsz or spec.default_imgsz)
