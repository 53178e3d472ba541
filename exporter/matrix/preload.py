"""Imported once by the local pool's fork server (engines.py), so that every worker forked from it starts warm:
torch, ONNX, ONNX Runtime, onnxsim, the model families and their fold plans are loaded before the fork instead
of again in each worker. Import only: nothing here runs a model or starts a thread."""
from __future__ import annotations

import onnxruntime  # noqa: F401  (imported lazily by the runners otherwise)
import onnxsim  # noqa: F401

from ...models.registry import list_models
from ..reparam import available_rewrites
from . import cell  # noqa: F401
from ..verdict import equivalence, localize
from ..flow import pipeline  # noqa: F401

list_models()  # imports every model family (registration)
available_rewrites("swiftformer_xs")  # imports every fold plan (on the meta device: no weights)
