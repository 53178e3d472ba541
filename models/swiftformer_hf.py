"""SwiftFormer as Hugging Face transformers stores it (`SwiftFormerForImageClassification.save_pretrained`, the
MBZUAI/swiftformer-* repos): its key names mapped to the official ones, and its config.json read as a model name
and constructor overrides. Registered with the family in models/swiftformer.py (`TRANSFORMERS_PORT`).

Key names (transformers 5.x modeling_swiftformer.py -> official):
  swiftformer.patch_embed.patch_embedding.{i}.*   -> patch_embed.{i}.*
  swiftformer.encoder.network.{i}.blocks.{j}.*    -> network.{i}.{j}.*      (a stage)
  swiftformer.encoder.network.{i}.{proj,norm}.*   -> network.{i}.{proj,norm}.*  (a downsampling Embedding)
  depth_wise_conv / point_wise_conv1 / point_wise_conv2 -> dwconv / pwconv1 / pwconv2; attn.proj -> attn.Proj
  norm.*, head.*, dist_head.*                     unchanged
The port's attention still applies the first release's softmax over a size-1 axis (every token weight 1), so its
weights are built with `attn_weights="softmax"` (layers.EfficientAdditiveAttention) wherever this layout loads.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Mapping

from ..errors import CheckpointError
from .registry import Remap, TransformersPort, get_spec, list_models

MODEL_TYPE = "swiftformer"
PREFIX = "swiftformer."
_RENAMES = ((".depth_wise_conv.", ".dwconv."), (".point_wise_conv1.", ".pwconv1."),
            (".point_wise_conv2.", ".pwconv2."), (".attn.proj.", ".attn.Proj."))
# config.json fields whose value vitedge's SwiftFormer cannot follow other than at the default
_FIXED = {"num_channels": 3, "hidden_act": "gelu", "batch_norm_eps": 1e-5}


def _key(k: str) -> str:
    k = k[len(PREFIX):] if k.startswith(PREFIX) else k
    if k.startswith("patch_embed.patch_embedding."):
        k = "patch_embed." + k[len("patch_embed.patch_embedding."):]
    k = re.sub(r"^encoder\.network\.(\d+)\.blocks\.(\d+)\.", r"network.\1.\2.", k)
    k = re.sub(r"^encoder\.network\.(\d+)\.", r"network.\1.", k)
    for a, b in _RENAMES:
        k = k.replace(a, b)
    return k


def _is_layout(ck: set, model: set) -> bool:
    return (any(k.startswith((PREFIX + "encoder.", PREFIX + "patch_embed.", "encoder.network.")) for k in ck)
            and "patch_embed.0.weight" in model)


def _from_transformers(sd: Mapping, model_sd: Mapping) -> tuple[OrderedDict, str]:
    out = OrderedDict((_key(k), v) for k, v in sd.items())
    return out, ("transformers SwiftFormer key names -> official (swiftformer.patch_embed.patch_embedding->"
                 "patch_embed, swiftformer.encoder.network.i.blocks.j->network.i.j, depth_wise_conv->dwconv, "
                 "point_wise_conv1/2->pwconv1/2, attn.proj->attn.Proj)")


def _ints(config: dict, key: str, where: str) -> list[int]:
    v = config.get(key)
    if not isinstance(v, (list, tuple)) or not v or not all(isinstance(x, int) and x > 0 for x in v):
        raise CheckpointError(f"{where}: {key} must be a list of positive integers; got {v!r}: re-save the folder "
                              "with save_pretrained")
    return list(v)


def from_config(config: dict, where: str) -> tuple[str, dict]:
    """(registered model, constructor overrides) for a transformers SwiftFormerConfig: the variant whose depths and
    widths it has, else swiftformer_xs rebuilt with them (`layers`, `embed_dims`); plus the port's semantics and
    any other field that differs from the registered defaults (mlp_ratio, downsamples, down_*)."""
    for key, want in _FIXED.items():
        if key in config and config[key] != want:
            raise CheckpointError(f"{where}: {key}={config[key]!r} is not supported (vitedge's SwiftFormer has "
                                  f"{key}={want!r}); export a model trained with {key}={want!r}")
    depths, dims = _ints(config, "depths", where), _ints(config, "embed_dims", where)
    overrides: dict = dict(TRANSFORMERS_SEMANTICS)
    name = next((n for n in list_models("swiftformer") if get_spec(n).default_kwargs.get("layers") == depths
                 and get_spec(n).default_kwargs.get("embed_dims") == dims), None)
    if name is None:
        name = "swiftformer_xs"
        overrides.update(layers=depths, embed_dims=dims)
    defaults = get_spec(name).default_kwargs
    mlp = config.get("mlp_ratio", 4)
    if mlp != defaults.get("mlp_ratios", 4):
        overrides["mlp_ratios"] = mlp
    for ours, theirs in (("downsamples", "downsamples"), ("down_patch_size", "down_patch_size"),
                         ("down_stride", "down_stride"), ("down_pad", "down_pad"),
                         ("use_layer_scale", "use_layer_scale")):
        if theirs in config and config[theirs] is not None:
            value = list(config[theirs]) if isinstance(config[theirs], (list, tuple)) else config[theirs]
            default = defaults.get(ours, {"down_patch_size": 3, "down_stride": 2, "down_pad": 1,
                                          "use_layer_scale": True}.get(ours))
            if value != default:
                overrides[ours] = value
    return name, overrides


TRANSFORMERS_SEMANTICS = {"attn_weights": "softmax"}
TRANSFORMERS_NAMES = Remap("transformers_swiftformer", _is_layout, _from_transformers)
TRANSFORMERS_PORT = TransformersPort(MODEL_TYPE, "SwiftFormerForImageClassification", from_config,
                                     TRANSFORMERS_NAMES, TRANSFORMERS_SEMANTICS)
