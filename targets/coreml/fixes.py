"""coremltools patches the conversion needs, each for the coremltools version it was written against.

Every Fix says which coremltools it is for and why (docs/coreml_spike.md has the full record). Each has a test
(tests/test_coreml_fixes.py) that converts a small probe model *without* the patch and expects the bug: when a
newer coremltools no longer has it, that test fails and says the patch can go. `install()` applies them all
(idempotent); `without(name)` restores coremltools' own converters for one fix while its test runs.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from .coremltools_import import quiet_coremltools

RELEASE_OUTPUT_TYPES = "vitedge::release_output_types"


@dataclass(frozen=True)
class Fix:
    name: str
    for_coremltools: str          # the release the bug was found in and the patch written for
    why: str
    torch_ops: tuple = ()         # the torch-frontend converters it overrides (registry names)
    graph_pass: str | None = None  # or: a MIL pass the conversion adds to its pipeline


FIXES = (
    Fix("scalar_int_bool", "9.0",
        "aten::Int/aten::Bool on a 1-element constant array: coremltools 9 calls int(ndarray), an error in the numpy "
        "used here (2.4; deprecated since 1.25); we take .item()", torch_ops=("_int", "int", "_bool", "bool")),
    Fix("layer_norm_bias_only", "9.0",
        "layer_norm with a bias but no weight (SimA's kept norm3 shift): coremltools 9 crashes on gamma=None; "
        "we pass gamma=ones", torch_ops=("layer_norm", "native_layer_norm")),
    Fix("reciprocal_exact", "9.0",
        "torch.reciprocal (SLA's 1/(q.sum k + eps)): coremltools 9 lowers it to MIL inverse with its default "
        "epsilon 1e-4, i.e. 1/(x + 1e-4); we pass epsilon=0 so the program computes 1/x", torch_ops=("reciprocal",)),
    Fix("classifier_output_types", "9.0",
        "classifier with a second output (logits): coremltools 9 indexes the user output types past their end once "
        "the classify op adds its two outputs; a final pass clears the output types after they have been applied",
        graph_pass=RELEASE_OUTPUT_TYPES),
)
CONVERSION_FIXES = tuple(f.why for f in FIXES)  # as the artifact info lists them

_ORIGINAL: dict = {}   # registry name -> coremltools' own converter (None: there was none)
_OURS: dict = {}       # registry name -> ours


def _registry():
    with quiet_coremltools():
        from coremltools.converters.mil.frontend.torch.torch_op_registry import _TORCH_OPS_REGISTRY
    return _TORCH_OPS_REGISTRY.name_to_func_mapping


def install() -> None:
    """Register every converter override and the graph pass (once per process)."""
    if _OURS:
        return
    table = _registry()
    names = [n for f in FIXES for n in f.torch_ops]
    _ORIGINAL.update({n: table.get(n) for n in names})
    _register_overrides()
    _OURS.update({n: table[n] for n in names})


@contextlib.contextmanager
def without(name: str):
    """Convert with coremltools' own behaviour for fix `name` inside the block (tests of the bug it works around)."""
    fix = next(f for f in FIXES if f.name == name)
    install()
    table = _registry()
    for n in fix.torch_ops:
        if _ORIGINAL[n] is None:
            table.pop(n, None)
        else:
            table[n] = _ORIGINAL[n]
    try:
        yield fix
    finally:
        table.update({n: _OURS[n] for n in fix.torch_ops})


def classifier_pipeline():
    """The default pass pipeline plus the pass that releases the output types (classifier_output_types)."""
    with quiet_coremltools():
        import coremltools as ct
    install()
    pipeline = ct.PassPipeline()
    pipeline.append_pass(RELEASE_OUTPUT_TYPES)
    return pipeline


def _register_overrides() -> None:
    with quiet_coremltools():
        from coremltools.converters.mil import Builder as mb
        from coremltools.converters.mil.frontend.torch import ops as torch_ops
        from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op
        from coremltools.converters.mil.mil import types
        from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
        from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY, register_pass

    def scalar_cast(context, node, pytype, dtype_name):
        x = torch_ops._get_inputs(context, node, expected=1)[0]
        if x.can_be_folded_to_const() and np.ndim(x.val) > 0 and np.size(x.val) == 1:
            context.add(mb.const(val=pytype(np.asarray(x.val).item()), name=node.name), node.name)
            return
        torch_ops._cast(context, node, pytype, dtype_name)

    @register_torch_op(torch_alias=["int"], override=True)
    def _int(context, node):
        scalar_cast(context, node, int, "int32")

    @register_torch_op(torch_alias=["bool"], override=True)
    def _bool(context, node):
        scalar_cast(context, node, bool, "bool")

    @register_torch_op(torch_alias=["native_layer_norm"], override=True)
    def layer_norm(context, node):
        inputs = torch_ops._get_inputs(context, node, min_expected=2)
        x, shape = inputs[0], inputs[1]
        weight = inputs[2] if len(inputs) > 2 else None
        bias = inputs[3] if len(inputs) > 3 else None
        eps = inputs[4] if len(inputs) > 4 else None
        if weight is None and bias is not None:
            dims = tuple(int(d) for d in np.asarray(shape.val).reshape(-1))
            weight = mb.const(val=np.ones(dims, dtype=types.nptype_from_builtin(bias.dtype)))
        out = mb.layer_norm(x=x, axes=list(range(-len(np.asarray(shape.val).reshape(-1)), 0)), gamma=weight,
                            beta=bias, epsilon=eps, name=node.name)
        context.add((out, None, None) if node.kind == "native_layer_norm" else out, torch_name=node.name)

    @register_torch_op(override=True)
    def reciprocal(context, node):
        x = torch_ops._get_inputs(context, node, expected=1)[0]
        eps = types.nptype_from_builtin(x.dtype)(0)
        context.add(mb.inverse(x=x, epsilon=eps, name=node.name))

    if RELEASE_OUTPUT_TYPES not in PASS_REGISTRY:
        @register_pass(namespace="vitedge")
        class release_output_types(AbstractGraphPass):  # noqa: N801  (pass names are snake_case)
            def apply(self, prog):
                for f in prog.functions.values():
                    f.output_types = None
