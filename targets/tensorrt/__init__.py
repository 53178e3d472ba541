"""The `tensorrt` target as a package: target.py (TensorRTTarget, the Target behind get_target("tensorrt"): a
serialized engine plus its JSON sidecar, and its runner), api.py (the TensorRT Python API table, per major version),
precision.py (precision truth from the engine inspector's JSON) and cuda_memory.py (device buffers, stream, events).
Import each name from its module (`from vitedge.targets.tensorrt.target import TensorRTTarget`).
"""
