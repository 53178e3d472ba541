"""The verified base of one model at one size (exporter/flow/verified_base.py), as a folder of the matrix cache
(cache.py: hubs/<key>/), behind the export pipeline's BaseStore interface: the first cell of a group builds it
(`put`), the others reuse it (`get`). The file and folder names keep the base's former name, "hub", so that
caches written before the rename stay valid.

Files: deploy.pth (a deploy-form checkpoint: tensors and plain metadata, loaded with the restricted
unpickler, so a shared cache never runs code from its files), hub.onnx (the simplified, verified fp32 base graph
with its metadata), raw.onnx (the unsimplified graph, for a failed cell's quarantine), y64.npy and y32.npy (the
train-form's logits on the parity set in float64 and float32: the ground truth), hub.json (the verified hops,
re-parameterization facts and the parity set's tags; written last: a folder without it is not a verified base).
The folder is built in a hidden sibling and renamed into place.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx

from ..verdict.criteria import GroundTruth
from ..flow.deploy_checkpoint import load_deploy_checkpoint, save_deploy_checkpoint
from ..flow.verified_base import VerifiedBase
from ..core.report import Hop, ReparamInfo
from ..core import outdir
from .folders import BASE_META, base_files, base_untrusted

FORMAT = "vitedge-hub/4"  # /2: the float64 ground truth replaced the float32 reference; /3: hub.json records
# how the ONNX was exported (`export`); /4: hub.json records the sha256 of every file (`files`), re-hashed on use
META = BASE_META


class FolderBaseStore:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    def get(self) -> VerifiedBase | None:
        try:
            meta = json.loads((self.path / META).read_text())
        except (OSError, ValueError):
            return None
        if meta.get("format") != FORMAT or base_untrusted(self.path) is not None:
            shutil.rmtree(self.path, ignore_errors=True)  # never served; the cell rebuilds and stores it afresh
            return None
        try:
            raw = self.path / "raw.onnx"
            deploy = load_deploy_checkpoint(self.path / "deploy.pth")
            truth = GroundTruth(np.load(self.path / "y64.npy"), np.load(self.path / "y32.npy"), tuple(meta["sets"]),
                                None if meta["labels"] is None else np.asarray(meta["labels"], np.int64),
                                meta["float32_threads"])
            return VerifiedBase(deploy=deploy, imgsz=deploy.deploy_checkpoint_meta["imgsz"],
                                onnx_path=self.path / "hub.onnx", raw=onnx.load(str(raw)) if raw.is_file() else None,
                                truth=truth, inputs=meta["inputs"], hops=[Hop.from_dict(h) for h in meta["hops"]],
                                reparam=ReparamInfo(**meta["reparam"]), attn_order=meta["attn_order"],
                                weights=meta["weights"], checkpoint_sha256=meta["checkpoint_sha256"],
                                overrides=meta["overrides"], export=meta["export"], resized=meta.get("resized", []))
        except Exception:  # noqa: BLE001  (a damaged base is rebuilt, never trusted)
            shutil.rmtree(self.path, ignore_errors=True)
            return None

    def put(self, base: VerifiedBase) -> None:
        if (self.path / META).is_file():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        outdir.recover(self.path)
        tmp = outdir.sibling(self.path, "tmp")
        try:
            tmp.mkdir()
            save_deploy_checkpoint(base.deploy, tmp / "deploy.pth", imgsz=base.imgsz, attn_order=base.attn_order,
                                   checkpoint_sha256=base.checkpoint_sha256)
            shutil.copyfile(base.onnx_path, tmp / "hub.onnx")
            if base.raw is not None:
                onnx.save(base.raw, str(tmp / "raw.onnx"))
            np.save(tmp / "y64.npy", base.truth.y64)
            np.save(tmp / "y32.npy", base.truth.y32)
            labels = base.truth.labels
            meta = {"format": FORMAT, "hops": [_plain(h) for h in base.hops], "sets": list(base.truth.sets),
                    "labels": None if labels is None else [int(v) for v in labels],
                    "float32_threads": base.truth.float32_threads, "inputs": base.inputs,
                    "reparam": _plain(base.reparam), "attn_order": base.attn_order, "weights": base.weights,
                    "checkpoint_sha256": base.checkpoint_sha256, "overrides": base.overrides, "export": base.export,
                    "resized": base.resized, "files": base_files(tmp)}
            (tmp / META).write_text(json.dumps(meta, indent=1, default=_json) + "\n")
            try:
                os.rename(tmp, self.path)
            except OSError:  # another cell stored this base first: keep theirs
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def _plain(obj) -> dict:
    from dataclasses import asdict

    from ..core.report import finite

    return finite(asdict(obj))


def _json(o):
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
