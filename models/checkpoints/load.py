"""Load a checkpoint into a train-form model: containers, layout remaps, strict checks, safe reading.

    result = load_checkpoint(model, "swiftformer_xs.pth")      # strict: raises CheckpointError on any mismatch
    print(result.summary())

Steps, each visible in the returned `LoadResult`:
1. read the file without running code from it (`safe_pickle`, or `safetensors`);
2. find the weights in the container (`model`, `state_dict`, `model_ema`, `state_dict_ema`, or a bare dict);
3. strip wrapper prefixes (`module.` from DDP, `_orig_mod.` from torch.compile);
4. cast fp16/bf16 to fp32, refuse NaN/Inf;
5. apply the layout remaps whose key pattern is detected against the *target model* - never guessed, always
   listed in `result.remaps`. Each model module keeps its remaps beside its models and registers them
   (`registry.register_model_module`): timm's SwiftFormer names in models/swiftformer.py, SLAB's LinearNorm <-> RepBN
   norm layouts in models/slab_deit.py;
6. compare keys and shapes; strict mode raises one line with the first few problems and a hint
   (e.g. "the checkpoint fits swiftformer_s") when another registered variant matches.
LinearNorm schedule buffers (`warm`, `iter`, `total_step`) are loaded as stored.
"""
from __future__ import annotations

import os
import struct
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn

from ...errors import CheckpointError
from .hub_sources import resolve_checkpoint
from .keys import compare, hint, match_registered, remap_state_dict
from .safe_pickle import Inert, TorchFile, load_torch_file
from .transformers_folder import CONFIG, WEIGHTS, is_transformers, open_folder, weight_file_in

CONTAINER_KEYS = ("model", "state_dict", "model_ema", "state_dict_ema")
EMA_CONTAINER_KEYS = ("model_ema", "state_dict_ema", "model", "state_dict")
HALF_DTYPES = (torch.float16, torch.bfloat16)
SHOW = 3  # keys shown per problem kind in one-line errors

__all__ = ["LoadResult", "load_checkpoint", "read_checkpoint", "read_weights", "extract_state_dict",
           "remap_state_dict", "compare", "match_registered", "CheckpointError"]


@dataclass
class LoadResult:
    """What `load_checkpoint` did. `remaps` names every key rewrite that was applied, in order."""

    path: str
    format: str  # "torch-zip" | "torch-legacy" | "safetensors" | "in-memory"
    source_key: str | None  # container entry the weights came from ("model", "model_ema", ...); None = bare dict
    remaps: list[str] = field(default_factory=list)
    missing_keys: list[str] = field(default_factory=list)
    unexpected_keys: list[str] = field(default_factory=list)
    mismatched_keys: list[tuple[str, tuple, tuple]] = field(default_factory=list)  # (key, checkpoint, model)
    cast: dict[str, int] = field(default_factory=dict)  # source dtype -> number of tensors cast to float32
    loaded: int = 0  # tensors copied into the model
    container_keys: list[str] = field(default_factory=list)  # top-level keys of the file's container
    metadata: dict = field(default_factory=dict)  # harmless extras as plain data: epoch, args, config, ...
    placeholders: list[str] = field(default_factory=list)  # classes kept inert (never imported): argparse.Namespace

    @property
    def ok(self) -> bool:
        return not (self.missing_keys or self.unexpected_keys or self.mismatched_keys)

    def summary(self) -> str:
        src = f"[{self.source_key!r}]" if self.source_key else "(bare state_dict)"
        parts = [f"loaded {self.loaded} tensors from {self.path} {src} ({self.format})"]
        parts += self.remaps
        parts += [f"cast {n} {dt} tensors to float32" for dt, n in self.cast.items()]
        if not self.ok:
            parts.append(_problems(self))
        return "; ".join(parts)


# --------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------
def _looks_like_safetensors(path: Path, size: int) -> bool:
    if path.suffix == ".safetensors":
        return True
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n <= size - 8 and head[8:9] == b"{"


def _read_safetensors(path: Path) -> TorchFile:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            tensors = OrderedDict((k, f.get_tensor(k)) for k in f.keys())
            meta = dict(f.metadata() or {})
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{path} is a corrupt or truncated safetensors file ({str(e)[:100]}); "
                              "re-download or re-save it") from None
    return TorchFile(tensors, "safetensors", metadata=meta)


def read_checkpoint(path: str | os.PathLike) -> TorchFile:
    """Read a checkpoint safely (torch.save zip/legacy, .safetensors, or a transformers save_pretrained folder:
    its weight file or every shard of its index, merged); no code from it runs. `hf-hub:` / `timm:` sources are
    resolved to a file (or a transformers repo's folder) in the Hugging Face cache first (`hub_sources`)."""
    p = Path(resolve_checkpoint(path))
    if not p.exists():
        raise CheckpointError(f"checkpoint {p} not found: check the path")
    if is_transformers(p):
        return read_weights(open_folder(p).weights)
    if p.is_dir():
        single = weight_file_in(p)
        if single is None:
            raise CheckpointError(f"{p} is a directory, not a checkpoint file: pass the .pth/.safetensors file in it, "
                                  f"or a transformers save_pretrained folder ({CONFIG} with "
                                  f"{' or '.join(WEIGHTS[::2])})")
        p = single
    return _read_file(p)


def read_weights(files: tuple[Path, ...]) -> TorchFile:
    """The tensors of one weight file, or of every shard of a sharded checkpoint merged into one state_dict."""
    if len(files) == 1:
        return _read_file(files[0])
    merged: OrderedDict = OrderedDict()
    formats, placeholders = set(), []
    for f in files:
        part = _read_file(f)
        sd, _ = extract_state_dict(part.obj, str(f))
        twice = [k for k in sd if k in merged]
        if twice:
            raise CheckpointError(f"{f} repeats {_few(twice)} from another shard; re-save the model with "
                                  "save_pretrained")
        merged.update(sd)
        formats.add(part.format)
        placeholders += part.placeholders
    return TorchFile(merged, f"{'+'.join(sorted(formats))} ({len(files)} shards)", placeholders)


def _read_file(p: Path) -> TorchFile:
    size = p.stat().st_size
    if size == 0:
        raise CheckpointError(f"{p} is empty (0 bytes): the download or save did not finish")
    if _looks_like_safetensors(p, size):
        return _read_safetensors(p)
    return load_torch_file(p)


# --------------------------------------------------------------------------------------------------
# Containers and metadata
# --------------------------------------------------------------------------------------------------
def _is_state_dict(obj: Any) -> bool:
    # Mostly tensors under string keys; a stray non-tensor entry (`_extra_state`, a counter) is tolerated.
    if not (isinstance(obj, Mapping) and obj and all(isinstance(k, str) for k in obj)):
        return False
    n_tensors = sum(isinstance(v, torch.Tensor) for v in obj.values())
    return n_tensors > 0 and 2 * n_tensors >= len(obj)


def _tensors_only(sd: Mapping) -> tuple[OrderedDict, list[str]]:
    dropped = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    notes = [f"ignored {len(dropped)} non-tensor entries ({_few(dropped)})"] if dropped else []
    return OrderedDict((k, v) for k, v in sd.items() if isinstance(v, torch.Tensor)), notes


def _holds_tensors(obj: Any, depth: int = 0) -> bool:
    if depth > 50:  # pickles may hold cycles; this deep is not metadata anyway
        return True
    if isinstance(obj, torch.Tensor):
        return obj.numel() > 1
    if isinstance(obj, Mapping):
        return any(_holds_tensors(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(_holds_tensors(v, depth + 1) for v in obj)
    if isinstance(obj, Inert):
        return _holds_tensors(obj.to_plain(), depth + 1)
    return False


def to_plain(obj: Any, depth: int = 0) -> Any:
    """Plain Python data (dict/list/str/number/None) for metadata; inert objects become their content."""
    if depth > 50:
        return "..."
    if isinstance(obj, Inert):
        return to_plain(obj.to_plain(), depth + 1)
    if isinstance(obj, Mapping):
        return {(k if isinstance(k, (str, int, float, bool)) else str(k)): to_plain(v, depth + 1)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [to_plain(v, depth + 1) for v in obj]
    if isinstance(obj, torch.Tensor):
        return obj.item() if obj.numel() == 1 else f"<tensor {tuple(obj.shape)}>"
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, bytes):
        return obj.decode("utf-8", "replace")
    return str(obj)


def extract_state_dict(obj: Any, where: str, use_ema: bool = False) -> tuple[Mapping, str | None]:
    """The weights inside a loaded container, and the container key they came from (None = bare)."""
    if isinstance(obj, Mapping):
        for key in EMA_CONTAINER_KEYS if use_ema else CONTAINER_KEYS:
            if _is_state_dict(obj.get(key)):
                return obj[key], key
            if _is_pickled_module(obj.get(key)):
                _refuse_module(obj[key], where)
        if _is_state_dict(obj):
            return obj, None
        keys = ", ".join(map(str, list(obj)[:8])) + (", ..." if len(obj) > 8 else "")
        raise CheckpointError(f"{where}: no state_dict found in the container (keys: {keys}); expected one of "
                              f"{', '.join(CONTAINER_KEYS)} holding tensors, or a bare state_dict")
    if _is_pickled_module(obj):
        _refuse_module(obj, where)
    raise CheckpointError(f"{where} is not a checkpoint: it holds a {type(obj).__name__}, not a dict of tensors")


def _is_pickled_module(obj: Any) -> bool:
    # `torch.save(model)`: an nn.Module arrives as an inert object whose state has `_parameters`.
    return isinstance(obj, Inert) and isinstance(obj.to_plain(), dict) and "_parameters" in obj.to_plain()


def _refuse_module(obj: Inert, where: str):
    raise CheckpointError(f"{where} holds a pickled nn.Module ({type(obj).qualified_name}), not a state_dict: "
                          "re-save it with torch.save(model.state_dict(), path)")


def _metadata(obj: Any, source_key: str | None) -> tuple[list[str], dict]:
    if not isinstance(obj, Mapping) or source_key is None:
        return [], {}
    keys = [str(k) for k in obj]
    meta = {str(k): to_plain(v) for k, v in obj.items() if k != source_key and not _holds_tensors(v)}
    return keys, meta


# --------------------------------------------------------------------------------------------------
# Values: precision and finiteness
# --------------------------------------------------------------------------------------------------
def _cast_and_check(sd: OrderedDict, where: str) -> dict[str, int]:
    cast: dict[str, int] = {}
    for k, v in sd.items():
        if v.dtype in HALF_DTYPES:
            name = str(v.dtype).replace("torch.", "")
            cast[name] = cast.get(name, 0) + 1
            v = sd[k] = v.float()
        if v.is_floating_point() and v.device.type != "meta":
            finite = torch.isfinite(v)
            if not bool(finite.all()):
                bad = int((~finite).sum())
                raise CheckpointError(f"{where}: weight {k!r} has {bad} NaN/Inf value(s) of {v.numel()}: the "
                                      "checkpoint is broken (diverged training or a corrupt file); use an earlier one")
    return cast


# --------------------------------------------------------------------------------------------------
# Comparison, hints, loading
# --------------------------------------------------------------------------------------------------
def _few(items: list[str]) -> str:
    more = f", +{len(items) - SHOW} more" if len(items) > SHOW else ""
    return ", ".join(items[:SHOW]) + more


def _problems(r: LoadResult) -> str:
    out = []
    if r.missing_keys:
        out.append(f"{len(r.missing_keys)} missing ({_few(r.missing_keys)})")
    if r.unexpected_keys:
        out.append(f"{len(r.unexpected_keys)} unexpected ({_few(r.unexpected_keys)})")
    if r.mismatched_keys:
        shown = [f"{k}: checkpoint {list(a)} vs model {list(b)}" for k, a, b in r.mismatched_keys]
        out.append(f"{len(r.mismatched_keys)} shape mismatches ({_few(shown)})")
    return ", ".join(out)


def load_checkpoint(model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, Any] | TorchFile,
                    strict: bool = True, *, use_ema: bool = False, where: str | None = None) -> LoadResult:
    """Load `checkpoint` (a file or transformers folder path, an already loaded container/state_dict, or a
    TorchFile read by `read_checkpoint`, named `where` in messages) into `model` in place.

    strict=True (default): any missing, unexpected or mis-shaped key raises CheckpointError (one line, the
    first few keys of each kind, counts, and a hint such as "the checkpoint fits swiftformer_s").
    strict=False: loads every key whose name and shape fit and lists the rest in the result.
    use_ema: prefer `model_ema` / `state_dict_ema` over `model` / `state_dict` when both are present.
    Always raises CheckpointError for unreadable/corrupt/unsafe files and NaN/Inf weights.
    """
    if isinstance(checkpoint, TorchFile):
        where, raw = where or "<checkpoint>", checkpoint
    elif isinstance(checkpoint, Mapping):
        where, raw = where or "<state_dict>", TorchFile(checkpoint, "in-memory")
    else:  # a timm: source names its model: checked before anything is fetched
        local = resolve_checkpoint(checkpoint, getattr(model, "vitedge_name", None))
        where, raw = str(checkpoint), read_checkpoint(local)
    sd, source_key = extract_state_dict(raw.obj, where, use_ema)
    container_keys, metadata = _metadata(raw.obj, source_key)
    metadata.update(raw.metadata)

    model_sd = model.state_dict()
    sd, dropped = _tensors_only(sd)
    original = sd
    sd, remaps = remap_state_dict(sd, model_sd)
    remaps = dropped + remaps
    cast = _cast_and_check(sd, where)
    missing, unexpected, mismatched = compare(sd, model_sd)
    result = LoadResult(where, raw.format, source_key, remaps, missing, unexpected, mismatched, cast,
                        container_keys=container_keys, metadata=metadata, placeholders=list(raw.placeholders))
    if strict and not result.ok:
        name = getattr(model, "vitedge_name", type(model).__name__)
        after = f" after {len(remaps)} remap(s)" if remaps else ""
        raise CheckpointError(f"{where} does not fit {name}{after}: {_problems(result)}; {hint(original, model)}",
                              api_hint="or pass strict=False to load only what fits")
    bad = {k for k, _, _ in mismatched}
    to_load = OrderedDict((k, v) for k, v in sd.items() if k in model_sd and k not in bad)
    on_meta = any(t.device.type == "meta" for t in model_sd.values())
    model.load_state_dict(to_load, strict=False, assign=on_meta)  # assign: fill a model built on `meta`
    result.loaded = len(to_load)
    return result
