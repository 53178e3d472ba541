"""Identify the model a checkpoint holds: what the checkpoint says about it, read once before the model is built.

    found = identify(checkpoint, name=None, overrides={})   # name None: the checkpoint must say (a transformers folder)
    model = create_model(found.name, **found.overrides); load_checkpoint(model, found.raw, where=found.where)

- A transformers `save_pretrained` folder (or one weight file of it, or an `hf-hub:` repo of one): config.json's
  model_type picks the family's port (registry.TransformersPort), whose `from_config` names the model and its
  architecture overrides; `id2label` gives the class count and the class names; preprocessor_config.json the
  eval preprocessing. A `--model` that disagrees is an error naming both.
- Any checkpoint, any layout: the class count of its classifier head, where it differs from the model's registered
  default and the user did not set `num_classes`, builds the model with that count (`notes` says so); a key
  layout whose port computes differently (transformers' SwiftFormer attention) adds the port's semantics.
The user's overrides always win over what the checkpoint determines.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ...errors import CheckpointError
from ..digest import digest_files
from ..preprocess import Recipe, from_preprocessor_config
from ..registry import get_spec, transformers_ports
from .hub_sources import is_hub_spec, parse_source, resolve_checkpoint
from .keys import head_classes
from .load import extract_state_dict, read_checkpoint, read_weights
from .safe_pickle import TorchFile
from .transformers_folder import CONFIG, HFFolder, is_transformers, open_folder, weight_file_in

GENERIC_LABEL = "LABEL_{}"   # transformers' placeholder names when no id2label was given
DEFAULT_NUM_LABELS = 2       # transformers' PreTrainedConfig default when config.json has no id2label


@dataclass
class Identified:
    name: str                    # the registered model to build
    overrides: dict              # constructor overrides: what the checkpoint determines, then the user's
    raw: TorchFile               # the weights as read
    where: str                   # the checkpoint as given
    files: tuple                 # every local file the weights came from (hashed: `digest`)
    layout: str                  # "official" | "timm" | "transformers"
    labels: tuple | None = None  # class names in index order (config.json id2label), None when it has none
    recipe: Recipe | None = None  # preprocessor_config.json's eval preprocessing
    imgsz: int | None = None     # the input size preprocessor_config.json crops to
    notes: dict = field(default_factory=dict)  # report.json `from_checkpoint`: what came from where

    def digest(self) -> str:
        """sha256 of the weights (`digest.digest_files`)."""
        return digest_files(self.files)


def _labels(config: dict, where: str) -> tuple[int, tuple | None]:
    """(class count, class names) from config.json's id2label ({"0": "cat", ...}); names None when they are
    transformers' placeholders (LABEL_0, ...)."""
    id2label = config.get("id2label")
    if not id2label:
        n = config.get("num_labels", DEFAULT_NUM_LABELS)
        return int(n), None
    try:
        pairs = sorted((int(k), str(v)) for k, v in id2label.items())
    except (AttributeError, TypeError, ValueError):
        raise CheckpointError(f"{where}: id2label must map class indices to names; got {str(id2label)[:80]}") from None
    if [i for i, _ in pairs] != list(range(len(pairs))):
        raise CheckpointError(f"{where}: id2label's indices are not 0..{len(pairs) - 1}; re-save the config")
    names = tuple(name for _, name in pairs)
    generic = all(name == GENERIC_LABEL.format(i) for i, name in enumerate(names))
    return len(names), None if generic else names


def _from_folder(folder: HFFolder, name: str | None, where: str) -> tuple[str, dict, dict]:
    ports = transformers_ports()
    config_path = str(folder.root / CONFIG)
    port = ports.get(folder.model_type)
    if port is None:
        supported = ", ".join(f"{t} ({p.classes})" for t, p in ports.items())
        raise CheckpointError(f"{where}: config.json has model_type {folder.model_type!r}; vitedge loads transformers "
                              f"folders of model_type {supported}. SLAB, PRepBN and SimA have no transformers port: "
                              "pass their official checkpoint file with --model")
    found, overrides = port.from_config(folder.config, config_path)
    custom = "layers" in overrides  # an architecture no registered variant has: built from the named family's model
    if name is not None and name != found and not (custom and get_spec(name).family == get_spec(found).family):
        raise CheckpointError(f"--model {name} disagrees with {config_path}, which describes {found} (model_type "
                              f"{folder.model_type}, depths {folder.config.get('depths')}, embed_dims "
                              f"{folder.config.get('embed_dims')}): drop --model, or pass --model {found}")
    chosen = name or found
    notes = {"model": f"{chosen} from {config_path} (model_type {folder.model_type}"
                      + (f", depths {overrides['layers']}, embed_dims {overrides['embed_dims']})" if custom else ")")}
    return chosen, overrides, notes


def identify(checkpoint, name: str | None = None, overrides: dict | None = None) -> Identified:
    """Read `checkpoint` (a file, a transformers folder or weight file of one, `hf-hub:` / `timm:`) and decide the
    model it fits: `name` (None: the checkpoint names it) with the overrides it determines under the user's."""
    user = dict(overrides or {})
    where = str(checkpoint)
    if name is None and is_hub_spec(checkpoint) and parse_source(checkpoint).model:
        name = parse_source(checkpoint).model  # timm:NAME names its vitedge model
    local = Path(resolve_checkpoint(checkpoint, name))
    if not local.exists():
        raise CheckpointError(f"checkpoint {local} not found: check the --checkpoint path")
    determined: dict = {}
    notes: dict = {}
    labels = recipe = imgsz = None
    if is_transformers(local):
        folder = open_folder(local)
        name, determined, notes = _from_folder(folder, name, where)
        raw, files, layout = read_weights(folder.weights), folder.weights, "transformers"
        n, labels = _labels(folder.config, str(folder.root / CONFIG))
        if n != get_spec(name).default_kwargs.get("num_classes", 1000):
            determined["num_classes"] = n
        notes["num_classes"] = f"{n} from config.json ({'id2label' if folder.config.get('id2label') else 'num_labels'})"
        if labels is not None:
            notes["labels"] = f"{len(labels)} class names from config.json id2label"
        if folder.preprocessor is not None:
            pre = str(folder.root / "preprocessor_config.json")
            recipe, imgsz = from_preprocessor_config(folder.preprocessor, pre)
            notes["preprocess"] = pre
        size = folder.config.get("image_size")
        imgsz = imgsz or (size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None)
    else:
        if name is None:
            raise CheckpointError(f"--model is needed: {where} is a weight file, which does not name its model (a "
                                  "transformers folder with config.json, or timm:NAME, does)")
        local = weight_file_in(local) or local if local.is_dir() else local  # (a timm repo's folder)
        raw, files, layout = read_checkpoint(local), (local,), None
    sd, _ = extract_state_dict(raw.obj, where)
    _layout_semantics(sd, name, {**determined, **user}, determined, notes)
    found = notes.pop("layout", "official")
    layout = layout or found
    if "num_classes" not in user and "num_classes" not in determined:
        _classes_from_head(sd, name, {**determined, **user}, determined, notes)
    return Identified(name, {**determined, **user}, raw, where, tuple(files), layout,
                None if labels is None else tuple(labels), recipe, imgsz, notes)


def _meta_keys(name: str, overrides: dict):
    from ..flops import meta_model  # shapes only, no weights

    return meta_model(name, **overrides).state_dict()


def _layout_semantics(sd, name: str, overrides: dict, determined: dict, notes: dict) -> None:
    """A port's key layout found in a plain weight file: its semantics are added (unless already set)."""
    model_keys = set(_meta_keys(name, overrides))
    for port in transformers_ports().values():
        if port.layout.detect(set(sd), model_keys):
            notes["layout"] = "transformers"
            new = {k: v for k, v in port.semantics.items() if k not in overrides}
            if new:
                determined.update(new)
                notes["semantics"] = f"{new} (the transformers {port.classes} forward)"
    if "layout" not in notes and any(r.detect(set(sd), model_keys) for r in _timm_remaps()):
        notes["layout"] = "timm"


def _timm_remaps():
    from ..registry import checkpoint_remaps

    return [r for r in checkpoint_remaps() if r.name.startswith("timm")]


def _classes_from_head(sd, name: str, overrides: dict, determined: dict, notes: dict) -> None:
    """The head's class count where it is the only difference from the model as it would be built."""
    n = head_classes(sd, _meta_keys(name, overrides))
    if n is not None:
        default = overrides.get("num_classes", get_spec(name).default_kwargs.get("num_classes", 1000))
        determined["num_classes"] = n
        notes["num_classes"] = f"{n} from the checkpoint's classifier head (the registered default is {default})"
