"""Whether ONNX Runtime's fused int8 kernels compute a QDQ graph's arithmetic on this CPU, and the session setting
that makes them when they do not.

On x86 CPUs without VNNI (AVX-512 VNNI, AVX-VNNI or AMX-INT8), ONNX Runtime fuses DequantizeLinear -> Conv/MatMul ->
QuantizeLinear into u8 x s8 kernels built on `vpmaddubsw`, which adds each pair of products into a *saturating*
int16: a pair of large activations times large weights clips. vitedge's int8 graphs use the full 8-bit weight range
(targets/graph/qdq.py), so there the fused kernels compute another function: the trained SwiftFormer-XS digits
graph on a Zen 3 EPYC (AVX2, no VNNI) differed from the same graph run unfused by 22 % of its logits' range, and
its products hop failed. VNNI's `vpdpbusd` accumulates in int32 (no saturation), as ARM's int8 kernels and
TensorRT do.

So on such a CPU vitedge's ONNX Runtime sessions run QDQ graphs with the fusion off
(`session.disable_quant_qdq`): each DequantizeLinear, the float Conv/MatMul and each QuantizeLinear run as written,
which is the graph's own arithmetic (float32 accumulation instead of int32: rounding-level differences). The
runner's backend and `info()` say so, since an app running the graph with ONNX Runtime's defaults on such a CPU
gets the saturated outputs; on VNNI and ARM CPUs nothing changes.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

import onnx

SETTING = "session.disable_quant_qdq"
VNNI_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})  # /proc/cpuinfo names: int32 dot products
NOTE = "int8 QDQ unfused: this CPU has no VNNI, where ONNX Runtime's fused int8 kernels saturate"
_X86 = {"x86_64", "amd64", "i386", "i686", "x86"}


def saturates(machine: str, flags: frozenset | None) -> bool:
    """Whether ONNX Runtime's fused u8 x s8 kernels may saturate on a CPU of this `machine` (platform.machine())
    with these /proc/cpuinfo `flags` (None: unreadable; on x86 that counts as no VNNI, the safe side)."""
    if machine.lower() not in _X86:
        return False
    return flags is None or not (VNNI_FLAGS & flags)


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> frozenset | None:
    """The first processor's flags in `cpuinfo` (None where there is no such file: not Linux)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return None


@functools.lru_cache(maxsize=1)
def this_cpu_saturates() -> bool:
    return saturates(platform.machine(), cpu_flags())


def has_qdq(model: bytes | str | onnx.ModelProto) -> bool:
    """Whether the graph (ModelProto, serialized bytes or a path) quantizes anything (a QuantizeLinear node). A file
    that does not parse counts as no: the session built from it next says what is wrong with it, as it always did."""
    if not isinstance(model, onnx.ModelProto):
        try:
            model = (onnx.load_from_string(model) if isinstance(model, bytes)
                     else onnx.load(str(model), load_external_data=False))
        except Exception:  # noqa: BLE001 - onnx raises DecodeError, OSError or ValueError by cause
            return False
    return any(n.op_type == "QuantizeLinear" for n in model.graph.node)


def unfuse(model: bytes | str | onnx.ModelProto) -> bool:
    """Whether a session of `model` on this CPU should run its QDQ nodes unfused (see the module's docstring)."""
    return this_cpu_saturates() and has_qdq(model)
