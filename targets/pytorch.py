"""PyTorch reference runners: the train-form (the ladder's reference) and the deploy-form hop."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from ..models.features import pack
from .base import Runner


class TorchRunner(Runner):
    """Runs an eval-mode module on float32 numpy batches (CPU, no grad)."""
    mode = "reference"

    def __init__(self, model: nn.Module, label: str = "pytorch", dtype: torch.dtype = torch.float32):
        self.model = model.eval()
        self.dtype = dtype
        self.backend = f"pytorch {torch.__version__.split('+')[0]} ({label})"

    @torch.no_grad()
    def run(self, x: np.ndarray) -> np.ndarray:
        y = pack(self.model(torch.from_numpy(np.ascontiguousarray(x)).to(self.dtype)))
        return y.float().numpy()


def train_form_runner(model: nn.Module) -> TorchRunner:
    return TorchRunner(model, "train-form")


def deploy_form_runner(model: nn.Module) -> TorchRunner:
    return TorchRunner(model, "deploy-form")
