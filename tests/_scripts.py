"""Load a script of scripts/ as a module (they are not part of the package), once per test module."""
from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from vitedge.tests.conftest import REPO


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"vitedge_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
