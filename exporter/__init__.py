"""The pipeline: re-parameterize, verify, export, check parity, measure, report, package; one group per job, each
importing only itself and the groups before it here (tests/test_architecture.py, EXPORTER_GROUPS):

core/       the report.json schema, the run's plan of targets, the output folder, progress lines, digests
reparam/    checkpoint -> train-form -> deploy-form (build_forms.py) and the exact folds
onnx/       ONNX export of the deploy-form
verdict/    the parity ladder's verdicts: criteria, parity, hops, inputs and photos, probe, localization, ...
quantize/   calibration sets and the compressed hops
flow/       the runs: export() (pipeline.py), parity() (verify.py), the verified base, deploy checkpoints
timing/     `vitedge bench`
packaging/  `vitedge package`
matrix/     `vitedge matrix`
"""
