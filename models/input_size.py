"""Input sizes as one value everywhere below the settings: an int S for a square S x S input, an (H, W) tuple for a
non-square one (`canonical`), and the helpers that read it (`as_hw`, `size_text`) and check it against a stride
(`check_stride`, whose message names the nearest valid sizes). Torch-free: the settings and the registry share it."""
from __future__ import annotations

from numbers import Integral

from ..errors import VitedgeError


def as_hw(size) -> tuple[int, int]:
    """(height, width) of an int S, an (H, W) pair, or the text "S" / "HxW"."""
    if isinstance(size, str):
        parts = size.lower().split("x")
        if len(parts) in (1, 2) and all(p.strip().isdigit() for p in parts):
            size = tuple(int(p) for p in parts) if len(parts) == 2 else int(parts[0])
    if isinstance(size, Integral) and not isinstance(size, bool):
        return int(size), int(size)
    if isinstance(size, (tuple, list)) and len(size) == 2 and all(
            isinstance(v, Integral) and not isinstance(v, bool) for v in size):
        return int(size[0]), int(size[1])
    raise VitedgeError(f"an input size is S or HxW (positive integers; e.g. 224 or 256x320); got {size!r}")


def canonical(size):
    """The one internal spelling: S for a square size, (H, W) otherwise; None stays None."""
    if size is None:
        return None
    h, w = as_hw(size)
    return h if h == w else (h, w)


def size_text(size) -> str:
    """224 for a square size, 256x320 (height x width) otherwise: how a size is written on the command line."""
    h, w = as_hw(size)
    return str(h) if h == w else f"{h}x{w}"


def size_json(size):
    """What report.json and the artifacts' metadata hold as `imgsz`: the int S for a square size (as always), the
    text "HxW" for a non-square one (`--imgsz` takes it back as it is)."""
    return None if size is None else (canonical(size) if isinstance(canonical(size), int) else size_text(size))


def _near(side: int, stride: int) -> list[int]:
    lo = max(stride, side // stride * stride)
    return sorted({lo, lo + stride} if side > lo else {lo})


def nearest_sizes(size, stride: int) -> list[str]:
    """The valid sizes next to `size` (each side a multiple of `stride`), closest first."""
    h, w = as_hw(size)
    cands = {(a, b) for a in _near(h, stride) for b in _near(w, stride)}
    if h == w:  # a square size asked: offer square sizes
        cands = {(a, a) for a in _near(h, stride)}
    return [size_text(c) for c in sorted(cands, key=lambda c: (abs(c[0] - h) + abs(c[1] - w), c))]


def check_stride(name: str, size, stride: int) -> None:
    """Raise VitedgeError (one line, naming the nearest valid sizes) unless both sides are multiples of `stride`."""
    h, w = as_hw(size)
    if h % stride or w % stride:
        near = nearest_sizes(size, stride)
        raise VitedgeError(f"{name} needs --imgsz sides divisible by {stride}; got {size_text(size)}: use --imgsz "
                           + " or ".join(near[:2]))
