"""The graph level, torch-free: what every backend and the pipeline need to know about ONNX / MIL graphs.

precision.py   the fp16 precision policy: which ops stay fp32 (islands), found the same way on ONNX and MIL graphs
onnx_fp16.py   the fp16 ONNX graph (fp16 everywhere but the policy's islands and the fp32 graph I/O)
metadata.py    the `vitedge.*` metadata_props of an exported ONNX graph
weights.py     the weights an ONNX graph stores (fp16 initializers, int8 through DequantizeLinear), as float32
runtime.py     ONNX Runtime on an ONNX graph: the base graph's runtime and every ONNX-graph backend's
fusions.py     the fused ops ONNX Runtime makes of a graph (so simplification never loses one)

It imports nothing above targets/: the torch-side fp16 range analysis is vitedge.exporter.verdict.fp16_ranges.
"""
