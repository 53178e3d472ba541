"""Target.held_sizes: each target names the sizes one artifact of its holds from the metadata it wrote itself, so the
flow layer (exporter/flow/artifact_files.py) reads them without knowing any target's metadata keys."""
from __future__ import annotations

from pathlib import Path

import pytest

from vitedge.targets import get_target

SIZES = {"size_224x224": [224, 224], "size_256x320": [256, 320]}


@pytest.mark.parametrize("name,key", [("coreml", "functions"), ("executorch", "methods")])
def test_multi_size_targets_read_their_own_key(name, key):
    t = get_target(name)
    assert t.held_sizes({key: SIZES, "imgsz": [224, 224]}) == SIZES
    assert t.held_sizes({"imgsz": [224, 224]}) == {}  # one size
    assert t.held_sizes({key: {}}) == {} and t.held_sizes({key: "none"}) == {}
    other = "methods" if key == "functions" else "functions"
    assert t.held_sizes({other: SIZES}) == {}  # another target's key is not its own


@pytest.mark.parametrize("name", ["onnx", "tensorrt"])
def test_one_file_per_size_targets_hold_one(name):
    try:
        t = get_target(name)
    except ImportError as e:
        pytest.skip(f"{name} target not importable here: {e}")
    assert t.held_sizes({"functions": SIZES, "methods": SIZES, "imgsz": [224, 224]}) == {}


def test_flow_layer_names_no_target_metadata_key():
    src = (Path(__file__).resolve().parents[1] / "exporter" / "flow" / "artifact_files.py").read_text()
    for key in ('"functions"', '"methods"', "ENTRY_KEYS"):
        assert key not in src
