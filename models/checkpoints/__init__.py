"""The checkpoint room: everything that turns a checkpoint someone trained into weights in a vitedge model.

Entry point:

    found = identify(checkpoint, name=None, overrides={})      # the model it holds, read once
    model = create_model(found.name, **found.overrides)
    result = load_checkpoint(model, found.raw, where=found.where)   # or load_checkpoint(model, "file.pth")

One job per module:

identify_model.py       what a checkpoint says about its model: name, class count, labels, recipe, layout
load.py                 a checkpoint into a model: file formats, containers, casts, strict key/shape checks
keys.py                 its keys against a model's: wrapper prefixes, the families' registered remaps, which
                        registered variants it fits, the class count of its head, the hint of a failed load
safe_pickle.py          reads torch.save files (zip and legacy) without running code from them
transformers_folder.py  a transformers save_pretrained folder: config.json, weights or shards, preprocessor
hub_sources.py          `hf-hub:` / `timm:` checkpoints, resolved through huggingface_hub's cache (vitedge[hub])

The weights' sha256 is models/digest.py's (one file hash for every layer: targets/base.py shares it, torch-free).

A model module's own layouts stay beside its models and are registered there (registry.register_model_module):
timm's and transformers' SwiftFormer names (models/swiftformer.py, models/swiftformer_hf.py), SLAB's norm layouts
(models/slab_deit.py). The eval preprocessing a checkpoint's folder names is read into models/preprocess.py's Recipe.
"""
from __future__ import annotations

from .hub_sources import resolve_checkpoint
from .identify_model import Identified, identify
from .load import LoadResult, extract_state_dict, load_checkpoint, read_checkpoint

__all__ = ["Identified", "LoadResult", "extract_state_dict", "identify", "load_checkpoint", "read_checkpoint",
           "resolve_checkpoint"]
