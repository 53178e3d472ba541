"""The feature probe: an ONNX hop is judged on the backbone's last feature map as well as on the logits.

Why: a classifier head pools positions (or reads one token) before its Linear, and the pooling averages away a
per-channel error whose sign varies across positions. Scaling one output channel of a mid-network SimA-XCiT
projection by 1.01 moved the logits by only 1.6-3.7x the model's own float32 noise (inside the 8x allowance:
8 of 35 models missed it, benchmarks/results/all_models.json before the probe), while the same error is about
160x the noise at the final norm's output. No per-sample rule on the logits can tell that apart from rounding
(correct hops reach 4.5x), so the error has to be looked at before the pooling.

So each ONNX hop whose tolerance sets the noise rule also compares, on the parity set's first PROBE_SAMPLES
inputs, the tensor holding the probe module's output with the deploy-form's output of that module in float64,
by the same per-sample rule (exporter/verdict/criteria.py: allowance max(floor, K x the deploy-form's float32 noise at
that module), the noise raised to its input set's median). The probe module is the last module in forward order,
at most one level inside a top-level container (`norm`, `blocks.11`, `stages.3`: whole blocks or stages, whose
outputs every exporter keeps in the model's own layout, not an op inside a block that a simplifier may
re-layout), that maps to an ONNX tensor and outputs a map (more than one position or token per sample): the head's input
before pooling (the final norm, or the last block where a deploy-form folded that norm into the head or, as
SimA-XCiT's deploy-form does, carries only the class token past the last patch-token block). A hop
whose probe breaks the rule fails and is localized like any other. `report.json` `parity[].probe` records
the module, the samples, the worst ratio and each set's.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import numpy as np
import onnx
import torch
import torch.nn as nn

from .criteria import NoiseRule
from .localize import _first_tensor, _with_outputs, capture_modules, module_outputs, param_owners
from ...targets.base import chunk_size
from .parity import run_batched

PROBE_SAMPLES = 16


@dataclass
class Probe:
    module: str              # deploy-form module path whose output was compared
    tensor: str              # the ONNX tensor holding it
    samples: int
    noise_ratio: float       # worst per-sample error / allowance over the probed samples (<= 1 passes)
    worst_sample: int        # index into the parity set
    sets: dict               # input set -> its worst noise_ratio

    @property
    def passed(self) -> bool:
        return bool(self.noise_ratio <= 1.0)

    def as_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        return (f"feature probe: the output of {self.module} breaks the noise rule (noise_ratio "
                f"{self.noise_ratio:.3g} > 1 on parity sample {self.worst_sample}; the logits pool it away)")


def _is_map(shape: tuple) -> bool:
    """A batched output with more than one position: (B, N, C) with N > 1, (B, C, H, W) with H x W > 1, ... (not
    a pooled vector or a lone class token, (B, 1, C))."""
    per_sample = shape[1:]
    return len(per_sample) >= 2 and int(np.prod(per_sample)) > max(per_sample)


def probe_point(onnx_model: onnx.ModelProto, deploy: nn.Module, x1: np.ndarray) -> tuple[str, str] | None:
    """(module path, ONNX tensor) of the probe (module doc), or None where no module maps to a feature map."""
    paths = {p for p, _ in deploy.named_modules() if p}
    mapping = module_outputs(onnx_model, paths, param_owners(deploy))
    with torch.no_grad():
        order, shapes = capture_modules(deploy, torch.from_numpy(np.ascontiguousarray(x1[:1], np.float32)),
                                        keep=lambda t: tuple(t.shape))
    maps = [p for p in order if p in mapping and _is_map(shapes[p]) and p.count(".") <= 1]
    return (maps[-1], mapping[maps[-1]]) if maps else None


@torch.no_grad()
def module_output(model: nn.Module, path: str, x: torch.Tensor, batch: int = 8) -> np.ndarray:
    """The output of `model`'s module `path` on `x`, in chunks of `batch` (fewer for large inputs: chunk_size)."""
    module = dict(model.named_modules())[path]
    batch = chunk_size(batch, tuple(x.shape))
    got: list[torch.Tensor] = []
    handle = module.register_forward_hook(lambda _m, _i, out: got.append(_first_tensor(out).detach().clone()))
    try:
        for i in range(0, len(x), batch):
            model(x[i:i + batch])
    finally:
        handle.remove()
    return torch.cat(got).double().numpy()


def deploy_reference(deploy: nn.Module, path: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(float64 truth, float32 output) of the deploy-form's module `path` on `x` (the probe's reference)."""
    xt = torch.from_numpy(np.ascontiguousarray(x, np.float32))
    y32 = module_output(deploy, path, xt)
    y64 = module_output(copy.deepcopy(deploy).double().eval(), path, xt.double())
    return y64, y32


class _TensorOf:
    """A runner view whose output is one tensor of its graph, so run_batched's chunking and static-batch padding
    apply unchanged."""

    def __init__(self, runner, tensor: str):
        self.runner, self.tensor = runner, tensor

    def max_batch(self) -> int | None:
        return self.runner.max_batch()

    def run(self, x: np.ndarray) -> np.ndarray:
        return self.runner.run_all(x)[self.tensor]


def onnx_tensor(onnx_model: onnx.ModelProto, tensor: str, x: np.ndarray) -> np.ndarray:
    """The value of `tensor` in `onnx_model` on `x` (ONNX Runtime, CPU), float64."""
    from ...targets.graph.runtime import OnnxRuntimeRunner

    runner = OnnxRuntimeRunner(_with_outputs(onnx_model, [tensor]))
    try:
        return np.asarray(run_batched(_TensorOf(runner, tensor), x), np.float64)
    finally:
        runner.close()


def judge_probe(module: str, tensor: str, candidate: np.ndarray, truth: np.ndarray, noisy: np.ndarray,
                sets: tuple[str, ...], rule: NoiseRule) -> Probe:
    """The noise rule on the probe's outputs, per input set (each set's median noise raises its samples')."""
    cand = candidate.reshape(truth.shape) if candidate.shape != truth.shape else candidate  # caller checked sizes
    ratios = np.full(len(truth), -np.inf)
    per_set = {}
    for name in dict.fromkeys(sets):
        idx = np.array([i for i, s in enumerate(sets) if s == name], dtype=np.int64)
        r = rule.ratios(truth[idx], cand[idx], noisy[idx])
        ratios[idx] = r
        per_set[name] = float(r.max())
    worst = int(np.argmax(ratios))
    return Probe(module, tensor, len(truth), float(ratios[worst]), worst, per_set)


__all__ = ["PROBE_SAMPLES", "Probe", "deploy_reference", "judge_probe", "onnx_tensor", "probe_point"]
