"""Re-parameterization: train-form -> deploy-form, with a summary of every fold."""
from .engine import (BlockCheck, FoldContext, ReparamSummary, available_rewrites, register_plan, reparameterize,
                     schedule_state)

__all__ = ["BlockCheck", "FoldContext", "ReparamSummary", "available_rewrites", "register_plan", "reparameterize",
           "schedule_state"]
