"""Fold of SLAB's LLaMA-style RepBN norms into the Linears that read them (models/layers/llama_repbn.py).

In eval the progressive norm is its masked RepBN alone, and a RepBN with running statistics is one per-channel
affine on every token (the pad mask only matters in training): `a = g / sqrt(var + eps) + alpha`,
`b = beta - g * mean / sqrt(var + eps)`. Folded exactly into the following Linears, as the official
`LlamaDecoderLayer.merge_bn` does for a decoder layer:
- `input_layernorm` -> `self_attn.{q_proj, k_proj, v_proj}`;
- `post_attention_layernorm` -> `mlp.{gate_proj, up_proj}`;
- the final `model.norm` -> `lm_head` (which the official code leaves unfolded; exact too: the head is linear).
Every folded norm becomes `FoldedNorm`, an identity that still accepts the official `(x, pad_mask)` call.
Exporting language models is out of scope: this works on module trees with the HF/SLAB LLaMA attribute names.
"""
from __future__ import annotations

import copy
import warnings
from typing import Sequence

import torch
import torch.nn as nn

from ...errors import VitedgeError
from ...models.layers.norms import LinearNorm, RepBN
from .engine import ReparamSummary, schedule_state
from .primitives import affine_before, require_repbn_affine

__all__ = ["FoldedNorm", "llama_norm_affine", "fold_norm_into", "fold_decoder_layer", "reparameterize_llama",
           "DECODER_FOLDS"]

# norm attribute -> the Linears (paths inside the decoder layer) that read it
DECODER_FOLDS = {
    "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
}


class FoldedNorm(nn.Identity):
    """The identity left where a norm was folded; accepts the official `(x, pad_mask)` signature."""

    def forward(self, x: torch.Tensor, pad_mask: torch.Tensor | None = None) -> torch.Tensor:
        return x


llama_norm_affine = require_repbn_affine  # LlamaLinearNorm / MaskedRepBN subclass these


@torch.no_grad()
def fold_norm_into(norm: nn.Module, linears: Sequence[nn.Linear], path: str = "norm") -> list[nn.Linear]:
    """`[lin(norm(x)) for lin in linears]` as new Linears reading x (each gains a bias)."""
    a, b = llama_norm_affine(norm, path)
    return [affine_before(lin, a, b) for lin in linears]


def _set(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, leaf = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, module)


@torch.no_grad()
def fold_decoder_layer(layer: nn.Module, summary: ReparamSummary | None = None, prefix: str = "") -> nn.Module:
    """Fold a decoder layer's two norms in place (see DECODER_FOLDS); returns the layer."""
    for norm_name, targets in DECODER_FOLDS.items():
        norm = getattr(layer, norm_name)
        folded = fold_norm_into(norm, [layer.get_submodule(t) for t in targets], f"{prefix}{norm_name}")
        for t, lin in zip(targets, folded):
            _set(layer, t, lin)
        setattr(layer, norm_name, FoldedNorm())
        if summary is not None:
            summary.folded[f"{norm_name}->{'/'.join(t.rsplit('.', 1)[-1] for t in targets)}"] += 1
    return layer


def _is_decoder_layer(m: nn.Module) -> bool:
    return all(isinstance(getattr(m, n, None), (LinearNorm, RepBN)) for n in DECODER_FOLDS)


@torch.no_grad()
def reparameterize_llama(model: nn.Module, strict_schedule: bool = False) -> nn.Module:
    """A folded copy of a LLaMA-style model (`model` untouched), with `.reparam_summary`.

    Folds every decoder layer found (modules with RepBN-type `input_layernorm` and `post_attention_layernorm`)
    and, when the model has `lm_head` and a RepBN-type final norm at `model.norm` or `norm`, that norm into
    `lm_head`. An unfinished RMSNorm -> RepBN schedule warns (or, with `strict_schedule`, raises), since eval
    semantics (RepBN only) are what gets folded.
    """
    unfinished = schedule_state(model)
    summary = ReparamSummary()
    if unfinished:
        lams = ", ".join(f"{u['module']}={u['lambda']}" for u in unfinished[:4])
        msg = (f"checkpoint taken before the RMSNorm->RepBN schedule finished: lambda {lams}"
               f"{f' (+{len(unfinished) - 4} more)' if len(unfinished) > 4 else ''}; folding eval semantics "
               "(RepBN only), which differ from the train-mode blend")
        if strict_schedule:
            raise VitedgeError(msg + "; drop strict_schedule to accept it or finish training")
        warnings.warn(msg, stacklevel=2)
        summary.schedule = unfinished
    out = copy.deepcopy(model).eval()
    layers = [(name, m) for name, m in out.named_modules() if _is_decoder_layer(m)]
    if not layers:
        raise VitedgeError("no decoder layer with RepBN-type input_layernorm / post_attention_layernorm found: "
                           "nothing to fold")
    for name, layer in layers:
        fold_decoder_layer(layer, summary, f"{name}.")
    head = getattr(out, "lm_head", None)
    for norm_path in ("model.norm", "norm"):
        try:
            norm = out.get_submodule(norm_path)
        except AttributeError:
            continue
        if isinstance(norm, (LinearNorm, RepBN)) and isinstance(head, nn.Linear):
            out.lm_head = fold_norm_into(norm, [head], norm_path)[0]
            _set(out, norm_path, FoldedNorm())
            summary.folded["final_norm->lm_head"] += 1
        elif isinstance(norm, (LinearNorm, RepBN)):
            summary.unfolded.append({"module": norm_path, "why": "no lm_head Linear to fold the final norm into"})
        break
    out.reparam_summary = summary
    return out
