"""The checkpoint room: everything that turns a checkpoint someone trained into weights in a vitedge model.

Entry point (names imported lazily from here, so `import vitedge.models.checkpoints` is torch-free):

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
digest.py               sha256 of the weights (and of any file: targets/base.py shares it with every layer)

A family's own layouts stay beside its models and are registered there (registry.register_family): timm's and
transformers' SwiftFormer names (models/swiftformer.py, models/swiftformer_hf.py), SLAB's norm layouts
(models/slab_deit.py). The eval preprocessing a checkpoint's folder names is read into models/preprocess.py's Recipe.
"""
from __future__ import annotations

import importlib

_NAMES = {
    "identify": "identify_model", "Identified": "identify_model",
    "load_checkpoint": "load", "LoadResult": "load", "read_checkpoint": "load", "extract_state_dict": "load",
    "resolve_checkpoint": "hub_sources",
    "sha256_file": "digest",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
