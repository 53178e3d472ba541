"""Checkpoint sources beyond local files: `hf-hub:ORG/REPO[@REVISION][:FILE]` and `timm:NAME[.TAG]`.

Both resolve to a file in the Hugging Face cache through `huggingface_hub` (an optional extra:
`pip install 'vitedge[hub]'`), which then goes through the same safe loader as a local path
(`load.load_checkpoint`). Resolution honours huggingface_hub's offline mode and cache location, read when
the checkpoint is resolved (not only when huggingface_hub was imported): with `HF_HUB_OFFLINE=1` only the
cache is consulted (`HF_HUB_CACHE`, else `HF_HOME/hub`, else huggingface_hub's default), and a file that is not
there is an error naming the repo, the file and the command that fetches it.

Without FILE, the first of `model.safetensors`, `pytorch_model.bin`, `pytorch_model.pth` that the repo has is
used (timm's order: safetensors first).

`timm:NAME` never imports timm (a test-only dependency here). timm publishes its pretrained weights on the hub
as `timm/<architecture>.<tag>` repos (timm's `_registry`: `hf_hub_id='timm/'` completed with the model name
and tag) holding `model.safetensors` / `pytorch_model.bin` with timm's key names; `load_checkpoint` detects
those names and remaps them (SwiftFormer: `timm_swiftformer`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ...errors import CheckpointError

HF_PREFIX = "hf-hub:"
TIMM_PREFIX = "timm:"
DEFAULT_FILES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth")
HUB_HINT = "pip install 'vitedge[hub]'"
# timm architectures with pretrained weights that fit a vitedge model: {timm name: (default tag, vitedge model)}
# (timm 1.0 models/swiftformer.py default_cfgs). SLAB and SimA are not in timm.
TIMM_WEIGHTS = {
    "swiftformer_xs": ("dist_in1k", "swiftformer_xs"),
    "swiftformer_s": ("dist_in1k", "swiftformer_s"),
    "swiftformer_l1": ("dist_in1k", "swiftformer_l1"),
    "swiftformer_l3": ("dist_in1k", "swiftformer_l3"),
}
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TIMM = re.compile(r"^(?P<arch>[a-z0-9_]+)(?:\.(?P<tag>[A-Za-z0-9_]+))?$")


@dataclass(frozen=True)
class HubSource:
    """Where a `hf-hub:` / `timm:` checkpoint lives on the Hugging Face Hub."""

    spec: str                   # as given
    repo_id: str
    revision: str | None        # None = the repo's main branch
    files: tuple[str, ...]      # candidates, in order; the first the repo has is used
    model: str | None = None    # the vitedge model the weights fit (timm names), when known


def is_hub_spec(checkpoint) -> bool:
    return isinstance(checkpoint, str) and checkpoint.startswith((HF_PREFIX, TIMM_PREFIX))


def parse_source(spec: str) -> HubSource:
    """Parse `hf-hub:ORG/REPO[@REVISION][:FILE]` or `timm:NAME[.TAG]`; CheckpointError when malformed."""
    if spec.startswith(HF_PREFIX):
        body = spec[len(HF_PREFIX):]
        repo, _, filename = body.partition(":")
        repo, _, revision = repo.partition("@")
        if not _REPO.match(repo) or (filename and (filename.startswith("/") or ".." in filename.split("/"))):
            raise CheckpointError(f"--checkpoint {spec!r} is not hf-hub:ORG/REPO[@REVISION][:FILE] "
                                  "(e.g. hf-hub:timm/swiftformer_xs.dist_in1k:model.safetensors)")
        return HubSource(spec, repo, revision or None, (filename,) if filename else DEFAULT_FILES)
    if spec.startswith(TIMM_PREFIX):
        m = _TIMM.match(spec[len(TIMM_PREFIX):])
        if not m or m["arch"] not in TIMM_WEIGHTS:
            raise CheckpointError(f"--checkpoint {spec!r}: timm has pretrained weights vitedge can load for "
                                  f"{', '.join(TIMM_WEIGHTS)} (timm:NAME[.TAG]); other families are not in timm")
        tag, model = TIMM_WEIGHTS[m["arch"]]
        return HubSource(spec, f"timm/{m['arch']}.{m['tag'] or tag}", None, DEFAULT_FILES, model)
    raise CheckpointError(f"--checkpoint {spec!r} has no {HF_PREFIX} or {TIMM_PREFIX} prefix")


def resolve_checkpoint(checkpoint, model_name: str | None = None):
    """A local path for `checkpoint`: `hf-hub:` / `timm:` specs are fetched into (or found in) the Hugging Face
    cache; anything else is returned as given. `model_name`: the vitedge model the weights will be loaded into,
    checked against a timm name's own model."""
    if not is_hub_spec(checkpoint):
        return checkpoint
    source = parse_source(checkpoint)
    if source.model and model_name and model_name != source.model:
        raise CheckpointError(f"--checkpoint {source.spec} holds {source.model} weights, not {model_name}'s: "
                              f"use --model {source.model}")
    return fetch(source)


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_settings() -> tuple[bool, str | None]:
    """(offline, cache folder) as the environment says now; None = huggingface_hub's own default."""
    from huggingface_hub import constants

    offline = constants.HF_HUB_OFFLINE or _env_true("HF_HUB_OFFLINE")
    cache = os.environ.get("HF_HUB_CACHE") or (os.path.join(os.environ["HF_HOME"], "hub")
                                               if os.environ.get("HF_HOME") else None)
    return offline, cache


HUB_PROBE_TIMEOUT_S = 3.0


def hub_unreachable(timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the Hugging Face Hub cannot be reached (one TCP connection to its endpoint, `timeout` seconds at most),
    or None. Without this, huggingface_hub retries each candidate file with back-off: over a minute of "Retrying"
    lines on a machine without network before the same answer."""
    import socket
    import urllib.request
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    if urllib.request.getproxies() and not urllib.request.proxy_bypass(host):
        return None  # through a proxy a direct connection proves nothing: huggingface_hub decides
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        return f"one connection to {host}:{port} failed: {type(e).__name__}"
    return None


def fetch(source: HubSource) -> Path:
    """The first of `source.files` that the repo has, as a local file (download or cache). An `hf-hub:` repo
    whose config.json names a transformers model_type (a save_pretrained upload) comes as its snapshot folder:
    config.json, preprocessor_config.json when it has one, and its weights (every shard of a sharded index)."""
    try:
        import huggingface_hub  # noqa: F401  (an optional extra)
    except ImportError:
        raise CheckpointError(f"--checkpoint {source.spec} needs huggingface_hub: {HUB_HINT}") from None
    hub = _Hub(source)
    if source.spec.startswith(HF_PREFIX):
        folder = hub.transformers_folder()
        if folder is not None:
            return folder
    for filename in source.files:
        got = hub.get(filename)
        if got is not None:
            return got
    hub.raise_missing(source.files)


class _Hub:
    """One repo's files through huggingface_hub: the offline / unreachable decision is taken once."""

    def __init__(self, source: HubSource):
        self.source = source
        self.offline, self.cache = hub_settings()
        self.unreachable = None if self.offline else hub_unreachable()
        self.where = f"{source.repo_id}{f'@{source.revision}' if source.revision else ''}"
        self.not_cached: list[str] = []

    def get(self, filename: str) -> Path | None:
        """The file, or None when the repo has no such file (or it is not cached offline: `not_cached`)."""
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import (EntryNotFoundError, LocalEntryNotFoundError, RepositoryNotFoundError,
                                            RevisionNotFoundError)

        s = self.source
        try:
            return Path(hf_hub_download(s.repo_id, filename, revision=s.revision, cache_dir=self.cache,
                                        local_files_only=self.offline or self.unreachable is not None))
        except LocalEntryNotFoundError:  # offline (or unreachable hub) and not in the cache
            self.not_cached.append(filename)
        except EntryNotFoundError:  # the hub answered: the repo has no such file
            return None
        except (RepositoryNotFoundError, RevisionNotFoundError) as e:
            raise CheckpointError(f"--checkpoint {s.spec}: {type(e).__name__} for {self.where} on the Hugging Face "
                                  "Hub (check the name, or log in with `hf auth login` for a private or gated "
                                  "repo)") from None
        except OSError as e:  # network errors other than "not cached" (ConnectionError, timeouts)
            raise CheckpointError(f"--checkpoint {s.spec}: could not fetch {filename} from {self.where} "
                                  f"({type(e).__name__}); retry, or fetch it first with `hf download "
                                  f"{s.repo_id} {filename}`") from None
        return None

    def transformers_folder(self) -> Path | None:
        """The snapshot folder of a transformers repo (config.json with model_type), or None for other repos."""
        from .transformers_folder import CONFIG, PREPROCESSOR, WEIGHTS, is_transformers

        config = self.get(CONFIG)
        if config is None or not is_transformers(config.parent):
            self.not_cached = []  # (a repo without config.json is looked up file by file)
            return None
        self.get(PREPROCESSOR)
        if self.source.files != DEFAULT_FILES:  # the weight file was named: that one
            names = self.source.files
        else:
            names = WEIGHTS
        for name in names:
            got = self.get(name)
            if got is not None:
                if name.endswith(".index.json"):
                    import json

                    shards = dict.fromkeys(json.loads(got.read_text()).get("weight_map", {}).values())
                    missing = [n for n in shards if isinstance(n, str) and self.get(n) is None]
                    if missing:
                        self.raise_missing(tuple(missing))
                return got if self.source.files != DEFAULT_FILES else config.parent
        self.raise_missing(names)

    def raise_missing(self, files: tuple[str, ...]):
        s = self.source
        if self.not_cached:
            mode = ("HF_HUB_OFFLINE=1 is set" if self.offline else
                    f"the Hugging Face Hub is unreachable ({self.unreachable})")
            then = ("or unset HF_HUB_OFFLINE" if self.offline else
                    "or, offline on purpose, set HF_HUB_OFFLINE=1 to skip the connection attempt")
            revision = f" --revision {s.revision}" if s.revision else ""
            raise CheckpointError(f"--checkpoint {s.spec}: {' or '.join(self.not_cached)} of {self.where} is not in "
                                  f"the Hugging Face cache ({self.cache or 'default location'}) and {mode}; fetch "
                                  f"it on a machine with network: `hf download {s.repo_id} {self.not_cached[0]}"
                                  f"{revision}` (into the same HF_HUB_CACHE), {then}")
        at = f"@{s.revision}" if s.revision else ""
        raise CheckpointError(f"--checkpoint {s.spec}: {self.where} has no {' or '.join(files)}; name the file: "
                              f"hf-hub:{s.repo_id}{at}:FILE")
