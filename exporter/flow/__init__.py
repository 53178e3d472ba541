"""The two runs: `vitedge export` (pipeline, with the verified base it builds once per model and size,
verified_base, and the per-target loop, target_hops) and `vitedge parity` on existing artifacts (verify), plus
deploy-form checkpoints (deploy_checkpoint).
"""
