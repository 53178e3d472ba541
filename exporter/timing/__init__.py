"""`vitedge bench`: the latency harness (bench), statistics and timing loops (latency), timing an existing
artifact (bench_artifact), the report and plot (bench_report), the one-call API (bench_api), and iPhone timing
(device_bench over iphone).
"""
