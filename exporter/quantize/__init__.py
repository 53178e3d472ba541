"""Quantized and compressed artifacts: calibration sets (calibrate) and the compressed hops of the parity
ladder (compressed).
"""
