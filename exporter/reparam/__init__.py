"""Re-parameterization: train-form -> deploy-form, with a summary of every fold.

engine.py runs a model module's fold plan (plan_<name> in <name>.py, named by the models registry's ModelModule);
build_forms.py builds the train-form and the deploy-form from a checkpoint;
primitives.py holds the exact folds the plans are made of.
"""
from .engine import (RENAMED_REWRITES, BlockCheck, FoldContext, ReparamSummary, available_rewrites, register_plan,
                     reparameterize, schedule_state)

__all__ = ["RENAMED_REWRITES", "BlockCheck", "FoldContext", "ReparamSummary", "available_rewrites", "register_plan",
           "reparameterize", "schedule_state"]
