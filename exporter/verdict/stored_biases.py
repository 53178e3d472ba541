"""Biases are weights: what a correct artifact's storage does to a bias vector (each target's reader returns the
biases it stores: a float value, or a targets.graph.weights.StoredBias with its int32 step).

The weights check (weight_check.py) judges a bias like a weight, each output channel on its own (its deviation
from the deploy-form's value over max(|b_c|, the vector's median |b|)), against how a correct artifact stores it:
- as a float (an fp16 or fp32 initializer, a CoreML const): within one fp16 ulp of the value, the coarsest float
  a correct artifact keeps a bias in (one ulp, not half: a converter that computes a bias in another order, a
  fused op's, lands one ulp away; measured on the trained SwiftFormer's w8 package, whose near-dead biases of
  3e-7 are a few fp16 subnormal ulps);
- as int32 (an int8 QDQ graph's Conv / Gemm / MatMul + Add bias, an XNNPACK int8 program's qcint32 bias): rounded
  to the step the int8 kernels take for it, the layer's input scale x its weight's per-channel scale. That step is
  read from those two scales, never from the bias's own: ONNX Runtime's fused kernels ignore a bias's
  DequantizeLinear scale (a x10 scale changed nothing it computes, yet another runtime reads it), so the bias's
  stored value (int32 x its own scale) is judged against the deploy-form's at the expected step. Where the two
  scales cannot be found, the bias's own scale stands in (weaker: a bias zeroed through a huge own scale passes).
"""
from __future__ import annotations

import numpy as np
import torch


def is_bias(key: str, param: torch.Tensor) -> bool:
    """A deploy-form parameter (name with `_` for `.`) that is a layer's bias vector."""
    return param.dim() == 1 and (key == "bias" or key.endswith("_bias"))


def emulated_bias(bias: torch.Tensor, stored) -> torch.Tensor:
    """The deploy-form's `bias` (float64) moved by the most a correct artifact's storage moves it, per channel: half
    the int32 step where `stored` carries one, else one fp16 ulp of the value (module doc)."""
    b = bias.detach().double()
    step = getattr(stored, "step", None)
    if step is None:
        bound = np.spacing(np.abs(b.numpy()).astype(np.float16)).astype(np.float64)
    else:
        bound = np.broadcast_to(np.asarray(step, np.float64).reshape(-1), b.shape) / 2
    return b + torch.as_tensor(np.array(bound, np.float64))
