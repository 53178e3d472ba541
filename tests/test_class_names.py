"""Class names live in one place, targets/labels.py: the --labels reader, the names an artifact carries and the
model's class count they are checked against. No other module reads or counts them."""
from __future__ import annotations

import ast

import pytest
import torch.nn as nn

from vitedge.errors import VitedgeError
from vitedge.targets.labels import class_names, labels_of, model_classes
from vitedge.tests.test_architecture import ROOT, package_modules

ONE_HOME = ("class_names", "labels_of", "model_classes", "num_classes")


def test_labels_are_checked_against_the_models_own_class_count(tmp_path):
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 4 * 4, 5))   # 5 classes at 4 x 4 px
    assert model_classes(model, 4) == 5
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text("a\nb\nc\nd\ne\n")
    bad.write_text("a\nb\nc\n")
    assert class_names(good, model, 4) == ["a", "b", "c", "d", "e"] and class_names(None, model, 4) is None
    with pytest.raises(VitedgeError, match="has 3 labels but the model has 5 classes"):
        class_names(bad, model, 4)
    assert labels_of({"labels": ["cat", 7]}) == ["cat", "7"] and labels_of({"labels": "cat"}) is None


def test_no_other_module_reads_or_counts_class_names():
    defined = sorted(f"{p.relative_to(ROOT)}: {node.name}" for p in package_modules().values()
                     for node in ast.walk(ast.parse(p.read_text()))
                     if isinstance(node, ast.FunctionDef) and node.name in ONE_HOME)
    assert defined == [f"targets/labels.py: {n}" for n in ("class_names", "labels_of", "model_classes")], defined
