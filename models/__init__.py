"""Train-form models in the official checkpoint layouts, their registry and safe checkpoint loading."""
from ..errors import CheckpointError, VitedgeError
from .registry import ModelSpec, create_model, get_spec, list_models, register_model
from .trained_like import make_trained_like

__all__ = ["CheckpointError", "VitedgeError", "ModelSpec", "create_model", "get_spec", "list_models",
           "register_model", "make_trained_like"]
