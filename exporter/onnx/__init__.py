"""ONNX export of a deploy-form: which exporter and opset (onnx_choice), the torch.export-based exporter
(onnx_dynamo) and the export with checker, shape inference and onnxsim (onnx_export).
"""
