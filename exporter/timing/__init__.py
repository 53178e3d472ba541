"""`vitedge bench`: the latency harness (bench), statistics and timing loops (latency), timing an existing
artifact (bench_artifact), the report and plot (bench_report), the one-call API (bench_api), and timing on a
tethered device (device_bench, through the target's DeviceBench: the iPhone's is targets/coreml/iphone.py).
"""
