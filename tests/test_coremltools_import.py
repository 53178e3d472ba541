"""coremltools' first import in the CLI's process skips the packages it imports only for converters vitedge never
calls (scikit-learn, ExecuTorch, torchao, torchaudio); each stays importable afterwards, and the Python API's
import (a user's process) is left as coremltools makes it. Fresh interpreters: the import happens once a process."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from vitedge.targets.coreml.coremltools_import import UNUSED_CONVERTER_DEPS
from vitedge.tests._ci import unavailable

PROBE = """
import json, sys
from vitedge.targets.coreml import coremltools_import as ci
if sys.argv[1] == "cli":
    ci.lean_coremltools_import()
with ci.quiet_coremltools():
    import coremltools as ct
    from coremltools import _deps
loaded = {m: m in sys.modules for m in ci.UNUSED_CONVERTER_DEPS}
flags = {"executorch": _deps._HAS_EXECUTORCH, "torchao": _deps._HAS_TORCHAO}
import executorch, torchao  # still importable in this process
print(json.dumps({"loaded": loaded, "flags": flags, "version": ct.__version__, "blocked_left": [m for m in
                  ci.UNUSED_CONVERTER_DEPS if m in sys.modules and sys.modules[m] is None]}))
"""


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["cli", "api"])
def test_the_cli_skips_the_unused_converters_and_leaves_them_importable(mode):
    if importlib.util.find_spec("executorch") is None:  # the executorch extra is what brings them in
        unavailable("the [executorch] extra is not installed")
    r = _probe(mode)
    assert r["blocked_left"] == []  # nothing left blocked: the later imports above worked
    if mode == "cli":
        assert set(r["loaded"]) == set(UNUSED_CONVERTER_DEPS) and not any(r["loaded"].values()), r["loaded"]
        assert r["flags"] == {"executorch": False, "torchao": False}
    else:
        assert r["loaded"]["executorch"] and r["loaded"]["torchao"] and r["flags"] == {"executorch": True,
                                                                                       "torchao": True}
