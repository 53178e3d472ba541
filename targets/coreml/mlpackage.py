"""The saved `.mlpackage` on disk: the same model gives the same bytes, and what the package says about itself.

coremltools writes random item identifiers into Manifest.json on every save, and protobuf map order varies per
process; `make_package_deterministic` replaces the first by uuid5(item path) and re-serializes the second
deterministically. `read_metadata` decodes the user-defined metadata `vitedge parity` reads a package's model and
size from.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from ..base import umask_modes
from .mil_interpreter import load_program, package_paths
from .coremltools_import import quiet_coremltools

_MANIFEST_NS = uuid.UUID("6f1d9d2e-6a43-4d3b-9a56-7c0a7a2f9e11")  # namespace of our deterministic item ids


def manifest_item_id(item_path: str) -> str:
    """The identifier we give a package item: uuid5 of its path (same contents -> same Manifest.json)."""
    return str(uuid.uuid5(_MANIFEST_NS, item_path)).upper()


def make_package_deterministic(package: Path) -> dict:
    """Same model -> same bytes: the protobuf re-serialized with sorted map keys (protobuf's map order varies per
    process), and the random item identifiers in Manifest.json replaced by uuid5(item path) in a fixed layout.
    Returns the new manifest; the package must still resolve (the caller loads it back)."""
    spec_file, _ = package_paths(package)
    spec = load_program_spec(package)
    spec_file.write_bytes(spec.SerializeToString(deterministic=True))
    path = Path(package) / "Manifest.json"
    manifest = json.loads(path.read_text())
    entries = manifest.get("itemInfoEntries", {})
    new_ids = {old: manifest_item_id(info["path"]) for old, info in entries.items()}
    manifest["itemInfoEntries"] = {new_ids[old]: entries[old] for old in sorted(entries, key=lambda k: new_ids[k])}
    if manifest.get("rootModelIdentifier") in new_ids:
        manifest["rootModelIdentifier"] = new_ids[manifest["rootModelIdentifier"]]
    path.write_text(json.dumps(manifest, indent=4, sort_keys=True) + "\n")
    umask_modes(package)  # coremltools writes model.mlmodel and weights/ 0600 / 0700
    return manifest


def check_package_loads(package: Path) -> None:
    """The package resolves through libmodelpackage and its program decodes (raises otherwise)."""
    load_program(package)


def load_program_spec(package: Path):
    """The package's Model protobuf (description, metadata, program)."""
    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, _ = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    return spec


def read_metadata(package: Path) -> dict:
    """The package's user-defined metadata (what Xcode shows), JSON values decoded like the ONNX metadata:
    model, imgsz, batch, weights, checkpoint_sha256, precision, ios, input, preprocessing, reparam, overrides,
    attn_order, toolchain. `vitedge parity --artifact X.mlpackage` reads its model and size from here."""
    out = {}
    for k, v in load_program_spec(package).description.metadata.userDefined.items():
        if k.startswith("com.github.apple."):
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out
