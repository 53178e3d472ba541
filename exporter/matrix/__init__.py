"""`vitedge matrix`: export a plan of models x sizes x targets x precisions through the `vitedge export`
pipeline, with a content-addressed cache, on a local process pool or Ray.

Modules, one job each: plan.py (the plan document, cells), resolve.py (plan -> cells, every key validated),
cache.py (keys, entries), folders.py (atomic cell folders), cell.py (one cell, in a worker), status.py (a
cell's verdict), engines.py (local pool), ray_engine.py (Ray), results.py (matrix.json / matrix.md /
progress), run.py (the driver: `matrix()`). Importing this package imports no torch.
"""
from __future__ import annotations

from .plan import Cell, PlanError
from .results import CellResult, MatrixResult
from .run import matrix

__all__ = ["matrix", "MatrixResult", "CellResult", "Cell", "PlanError"]
