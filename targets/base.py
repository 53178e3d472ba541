"""The interface every backend implements, declared whole: the pipeline calls these and nothing else.

A Target lowers the verified deploy-form model (and/or its simplified fp32 ONNX) into an artifact, and gives a
Runner for an artifact. `available()` / `runnable()` are the only places that check platforms: a backend that
cannot run here says why, and the parity hop is reported "unverified" with that reason. Every hook has a
default, so a backend overrides only what it has.

A Runner is a context manager owning its resources (sessions, engines, device buffers): `with target.runner(a)
as r: ...` releases them at the end (`close()`).

What the verdict needs from a backend beyond running it goes through hooks here too, so that exporter/ never
imports a backend or looks at a file's suffix: `read_weights` (the stored weights, for the weights check and the
localization of a failed compressed hop, or why they cannot be read), `graph` (the artifact as an ONNX graph, where
it is one: localized per module and checked as a graph), `require` (what a precision needs installed),
`bundle_runner` (an app bundle's self-check) and `device_bench` (timing and golden vectors on a tethered device,
`vitedge bench --device`: a DeviceBench).

Also the small facts every layer shares about artifacts and batches: `sha256_file`, `size_bytes`, `pad_batch`.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..models.digest import sha256_file  # noqa: F401  (shared here with every layer above)

if TYPE_CHECKING:  # annotations only: importing this module stays torch-free (the CLI builds parsers from it)
    import torch.nn as nn

    from .calibration import Calibration
    from .rows import TargetRow

@dataclass
class LowerSpec:
    """Everything a target needs to lower one model."""
    name: str                 # model name (file stem)
    imgsz: int
    batch: int | None         # None = dynamic batch
    precision: str            # "fp32" | "fp16" | one of the compressed kinds the target lists in `precisions`
    out_dir: Path             # the temporary build folder (renamed into place by the pipeline)
    onnx_path: Path | None    # the simplified, verified fp32 ONNX
    metadata: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # target-specific flags (ios, input, labels, workspace, ...)
    calibration: "Calibration | None" = None     # int8 / w8a8: the samples that set activation ranges
    qdq_path: Path | None = None                 # int8: the QDQ graph (in the target's `qdq_encoding`) to build from


@dataclass
class Artifact:
    target: str
    path: Path
    precision: str
    extra_files: list = field(default_factory=list)  # sidecars written next to it
    info: dict = field(default_factory=dict)          # anything the report should carry (policy, node counts, ...)
    entry: str | None = None  # one size of a multi-size artifact: the function / method that serves it (runners run it)


@dataclass
class StoredWeights:
    """The weights an artifact stores, read back from the saved file (by the backend's own reader): the weights check
    compares them with the deploy-form's, and a failed compressed hop without a graph is localized with them."""
    values: dict                       # name -> float32 value (dequantized / decompressed) of every stored weight
    named: bool = True                 # False: the file carries no names (matched to parameters by shape and values)
    scale_floor: float = 0.0           # the backend's int8 quantizer's floor on a channel's scale (the emulation's)
    graph: object = None               # the onnx.ModelProto where the artifact is one (unnamed MatMul weights are
    #                                    named by their module scopes)
    reference: object = None           # deploy-form -> the deploy-form as the artifact was built from it (an image
    #                                    input's 1/std folded into its first conv); None: the deploy-form itself
    input_scale: tuple | None = None   # with `reference`: the per-channel factor the inputs get on the way in (std)
    localize: dict | None = None       # the weights a localization loads into a copy of the deploy-form (None: it
    #                                    is not localized by its weights)
    biases: dict | None = None         # unnamed files: {stored weight name: its layer's graph.weights.StoredBias}, each judged as
    #                                    the bias of the parameter its weight pairs with (named files: in `values`)


class Runner(ABC):
    """Runs an artifact on float32 NCHW batches (normalized like the parity set) and returns float32 logits."""
    mode: str | None = "device"      # "reference" | "device" | "emulated" (None: not known to have run yet)
    backend: str = ""                # runtime and version, as the report names it
    max_samples: int | None = None   # run only the first N parity inputs (an emulator's documented subset)

    @abstractmethod
    def run(self, x: np.ndarray) -> np.ndarray:
        ...

    def max_batch(self) -> int | None:
        """Largest batch the artifact accepts per call (None: any); a static batch is exactly this."""
        return None

    def reference_inputs(self, x: np.ndarray) -> np.ndarray:
        """The inputs the reference must see for `run(x)` to be comparable: `x` itself unless the artifact changes
        its inputs on the way in (an image input quantizes them to 8-bit pixels). Return `x` when unchanged."""
        return x

    def info(self) -> dict:
        """Facts for the report about how this runner ran (compute units, emulated semantics, ...); after run()."""
        return {}

    def close(self) -> None:
        """Release sessions, engines and buffers; the runner is not used afterwards. Safe to call twice."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DeviceBench(ABC):
    """A tethered device a target's artifacts are timed on (`vitedge bench --device KIND[:NAME]`, KIND in its row's
    `devices`): how to reach it, what it is sent, and one timed run of an artifact with its golden vectors there.
    The bench (exporter/timing/device_bench.py) lowers, judges the outputs and writes the report's `device`
    section; everything that speaks to the device is here."""
    kind: str = ""                  # the --device kind (the section's "type")
    compute_units: str = ""         # where on the device the artifact runs (the section's "compute_units")
    parity_samples: int = 16        # golden inputs sent to the device (each a round trip)
    precision: str = "fp16"         # what the model bench lowers to for it (its parity profile's precision)

    @abstractmethod
    def connect(self, spec: str):
        """The connected device `spec` names (`KIND` or `KIND:NAME`), or VitedgeError naming what is missing;
        the returned object's `name`, `os_version` and `os_build_number` head the report's section."""

    def signing(self, team_id: str | None, bundle_id: str | None) -> str | None:
        """The signing identity the device run needs, checked before any work (VitedgeError naming the flag);
        None where the device needs none."""
        return None

    def inputs(self, x: np.ndarray, image: bool, mean, std) -> tuple[np.ndarray, np.ndarray]:
        """(what the device is sent, what the reference must see) for normalized NCHW inputs `x`; `image`: the
        artifact takes pixels."""
        return x, x

    @abstractmethod
    def run(self, path: str | Path, device, feed: np.ndarray, team_id: str | None, iterations: int,
            bundle_id: str | None = None) -> dict:
        """Time load and predict of the artifact at `path` on `device` and run each row of `feed` through it:
        {"load_ms": [...], "predict_ms": [...], "outputs": array, "name", "os", "os_build", "transport": [...]}."""


class Target(ABC):
    name: str = ""
    suffix: str = ""
    default_precision: str = "fp32"
    precisions: tuple = ("fp32",)
    options: tuple = ()          # target-specific CLI option names it accepts
    dynamic_batch: bool = False  # whether --dynamic-batch applies
    hop_names: dict = {}         # precision -> parity hop name, where it is not the target's name
    qdq_encoding: str | None = None  # int8: which QDQ encoding the pipeline writes for it (targets/graph/qdq.py);
    #                                  None: the target quantizes the deploy-form itself (LowerSpec.calibration)
    localization: str | None = None  # why a failed hop of this target's artifacts is not localized, where it is not
    weights_unread: str = "its stored weights are not read outside its runtime"  # where read_weights gives None
    threaded: bool = False           # its runner takes `threads` (a CPU runtime's pool), as the bench sets them
    existing_hop_names: dict = {}    # precision -> hop name of an existing artifact `parity` checks, where it differs
    row: "TargetRow | None" = None   # its declaration (rows.py): name, suffix, precisions, options come from it

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("row") is not None:
            cls.use_row(cls.row)

    @classmethod
    def use_row(cls, row: "TargetRow") -> None:
        """Take the facts of `row`: one declaration, the class's name, suffix, precisions, ... are its row's."""
        cls.row = row
        cls.name, cls.suffix, cls.precisions = row.name, row.suffix, row.precisions
        cls.default_precision, cls.dynamic_batch, cls.options = (row.default_precision, row.dynamic_batch,
                                                                 row.option_keys)

    def hop_name(self, precision: str | None) -> str:
        """The parity hop this target's artifact of `precision` is reported as."""
        return self.hop_names.get(precision, self.name)

    def available(self) -> tuple[bool, str | None]:
        """Can this target lower artifacts here? (ok, reason when not)."""
        return True, None

    def runnable(self) -> tuple[bool, str | None]:
        """Can this target execute its artifacts here (natively or emulated)? (ok, reason when not)."""
        return True, None

    def validate_options(self, options: dict) -> None:
        """Check target-specific option values before any work; raise VitedgeError naming the flag."""

    def validate_input(self, batch: int | None, options: dict) -> None:
        """Check what this target's input can take at `batch` (None: dynamic) with its options, before any work;
        raise VitedgeError naming the problem and the fix."""

    def plan_precision(self, precision: str, options: dict) -> dict:
        """Check `precision` against this target's options (those the user set; unset ones are absent) before any
        work and return the options it needs (e.g. a deployment target raised for it, with a note of why). Raise
        VitedgeError naming the flags for a combination that cannot work."""
        return options

    def plan_sizes(self, sizes: int, options: dict) -> dict:
        """Check, before any work, that one artifact of `sizes` input sizes can be made with these options (those
        the user set), and return the options it needs (e.g. a deployment target raised for it, with a note of
        why). Only targets whose row has `entries` are asked."""
        return options

    def file_name(self, name: str, precision: str) -> str:
        """The artifact's file name for model `name` at `precision` (NAME.mlpackage; a target whose compressed
        artifacts are named apart overrides it), as `lower` writes it and a multi-size export names its one file."""
        return f"{name}{self.suffix}"

    def lower_sizes(self, parts: dict, path: Path) -> Artifact:
        """One artifact at `path` of several sizes: `parts` maps each entry name (settings.size_entry) to its
        (deploy-form, LowerSpec) at that size, in order; the first entry is the default. Targets whose row has
        `entries` implement it."""
        raise NotImplementedError(f"the {self.name} target writes one file per size")

    def held_sizes(self, meta: dict) -> dict:
        """{entry: [H, W]} of the sizes one artifact holds, from its decoded metadata (`read_metadata`) as this
        target's `lower_sizes` wrote it; {} for an artifact of one size (each ONNX / TensorRT file is one size)."""
        return {}

    def read_metadata(self, path: str | Path) -> dict:
        """What an artifact this target wrote says about itself (model, imgsz, precision, overrides, ...);
        string values may be JSON. {} when the artifact carries nothing."""
        return {}

    def require(self, precision: str) -> None:
        """Check, before any work, that what `precision` needs on this target is installed; raise VitedgeError
        naming the extra."""

    def read_weights(self, path: str | Path) -> StoredWeights | None:
        """The weights the artifact at `path` stores, read from the file; None where they cannot be read outside
        the runtime (`weights_unread` says why). An ONNX graph's (its row's `onnx_graph`) are read here."""
        model = self.graph(path)
        if model is None:
            return None
        from .graph.weights import onnx_stored_weights

        return StoredWeights(onnx_stored_weights(model), graph=model)

    def graph(self, path: str | Path, weights: bool = True):
        """The artifact at `path` as an onnx.ModelProto, where it is an ONNX graph (its row's `onnx_graph`: checked
        as a graph and localized per module by ONNX Runtime); None otherwise. `weights=False`: the graph without
        its external data (counting nodes)."""
        if self.row is None or not self.row.onnx_graph:
            return None
        import onnx

        return onnx.load(str(path), load_external_data=weights)

    def bundle_runner(self, path: str | Path, entry: str | None = None) -> Runner:
        """A runner of the artifact at `path` (of its function / method `entry`, in a multi-size artifact) on the
        input an app feeds it (an image input's pixels 0-255, else the normalized tensor), on every sample, here:
        `vitedge package` checks its bundle's golden vectors with it."""
        raise UnavailableError(f"the {self.name} target makes no app bundle")

    def device_bench(self, kind: str) -> DeviceBench | None:
        """The tethered device of `kind` this target's artifacts are timed on (its row's `devices`); None where
        it has none."""
        return None

    @abstractmethod
    def lower(self, deploy_model: "nn.Module", spec: LowerSpec) -> Artifact:
        ...

    @abstractmethod
    def runner(self, artifact: Artifact, mode: str | None = None) -> Runner:
        """A runner for `artifact`. `mode` ("device" | "emulated") asks for one kind: a target that cannot give it
        raises UnavailableError, or returns what it has (the pipeline then reports the mismatch)."""


class UnavailableError(RuntimeError):
    """Raised by a target or runner that cannot work on this machine; its message is the reason."""


def reraise_interrupt(e: BaseException) -> None:
    """Raise KeyboardInterrupt if the import failure `e` was a Ctrl-C: one that lands while a C extension is being
    imported surfaces as ImportError("initialization failed") with the KeyboardInterrupt as its cause or context,
    which must end the run (exit 130), never read as "not installed"."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from e
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__


# A chunk of `batch` samples holds inputs of up to this many pixels; a larger input gets proportionally fewer
# samples per chunk (at least one), so a chunk's activations stay the size they are at 224 x 224: at 800 x 1344, 32
# SwiftFormer-XS samples in float32 held ~4 GB of activations (8 in float64 ~3 GB) for no speedup.
CHUNK_PIXELS = 224 * 224


def chunk_size(batch: int, shape) -> int:
    """Samples per chunk for inputs of `shape` (N, C, H, W...): `batch` up to CHUNK_PIXELS pixels per sample,
    proportionally fewer above (at least one)."""
    pixels = int(np.prod(shape[2:])) if len(shape) > 2 else 0
    return max(1, min(batch, batch * CHUNK_PIXELS // pixels)) if pixels else batch


def pad_batch(x: np.ndarray, batch: int) -> np.ndarray:
    """`x` (n <= batch rows) padded to exactly `batch` rows by repeating its last row, for artifacts with a static
    batch; the caller keeps the first n outputs. A real input (not zeros) keeps the padding rows' numerics
    ordinary."""
    n = len(x)
    if n >= batch:
        return x
    return np.concatenate([x, np.repeat(x[-1:], batch - n, axis=0)])


def umask_modes(path: str | Path) -> None:
    """Give `path` (a file, or a folder and everything in it) the modes a plain write gives: 0666 for files and
    0777 for folders, less the umask. coremltools (a package's model.mlmodel, weights/) and safetensors write
    theirs 0600 / 0700, unreadable to the group and others unlike every other artifact."""
    mask = os.umask(0)
    os.umask(mask)
    path = Path(path)
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def listed_sizes(meta: dict, key: str) -> dict:
    """meta[key] where it is a non-empty {entry: [H, W]}, else {}: a `held_sizes` read of the key a target wrote."""
    held = meta.get(key)
    return held if isinstance(held, dict) and held else {}


def size_bytes(path: str | Path) -> int:
    path = Path(path)
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
