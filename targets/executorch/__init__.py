"""The `executorch` target: a `.pte` program for ExecuTorch (Android and iOS), lowered from the verified deploy-form
through `torch.export`, delegated to XNNPACK (or ExecuTorch's portable kernels), fp32 or int8 (PT2E with the
XNNPACK quantizer), and run here by ExecuTorch's own runtime: a real "device" parity hop.

target.py: lowering, metadata and the runner; delegable.py: the graph rewrites that keep every op inside the
XNNPACK delegate; quantize.py: PT2E int8 calibration.
"""
