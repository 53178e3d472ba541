"""validate_once (targets/coreml/validate_once.py): fewer whole-program validations during a conversion, the same
converted package, and a program a pass broke still fails the conversion."""
from __future__ import annotations

import pytest

ct = pytest.importorskip("coremltools")

from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager  # noqa: E402
from coremltools.converters.mil.mil.program import Program  # noqa: E402

from vitedge.exporter.reparam import reparameterize  # noqa: E402
from vitedge.models import create_model, make_trained_like  # noqa: E402
from vitedge.targets.base import LowerSpec  # noqa: E402
from vitedge.targets.coreml import convert as conv  # noqa: E402
from vitedge.targets.coreml.options import parse_options  # noqa: E402
from vitedge.targets.coreml.validate_once import validate_once  # noqa: E402

TINY = {"layers": [1, 1, 1, 1], "embed_dims": [8, 8, 16, 16], "num_classes": 5}


def _convert(tmp_path, name: str, monkeypatch, scoped) -> tuple[bytes, int]:
    """(the saved package's model spec bytes, whole-program validations made) for one conversion."""
    model = make_trained_like(create_model("swiftformer_xs", **TINY), seed=0).eval()
    deploy = reparameterize(model, imgsz=32)
    deploy = deploy[0] if isinstance(deploy, tuple) else deploy
    calls = []
    own = Program.validate

    def counting(self, *a, **k):
        calls.append(1)
        return own(self, *a, **k)

    monkeypatch.setattr(Program, "validate", counting)  # installed first: validate_once wraps the counter
    monkeypatch.setattr(conv, "validate_once", scoped)
    out = tmp_path / name
    out.mkdir()
    spec = LowerSpec(name="m", imgsz=32, batch=1, precision="fp16", out_dir=out, onnx_path=None, options={})
    conv.convert(deploy, spec, parse_options({}, 5), out / "m.mlpackage")
    monkeypatch.undo()
    blob = next((out / "m.mlpackage").rglob("model.mlmodel")).read_bytes()
    return blob, len(calls)


def test_same_package_with_far_fewer_validations(tmp_path, monkeypatch):
    import contextlib

    originals = (PassPipelineManager.__dict__["apply_pipeline"], Program.validate)
    plain, n_plain = _convert(tmp_path, "plain", monkeypatch, contextlib.nullcontext)
    once, n_once = _convert(tmp_path, "once", monkeypatch, validate_once)
    assert once == plain  # the converted program is byte for byte the same
    assert n_plain > 50 and n_once < n_plain / 3, (n_plain, n_once)
    assert (PassPipelineManager.__dict__["apply_pipeline"], Program.validate) == originals  # restored on exit


def test_a_broken_program_still_fails_once_the_pipeline_ends(monkeypatch):
    """A validation error is raised after the pipeline instead of at the pass: never swallowed."""
    own = Program.validate
    seen = []

    def failing(self, check_essential_scope=False):
        seen.append(check_essential_scope)
        raise ValueError("broken program")

    monkeypatch.setattr(Program, "validate", failing)
    prog = Program()
    pipeline = PassPipeline(pass_names=[], pipeline_name="empty")
    with validate_once(), pytest.raises(ValueError, match="broken program"):
        PassPipelineManager.apply_pipeline(prog, pipeline)
    assert seen  # the final, unconditional validation ran
    monkeypatch.setattr(Program, "validate", own)
    with validate_once():
        PassPipelineManager.apply_pipeline(prog, pipeline)  # a valid (empty) program passes
