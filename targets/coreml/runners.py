"""Runners for a saved `.mlpackage`: CoreML itself on macOS ("device"), the numpy MIL interpreter elsewhere
("emulated").

A device runner reports mode "device" only after a real prediction returned. An image-input model receives 8-bit
pixels on the device, so its `reference_inputs` quantizes the parity inputs the same way; the emulator takes the
float pixels and needs no such step.
"""
from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np

from ...models.outputs import pack_arrays
from ...models.registry import IMAGENET_MEAN, IMAGENET_STD
from ..base import Runner, UnavailableError, pad_batch
from .framework import ComputePlanUnavailable, ane_residency
from .mil_interpreter import UnsupportedOpError, load_program
from .mlpackage import load_program_spec, read_metadata

DEFAULT_EMULATED_SAMPLES = 16   # parity inputs the emulated hop runs (the first N: every input category appears)
DEVICE_COMPUTE_UNITS = ("CPU_AND_NE", "CPU_ONLY")  # the first is the one reported; ALL aborts on some macOS hosts


def _pixels(x: np.ndarray, mean, std) -> np.ndarray:
    """Normalized NCHW -> the RGB pixel values 0-255 that normalize to it (the image input's domain)."""
    m = np.asarray(mean, np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, np.float32).reshape(1, -1, 1, 1)
    return ((x * s + m) * np.float32(255.0)).astype(np.float32)


def quantized_pixels(x: np.ndarray, mean, std) -> np.ndarray:
    """The 8-bit pixels (as float32 0-255) a camera frame would give for normalized NCHW `x`."""
    return np.clip(np.round(_pixels(x, mean, std)), 0, 255).astype(np.float32)


def _judged_outputs(outputs) -> list[str]:
    """The outputs a hop compares, in order: `logits`, else every tensor output (feature maps: each judged)."""
    if "logits" in outputs:
        return ["logits"]
    tensors = [n for n in outputs if n not in ("classLabel", "classLabel_probs", "probabilities")]
    if not tensors:
        raise UnavailableError("the CoreML model has no logits output to compare")
    return tensors


class EmulatedCoreMLRunner(Runner):
    """The saved package's ML Program executed by the numpy MIL interpreter (fp16 rounding emulated)."""
    mode = "emulated"

    def __init__(self, path: str | Path, max_samples: int | None = DEFAULT_EMULATED_SAMPLES,
                 function: str | None = None):
        self.path, self.function = Path(path), function  # function: of a multifunction package (None: default)
        self.program = load_program(self.path, function)
        unknown = self.program.unknown_ops()
        if unknown:
            raise UnsupportedOpError(f"the MIL emulator has no kernel for op(s) {', '.join(unknown)}; add them to "
                                     "vitedge/targets/coreml/mil_ops.py or run the CoreML hop on macOS")
        self.input_name, (_, self.input_shape) = next(iter(self.program.inputs.items()))
        self.outputs = _judged_outputs(list(self.program.outputs))
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
                **({"function": self.function} if self.function else {}),
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
            y = self.program.run({self.input_name: pad_batch(chunk, b)})
            outs.append(pack_arrays([np.asarray(y[n], np.float32)[:len(chunk)] for n in self.outputs]))
        return np.concatenate(outs)

    def close(self) -> None:
        self.program = None  # the decoded weights


class DeviceCoreMLRunner(Runner):
    """`MLModel.predict` through coremltools on macOS. Reports mode "device" only once a prediction returned."""

    def __init__(self, path: str | Path, coreml, compute_units=DEVICE_COMPUTE_UNITS, function: str | None = None):
        self.path, self.function = Path(path), function  # function: of a multifunction package (None: default)
        self.coreml = coreml
        self.compute_units = tuple(compute_units)
        self.models = {u: coreml.load(self.path, u, **({"function": function} if function else {}))
                       for u in self.compute_units}
        spec = load_program_spec(self.path)
        desc = next((f for f in spec.description.functions if f.name == function), spec.description)
        inp = desc.input[0]
        self.input_name = inp.name
        self.image = inp.type.WhichOneof("Type") == "imageType"
        self.outputs = _judged_outputs([o.name for o in desc.output])
        pre = json.loads(dict(spec.description.metadata.userDefined).get("preprocessing", "{}") or "{}")
        self.mean, self.std = pre.get("mean", list(IMAGENET_MEAN)), pre.get("std", list(IMAGENET_STD))
        shape = tuple(inp.type.multiArrayType.shape) if not self.image else (1, 3, inp.type.imageType.height,
                                                                              inp.type.imageType.width)
        self._batch = int(shape[0]) if shape else 1
        self.predictions = 0
        self.unit_max_abs_diff: dict[str, float] = {}
        self.backend = f"CoreML {'/'.join(self.compute_units)} (macOS {platform.mac_ver()[0] or '?'})"

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
                missing = [n for n in self.outputs if n not in y]
                if missing:
                    raise RuntimeError(f"CoreML prediction ({u}) returned {sorted(y)} without {missing}")
                outs[u].append(pack_arrays([np.asarray(y[n], np.float32).reshape(len(chunk), -1)
                                            for n in self.outputs]))
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

    def close(self) -> None:
        self.models = {}  # the loaded MLModels (compiled programs, device sessions)
