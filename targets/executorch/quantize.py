"""int8 for ExecuTorch: PT2E static quantization with XNNPACK's quantizer (symmetric int8, weights per output
channel, activations per tensor), calibrated on the pipeline's calibration set (never the judged samples)."""
from __future__ import annotations

import torch

from ..calibration import Calibration

METHOD = "pt2e XNNPACKQuantizer: symmetric int8, per-channel weights, per-tensor activations (observers' ranges)"
CALIB_BATCH = 1  # the exported graph's static batch


def _config():
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import get_symmetric_quantization_config

    return get_symmetric_quantization_config(is_per_channel=True)


def weight_scale_floor() -> float:
    """The smallest per-channel weight scale the quantizer gives: its weight observer's eps (2^-12 in ExecuTorch
    1.5), so a channel with max|w| < 127 x eps is stored in steps of eps, not max|w| / 127."""
    return float(_config().weight.observer_or_fake_quant_ctr().eps)


def quantize_pt2e(ep: "torch.export.ExportedProgram", example: torch.Tensor,
                  calibration: Calibration) -> "torch.export.ExportedProgram":
    """The exported fp32 program quantized, re-exported on `example`."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = XNNPACKQuantizer().set_global(_config())
    prepared = prepare_pt2e(ep.module(), quantizer)
    b = example.shape[0]
    x = torch.from_numpy(calibration.x)
    with torch.no_grad():
        for i in range(0, len(x), b):
            chunk = x[i:i + b]
            if len(chunk) < b:  # the static batch: the last rows repeated (observers see each sample)
                chunk = torch.cat([chunk, chunk[-1:].expand(b - len(chunk), *chunk.shape[1:])])
            prepared(chunk)
    return torch.export.export(convert_pt2e(prepared), (example,))
