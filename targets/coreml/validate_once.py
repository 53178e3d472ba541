"""Validate a MIL program once per pass pipeline, not after every pass: coremltools' conversion time.

coremltools 9's `PassPipelineManager.apply_pipeline` validates the whole program before the pipeline and after
each of its passes (~115 for a conversion): 7.3 of the main job's 15.9 CPU seconds of conversion
(docs/export_profile.md). Inside `validate_once()` a pipeline still validates where coremltools also checks
essential scopes (after `dead_code_elimination`) and once after its last pass; the per-pass repeats are skipped.
What changes: a pass that breaks the program is reported when its pipeline ends, not at the pass. The converted
program is the same (tests/test_coreml_validate_once.py), and the coreml hop loads and runs the saved package.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from .coremltools_import import quiet_coremltools

_state = threading.local()  # depth of apply_pipeline calls inside validate_once() on this thread


@contextlib.contextmanager
def validate_once() -> Iterator[None]:
    """While active (this thread), each pass pipeline validates after dead-code elimination and at its end only."""
    with quiet_coremltools():
        from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager
        from coremltools.converters.mil.mil.program import Program

    own_apply = PassPipelineManager.__dict__["apply_pipeline"]  # a staticmethod
    own_validate = Program.validate

    def apply_pipeline(prog, pass_pipeline):
        _state.depth = getattr(_state, "depth", 0) + 1
        try:
            own_apply.__func__(prog, pass_pipeline)
        finally:
            _state.depth -= 1
        own_validate(prog)  # the check every skipped per-pass validation would have made, once

    def validate(self, check_essential_scope=False):
        if getattr(_state, "depth", 0) and not check_essential_scope:
            return None
        return own_validate(self, check_essential_scope=check_essential_scope)

    PassPipelineManager.apply_pipeline = staticmethod(apply_pipeline)
    Program.validate = validate
    try:
        yield
    finally:
        PassPipelineManager.apply_pipeline = own_apply
        Program.validate = own_validate
