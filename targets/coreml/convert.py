"""Lowering to an ML Program: the deploy-form -> torch.jit.trace -> `ct.convert(convert_to="mlprogram")` -> a saved,
deterministic `.mlpackage` and the facts the report carries about it.

Static shape, the iOS deployment target (16/17/18), fp16 compute precision with the shared precision policy's fp32
islands (`FP16ComputePrecision(op_selector=policy.mil_op_selector)`) or fp32, metadata for Xcode and `vitedge
parity`.
  - input "tensor": `image` float32 NCHW, already normalized; output `logits` float32.
  - input "image":  `image` is an RGB image of pixels 0-255. CoreML's ImageType has one global scale, so it
    computes `p/255 - mean_c` and the per-channel 1/std is folded into the input channels of the first conv
    (exact, zero padding included: the fold is linear with no offset).
  - labels: a classifier (`classLabel`, `classLabel_probs`) with the softmax built in; `logits` stays an output.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.layers.normalize import l1_normalize_div, l2_normalize_rsqrt
from ...models.preprocess import Recipe
from ...models.outputs import LOGITS
from ...models.registry import IMAGENET_MEAN, IMAGENET_STD
from ..base import LowerSpec
from ..graph.precision import default_policy
from . import fixes
from .mil_interpreter import load_program
from .coremltools_import import quiet_coremltools
from .mlpackage import make_package_deterministic
from .options import CoreMLOptions
from .validate_once import validate_once
from ...models.input_size import as_hw, size_text

PIXEL_SCALE = 1.0 / 255.0
_DROPPED_METADATA = ("com.github.apple.coremltools.conversion_date",)  # changes daily: breaks reproducible bytes


# ------------------------------------------------------------------------------------------------ torch side

class _AneFriendly(torch.overrides.TorchFunctionMode):
    """While tracing: F.normalize -> `x * rsqrt(max(sum x^2, eps^2))` (p=2) or `x / max(sum|x|, eps)` (p=1).

    Exactly F.normalize's function, without the reduce_l2_norm + tile + real_div coremltools emits for it (the
    Neural Engine runs rsqrt/mul/broadcast natively). Counts the rewrites for the artifact info.
    """

    def __init__(self):
        super().__init__()
        self.rewrites = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.normalize:
            x = args[0]
            p = kwargs.get("p", args[1] if len(args) > 1 else 2.0)
            dim = kwargs.get("dim", args[2] if len(args) > 2 else 1)
            eps = kwargs.get("eps", args[3] if len(args) > 3 else 1e-12)
            if p in (1, 1.0, 2, 2.0) and kwargs.get("out") is None:
                self.rewrites += 1
                return l2_normalize_rsqrt(x, dim, eps) if p in (2, 2.0) else l1_normalize_div(x, dim, eps)
        return func(*args, **kwargs)


class _Classifier(nn.Module):
    """(logits, softmax probabilities): the classifier's dictionary is built from the second output."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        y = self.model(x)
        return y, torch.softmax(y, dim=-1)


class _InputScale(nn.Module):
    """Fallback when no conv reads the input directly: an explicit per-channel multiply."""

    def __init__(self, model: nn.Module, scale: torch.Tensor):
        super().__init__()
        self.model = model
        self.register_buffer("scale", scale.reshape(1, -1, 1, 1))

    def forward(self, x):
        return self.model(x * self.scale)


def fold_input_std(model: nn.Module, std, imgsz: int) -> tuple[nn.Module, str]:
    """A copy of `model` taking `x * std` (per channel) instead of `x`: 1/std folded into the first conv that reads
    the input (its input-channel slices). Returns (module, where it went)."""
    model = copy.deepcopy(model).eval()
    x = torch.zeros(1, 3, *as_hw(imgsz), dtype=_dtype(model))
    found: list[tuple[str, nn.Conv2d]] = []
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, nn.Conv2d):
            def pre(mod, inp, name=name):
                if not found and inp[0] is x:
                    found.append((name, mod))
            hooks.append(m.register_forward_pre_hook(pre))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    inv = 1.0 / torch.tensor(std, dtype=torch.float64)
    if found and found[0][1].groups == 1 and found[0][1].in_channels == len(std):
        name, conv = found[0]
        with torch.no_grad():
            w = conv.weight.double() * inv.reshape(1, -1, 1, 1)
            conv.weight.copy_(w.to(conv.weight.dtype))
        return model, f"1/std folded into {name}.weight"
    return _InputScale(model, inv.float()), "1/std applied by an explicit per-channel multiply (no conv reads the input)"


def _dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters()), torch.float32)


class _FirstLayer(Exception):
    """Raised by the pre-hook of the first conv a forward reaches: its input channels are known, stop there."""


def input_channels(model: nn.Module, imgsz: int) -> int | None:
    """The channel count of the first Conv2d the forward reaches (it stops right there) when that conv reads the
    input itself; None when it reads something derived from it (SLAB-DeiT's position planes are concatenated
    first), when no conv comes first, or when the model fails before one."""
    x = torch.zeros(1, 3, *as_hw(imgsz), dtype=_dtype(model))
    seen: list[int | None] = []

    def pre(mod, inp):
        seen.append(mod.in_channels if inp[0] is x else None)
        raise _FirstLayer

    hooks = [m.register_forward_pre_hook(pre) for m in model.modules() if isinstance(m, nn.Conv2d)]
    try:
        with torch.no_grad():
            model(x)
    except _FirstLayer:
        pass
    except Exception:  # noqa: BLE001 - not a conv first: the conversion itself will say what is wrong
        return None
    finally:
        for h in hooks:
            h.remove()
    return seen[0] if seen else None


# ------------------------------------------------------------------------------------------------ conversion

def convert(deploy_model: nn.Module, spec: LowerSpec, opts: CoreMLOptions, path: Path) -> dict:
    """Convert `deploy_model` (float32, eval) to the ML Program package `path`; returns the artifact's info."""
    with quiet_coremltools():
        import coremltools as ct
    fixes.install()
    meta = dict(spec.metadata)
    mean, std = tuple(meta.get("mean", IMAGENET_MEAN)), tuple(meta.get("std", IMAGENET_STD))
    module, fold_note = deploy_model, None
    if opts.input == "image":
        module, fold_note = fold_input_std(deploy_model, std, spec.imgsz)
    if opts.labels:
        module = _Classifier(module)
    shape = (spec.batch, 3, *as_hw(spec.imgsz))
    example = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ane = _AneFriendly()
    with torch.no_grad(), ane, warnings.catch_warnings():
        # static shapes are the point (TracerWarning), and jit.trace is still coremltools' recommended path
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = torch.jit.trace(module, example, check_trace=False)

    if opts.input == "image":
        inputs = [ct.ImageType(name="image", shape=shape, scale=PIXEL_SCALE, bias=[-m for m in mean],
                               color_layout=ct.colorlayout.RGB)]
    else:
        inputs = [ct.TensorType(name="image", shape=shape, dtype=np.float32)]
    # one output `logits`, or each of several (feature maps) under its own name, in order (models/outputs.py)
    names = [o["name"] for o in meta.get("outputs") or ()] or [LOGITS]
    outputs = [ct.TensorType(name=n, dtype=np.float32) for n in names]
    kwargs = {}
    if opts.labels:
        outputs.append(ct.TensorType(name="probabilities", dtype=np.float32))
        kwargs["classifier_config"] = ct.ClassifierConfig(list(opts.labels),
                                                          predicted_probabilities_output="probabilities")
        kwargs["pass_pipeline"] = fixes.classifier_pipeline()

    policy, fp32_ops = default_policy(), {}
    if spec.precision == "fp16":
        def selector(op) -> bool:
            ok16 = policy.mil_op_selector(op)
            if not ok16 and op.op_type != "const":
                rule = policy.mil_fp32_ops(op.enclosing_block).get(op.name, "?")
                fp32_ops.setdefault(rule, {}).setdefault(op.op_type, set()).add(op.name)
            return ok16
        precision = ct.transform.FP16ComputePrecision(op_selector=selector)
    else:
        precision = ct.precision.FLOAT32
    with quiet_coremltools(), _no_progress_bars(), validate_once():  # (validate_once: conversion time)
        ml = ct.convert(traced, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                        minimum_deployment_target=getattr(ct.target, f"iOS{opts.ios}"),
                        compute_precision=precision, skip_model_load=True, **kwargs)
    _set_metadata(ml, spec, opts, mean, std, fold_note)
    with quiet_coremltools():
        ml.save(str(path))
    make_package_deterministic(path)
    program = load_program(path)  # the saved package resolves and decodes; its facts go into the report
    return {
        "ios": opts.ios, "minimum_deployment_target": f"iOS{opts.ios}", "input": opts.input,
        "input_spec": _input_spec(opts, shape, mean, std, fold_note),
        "labels": len(opts.labels) if opts.labels else None,
        "outputs": list(program.outputs),
        "compute_precision": spec.precision,
        "precision_policy": policy.to_dict() if spec.precision == "fp16" else None,
        "fp32_islands": {rule: {t: len(n) for t, n in sorted(ops.items())} for rule, ops in sorted(fp32_ops.items())},
        "ops": dict(sorted(program.op_counts().items())),
        "ops_by_dtype": program.dtype_counts(),
        "ane_lowering": {"normalize_rewrites": ane.rewrites},
        "conversion_fixes": list(fixes.CONVERSION_FIXES),
        "emulator_unknown_ops": program.unknown_ops(),
    }


def _set_metadata(ml, spec: LowerSpec, opts: CoreMLOptions, mean, std, fold_note) -> None:
    from ... import __version__  # the package root (no imports of its own)

    meta = spec.metadata
    weights = meta.get("weights", "untrained")
    ml.author = str(meta.get("author") or f"vitedge {__version__}")
    ml.license = str(meta.get("license") or "weights: the license of the upstream checkpoint; "
                                             "converter: vitedge (Apache-2.0)")
    ml.version = str(meta.get("version") or f"vitedge-{__version__}")
    kind = "classifier" if opts.labels else "logits"
    ml.short_description = (f"{spec.name} (re-parameterized deploy-form) image {kind}, {'x'.join(map(str, as_hw(spec.imgsz)))} "
                            f"RGB, {spec.precision}, iOS {opts.ios}+; weights: {weights}")
    vers = meta.get("versions") or {}
    user = {
        "model": spec.name, "imgsz": size_text(spec.imgsz), "batch": str(spec.batch), "input": opts.input,
        "preprocessing": json.dumps(_input_spec(opts, None, mean, std, fold_note), sort_keys=True),
        "preprocess": json.dumps(meta.get("preprocess") or {}, sort_keys=True),
        "reparam": json.dumps(meta.get("reparam", {}), sort_keys=True),
        "checkpoint_sha256": str(meta.get("checkpoint_sha256") or "null"),
        "weights": str(weights), "precision": spec.precision, "ios": str(opts.ios),
        "toolchain": json.dumps({k: vers.get(k) for k in ("vitedge", "torch", "coremltools", "numpy")}
                                if vers else {"vitedge": __version__}, sort_keys=True),
        "overrides": json.dumps(meta.get("overrides", {}), sort_keys=True),
        "attn_order": str(meta.get("attn_order", "auto")),
    }
    if opts.labels_path:
        user["labels"] = str(len(opts.labels))
    if meta.get("num_classes"):  # a classifier's class count, checked against --checkpoint's before any work
        user["num_classes"] = str(meta["num_classes"])
    if meta.get("outputs"):  # several outputs: each one's name, shape per sample and stride
        user["outputs"] = json.dumps(meta["outputs"], sort_keys=True)
    if meta.get("features") is not None:  # --features as exported (what `vitedge parity` rebuilds)
        user["features"] = json.dumps(meta["features"])
    for k, v in user.items():
        ml.user_defined_metadata[k] = v
    spec_pb = ml._spec  # MLModel.save writes this very spec
    for k in _DROPPED_METADATA:
        if k in spec_pb.description.metadata.userDefined:
            del spec_pb.description.metadata.userDefined[k]
    # Xcode's description pane
    resize = _resize_text(meta.get("preprocess"), spec.imgsz)
    spec_pb.description.input[0].shortDescription = (
        f"RGB image, pixels 0-255 ({resize}; normalized inside the model)" if opts.input == "image"
        else f"float32 NCHW RGB ({resize}), normalized: (pixel / 255 - mean) / std, mean {_fmt3(mean)}, "
             f"std {_fmt3(std)}")
    strides = {o["name"]: o.get("stride") for o in meta.get("outputs") or ()}
    for o in spec_pb.description.output:
        o.shortDescription = {"logits": "class scores before softmax", "classLabel": "most likely class",
                              "classLabel_probs": "probability of every class"}.get(o.name, "")
        if strides.get(o.name):
            o.shortDescription = f"feature map, NCHW, stride {strides[o.name]}"


def _fmt3(v) -> str:
    return "[" + ", ".join(f"{x:.4g}" for x in v) + "]"


def _resize_text(recipe: dict | None, imgsz: int) -> str:
    """How the app makes the model's input from a photo (the export's eval preprocessing, models/preprocess.py)."""
    return Recipe.from_dict(recipe).describe(imgsz) if recipe else "x".join(map(str, as_hw(imgsz)))


def _input_spec(opts: CoreMLOptions, shape, mean, std, fold_note) -> dict:
    d = {"name": "image", "kind": opts.input, "layout": "NCHW", "color": "RGB", "mean": list(mean), "std": list(std)}
    if shape is not None:
        d["shape"] = list(shape)
    if opts.input == "image":
        d.update(pixel_range=[0, 255], coreml_scale=PIXEL_SCALE, coreml_bias=[-m for m in mean],
                 std_fold=fold_note,
                 formula="x_c = (p_c / 255 - mean_c) / std_c: CoreML applies p/255 - mean_c, the model's first conv "
                         "carries 1/std_c")
    else:
        d.update(dtype="float32", formula="x_c = (p_c / 255 - mean_c) / std_c, computed by the caller")
    return d


@contextlib.contextmanager
def _no_progress_bars():
    """coremltools' tqdm bars (stderr) would interleave with our progress lines; errors still raise."""
    with contextlib.redirect_stderr(io.StringIO()):
        yield
