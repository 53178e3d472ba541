"""Which ONNX exporter writes the graph, and at which opset: the names, the default, the opset defaults.

Torch-free, so the command line can name the choices and defaults in `--help` without importing torch; the
export itself is onnx_export.py (TorchScript) and onnx_dynamo.py (dynamo).

The default exporter is the one constant DEFAULT_EXPORTER: switching it is a one-line change here (then
regenerate docs/cli.md with `python scripts/gen_docs.py` and update the README's "ONNX exporters" choice).
"""
from __future__ import annotations

from ...errors import VitedgeError

EXPORTERS = ("dynamo", "torchscript")
# The exporter used when none is asked for: TorchScript, measured no slower than dynamo on every family and 2-5x
# quicker to export (benchmarks/results/exporters.json; README "ONNX exporters").
DEFAULT_EXPORTER = "torchscript"
DEFAULT_OPSET = 17  # the TorchScript exporter's default opset
MIN_OPSET = 13  # the oldest opset the tests exercise (per-axis ReduceSum inputs, Gemm broadcasting)
DYNAMO_OPSET = 18  # the dynamo exporter's own opset (torchlib's; onnx_dynamo.NATIVE_OPSET): lower ones are refused
LABELS = {"torchscript": "TorchScript", "dynamo": "dynamo"}


def check_exporter(exporter: str) -> str:
    if exporter not in EXPORTERS:
        raise VitedgeError(f"unknown ONNX exporter {exporter!r}: use one of {', '.join(EXPORTERS)}")
    return exporter


def default_opset(exporter: str = DEFAULT_EXPORTER) -> int:
    """The opset written when none is given: 17 for TorchScript, 18 (its own, no conversion) for dynamo."""
    return DYNAMO_OPSET if check_exporter(exporter) == "dynamo" else DEFAULT_OPSET


def exporter_label(exporter: str) -> str:
    """How reports name the exporter as a backend: `torch.onnx (TorchScript)` / `torch.onnx (dynamo)`."""
    return f"torch.onnx ({LABELS.get(exporter, exporter)})"
