"""The package root: its public names resolve lazily, and importing it changes nothing else in the process (no
import hook: the module paths from before exporter/ was grouped by job are gone, 0.x was never released)."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import vitedge


def test_importing_vitedge_adds_no_import_hook():
    code = "import sys; before = list(sys.meta_path); import vitedge; assert sys.meta_path == before, sys.meta_path"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("old", ["vitedge.exporter.parity", "vitedge.targets.ort", "vitedge.exporter.pipeline"])
def test_a_path_from_before_the_grouping_is_not_a_module(old):
    with pytest.raises(ModuleNotFoundError, match=old):
        importlib.import_module(old)


def test_the_tensorrt_package_serves_no_names_of_its_own():
    import vitedge.targets.tensorrt as package

    with pytest.raises(AttributeError):
        package.TensorRTTarget  # noqa: B018  (import it from vitedge.targets.tensorrt.target)


def test_every_public_name_resolves():
    for name in vitedge.__all__:
        assert getattr(vitedge, name) is not None, name


def test_the_checkpoint_room_is_one_entry_point_and_files_are_hashed_once():
    from vitedge import models
    from vitedge.models import checkpoints
    from vitedge.targets import base

    assert vitedge.load_checkpoint is checkpoints.load_checkpoint
    assert callable(checkpoints.identify) and checkpoints.Identified.__module__.endswith(".checkpoints.identify_model")
    assert base.sha256_file is models.digest.sha256_file  # targets share the models layer's one implementation


def test_the_file_hash_imports_without_torch():
    code = ("import sys; import vitedge.models.digest, vitedge.targets.base; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
