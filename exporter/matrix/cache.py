"""The content-addressed matrix cache: keys, entries, and the plan-resolution memo. Imports no torch.

A cell's key is the sha256 of a canonical JSON of everything that shapes its artifact and its verdict: the
checkpoint's sha256 (or "untrained"), model, `set` overrides, size, batch, opset, ONNX exporter, rewrites,
attention order, target, precision, target options (a labels file by its sha256), tolerances and parity set (samples), the
CoreML verification mode, the vitedge version and a digest of its source and package data (a development
checkout changes without a version bump), Python, and the versions of the packages that shape the artifact (torch, numpy,
onnx, onnxruntime, onnxsim, plus coremltools / tensorrt for their targets). A TensorRT key also holds the GPU
architecture and the TensorRT version; a TensorRT cell with either unknown (no `trt_arch`, no
`tensorrt_version` and no local TensorRT) is never cached. `--bench` cells are keyed apart (their latency is
part of the entry).

Layout under the cache root (safe to share between drivers and CI runs: every write is a rename):
  plans/<key>.json          a validated plan resolved into cells (so a cached re-run needs no registry)
  cells/<kk>/<key>/cell/    the cell's export output folder;  .../entry.json  its status and key inputs
  hubs/<kk>/<key>/          a verified base (deploy-form + base ONNX + ground truth) shared by the cells of one
                            model and size (its hub.json records the sha256 of each file, re-hashed before a
                            cell is given it; the folders keep the base's former name)
Only entries whose status is "passed" are ever looked up: a failed cell is never reused as passed.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..verdict.parity_cost import SAMPLES_RULE
from ..core.digests import json_digest, source_digest
from ...targets.base import sha256_file
from ..core.report import CORE_PACKAGES, versions
from .folders import base_untrusted, untrusted
from .plan import Cell

SCHEMA = 1
BASE_PACKAGES = CORE_PACKAGES


@dataclass
class Env:
    """What this driver knows of the toolchain (read from package metadata: no imports)."""
    versions: dict = field(default_factory=versions)
    source: str = field(default_factory=source_digest)
    _shas: dict = field(default_factory=dict)

    def file_sha(self, path: str) -> str:
        st = os.stat(path)
        memo = (path, st.st_size, st.st_mtime_ns)
        if memo not in self._shas:
            self._shas[memo] = sha256_file(path)
        return self._shas[memo]

    def common(self, packages) -> dict:
        return {"schema": SCHEMA, "vitedge": self.versions.get("vitedge"), "vitedge_source": self.source,
                "python": ".".join(platform.python_version_tuple()[:2]),
                "toolchain": {p: self.versions.get(p) for p in packages}}


def _weights(cell: Cell, env: Env) -> dict:
    return {"model": cell.model, "checkpoint_sha256": env.file_sha(cell.checkpoint) if cell.checkpoint else None,
            "weights": "checkpoint" if cell.checkpoint else "untrained", "overrides": cell.overrides}


def base_key(cell: Cell, env: Env) -> tuple[str, dict]:
    """The shared verified base (deploy-form + base ONNX) of a model at one size: everything before the target.
    ("kind" keeps the base's former name: the keys of existing caches stay valid.)"""
    inputs = {"kind": "hub", **env.common(BASE_PACKAGES), **_weights(cell, env), "imgsz": cell.size,
              "batch": cell.batch, "opset": cell.opset, "exporter": cell.exporter, "rewrites": cell.rewrites,
              "attn_order": cell.attn_order, "samples": _samples(cell), "tolerance_fp32": cell.tolerances.get("fp32", {})}
    return json_digest(inputs), inputs


def cell_key(cell: Cell, env: Env, bench: bool = False) -> tuple[str, dict, str | None]:
    """(key, its inputs, why the cell is not cacheable or None)."""
    row = _row(cell.target)
    packages = BASE_PACKAGES + (row.packages if row is not None else
                                tuple(k for k in env.versions if k not in ("vitedge", "python", "platform")))
    options = dict(cell.options)
    if options.get("labels"):
        options["labels"] = {"sha256": env.file_sha(options["labels"])}
    inputs = {"kind": "cell", **env.common(packages), **_weights(cell, env), "imgsz": cell.size,
              "batch": cell.batch, "opset": cell.opset, "exporter": cell.exporter, "rewrites": cell.rewrites,
              "attn_order": cell.attn_order, "target": cell.target, "precision": cell.precision, "options": options,
              "tolerances": cell.tolerances, "samples": _samples(cell), "coreml_mode": cell.coreml_mode,
              "bench": bool(bench)}
    uncacheable = None
    if row is not None and row.cache_pin is not None:  # e.g. a TensorRT engine: its GPU architecture and version
        for p in row.packages:
            inputs["toolchain"].pop(p, None)  # held below, as pinned by the plan
        inputs[row.name], uncacheable = row.cache_pin(cell, env.versions)
    return json_digest(inputs), inputs, uncacheable


def _row(target: str):
    """The target's declared row; None for a bare "module:Class" entry, which declares no packages (its key then
    holds every known version)."""
    from ...targets import TARGETS, TargetRow

    row = TARGETS.get(target)
    return row if isinstance(row, TargetRow) else None


def trt_mismatch(cell: Cell, inputs: dict, report: dict | None) -> str | None:
    """Why a built TensorRT engine does not match its key (other GPU arch or TensorRT version), else None."""
    want = inputs.get("tensorrt")
    if not want or not report:
        return None
    info = ((report.get("artifacts") or {}).get("tensorrt") or {}).get("info") or {}
    built = info.get("versions") or {}
    cc = built.get("compute_capability")
    if want["arch"] and cc and want["arch"] != "sm_" + str(cc).replace(".", ""):
        return f"built on compute capability {cc}, the cell asks for {want['arch']}"
    ver = built.get("tensorrt") or (report.get("versions") or {}).get("tensorrt")
    if want["tensorrt"] and ver and not str(ver).startswith(str(want["tensorrt"])):
        return f"built with TensorRT {ver}, the cell's key pins {want['tensorrt']}"
    return None


def toolchain_drift(inputs: dict, report: dict | None) -> str | None:
    """Why a cell built elsewhere (a Ray node) is not cached under its key: the versions its report records
    differ from the driver's, which the key holds. None when they agree."""
    built = (report or {}).get("versions") or {}
    want = {"vitedge": inputs.get("vitedge"), **inputs.get("toolchain", {})}
    diff = [f"{p} {built[p]} (here {v})" for p, v in want.items() if p in built and built[p] != v]
    return f"not cached: built with {', '.join(diff)}" if diff else None


class Cache:
    def __init__(self, root: str | Path):
        self.root = Path(root)

    # -- plan memo ------------------------------------------------------------------------------------
    def plan_path(self, key: str) -> Path:
        return self.root / "plans" / f"{key}.json"

    def get_plan(self, key: str) -> dict | None:
        try:
            return json.loads(self.plan_path(key).read_text())
        except (OSError, ValueError):
            return None

    def put_plan(self, key: str, resolved: dict) -> None:
        _write_json(self.plan_path(key), resolved)

    # -- cells ----------------------------------------------------------------------------------------
    def cell_dir(self, key: str) -> Path:
        return self.root / "cells" / key[:2] / key

    def cell_output(self, key: str) -> Path:
        """Where a cell's export output lives in the cache (a worker with this filesystem exports into it)."""
        return self.cell_dir(key) / "cell"

    def lookup(self, key: str) -> dict | None:
        """The entry of a passed cell with this key, or None (failed, unverified or absent entries never hit). The
        entry's artifacts are not re-hashed here: `untrusted` does that before an entry is used."""
        d = self.cell_dir(key)
        try:
            entry = json.loads((d / "entry.json").read_text())
        except (OSError, ValueError):
            return None
        if entry.get("key") != key or entry.get("status") != "passed" or not (d / "cell" / "report.json").is_file():
            return None
        return entry

    def untrusted(self, key: str) -> str | None:
        """Why the cached cell `key` cannot be trusted (its artifacts re-hashed against its report), or None."""
        return untrusted(self.cell_output(key))

    def verify(self) -> list[tuple[str, str | None]]:
        """Every cell entry and every verified base of the cache, re-checked without building: [(key, why it is bad
        or None)]; a base's key is given as "hub <key>" (its folder's name, hubs/)."""
        out = []
        for entry_file in sorted(self.root.glob("cells/*/*/entry.json")):
            key = entry_file.parent.name
            try:
                entry = json.loads(entry_file.read_text())
            except (OSError, ValueError) as e:
                out.append((key, f"entry.json unreadable ({type(e).__name__})"))
                continue
            if entry.get("key") != key:
                out.append((key, f"entry.json names another key ({str(entry.get('key'))[:12]}...)"))
            elif entry.get("status") != "passed":
                out.append((key, None))  # never looked up: nothing to trust
            else:
                out.append((key, self.untrusted(key)))
        for meta in sorted(self.root.glob("hubs/*/*/hub.json")):
            out.append((f"hub {meta.parent.name}", base_untrusted(meta.parent)))
        return out

    def record(self, key: str, entry: dict) -> None:
        """Write a cell's entry.json (last, so that an entry is complete or absent)."""
        _write_json(self.cell_dir(key) / "entry.json", {"key": key, "recorded": time.time(), **entry})

    def drop(self, key: str) -> None:
        """Forget a cell (its entry first, so a half-removed folder is never an entry)."""
        d = self.cell_dir(key)
        (d / "entry.json").unlink(missing_ok=True)
        shutil.rmtree(d, ignore_errors=True)

    # -- verified bases (hubs/) ---------------------------------------------------------------------
    def base_dir(self, key: str) -> Path:
        return self.root / "hubs" / key[:2] / key


def _write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def _samples(cell: Cell):
    """The parity sample count of the key: as planned, or the name of the rule that picks it from the model."""
    return cell.samples if cell.samples is not None else SAMPLES_RULE
