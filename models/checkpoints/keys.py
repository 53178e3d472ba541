"""How a checkpoint fits the registered models: its keys rewritten to a model's layout (wrapper prefixes, the
families' registered remaps), compared with the model's, which variants it fits (exactly, or but for the class
count), the class count its classifier head holds, and the one-line hint of a strict load that failed
(load.py).
"""
from __future__ import annotations

import functools
import re
from collections import OrderedDict
from typing import Mapping

import torch.nn as nn

from ..registry import checkpoint_remaps

__all__ = ["remap_state_dict", "compare", "match_registered", "head_classes", "hint"]
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _strip_wrappers(sd: Mapping, model_keys: set) -> tuple[Mapping, list[str]]:
    notes = []
    for prefix in WRAPPER_PREFIXES:
        if sd and all(k.startswith(prefix) for k in sd) and not any(k.startswith(prefix) for k in model_keys):
            sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items())
            notes.append(f"stripped the {prefix!r} prefix")
    return sd, notes


def remap_state_dict(sd: Mapping, model_sd: Mapping) -> tuple[OrderedDict, list[str]]:
    """`sd` rewritten to the target model's layout, and a description of every rewrite applied."""
    sd, notes = _strip_wrappers(sd, set(model_sd))
    sd = OrderedDict(sd)
    for remap in checkpoint_remaps():
        if remap.detect(set(sd), set(model_sd)):
            sd, note = remap.apply(sd, model_sd)
            notes.append(note)
    return sd, notes


def compare(sd: Mapping, model_sd: Mapping) -> tuple[list[str], list[str], list[tuple[str, tuple, tuple]]]:
    missing = [k for k in model_sd if k not in sd]
    unexpected = [k for k in sd if k not in model_sd]
    mismatched = [(k, tuple(v.shape), tuple(model_sd[k].shape)) for k, v in sd.items()
                  if k in model_sd and tuple(v.shape) != tuple(model_sd[k].shape)]
    return missing, unexpected, mismatched


def head_classes(sd: Mapping, model_sd: Mapping) -> int | None:
    """The class count of `sd`'s classifier head where it differs from the model's and nothing else does (after
    the layout remaps): the head's output rows; None otherwise."""
    mapped, _ = remap_state_dict(sd, model_sd)
    missing, unexpected, mismatched = compare(mapped, model_sd)
    if missing or unexpected or not mismatched:
        return None
    if not all(_is_head_key(k) and a[1:] == b[1:] for k, a, b in mismatched):
        return None
    counts = {a[0] for _, a, _ in mismatched}
    return counts.pop() if len(counts) == 1 else None


@functools.lru_cache(maxsize=None)
def _signature(name: str) -> OrderedDict:
    from ..flops import meta_model  # shapes only, no weights

    return OrderedDict(meta_model(name).state_dict())


def _templates(keys) -> set:
    return {re.sub(r"\d+", "#", k) for k in keys}


def _is_head_key(k: str) -> bool:
    return k.split(".")[-2:-1] in (["head"], ["dist_head"], ["head_dist"])


def match_registered(sd: Mapping) -> list[tuple[str, int | None]]:
    """Registered variants whose official layout `sd` fits: (name, None) for an exact fit,
    (name, num_classes) when only the classifier width differs. Builds each variant on `meta` (cached)."""
    from ..registry import list_models

    fits = []
    for name in list_models():
        try:
            ref = _signature(name)
        except Exception:  # a variant that cannot be built here cannot be suggested either
            continue
        mapped, _ = remap_state_dict(sd, ref)
        missing, unexpected, mismatched = compare(mapped, ref)
        if missing or unexpected:
            continue
        classes = None if not mismatched else head_classes(sd, ref)
        if not mismatched or classes is not None:
            fits.append((name, classes))
    return fits


def _own_layout_shapes(sd: Mapping, model: nn.Module) -> str | None:
    """Where the checkpoint has exactly the model's key names and only shapes differ: a line naming the tensors."""
    model_sd = model.state_dict()
    mapped, _ = remap_state_dict(sd, model_sd)
    missing, unexpected, mismatched = compare(mapped, model_sd)
    if missing or unexpected or not mismatched:
        return None
    key, have, want = mismatched[0]
    more = f" and {len(mismatched) - 1} more" if len(mismatched) > 1 else ""
    return (f"it has this model's layout but {key} is {tuple(have)} where the model has {tuple(want)}{more}: build "
            "the model with the options the checkpoint was trained with (`--set KEY=VALUE`)")


def hint(sd: Mapping, model: nn.Module) -> str:
    from ..registry import get_spec, list_models

    own = getattr(model, "vitedge_name", None)
    fits = match_registered(sd)
    exact = [n for n, classes in fits if classes is None]
    heads = {n: classes for n, classes in fits if classes is not None}
    if own in exact:
        return (f"the checkpoint fits {own} with its default options: drop the overrides "
                f"{getattr(model, 'vitedge_overrides', {})}")
    if exact:
        return f"the checkpoint fits {exact[0]}: create the model with that name"
    if own in heads:
        return (f"the checkpoint has {heads[own]} classes: build the model with num_classes={heads[own]} "
                f"(`--set num_classes={heads[own]}`)")
    if heads:
        name, classes = next(iter(heads.items()))
        return (f"the checkpoint fits {name} with num_classes={classes}: build that model with it (`--model {name} "
                f"--set num_classes={classes}`)")
    shapes = _own_layout_shapes(sd, model)
    if shapes:  # the model's own key names, some shapes differ: name them, not a guessed relative
        return shapes
    # No exact variant: name the family whose key names (digits ignored) overlap most.
    ck = _templates(sd)
    best, score = None, 0.0
    for name in list_models():
        try:
            ref = _templates(_signature(name))
        except Exception:
            continue
        s = len(ck & ref) / max(len(ck | ref), 1)
        if s > score:
            best, score = name, s
    if best and score >= 0.5:
        fam = get_spec(best).family
        return (f"the checkpoint looks like a {fam} model with another configuration (closest: {best}); "
                "pass the matching overrides")
    return "the checkpoint does not match any registered model's layout"
