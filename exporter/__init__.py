"""The pipeline: re-parameterize, verify, export, check parity, measure, report, package."""
