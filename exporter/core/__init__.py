"""What every exporter job shares: what a run is asked to do (settings), the report.json schema (report), the run's
plan of targets and flags (target_plans), the output folder as one transaction (outdir), progress lines
(progress), cache digests (digests) and the allocator setting (allocator). Imports nothing else from exporter/.
"""
