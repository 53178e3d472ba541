"""The `coreml` target: an ML Program `.mlpackage` for iPhone, and a runner for it on every platform.

lower(): the verified deploy-form -> torch.jit.trace -> `ct.convert(convert_to="mlprogram")` with a static shape,
the iOS deployment target (16/17/18), fp16 compute precision with the shared precision policy's fp32 islands
(`FP16ComputePrecision(op_selector=policy.mil_op_selector)`) or fp32, then metadata, and a package whose own
Manifest.json identifiers are derived from its contents (coremltools writes random UUIDs on every save).
  - input "tensor": `image` float32 NCHW, already normalized; output `logits` float32.
  - input "image":  `image` is an RGB image of pixels 0-255. CoreML's ImageType has one global scale, so it
    computes `p/255 - mean_c` and the per-channel 1/std is folded into the input channels of the first conv
    (exact, zero padding included: the fold is linear with no offset).
  - labels: a classifier (`classLabel`, `classLabel_probs`) with the softmax built in; `logits` stays an output.
runner(): on macOS `MLModel.predict` (CPU_AND_NE, cross-checked against CPU_ONLY; ALL aborts on some hosts) with
`mode="device"`; elsewhere the numpy MIL interpreter on the saved package with `mode="emulated"`, on the first
DEFAULT_EMULATED_SAMPLES parity inputs (`runner.max_samples`). A device runner reports mode "device" only after a
real prediction returned.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import platform
import sys
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import VitedgeError
from ..models.registry import IMAGENET_MEAN, IMAGENET_STD
from .base import Artifact, LowerSpec, Runner, Target, UnavailableError
from .mil_interpreter import load_program, quiet_coremltools

DEFAULT_EMULATED_SAMPLES = 16   # parity inputs the emulated hop runs (the first N: every input category appears)
IOS_TARGETS = (16, 17, 18)
DEFAULT_IOS = 16
INPUT_KINDS = ("tensor", "image")
DEVICE_COMPUTE_UNITS = ("CPU_AND_NE", "CPU_ONLY")  # the first is the one reported; ALL aborts on some macOS hosts
PIXEL_SCALE = 1.0 / 255.0
_MANIFEST_NS = uuid.UUID("6f1d9d2e-6a43-4d3b-9a56-7c0a7a2f9e11")  # namespace of our deterministic item ids
_DROPPED_METADATA = ("com.github.apple.coremltools.conversion_date",)  # changes daily: breaks reproducible bytes


# ------------------------------------------------------------------------------------------------ options

@dataclass
class CoreMLOptions:
    ios: int = DEFAULT_IOS
    input: str = "tensor"
    labels: list | None = None
    labels_path: str | None = None


def parse_ios(value) -> int:
    s = str(value).strip().lower().removeprefix("ios")
    if not s.isdigit() or int(s) not in IOS_TARGETS:
        raise VitedgeError(f"--ios must be one of {', '.join(map(str, IOS_TARGETS))}; got {value!r}")
    return int(s)


def read_labels(path, num_classes: int | None = None) -> list[str]:
    """One label per line (trailing blank lines ignored); the count must match the model's classes."""
    p = Path(path)
    if not p.is_file():
        raise VitedgeError(f"--labels file {p} not found; give a text file with one class label per line")
    lines = p.read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    labels = [ln.strip() for ln in lines]
    if not labels or any(not lb for lb in labels):
        raise VitedgeError(f"--labels file {p} has empty lines; write exactly one non-empty label per line")
    dup = sorted({lb for lb in labels if labels.count(lb) > 1})
    if dup:
        raise VitedgeError(f"--labels file {p} repeats {dup[:3]}; class labels must be unique")
    if num_classes is not None and len(labels) != num_classes:
        raise VitedgeError(f"--labels file {p} has {len(labels)} labels but the model has {num_classes} classes; "
                           "give one label per class")
    return labels


def parse_options(options: dict, num_classes: int | None = None) -> CoreMLOptions:
    opts = CoreMLOptions()
    if options.get("ios") is not None:
        opts.ios = parse_ios(options["ios"])
    if options.get("input") is not None:
        if options["input"] not in INPUT_KINDS:
            raise VitedgeError(f"--input must be one of {', '.join(INPUT_KINDS)}; got {options['input']!r}")
        opts.input = options["input"]
    if options.get("labels") is not None:
        opts.labels_path = str(options["labels"])
        opts.labels = read_labels(options["labels"], num_classes)
    return opts


# ------------------------------------------------------------------------------------------------ torch-side lowering

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
                if p in (2, 2.0):
                    return x * torch.rsqrt(torch.clamp_min((x * x).sum(dim, keepdim=True), eps * eps))
                return x / torch.clamp_min(x.abs().sum(dim, keepdim=True), eps)
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
    x = torch.zeros(1, 3, imgsz, imgsz, dtype=_dtype(model))
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


def _num_classes(model: nn.Module, imgsz: int) -> int:
    with torch.no_grad():
        return int(model(torch.zeros(1, 3, imgsz, imgsz, dtype=_dtype(model))).shape[-1])


# ------------------------------------------------------------------------------------------------ coremltools fixes

_FIXES_INSTALLED = False
CONVERSION_FIXES = (
    "aten::Int/aten::Bool on a 1-element constant array: coremltools 9 calls int(ndarray), an error in the numpy "
    "used here (2.4; deprecated since 1.25); we take .item()",
    "layer_norm with a bias but no weight (SimA's kept norm3 shift): coremltools 9 crashes on gamma=None; "
    "we pass gamma=ones",
    "torch.reciprocal (SLA's 1/(q.sum k + eps)): coremltools 9 lowers it to MIL inverse with its default "
    "epsilon 1e-4, i.e. 1/(x + 1e-4); we pass epsilon=0 so the program computes 1/x",
    "classifier with a second output (logits): coremltools 9 indexes the user output types past their end once the "
    "classify op adds its two outputs; a final pass clears the output types after they have been applied",
)


def _install_conversion_fixes() -> None:
    """Converter overrides for coremltools 9 + torch 2.13 + numpy 2.4 (docs/coreml_spike.md records why)."""
    global _FIXES_INSTALLED
    if _FIXES_INSTALLED:
        return
    with quiet_coremltools():
        from coremltools.converters.mil import Builder as mb
        from coremltools.converters.mil.frontend.torch import ops as torch_ops
        from coremltools.converters.mil.frontend.torch.torch_op_registry import register_torch_op
        from coremltools.converters.mil.mil import types
        from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
        from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY, register_pass

    def scalar_cast(context, node, pytype, dtype_name):
        x = torch_ops._get_inputs(context, node, expected=1)[0]
        if x.can_be_folded_to_const() and np.ndim(x.val) > 0 and np.size(x.val) == 1:
            context.add(mb.const(val=pytype(np.asarray(x.val).item()), name=node.name), node.name)
            return
        torch_ops._cast(context, node, pytype, dtype_name)

    @register_torch_op(torch_alias=["int"], override=True)
    def _int(context, node):
        scalar_cast(context, node, int, "int32")

    @register_torch_op(torch_alias=["bool"], override=True)
    def _bool(context, node):
        scalar_cast(context, node, bool, "bool")

    @register_torch_op(torch_alias=["native_layer_norm"], override=True)
    def layer_norm(context, node):
        inputs = torch_ops._get_inputs(context, node, min_expected=2)
        x, shape = inputs[0], inputs[1]
        weight = inputs[2] if len(inputs) > 2 else None
        bias = inputs[3] if len(inputs) > 3 else None
        eps = inputs[4] if len(inputs) > 4 else None
        if weight is None and bias is not None:
            dims = tuple(int(d) for d in np.asarray(shape.val).reshape(-1))
            weight = mb.const(val=np.ones(dims, dtype=types.nptype_from_builtin(bias.dtype)))
        out = mb.layer_norm(x=x, axes=list(range(-len(np.asarray(shape.val).reshape(-1)), 0)), gamma=weight,
                            beta=bias, epsilon=eps, name=node.name)
        context.add((out, None, None) if node.kind == "native_layer_norm" else out, torch_name=node.name)

    @register_torch_op(override=True)
    def reciprocal(context, node):
        x = torch_ops._get_inputs(context, node, expected=1)[0]
        eps = types.nptype_from_builtin(x.dtype)(0)
        context.add(mb.inverse(x=x, epsilon=eps, name=node.name))

    if "vitedge::release_output_types" not in PASS_REGISTRY:
        @register_pass(namespace="vitedge")
        class release_output_types(AbstractGraphPass):  # noqa: N801  (pass names are snake_case)
            def apply(self, prog):
                for f in prog.functions.values():
                    f.output_types = None

    _FIXES_INSTALLED = True


# ------------------------------------------------------------------------------------------------ package helpers

def manifest_item_id(item_path: str) -> str:
    """The identifier we give a package item: uuid5 of its path (same contents -> same Manifest.json)."""
    return str(uuid.uuid5(_MANIFEST_NS, item_path)).upper()


def make_package_deterministic(package: Path) -> dict:
    """Same model -> same bytes: the protobuf re-serialized with sorted map keys (protobuf's map order varies per
    process), and the random item identifiers in Manifest.json replaced by uuid5(item path) in a fixed layout.
    Returns the new manifest; the package must still resolve (the caller loads it back)."""
    from .mil_interpreter import package_paths
    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, _ = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    spec_file.write_bytes(spec.SerializeToString(deterministic=True))
    path = Path(package) / "Manifest.json"
    manifest = json.loads(path.read_text())
    entries = manifest.get("itemInfoEntries", {})
    new_ids = {old: manifest_item_id(info["path"]) for old, info in entries.items()}
    manifest["itemInfoEntries"] = {new_ids[old]: entries[old] for old in sorted(entries, key=lambda k: new_ids[k])}
    if manifest.get("rootModelIdentifier") in new_ids:
        manifest["rootModelIdentifier"] = new_ids[manifest["rootModelIdentifier"]]
    path.write_text(json.dumps(manifest, indent=4, sort_keys=True) + "\n")
    return manifest


def check_package_loads(package: Path) -> None:
    """The package resolves through libmodelpackage and its program decodes (raises otherwise)."""
    load_program(package)


def read_metadata(package: Path) -> dict:
    """The package's user-defined metadata (what Xcode shows), JSON values decoded like the ONNX metadata:
    model, imgsz, batch, weights, checkpoint_sha256, precision, ios, input, preprocessing, reparam, overrides,
    attn_order, toolchain. `vitedge parity --artifact X.mlpackage` reads its model and size from here."""
    out = {}
    for k, v in load_program_spec(package).description.metadata.userDefined.items():
        if k.startswith("com.github.apple."):
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def load_program_spec(package: Path):
    from .mil_interpreter import package_paths
    with quiet_coremltools():
        from coremltools.proto import Model_pb2
    spec_file, _ = package_paths(package)
    spec = Model_pb2.Model()
    spec.ParseFromString(spec_file.read_bytes())
    return spec


# ------------------------------------------------------------------------------------------------ runners

def _pixels(x: np.ndarray, mean, std) -> np.ndarray:
    """Normalized NCHW -> the RGB pixel values 0-255 that normalize to it (the image input's domain)."""
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x * s + m) * np.float32(255.0)).astype(np.float32)


def quantized_pixels(x: np.ndarray, mean, std) -> np.ndarray:
    """The 8-bit pixels (as float32 0-255) a camera frame would give for normalized NCHW `x`."""
    return np.clip(np.round(_pixels(x, mean, std)), 0, 255).astype(np.float32)


def _logits_output(outputs) -> str:
    if "logits" in outputs:
        return "logits"
    tensors = [n for n in outputs if n not in ("classLabel", "classLabel_probs")]
    if not tensors:
        raise UnavailableError("the CoreML model has no logits output to compare")
    return tensors[0]


class EmulatedCoreMLRunner(Runner):
    """The saved package's ML Program executed by the numpy MIL interpreter (fp16 rounding emulated)."""
    mode = "emulated"

    def __init__(self, path: str | Path, max_samples: int | None = DEFAULT_EMULATED_SAMPLES):
        self.path = Path(path)
        self.program = load_program(self.path)
        unknown = self.program.unknown_ops()
        if unknown:
            from .mil_interpreter import UnsupportedOpError
            raise UnsupportedOpError(f"the MIL emulator has no kernel for op(s) {', '.join(unknown)}; add them to "
                                     "vitedge/targets/mil_ops.py or run the CoreML hop on macOS")
        self.input_name, (_, self.input_shape) = next(iter(self.program.inputs.items()))
        self.output = _logits_output(self.program.outputs)
        meta = dict(self.program.spec.description.metadata.userDefined)
        pre = json.loads(meta.get("preprocessing", "{}") or "{}")
        self.mean = pre.get("mean", list(IMAGENET_MEAN))
        self.std = pre.get("std", list(IMAGENET_STD))
        self.image = self.program.input_kind == "image"
        self.max_samples = max_samples
        self.backend = f"vitedge MIL interpreter (numpy {np.__version__}, {self.program.opset})"

    def max_batch(self) -> int | None:
        return int(self.input_shape[0]) if self.input_shape else None

    def reference_inputs(self, x: np.ndarray) -> np.ndarray:
        """The emulator takes float pixels, so the reference sees the parity inputs unchanged."""
        return x

    def info(self) -> dict:
        """Facts for the report: how the hop ran."""
        return {"mode": self.mode, "max_samples": self.max_samples, "opset": self.program.opset,
                "input": "image" if self.image else "tensor",
                "semantics": "each op in float32 on its inputs, outputs rounded to the declared dtype (fp16: "
                             "nearest-even, overflow to inf)"}

    def run(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        feed = _pixels(x, self.mean, self.std) if self.image else x
        return self.run_raw(feed)

    def run_raw(self, feed: np.ndarray) -> np.ndarray:
        """Run on the program's own input domain (pixels 0-255 for an image model)."""
        b = self.max_batch() or len(feed)
        outs = []
        for i in range(0, len(feed), b):
            chunk = feed[i:i + b]
            n = len(chunk)
            if n < b:
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], b - n, axis=0)])
            outs.append(np.asarray(self.program.run({self.input_name: chunk})[self.output], np.float32)[:n])
        return np.concatenate(outs)


class DeviceCoreMLRunner(Runner):
    """`MLModel.predict` through coremltools on macOS. Reports mode "device" only once a prediction returned."""

    def __init__(self, path: str | Path, coreml, compute_units=DEVICE_COMPUTE_UNITS):
        self.path = Path(path)
        self.coreml = coreml
        self.compute_units = tuple(compute_units)
        self.models = {u: coreml.load(self.path, u) for u in self.compute_units}
        spec = load_program_spec(self.path)
        inp = spec.description.input[0]
        self.input_name = inp.name
        self.image = inp.type.WhichOneof("Type") == "imageType"
        self.output = _logits_output([o.name for o in spec.description.output])
        pre = json.loads(dict(spec.description.metadata.userDefined).get("preprocessing", "{}") or "{}")
        self.mean, self.std = pre.get("mean", list(IMAGENET_MEAN)), pre.get("std", list(IMAGENET_STD))
        shape = tuple(inp.type.multiArrayType.shape) if not self.image else (1, 3, inp.type.imageType.height,
                                                                              inp.type.imageType.width)
        self._batch = int(shape[0]) if shape else 1
        self.predictions = 0
        self.unit_max_abs_diff: dict[str, float] = {}
        self.backend = f"CoreML {'/'.join(self.compute_units)} (macOS {platform.mac_ver()[0] or '?'})"
        self.max_samples = None

    @property
    def mode(self) -> str | None:  # never "device" without a real prediction
        return "device" if self.predictions > 0 else None

    def max_batch(self) -> int | None:
        return self._batch

    def reference_inputs(self, x: np.ndarray) -> np.ndarray:
        """What the reference must see: an image model receives 8-bit pixels, so the inputs are quantized."""
        if not self.image:
            return x
        p = quantized_pixels(x, self.mean, self.std)
        m = np.asarray(self.mean, np.float32).reshape(1, -1, 1, 1)
        s = np.asarray(self.std, np.float32).reshape(1, -1, 1, 1)
        return ((p / 255.0 - m) / s).astype(np.float32)

    def _feed(self, x: np.ndarray):
        if not self.image:
            return {self.input_name: np.asarray(x, np.float32)}
        from PIL import Image
        p = quantized_pixels(x, self.mean, self.std).astype(np.uint8)
        return {self.input_name: Image.fromarray(p[0].transpose(1, 2, 0), "RGB")}

    def run(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, np.float32)
        # a tensor input takes the artifact's whole static batch; an image input is one picture per prediction
        chunks = [x[i:i + 1] for i in range(len(x))] if self.image else [x]
        outs = {u: [] for u in self.compute_units}
        for chunk in chunks:
            feed = self._feed(chunk)
            for u, m in self.models.items():
                y = m.predict(feed)
                if self.output not in y:
                    raise RuntimeError(f"CoreML prediction ({u}) returned {sorted(y)} without {self.output!r}")
                outs[u].append(np.asarray(y[self.output], np.float32).reshape(len(chunk), -1))
        res = {u: np.concatenate(v) for u, v in outs.items()}
        first = res[self.compute_units[0]]
        for u in self.compute_units[1:]:
            d = float(np.abs(res[u] - first).max())
            self.unit_max_abs_diff[u] = max(d, self.unit_max_abs_diff.get(u, 0.0))
        self.predictions += len(x)
        return first

    def info(self) -> dict:
        """Facts for the report: compute units predicted on, how far they disagree, ops per device (compute plan)."""
        try:
            plan = self.compute_plan()
        except ComputePlanUnavailable as e:  # only the documented "not available here" cases; bugs propagate
            plan = f"unavailable ({e})"
        return {"mode": self.mode, "compute_units": list(self.compute_units), "predictions": self.predictions,
                "unit_max_abs_diff": dict(self.unit_max_abs_diff), "compute_plan": plan}

    def compute_plan(self) -> dict:
        """Ops per preferred compute device (MLComputePlan) for each compute unit set (see CoreMLFramework)."""
        return {u: self.coreml.compute_plan(self.path, u) for u in self.compute_units}

    def ane_residency(self, threshold: float | None = None) -> dict:
        """The Neural Engine residency check of the first compute unit set (CPU_AND_NE), see `ane_residency`."""
        unit = self.compute_units[0]
        if "NE" not in unit and unit != "ALL":
            return {"status": "inconclusive", "reason": f"compute units {unit} exclude the Neural Engine"}
        try:
            plan = self.coreml.compute_plan(self.path, unit)
        except ComputePlanUnavailable as e:
            return {"status": "inconclusive", "reason": f"no compute plan: {e}"}
        precision = read_metadata(self.path).get("precision")
        return ane_residency(plan, self.coreml.has_neural_engine(), threshold, precision)


MIN_ANE_SHARE = 0.5  # --require-ane: at least this share of the estimated cost (else of the ops) on the ANE


class ComputePlanUnavailable(RuntimeError):
    """CoreML cannot give a compute plan here (macOS < 14.4, no CoreML framework, the framework refused)."""


def _device_kind(device) -> str:
    """"ane" | "gpu" | "cpu" | "unknown" for a coremltools MLComputeDevice."""
    from coremltools.models.compute_device import (MLCPUComputeDevice, MLGPUComputeDevice,
                                                   MLNeuralEngineComputeDevice)
    for cls, key in ((MLNeuralEngineComputeDevice, "ane"), (MLGPUComputeDevice, "gpu"), (MLCPUComputeDevice, "cpu")):
        if isinstance(device, cls):
            return key
    return "unknown"


def summarize_compute_plan(plan) -> dict:
    """Each main-function op's preferred device, with counts and the estimated-cost share per device."""
    program = plan.model_structure.program
    if program is None:
        raise ComputePlanUnavailable("the model is not an ML Program")
    counts = {"ane": 0, "gpu": 0, "cpu": 0, "unknown": 0}
    cost = dict.fromkeys(counts, 0.0)
    ops, weighed = [], 0
    for op in program.functions["main"].block.operations:
        if op.operator_name == "const":
            continue
        usage = plan.get_compute_device_usage_for_mlprogram_operation(op)
        key = _device_kind(usage.preferred_compute_device) if usage is not None else "unknown"
        counts[key] += 1
        est = plan.get_estimated_cost_for_mlprogram_operation(op)
        if est is not None:
            cost[key] += float(est.weight)
            weighed += 1
        ops.append([op.operator_name, op.outputs[0].name if op.outputs else "", key])
    total = sum(counts.values())
    wsum = sum(cost.values())
    return {**counts, "ops": total, "ane_op_share": counts["ane"] / total if total else None,
            "cost_share": {k: v / wsum for k, v in cost.items()} if weighed and wsum > 0 else None,
            "per_op": ops}


def ane_residency(plan: dict, has_ane: bool | None, threshold: float | None = None,
                  precision: str | None = None) -> dict:
    """passed / failed / inconclusive: does a model meant for the Neural Engine mostly run there?

    The share is of the estimated cost (MLComputePlan's per-op weights) when CoreML gives it, else of the ops.
    Inconclusive, never passed or failed, where no Neural Engine exists (virtualized CI Macs) or it is unknown."""
    threshold = MIN_ANE_SHARE if threshold is None else threshold
    if has_ane is False:
        return {"status": "inconclusive", "threshold": threshold,
                "reason": "this Mac has no Neural Engine that CoreML can use (e.g. a virtualized CI Mac): where the "
                          "model would run on an iPhone cannot be told here"}
    if has_ane is None:
        return {"status": "inconclusive", "threshold": threshold,
                "reason": "CoreML did not list its compute devices (macOS 14+ needed)"}
    by_cost = plan.get("cost_share") is not None
    share = plan["cost_share"]["ane"] if by_cost else plan.get("ane_op_share")
    if share is None:
        return {"status": "inconclusive", "threshold": threshold, "reason": "the compute plan lists no op"}
    what = "estimated cost" if by_cost else "ops"
    off = [o for o in plan.get("per_op", []) if o[2] != "ane"][:10]
    out = {"status": "passed" if share >= threshold else "failed", "share": share, "measure": what,
           "threshold": threshold, "ops": {k: plan[k] for k in ("ane", "gpu", "cpu", "unknown")}, "not_on_ane": off}
    if out["status"] == "failed":
        hint = "; fp32 models never run on the Neural Engine: export fp16" if precision == "fp32" else ""
        out["reason"] = (f"{share:.0%} of the {what} prefers the Neural Engine ({plan['ane']} of {plan['ops']} ops), "
                         f"below --require-ane's {threshold:.0%}{hint}")
    else:
        out["reason"] = f"{share:.0%} of the {what} prefers the Neural Engine ({plan['ane']} of {plan['ops']} ops)"
    return out


class CoreMLFramework:
    """The real CoreML through coremltools (macOS only). Tests inject a stand-in with the same methods."""

    def load(self, path: Path, compute_unit: str):
        with quiet_coremltools():
            import coremltools as ct
        return ct.models.MLModel(str(path), compute_units=getattr(ct.ComputeUnit, compute_unit))

    def compute_plan(self, path: Path, compute_unit: str) -> dict:
        """Each op's preferred device (MLComputePlan, macOS 14.4+) for `compute_unit`; summarize_compute_plan."""
        with quiet_coremltools():
            import coremltools as ct
            from coremltools.models.compute_plan import MLComputePlan
        ver = tuple(int(v) for v in (platform.mac_ver()[0] or "0").split(".")[:2])
        if sys.platform == "darwin" and ver < (14, 4):
            raise ComputePlanUnavailable(f"MLComputePlan needs macOS 14.4+ (this is {platform.mac_ver()[0]})")
        units = getattr(ct.ComputeUnit, compute_unit)
        model = ct.models.MLModel(str(path), compute_units=units)
        try:
            plan = MLComputePlan.load_from_path(path=model.get_compiled_model_path(), compute_units=units)
        except ValueError as e:  # "MLComputePlan is not supported." (no CoreML framework proxy)
            raise ComputePlanUnavailable(str(e)) from None
        except RuntimeError as e:  # the framework's own error, passed through pybind11
            raise ComputePlanUnavailable(f"CoreML could not build the compute plan: {e}") from None
        return summarize_compute_plan(plan)

    def has_neural_engine(self) -> bool | None:
        """Whether CoreML can use a Neural Engine here (None: it cannot tell, macOS < 14)."""
        with quiet_coremltools():
            import coremltools as ct
            from coremltools.models.compute_device import MLNeuralEngineComputeDevice
        try:
            devices = ct.models.MLModel.get_available_compute_devices()
        except (AttributeError, RuntimeError):  # no framework proxy, or macOS < 14: the API is missing
            return None
        return any(isinstance(d, MLNeuralEngineComputeDevice) for d in devices)


def coreml_framework_status(system: str | None = None) -> tuple[bool, str | None]:
    """Can CoreML itself run predictions here? (macOS with coremltools' libcoremlpython)"""
    system = system or sys.platform
    if system != "darwin":
        return False, "CoreML predictions need macOS (coremltools ships libcoremlpython for macOS only)"
    try:
        with quiet_coremltools():
            from coremltools import libcoremlpython  # noqa: F401
    except Exception as e:
        return False, f"coremltools cannot load CoreML.framework here ({type(e).__name__}: {e})"
    return True, None


# ------------------------------------------------------------------------------------------------ the target

class CoreMLTarget(Target):
    name = "coreml"
    suffix = ".mlpackage"
    default_precision = "fp16"
    precisions = ("fp16", "fp32")
    options = ("ios", "input", "labels")
    dynamic_batch = False

    def __init__(self, framework=None, system: str | None = None):
        # `framework`/`system` are injectable so the macOS dispatch is testable on Linux.
        self.framework = framework
        self.system = system

    # -- capability --------------------------------------------------------------------------------
    def available(self) -> tuple[bool, str | None]:
        try:
            with quiet_coremltools():
                import coremltools  # noqa: F401
        except Exception as e:
            return False, f"coremltools is not installed ({type(e).__name__}: {e}); pip install coremltools"
        return True, None

    def device_status(self) -> tuple[bool, str | None]:
        system = self.system or sys.platform
        if self.framework is not None:  # an injected framework stands in for CoreML.framework on "darwin"
            return (True, None) if system == "darwin" else (False, "CoreML predictions need macOS")
        return coreml_framework_status(system)

    def validate_options(self, options: dict) -> None:
        """Check --ios/--input/--labels before any work (the label count is checked against the model later)."""
        parse_options(options)

    def run_mode(self) -> tuple[str, str | None]:
        """("device", None) where CoreML itself predicts, else ("emulated", why not device)."""
        ok, why = self.device_status()
        return ("device", None) if ok else ("emulated", why)

    def runnable(self) -> tuple[bool, str | None]:
        # Natively on macOS, else emulated by the numpy MIL interpreter (reported mode "emulated"); both read the
        # package with coremltools' libraries.
        return self.available()

    # -- lowering ----------------------------------------------------------------------------------
    def lower(self, deploy_model: nn.Module, spec: LowerSpec) -> Artifact:
        if spec.batch is None:
            raise VitedgeError("--dynamic-batch is not supported by coreml (static shapes keep the Neural Engine "
                               "usable); export coreml in a separate run without it")
        if spec.precision not in self.precisions:
            raise VitedgeError(f"coreml precision must be one of {', '.join(self.precisions)}; got {spec.precision!r}")
        ok, why = self.available()
        if not ok:
            raise UnavailableError(why)
        deploy_model = copy.deepcopy(deploy_model).float().eval()
        opts = parse_options(spec.options, _num_classes(deploy_model, spec.imgsz))
        with quiet_coremltools():
            import coremltools as ct
        _install_conversion_fixes()
        from ..exporter.precision import default_policy

        meta = dict(spec.metadata)
        mean, std = tuple(meta.get("mean", IMAGENET_MEAN)), tuple(meta.get("std", IMAGENET_STD))
        module, fold_note = deploy_model, None
        if opts.input == "image":
            module, fold_note = fold_input_std(deploy_model, std, spec.imgsz)
        if opts.labels:
            module = _Classifier(module)
        shape = (spec.batch, 3, spec.imgsz, spec.imgsz)
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
        outputs = [ct.TensorType(name="logits", dtype=np.float32)]
        kwargs = {}
        if opts.labels:
            outputs.append(ct.TensorType(name="probabilities", dtype=np.float32))
            kwargs["classifier_config"] = ct.ClassifierConfig(list(opts.labels),
                                                              predicted_probabilities_output="probabilities")
            pipeline = ct.PassPipeline()
            pipeline.append_pass("vitedge::release_output_types")
            kwargs["pass_pipeline"] = pipeline

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
        with quiet_coremltools(), _no_progress_bars():
            ml = ct.convert(traced, inputs=inputs, outputs=outputs, convert_to="mlprogram",
                            minimum_deployment_target=getattr(ct.target, f"iOS{opts.ios}"),
                            compute_precision=precision, skip_model_load=True, **kwargs)
        self._set_metadata(ml, spec, opts, mean, std, fold_note)
        path = Path(spec.out_dir) / f"{spec.name}{self.suffix}"
        with quiet_coremltools():
            ml.save(str(path))
        make_package_deterministic(path)
        program = load_program(path)  # the saved package resolves and decodes; its facts go into the report
        info = {
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
            "conversion_fixes": list(CONVERSION_FIXES),
            "emulator_unknown_ops": program.unknown_ops(),
        }
        return Artifact(self.name, path, spec.precision, info=info)

    def _set_metadata(self, ml, spec: LowerSpec, opts: CoreMLOptions, mean, std, fold_note) -> None:
        from .. import __version__

        meta = spec.metadata
        weights = meta.get("weights", "untrained")
        ml.author = str(meta.get("author") or f"vitedge {__version__}")
        ml.license = str(meta.get("license") or "weights: the license of the upstream checkpoint; "
                                                 "converter: vitedge (Apache-2.0)")
        ml.version = str(meta.get("version") or f"vitedge-{__version__}")
        kind = "classifier" if opts.labels else "logits"
        ml.short_description = (f"{spec.name} (re-parameterized deploy-form) image {kind}, {spec.imgsz}x{spec.imgsz} "
                                f"RGB, {spec.precision}, iOS {opts.ios}+; weights: {weights}")
        vers = meta.get("versions") or {}
        user = {
            "model": spec.name, "imgsz": str(spec.imgsz), "batch": str(spec.batch), "input": opts.input,
            "preprocessing": json.dumps(_input_spec(opts, None, mean, std, fold_note), sort_keys=True),
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
        for k, v in user.items():
            ml.user_defined_metadata[k] = v
        spec_pb = ml._spec  # MLModel.save writes this very spec
        for k in _DROPPED_METADATA:
            if k in spec_pb.description.metadata.userDefined:
                del spec_pb.description.metadata.userDefined[k]
        # Xcode's description pane
        spec_pb.description.input[0].shortDescription = (
            "RGB image, pixels 0-255 (normalized inside the model)" if opts.input == "image"
            else "float32 NCHW RGB, normalized with ImageNet mean/std")
        for o in spec_pb.description.output:
            o.shortDescription = {"logits": "class scores before softmax", "classLabel": "most likely class",
                                  "classLabel_probs": "probability of every class"}.get(o.name, "")

    def read_metadata(self, path) -> dict:
        """The pipeline's optional hook: what the package says about itself (model, imgsz, precision, ...)."""
        return read_metadata(Path(path))

    # -- running -----------------------------------------------------------------------------------
    def runner(self, artifact: Artifact, mode: str | None = None, **kw) -> Runner:
        """Device runner on macOS, emulated runner elsewhere; `mode` forces one ("device" fails off macOS)."""
        path = Path(artifact.path)
        if mode not in (None, "device", "emulated"):
            raise ValueError(f"mode must be 'device' or 'emulated'; got {mode!r}")
        if mode != "emulated":
            ok, why = self.device_status()
            if ok:
                return DeviceCoreMLRunner(path, self.framework or CoreMLFramework(),
                                          kw.get("compute_units", DEVICE_COMPUTE_UNITS))
            if mode == "device":
                raise UnavailableError(why)
        return EmulatedCoreMLRunner(path, kw.get("max_samples", DEFAULT_EMULATED_SAMPLES))


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
