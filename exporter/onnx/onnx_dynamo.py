"""The torch.export-based ("dynamo") ONNX exporter: the export call, its opset policy, and torch module scopes.

Opset policy: the exporter's operator library (torchlib) writes opset 18. Any other opset goes through the ONNX
version converter after export; below 18 that converter is partial (it has no adapter to take
LayerNormalization below 17) and torch then keeps opset 18 with only a log line. So the dynamo path takes
opset >= 18, defaults to 18 (no conversion at all), and checks that the graph really has the opset asked for.

Scopes: every node the exporter writes carries its torch module stack in `metadata_props`
(`pkg.torch.onnx.name_scopes`: `['', 'blocks', 'blocks.0', 'blocks.0.attn', 'matmul_3']`, full module paths,
the fx node's name last; `namespace`: `': Model/blocks: Sequential/blocks.0: Block/matmul_3: aten.matmul...'`).
onnxsim drops `metadata_props` but keeps node names, so the scope is also written into each node's name in the
TorchScript exporter's slash form (`/blocks/blocks.0/blocks.0.attn/node_matmul_3`); `exporter.verdict.localize`
reads the metadata first and the names after simplification.
"""
from __future__ import annotations

import ast
import io
import logging
import re
import warnings
from contextlib import contextmanager, redirect_stderr

import onnx
import torch
import torch.nn as nn

NATIVE_OPSET = 18  # torchlib's opset: the graph is written in it, no version conversion
SCOPES_KEY = "pkg.torch.onnx.name_scopes"
NAMESPACE_KEY = "namespace"
_CALL_SUFFIX = re.compile(r"@\d+$")  # torch.export marks a module's second call as `path@1`
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def newest_opset() -> int:
    """The newest opset the dynamo path offers: torch's ceiling and the installed onnx's, whichever is lower."""
    from torch.onnx import _constants

    return min(getattr(_constants, "ONNX_MAX_OPSET", NATIVE_OPSET), onnx.defs.onnx_opset_version())


@contextmanager
def _quiet():
    # torch.export and the exporter log warnings, print a failed capture's partial graph to sys.stderr and warn
    # about pytree internals; none of it is actionable here: a failure raises, and its root cause becomes the
    # fallback reason. torch configures its loggers one by one, so logging is held below ERROR process-wide
    # for the duration of the export (restored after). Progress lines are unaffected: `Progress` holds the
    # stream it was created with.
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    try:
        with warnings.catch_warnings(), redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def export_dynamo(model: nn.Module, x: torch.Tensor, dynamic_batch: bool, opset: int, input_name: str,
                  output_names) -> onnx.ModelProto:
    """`torch.onnx.export(dynamo=True)` of `model` at `x`; raises whatever the exporter raises (the caller
    decides whether to fall back), or ValueError when the graph's opset is not `opset`."""
    dynamic_shapes = ({0: torch.export.Dim("batch")},) if dynamic_batch else None
    with _quiet(), torch.no_grad():
        # optimize=True is the default from torch 2.7; passed so that 2.6 writes the same optimized graph.
        program = torch.onnx.export(model, (x,), dynamo=True, input_names=[input_name], output_names=[output_names] if isinstance(output_names, str) else list(output_names),
                                    opset_version=opset, dynamic_shapes=dynamic_shapes, optimize=True,
                                    verbose=False)
    graph = program.model_proto
    got = graph_opset(graph)
    if got != opset:
        raise ValueError(f"the exporter wrote opset {got} instead of {opset} (version conversion failed)")
    scope_node_names(graph)
    return graph


def root_cause(e: BaseException) -> str:
    """`Type: first line` of the innermost `raise ... from` cause: torch wraps capture failures in a
    TorchExportError whose own message is only advice ("This is step 1/3 ...")."""
    while e.__cause__ is not None:
        e = e.__cause__
    lines = _ANSI.sub("", str(e)).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:300]}" if lines else type(e).__name__


def graph_opset(model: onnx.ModelProto) -> int | None:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)


def node_module_scopes(node: onnx.NodeProto) -> list[str]:
    """The torch module paths enclosing `node`, outermost first, from the dynamo exporter's metadata (empty
    when the node has none: TorchScript graphs, nodes the optimizer created, graphs onnxsim rewrote)."""
    meta = {p.key: p.value for p in node.metadata_props}
    if SCOPES_KEY in meta:
        try:
            scopes = ast.literal_eval(meta[SCOPES_KEY])
        except (ValueError, SyntaxError):
            scopes = None
        if isinstance(scopes, list) and all(isinstance(s, str) for s in scopes):
            return [_CALL_SUFFIX.sub("", s) for s in scopes[:-1] if s]  # the last entry is the fx node's name
    if NAMESPACE_KEY in meta:  # older exporters: `path: class/path: class/node: target`
        parts = [p.split(": ", 1)[0] for p in meta[NAMESPACE_KEY].split("/")]
        return [_CALL_SUFFIX.sub("", s) for s in parts[:-1] if s]
    return []


def scope_node_names(model: onnx.ModelProto) -> onnx.ModelProto:
    """Prefix each node's name with its module scopes (`/blocks/blocks.0/node_add`), in place: the names
    survive onnxsim where the metadata does not. Names stay unique (the exporter's own name is kept last)."""
    for node in model.graph.node:
        scopes = node_module_scopes(node)
        if scopes and not node.name.startswith("/"):
            node.name = "/" + "/".join(scopes + [node.name])
    return model
