"""A Hugging Face transformers `save_pretrained` folder: config.json beside the weights (`model.safetensors`,
`pytorch_model.bin`, or a sharded index `model.safetensors.index.json` / `pytorch_model.bin.index.json` naming
its shard files), and optionally the image processor's `preprocessor_config.json`.

`open_folder(path)` takes the folder, or one weight file of it (the files beside it then say what it holds). What
the folder says about the model (architecture, class count, labels, preprocessing) is read by
identify_model.py; the weights are read by load.py through the same safe readers as a single file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError

CONFIG = "config.json"
PREPROCESSOR = "preprocessor_config.json"
# In transformers' own order of preference (safetensors first); an index names the shard files of a large model.
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class HFFolder:
    root: Path
    config: dict
    weights: tuple[Path, ...]      # one file, or every shard an index names (in index order, each once)
    weight_name: str               # the file given or found (an index's name for a sharded model)
    preprocessor: dict | None      # preprocessor_config.json, when the folder has one

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is not readable JSON ({type(e).__name__}: {str(e)[:80]}); re-save the folder "
                              "with save_pretrained") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path} is not a JSON object; re-save the folder with save_pretrained")
    return doc


def is_transformers(path: str | Path) -> bool:
    """Whether `path` is a folder whose config.json names a transformers model_type, or a weight file beside one
    (timm's hub repos also hold a config.json, without model_type: their weight file is a plain checkpoint)."""
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    if not (folder / CONFIG).is_file() or not (p.is_dir() or p.name in WEIGHTS or p.suffix in (".safetensors", ".bin")):
        return False
    try:
        return "model_type" in _json(folder / CONFIG)
    except CheckpointError:
        return True  # a transformers folder with a broken config.json: open_folder says what is wrong


def weight_file_in(folder: Path) -> Path | None:
    """The single weight file of a folder that is not a transformers one (a timm repo's), if it has one."""
    return next((folder / n for n in WEIGHTS if not n.endswith(".json") and (folder / n).is_file()), None)


def _shards(index: Path) -> tuple[Path, ...]:
    doc = _json(index)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map naming its shard files; re-save the model with "
                              "save_pretrained")
    names = list(dict.fromkeys(weight_map.values()))
    if any(not isinstance(n, str) or "/" in n or "\\" in n or n in ("", ".", "..") for n in names):
        raise CheckpointError(f"{index} names a shard outside its folder ({names[:3]}); re-save the model")
    missing = [n for n in names if not (index.parent / n).is_file()]
    if missing:
        raise CheckpointError(f"{index} names {len(missing)} shard file(s) missing from {index.parent} "
                              f"({', '.join(missing[:3])}); copy the whole folder")
    return tuple(index.parent / n for n in names)


def open_folder(path: str | Path) -> HFFolder:
    """The transformers folder `path` is, or holds the weight file `path`; CheckpointError naming what is
    missing (a config.json without weights, an index whose shards are not there)."""
    p = Path(path)
    root = p if p.is_dir() else p.parent
    config = _json(root / CONFIG)
    if p.is_dir():
        found = next((root / n for n in WEIGHTS if (root / n).is_file()), None)
        if found is None:
            raise CheckpointError(f"{root} has config.json but none of {', '.join(WEIGHTS)}: copy the weights "
                                  "saved with it (save_pretrained writes them beside config.json)")
    else:
        found = p
    weights = _shards(found) if found.name.endswith(".index.json") else (found,)
    pre = _json(root / PREPROCESSOR) if (root / PREPROCESSOR).is_file() else None
    return HFFolder(root, config, weights, found.name, pre)
