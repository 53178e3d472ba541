"""Reusable layers: norms (RepBN, LinearNorm), attentions (SLA, additive, SimA), Mlp."""
from .attention import (ORDERS, EfficientAdditiveAttention, SimAAttention, SimplifiedLinearAttention,
                        l1_attention, linear_attention, resolve_order, sima_rule, sla_rule)
from .common import DropPath, Mlp, init_trunc_normal, init_vit_weights
from .norms import SCHEDULES, LinearNorm, RepBN

__all__ = ["ORDERS", "EfficientAdditiveAttention", "SimAAttention", "SimplifiedLinearAttention", "l1_attention",
           "linear_attention", "resolve_order", "sima_rule", "sla_rule", "DropPath", "Mlp", "init_trunc_normal", "init_vit_weights",
           "SCHEDULES", "LinearNorm", "RepBN"]
