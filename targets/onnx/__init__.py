"""The `onnx` target as a package: target.py (OnnxTarget, the Target behind get_target("onnx"): the fp32 base
graph, fp16 and QDQ graphs, ONNX Runtime runners) and fusions.py (which fusions ONNX Runtime applies, counted).
"""
