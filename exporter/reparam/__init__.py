"""Re-parameterization: train-form -> deploy-form, with a summary of every fold.

engine.py runs a family's fold plan (plan_<family> in <family>.py, named by the models registry's family);
primitives.py holds the exact folds the plans are made of.
"""
from .engine import (RENAMED_REWRITES, BlockCheck, FoldContext, ReparamSummary, available_rewrites, register_plan,
                     reparameterize, schedule_state)

__all__ = ["RENAMED_REWRITES", "BlockCheck", "FoldContext", "ReparamSummary", "available_rewrites", "register_plan",
           "reparameterize", "schedule_state"]
