"""Deploy-form checkpoints: the folded state_dict plus what is needed to rebuild its module tree.

The file holds only tensors and plain metadata: a `.pth` loads under `torch.load(weights_only=True)` (no
pickled classes); a `.safetensors` file (the suffix decides) holds the state_dict as its tensors and the metadata
as string fields (text as it is, everything else as JSON). `load_deploy_checkpoint` rebuilds the structure by
re-parameterizing a fresh `create_model(name, **overrides)` at the recorded size and attention order, then
loads the state_dict strictly, so a mismatch is an error and never a silently half-loaded model.
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

from ...errors import CheckpointError, VitedgeError
from ...models.layers.norms import LinearNorm
from ...models.input_size import canonical, size_json, size_text
from ...models.registry import create_model, default_imgsz
from ...targets.base import umask_modes
from ..core import outdir
from ..verdict.equivalence import verify_equivalence
from ..reparam.build_forms import build_deploy_form, build_train_form
from ..core.progress import QUIET
from ..core.settings import ExportSettings
from ..reparam import available_rewrites, reparameterize
from ..reparam.engine import current_rewrite_names
from ..core.report import versions

FORMAT = "vitedge-deploy/1"
_PLAIN = (str, int, float, bool, type(None))
SAFETENSORS_SUFFIX = ".safetensors"
OUT_SUFFIXES = (".pth", ".pt", SAFETENSORS_SUFFIX)  # what `vitedge reparam --out` writes: torch.save or safetensors
# safetensors metadata fields stored as the text they are (absent = None); every other field is JSON
_TEXT_FIELDS = ("format", "model", "attn_order", "checkpoint_sha256")


def _plain(value, what: str):
    """Metadata must stay plain (str/number/bool/None, lists and dicts of them) to load without pickled classes."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, what) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, what) for k, v in value.items()}
    raise VitedgeError(f"{what} value {value!r} is not a plain str/number/bool; deploy checkpoints store plain "
                       "metadata only (pass overrides as literals)")


def save_deploy_checkpoint(deploy_model: nn.Module, path: str | Path, *, imgsz: int | None = None,
                           attn_order: str = "auto", checkpoint_sha256: str | None = None, force: bool = False) -> Path:
    """Write `deploy_model` (from `reparameterize`, folded for `imgsz`) to `path` atomically; refuses to overwrite
    without `force`. `imgsz` None is deprecated: the model's default size is recorded (the size `reparameterize`
    folds for when none is given), with a DeprecationWarning."""
    name = getattr(deploy_model, "vitedge_name", None)
    summary = getattr(deploy_model, "reparam_summary", None)
    if name is None or summary is None:
        raise VitedgeError("save_deploy_checkpoint needs a model from vitedge.reparameterize(create_model(...))")
    path = Path(path)
    if path.exists() and not force:
        raise VitedgeError(f"{path} exists; pass --force to overwrite it")
    if imgsz is None:  # the size once rode on the model; it is an argument now
        imgsz = default_imgsz(deploy_model)
        warnings.warn(f"save_deploy_checkpoint without imgsz records the model's default size {imgsz}; pass imgsz= "
                      "(the size the deploy-form was folded for)", DeprecationWarning, stacklevel=2)
    payload = {
        "format": FORMAT,
        "model": name,
        "overrides": _plain(dict(getattr(deploy_model, "vitedge_overrides", {})), "override"),
        "imgsz": size_json(imgsz),  # S, or "HxW" for a non-square size (plain data for the safe loader)
        "attn_order": attn_order,
        "rewrites": list(summary.rewrites),  # the rewrites applied: re-applying exactly these rebuilds the tree
        "attention_order": dict(summary.attention_order),
        "reparam": _plain(summary.to_dict(), "reparam summary"),
        "checkpoint_sha256": checkpoint_sha256,
        "versions": versions(),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in deploy_model.state_dict().items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    outdir.recover(path)  # temporary files of killed earlier writes of this path
    tmp = outdir.sibling(path, "tmp")  # not mkstemp: keep the umask's mode
    try:
        if path.suffix == SAFETENSORS_SUFFIX:
            _save_safetensors(payload, tmp)
        else:
            torch.save(payload, tmp)
        umask_modes(tmp)  # safetensors writes 0600: the umask's mode, as torch.save's
        os.replace(tmp, path)  # atomic: readers see the old file or the complete new one
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _save_safetensors(payload: dict, path: Path) -> None:
    from safetensors.torch import save_file

    # clone: safetensors refuses tensors that share storage (views, tied weights)
    tensors = {k: v.clone() for k, v in payload["state_dict"].items()}
    meta = {k: (v if k in _TEXT_FIELDS else json.dumps(v, sort_keys=True)) for k, v in payload.items()
            if k != "state_dict" and not (k in _TEXT_FIELDS and v is None)}
    save_file(tensors, str(path), metadata=meta)


def _read_safetensors(path: Path) -> dict:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            state = {k: f.get_tensor(k) for k in f.keys()}
        payload = {k: (v if k in _TEXT_FIELDS else json.loads(v)) for k, v in meta.items()}
    except (SafetensorError, OSError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"{path} is not a vitedge deploy checkpoint ({type(e).__name__}); "
                              "write one with `vitedge reparam`") from None
    payload.setdefault("checkpoint_sha256", None)
    payload["state_dict"] = state
    return payload


def read_deploy_checkpoint(path: str | Path) -> dict:
    """The raw payload (tensors + plain metadata): `.safetensors` by its suffix, else the restricted unpickler."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"deploy checkpoint {path} not found; write one with `vitedge reparam`")
    if path.suffix == SAFETENSORS_SUFFIX:
        payload = _read_safetensors(path)
    else:
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise CheckpointError(f"{path} is not a vitedge deploy checkpoint ({type(e).__name__}); "
                                  "write one with `vitedge reparam`") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a vitedge deploy checkpoint (format {FORMAT!r}); "
                              "train-form checkpoints go to --checkpoint")
    return payload


def _finish_schedules(model: nn.Module) -> None:
    # A fresh model's LN->RepBN counters say "not started"; only the structure matters here, so mark them
    # finished to keep reparameterize from warning about a schedule that the saved weights already ended.
    for m in model.modules():
        if isinstance(m, LinearNorm):
            m.iter.zero_()
            m.warm.zero_()


def load_deploy_checkpoint(path: str | Path) -> nn.Module:
    """Rebuild a deploy-form model from a `vitedge reparam` checkpoint (strict load)."""
    payload = read_deploy_checkpoint(path)
    model = create_model(payload["model"], **payload.get("overrides", {}))
    _finish_schedules(model)
    rewrites = payload.get("rewrites", True)  # a bool in files written before rewrites were switchable one by one
    if isinstance(rewrites, (list, tuple)):
        # files from before a rewrite was renamed record its old name: the same rewrite, read without a warning
        rewrites = payload["rewrites"] = current_rewrite_names(rewrites, warn=False)
        unknown = sorted(set(rewrites) - set(available_rewrites(model)))
        if unknown:
            raise CheckpointError(f"{path} was written with deploy-form rewrites this vitedge does not know "
                                  f"({', '.join(unknown)}); re-create it with `vitedge reparam`")
    payload["imgsz"] = canonical(payload["imgsz"])  # S or (H, W), as every size below the settings
    deploy = reparameterize(model, imgsz=payload["imgsz"], attn_order=payload.get("attn_order", "auto"),
                            rewrites=rewrites)
    if dict(deploy.reparam_summary.attention_order) != dict(payload.get("attention_order", {})):
        raise CheckpointError(f"{path}: attention orders differ from a fresh re-parameterization at imgsz "
                              f"{size_text(payload['imgsz'])}; re-create it with this vitedge version "
                              "(`vitedge reparam`)")
    state = payload["state_dict"]
    own = deploy.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in own.items()
              if k in state and state[k].shape != v.shape]
    if missing or unexpected or shapes:
        raise CheckpointError(f"{path} does not fit {payload['model']}'s deploy-form: {len(missing)} missing "
                              f"{missing[:3]}, {len(unexpected)} unexpected {unexpected[:3]}, {len(shapes)} mis-shaped "
                              f"{shapes[:3]}; re-create it with `vitedge reparam`")
    deploy.load_state_dict(state, strict=True)
    # Some deploy-form modules hold a tensor twice (one copy per backend or per head); they must agree.
    for name, m in deploy.named_modules():
        why = m.copies_disagree() if hasattr(m, "copies_disagree") else None
        if why:
            raise CheckpointError(f"{path}: {name}: {why} (the deploy-form keeps these copies equal; was the file "
                                  "edited?); change the train-form weights and re-create it with `vitedge reparam`")
    deploy.deploy_checkpoint_meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return deploy.eval()


@dataclass
class ReparamResult:
    path: Path | None          # None when the equivalence gate failed (nothing written)
    model: str
    imgsz: int | tuple         # S, or (H, W) for a non-square size
    weights: str
    summary: object            # ReparamSummary
    equivalence: object        # EquivalenceResult


# the settings `vitedge reparam` reads (the rest shape an export, and are refused rather than ignored)
REPARAM_SETTINGS = ("model", "checkpoint", "imgsz", "attn_order", "strict_schedule", "overrides", "force", "rewrites")


def reparam_checkpoint(model=None, out: str | Path | None = None, *, progress=None, **settings) -> ReparamResult:
    """`vitedge reparam`: load, fold, run the float64 gate, and write the deploy-form checkpoint `out` only if it
    passed. `model` is an ExportSettings or the model name, with the settings reparam reads as keywords
    (REPARAM_SETTINGS: checkpoint, imgsz, attn_order, strict_schedule, overrides, force, rewrites), as for
    `export`."""
    s = ExportSettings.build(model, settings, "reparam_checkpoint")
    s.only(REPARAM_SETTINGS, "reparam")
    model_name, checkpoint, overrides, force = s.model, s.checkpoint, s.overrides, s.force
    imgsz, attn_order = s.one_size(), s.attn_order or "auto"
    progress = progress or QUIET
    if out is None:
        raise VitedgeError("vitedge reparam needs --out PATH (the deploy checkpoint to write)")
    out = Path(out)
    if out.exists() and not force:
        raise VitedgeError(f"{out} exists; pass --force to overwrite it")
    if out.is_dir():
        raise VitedgeError(f"--out {out} is a folder; give a file path such as {out / 'deploy.pth'}")
    if out.suffix not in OUT_SUFFIXES:
        raise VitedgeError(f"--out {out}: a deploy-form checkpoint is written as {' or '.join(OUT_SUFFIXES)} (the "
                           f"suffix decides the format); give a path such as {out.with_suffix('.pth')}")
    _plain(dict(overrides or {}), "override")
    with progress.step("building the train-form model"):
        loaded = build_train_form(model_name, checkpoint, overrides)
    size = loaded.at_size(imgsz)
    with progress.step("re-parameterizing"):
        deploy, deploy64 = build_deploy_form(loaded.model, size, True, attn_order, s.strict_schedule, s.rewrites)
    with progress.step("equivalence gate (float64)"):
        eq = verify_equivalence(loaded.model, deploy64, size, raise_on_fail=False)
    path = None
    if eq.passed:
        path = save_deploy_checkpoint(deploy, out, imgsz=size, attn_order=attn_order,
                                      checkpoint_sha256=loaded.checkpoint_sha256, force=force)
    return ReparamResult(path, loaded.name, size, loaded.weights, deploy.reparam_summary, eq)
