"""CoreML compression of a saved ML Program through `coremltools.optimize.coreml`: w8, palette4/6 and w8a8.

`compress_package(src, dst, kind)` reads the `.mlpackage` the coreml target wrote (fp16 with the precision policy's
fp32 islands), compresses it and saves a deterministic package whose `info` says what was compressed, what stayed
float and why, which samples calibrated activations, and the sizes. The numpy MIL interpreter runs the result
(kernels in mil_ops_compressed.py), so the emulated `coreml` hop works for compressed packages too.

| kind | coremltools call | config |
|---|---|---|
| `w8` | `linear_quantize_weights` | int8, `linear_symmetric`, `per_channel` |
| `palette4` / `palette6` | `palettize_weights` | `kmeans`, 4 / 6 bits; iOS 18: `per_grouped_channel` (16 channels per LUT), iOS 16-17: `per_tensor` |
| `w8a8` (iOS 17+) | `linear_quantize_activations`, then `linear_quantize_weights` | activations int8 `linear_symmetric` from calibration ranges; weights as `w8` |

Weights under coremltools' `weight_threshold` (2048 elements) stay fp16, as coremltools does by default: their
decompression costs more than their bytes save. Activation ranges: coremltools calibrates with `MLModel.predict`
(macOS only) and, in coremltools 9, keeps only the *last* sample's min/max for every tensor
(`ModelDebugger.record_intermediate_output` overwrites before comparing). Here the ranges come from the MIL
interpreter running the source program on every calibration sample (min/max over all of them, concat inputs and
output sharing one range as coremltools does), handed to `linear_quantize_activations` in place of its own
calibration; everything else is coremltools' pass.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import VitedgeError
from ...precisions import TABLE
from ..rows import COREML_ROW
from ..calibration import calibration_record
from .convert import _no_progress_bars
from .mil_interpreter import load_program, package_paths
from .coremltools_import import quiet_coremltools
from .mlpackage import load_program_spec, make_package_deterministic

KINDS = tuple(p for p in COREML_ROW.precisions if TABLE[p].compressed)  # the compressed kinds coreml offers
WEIGHT_ONLY = tuple(k for k in KINDS if TABLE[k].weight_only)
# the iOS each kind needs: weight compression (constexpr_* ops) iOS 16; quantized activations (activation
# quantize/dequantize ops) iOS 17
MIN_IOS = {k: 17 if TABLE[k].calibrates else 16 for k in KINDS}
PALETTE_BITS = {k: TABLE[k].bits for k in KINDS if TABLE[k].palette}  # the precision rows' bits
GROUPED_PALETTE_IOS = 18       # per_grouped_channel palettization needs the iOS 18 constexpr_lut_to_dense
PALETTE_GROUP = 16             # output channels sharing one LUT on iOS 18
WEIGHT_THRESHOLD = max(TABLE[k].emulation.min_elements for k in KINDS)  # the rows': smaller weights stay fp16
_SPEC_TO_IOS = {7: 16, 8: 17, 9: 18}
ACTIVATION_FLOAT_OPS = ("add",)  # residual adds keep float activations (see docs/quantization_spike.md)
_FLOAT = ("fp16", "fp32", "fp64")  # MIL float dtypes


@dataclass
class Compressed:
    path: Path
    kind: str
    info: dict


def package_ios(path: Path) -> int:
    """The iOS deployment target of a package, from its specification version (7 = iOS 16, 8 = 17, 9 = 18)."""
    version = load_program_spec(Path(path)).specificationVersion
    if version not in _SPEC_TO_IOS:
        raise VitedgeError(f"{path} has Core ML specification version {version}; compression needs an iOS 16-18 "
                           "ML Program: re-export with --target coreml --ios 16|17|18")
    return _SPEC_TO_IOS[version]


def require_kmeans(kind: str) -> None:
    """palette4/6 cluster weights with scikit-learn's KMeans inside coremltools (kmeans1d, where installed, only
    takes fp16 tensors of >= 10k elements): without scikit-learn, a one-line VitedgeError naming the extra."""
    if kind not in PALETTE_BITS:
        return
    try:
        import sklearn.cluster  # noqa: F401
    except ImportError:
        raise VitedgeError(f"--precision {kind} needs scikit-learn for k-means palettization: "
                           "pip install 'vitedge[compress]'") from None


def check_request(kind: str, ios: int, calibration) -> None:
    """The combinations that cannot work, as one-line VitedgeErrors (the CLI exits 2 on them)."""
    if kind not in KINDS:
        raise VitedgeError(f"CoreML compression must be one of {', '.join(KINDS)}; got {kind!r}")
    if ios < MIN_IOS[kind]:
        raise VitedgeError(f"{kind} needs iOS {MIN_IOS[kind]}+ (activation quantize/dequantize ops); the package "
                           f"targets iOS {ios}: export with --ios {MIN_IOS[kind]} or later")
    if kind in WEIGHT_ONLY and calibration is not None:
        raise VitedgeError(f"{kind} compresses weights only and takes no calibration samples: drop them (--calib)")
    if kind == "w8a8" and (calibration is None or len(calibration) == 0):
        raise VitedgeError("w8a8 needs calibration samples (--calib N >= 1) to set its activation ranges")
    require_kmeans(kind)


@contextlib.contextmanager
def _quiet():
    """coremltools without its import noise and tqdm bars (errors still raise)."""
    with quiet_coremltools(), _no_progress_bars():
        yield


def _weight_config(cto):
    return cto.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel",
                                       weight_threshold=WEIGHT_THRESHOLD)


def float_weights(program, threshold: int = 0) -> dict[str, tuple[int, ...]]:
    """{const name: shape} of the program's float constants of at least `threshold` elements, as coremltools'
    compression passes see them. Read from the program vitedge decoded, not with coremltools'
    get_weights_metadata: that raises (AttributeError: 'list' object has no attribute 'val') on a constant feeding
    an op that takes a list of inputs, e.g. SimA's concat."""
    return {n: np.shape(v) for n, v in program.consts.items()
            if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating) and v.size >= threshold}


def _palette_config(cto, program, nbits: int, ios: int) -> tuple[object, dict]:
    """(OptimizationConfig, {weight: LUT group size}). On iOS 18 each LUT serves PALETTE_GROUP output channels;
    a weight whose channel count PALETTE_GROUP does not divide gets the largest power-of-two group that does
    (coremltools would otherwise leave it fp16 with only a log warning)."""
    if ios < GROUPED_PALETTE_IOS:
        cfg = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_tensor",
                                     weight_threshold=WEIGHT_THRESHOLD)
        return cto.OptimizationConfig(global_config=cfg), {}
    groups, per_name = {}, {}
    for name, shape in float_weights(program, WEIGHT_THRESHOLD).items():
        channels = int(shape[0])  # conv/linear weights: output channels first
        g = math.gcd(channels, PALETTE_GROUP)
        groups[name] = g
        if g != PALETTE_GROUP:
            per_name[name] = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_grouped_channel",
                                                    group_size=g, weight_threshold=WEIGHT_THRESHOLD)
    cfg = cto.OpPalettizerConfig(mode="kmeans", nbits=nbits, granularity="per_grouped_channel",
                                 group_size=PALETTE_GROUP, weight_threshold=WEIGHT_THRESHOLD)
    return cto.OptimizationConfig(global_config=cfg, op_name_configs=per_name or None), groups


def activation_ranges(src: Path, samples: list[np.ndarray]) -> dict[str, dict[str, np.float32]]:
    """{tensor: {"rmin", "rmax"}} over every calibration sample, for the program's input and every float op
    output except the program outputs, in the format coremltools' activation passes read."""
    prog = load_program(src)
    (input_name, _), = prog.inputs.items()
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}

    def see(name: str, v) -> None:
        v = np.asarray(v, np.float32)
        lo[name] = min(lo.get(name, np.inf), float(v.min()))
        hi[name] = max(hi.get(name, -np.inf), float(v.max()))

    floats = [n for o in prog.ops for n, dt in o.outputs if dt in _FLOAT and n not in prog.outputs]
    for x in samples:
        env = prog.run({input_name: x}, keep=True)
        see(input_name, x)
        for n in floats:
            see(n, env[n])
    # coremltools gives a concat's inputs and output one shared range (a quantized concat needs one scale)
    groups = [set(n for kind, n in o.inputs["values"] if kind == "var") | {o.outputs[0][0]}
              for o in prog.ops if o.type == "concat"]
    for group in _merge(groups):
        names = [n for n in group if n in lo]
        if names:
            a, b = min(lo[n] for n in names), max(hi[n] for n in names)
            for n in names:
                lo[n], hi[n] = a, b
    return {n: {"rmin": np.float32(lo[n]), "rmax": np.float32(hi[n])} for n in lo}


def _merge(groups: list[set]) -> list[set]:
    out: list[set] = []
    for g in groups:
        g = set(g)
        for other in [o for o in out if o & g]:
            g |= other
            out.remove(other)
        out.append(g)
    return out


@contextlib.contextmanager
def _interpreter_calibration(stats: dict):
    """coremltools 9 calls `_get_activation_calibration_stats(mlmodel, sample_data, group_size)` (MLModel.predict,
    macOS only) inside `linear_quantize_activations`; this hands it the interpreter's ranges instead."""
    from coremltools.optimize.coreml import _post_training_quantization as ptq

    if not hasattr(ptq, "_get_activation_calibration_stats"):
        raise VitedgeError("this coremltools has no _get_activation_calibration_stats hook: w8a8 calibration "
                           "was written for coremltools 9; pin coremltools 9.x")
    original = ptq._get_activation_calibration_stats
    ptq._get_activation_calibration_stats = lambda *args, **kwargs: stats
    try:
        yield
    finally:
        ptq._get_activation_calibration_stats = original


def _batches(x: np.ndarray, batch: int) -> list[np.ndarray]:
    """Calibration images in the program's static batch (the last chunk padded by repeating its last image:
    repeats do not move a min/max)."""
    out = []
    for i in range(0, len(x), batch):
        chunk = x[i:i + batch]
        if len(chunk) < batch:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], batch - len(chunk), axis=0)])
        out.append(np.ascontiguousarray(chunk, np.float32))
    return out


def _weights_bytes(path: Path) -> int:
    _, weights = package_paths(path)
    return sum(f.stat().st_size for f in weights.rglob("*") if f.is_file()) if weights else 0


def _package_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def compress_package(src: str | Path, dst: str | Path, kind: str, *, calibration: np.ndarray | None = None,
                     calibration_ids: list | None = None) -> Compressed:
    """Compress the ML Program at `src` into a new package `dst` (see the module doc for each kind).

    `calibration`: w8a8 only, float32 NCHW images in the program's input domain (normalized tensors, or pixels for an
    image-input package); they must not be the images the result is evaluated on. `calibration_ids` names them
    (file names, dataset indices) for the record; the array's sha256 is recorded either way.
    """
    src, dst = Path(src), Path(dst)
    ios = package_ios(src)
    check_request(kind, ios, calibration)
    if dst.exists():
        raise VitedgeError(f"{dst} already exists: remove it or choose another output path")
    with _quiet():
        import coremltools as ct
        import coremltools.optimize.coreml as cto

        ml = ct.models.MLModel(str(src), skip_model_load=True)
    source_ops = load_program(src)
    weights = {n: int(np.prod(shape)) for n, shape in float_weights(source_ops).items()}
    info: dict = {"kind": kind, "ios": ios, "coremltools": ct.__version__, "weight_threshold": WEIGHT_THRESHOLD}
    with _quiet():
        if kind == "w8":
            out = cto.linear_quantize_weights(ml, cto.OptimizationConfig(global_config=_weight_config(cto)))
            info["api"] = ("linear_quantize_weights(OpLinearQuantizerConfig(mode='linear_symmetric', dtype='int8', "
                           "granularity='per_channel'))")
        elif kind in PALETTE_BITS:
            config, groups = _palette_config(cto, source_ops, PALETTE_BITS[kind], ios)
            out = cto.palettize_weights(ml, config)
            granularity = "per_grouped_channel" if ios >= GROUPED_PALETTE_IOS else "per_tensor"
            info["api"] = (f"palettize_weights(OpPalettizerConfig(mode='kmeans', nbits={PALETTE_BITS[kind]}, "
                           f"granularity='{granularity}'" + (f", group_size={PALETTE_GROUP}))" if groups else "))"))
            if groups:
                info["lut_group_sizes"] = {str(g): sum(1 for v in groups.values() if v == g)
                                           for g in sorted(set(groups.values()))}
        else:
            (input_name, (_, shape)), = source_ops.inputs.items()
            samples = _batches(np.asarray(calibration, np.float32), int(shape[0]) if shape else 1)
            stats = activation_ranges(src, samples)
            act_cfg = cto.OptimizationConfig(global_config=cto.OpLinearQuantizerConfig(mode="linear_symmetric"),
                                             op_type_configs={t: None for t in ACTIVATION_FLOAT_OPS})
            with _interpreter_calibration(stats):
                a8 = cto.linear_quantize_activations(ml, act_cfg, [{input_name: s} for s in samples])
            out = cto.linear_quantize_weights(a8, cto.OptimizationConfig(global_config=_weight_config(cto)))
            info["api"] = ("linear_quantize_activations(OpLinearQuantizerConfig(mode='linear_symmetric')) with "
                           "interpreter min/max ranges, then linear_quantize_weights(int8 per_channel)")
            info["calibration"] = {
                **calibration_record(calibration, calibration_ids,
                                     "min/max over all samples, the source program run by the vitedge MIL interpreter"),
                "tensors": len(stats)}
        entry = {"kind": kind, "ios": ios}
        if calibration is not None:  # which samples calibrated: `vitedge parity` leaves them out of its evaluation
            entry["calibration_ids"] = [str(i) for i in calibration_ids] if calibration_ids is not None else None
        out.user_defined_metadata["compression"] = json.dumps(entry, sort_keys=True)
        out.user_defined_metadata["precision"] = kind  # what `vitedge parity` reads to pick the tolerance profile
        tmp = dst.with_name(dst.stem + ".partial.mlpackage")  # coremltools saves only *.mlpackage
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            out.save(str(tmp))
            make_package_deterministic(tmp)
            tmp.rename(dst)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    program = load_program(dst)
    info.update(_facts(source_ops, program, weights, src, dst))
    return Compressed(dst, kind, info)


_CONSTEXPR_SUFFIXES = ("_quantized", "_palettized")


def _facts(source, program, weights: dict[str, int], src: Path, dst: Path) -> dict:
    """Ops, which weights were compressed and which stayed float (and why), float ops kept, sizes."""
    produced = {n for o in program.ops if o.type.startswith("constexpr_") for n, _ in o.outputs}
    compressed, kept = [], {}
    for name, size in sorted(weights.items()):
        if any(name + s in produced for s in _CONSTEXPR_SUFFIXES) or name in produced:
            compressed.append(name)
        elif size < WEIGHT_THRESHOLD:
            kept[name] = f"{size} elements < weight_threshold {WEIGHT_THRESHOLD}"
        else:
            kept[name] = "coremltools left it uncompressed"
    src_w, dst_w = _weights_bytes(src), _weights_bytes(dst)
    return {
        "ops": dict(sorted(program.op_counts().items())),
        "compression_ops": {t: c for t, c in sorted(program.op_counts().items())
                            if t.startswith("constexpr_") or t in ("quantize", "dequantize")},
        "weights_compressed": len(compressed),
        "weights_kept_float": kept,
        "fp32_ops": {t: d["fp32"] for t, d in program.dtype_counts().items() if "fp32" in d},
        "source_fp32_ops": {t: d["fp32"] for t, d in source.dtype_counts().items() if "fp32" in d},
        "bytes": {"weights": dst_w, "source_weights": src_w, "package": _package_bytes(dst),
                  "source_package": _package_bytes(src),
                  "weights_ratio": round(src_w / dst_w, 3) if dst_w else None,
                  "package_ratio": round(_package_bytes(src) / max(_package_bytes(dst), 1), 3)},
    }
