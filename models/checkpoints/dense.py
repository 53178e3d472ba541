"""Detection and segmentation checkpoints into a backbone's feature maps (`--features --checkpoint`).

What users hold, read the way the official dense-prediction code writes them:
- an mmdet / mmseg checkpoint (`state_dict` with `backbone.*`, `neck.*`, `*_head.*` keys): the backbone's keys are
  taken from under `backbone.`, its per-output modules (`backbone.norm{i}`, XCiT's `backbone.fpn{i}`) become the
  feature maps' own, every other key (neck, heads) is listed as ignored;
- the official `fork_feat` backbone's own state_dict (no prefix, `norm{i}` beside the backbone's keys);
- a timm `features_only` model's state_dict (`stem_0.*`, `stages_1.*`: timm's flattened module names, then timm's
  key names): maps without detection norms, as timm gives them (the wrapper's norms are dropped).
The classifier's own modules (its final norm and heads) are not expected. Missing, unexpected or mis-shaped backbone
keys are a CheckpointError (exit 2) naming them, as for every checkpoint.
"""
from __future__ import annotations

import os
import re
from collections import OrderedDict

import torch
import torch.nn as nn

from ...errors import CheckpointError
from ..features import FeatureMaps
from .hub_sources import resolve_checkpoint
from .keys import compare, remap_state_dict
from .load import SHOW, _cast_and_check, _tensors_only, extract_state_dict, read_checkpoint

BACKBONE = "backbone."
STRUCTURAL = (".attn_mask", ".relative_position_index")  # built by the constructor, never trained
_TIMM_FLAT = re.compile(r"^([A-Za-z]+)_(\d+)\.")  # timm FeatureListNet: `stages.1` is stored as `stages_1`


def _few(keys) -> str:
    keys = list(keys)
    return ", ".join(keys[:SHOW]) + (f" (+{len(keys) - SHOW} more)" if len(keys) > SHOW else "")


def classifier_keys(backbone: nn.Module) -> set[str]:
    """The backbone's state_dict keys that belong to its classifier only (`classifier_modules`: the final norm
    and the heads), which a detection checkpoint does not hold."""
    heads = tuple(getattr(backbone, "classifier_modules", ("norm", "head")))
    return {k for k in backbone.state_dict() if k.split(".")[0] in heads}


def load_dense_checkpoint(model: FeatureMaps, checkpoint: str | os.PathLike) -> dict:
    """Load `checkpoint` (module doc) into `model` in place; returns what the report records under
    `from_checkpoint`: the layout, the remaps applied and the ignored keys."""
    where = str(checkpoint)
    raw = read_checkpoint(resolve_checkpoint(checkpoint, getattr(model, "vitedge_name", None)))
    sd, _ = extract_state_dict(raw.obj, where)
    sd, notes = _tensors_only(sd)
    ignored: list[str] = []
    if any(k.startswith(BACKBONE) for k in sd):
        layout = "mmdet/mmseg (backbone.*)"
        ignored = [k for k in sd if not k.startswith(BACKBONE)]
        sd = OrderedDict((k[len(BACKBONE):], v) for k, v in sd.items() if k.startswith(BACKBONE))
    else:
        layout = "backbone"
    if sd and all(_TIMM_FLAT.match(k) for k in sd):
        sd = OrderedDict((_TIMM_FLAT.sub(r"\1.\2.", k), v) for k, v in sd.items())
        layout = "timm features_only"
        notes.append("timm features_only module names (stages_1 -> stages.1)")
    taps = {t.attr for t in model.taps}
    all_norms = {t.attr for t in model.backbone.feature_info()}
    norms = OrderedDict((k, v) for k, v in sd.items() if k.split(".")[0] in all_norms)
    ignored += [k for k in norms if k.split(".")[0] not in taps]  # the maps not asked for
    norms = OrderedDict((k, v) for k, v in norms.items() if k.split(".")[0] in taps)
    body = OrderedDict((k, v) for k, v in sd.items() if k.split(".")[0] not in all_norms)
    backbone_sd = model.backbone.state_dict()
    body, remaps = remap_state_dict(body, backbone_sd)
    remap = getattr(model.backbone, "dense_checkpoint_remap", None)  # a family's detection layout, where it differs
    if remap is not None:
        remaps += remap(body)
    expected = {k: v for k, v in backbone_sd.items() if k not in classifier_keys(model.backbone)}
    # SLAB's detection LinearNorm (mmdet_custom/prepbn.py) has no warm-up counter: warm = 0, as it behaves
    no_warm = [k for k in expected if k.endswith(".warm") and k not in body and k[:-4] + "iter" in body]
    for k in no_warm:
        body[k] = torch.zeros_like(backbone_sd[k])
    if no_warm:
        remaps.append(f"LinearNorm without a warm-up counter (SLAB's detection code): warm = 0 in {len(no_warm)}")
    # Swin's shift masks: the detection code builds them per input size in forward; the constructor's are kept
    masks = [k for k in expected if k.endswith(STRUCTURAL) and k not in body]
    for k in masks:
        body[k] = backbone_sd[k]
    if masks:
        remaps.append(f"{len(masks)} structural buffer(s) the detection code computes in forward, as built here "
                      f"({_few(masks)})")
    if not norms and layout == "timm features_only":  # timm's maps carry no detection norm
        for t in model.taps:
            if hasattr(model, t.attr):
                setattr(model, t.attr, nn.Identity())
        notes.append("no detection norms (timm's feature maps): outputs as timm's forward_intermediates")
    norm_sd = {k: v for k, v in model.state_dict().items() if k.split(".")[0] in taps}
    _cast_and_check(OrderedDict(**body, **norms), where)
    missing, unexpected, mismatched = compare(OrderedDict(**body, **norms), {**expected, **norm_sd})
    if missing or unexpected or mismatched:
        problems = [f"{len(missing)} missing ({_few(missing)})" if missing else "",
                    f"{len(unexpected)} unexpected ({_few(unexpected)})" if unexpected else "",
                    f"{len(mismatched)} mis-shaped ({_few(f'{k} {a} vs {b}' for k, a, b in mismatched)})"
                    if mismatched else ""]
        raise CheckpointError(f"{where} ({layout}) does not fit the feature maps of "
                              f"{getattr(model, 'vitedge_name', type(model.backbone).__name__)}: "
                              f"{'; '.join(p for p in problems if p)}")
    model.backbone.load_state_dict(body, strict=False)
    model.load_state_dict(norms, strict=False)
    return {"layout": layout, "remaps": notes + remaps, "loaded": len(body) + len(norms), "ignored": ignored}
