"""The largest input size vitedge takes, and its one-line error: checked where sizes are parsed (before any work,
torch-free) and again where a model checks its size (a plan or a Python call that bypasses the parser)."""
from __future__ import annotations

from ..errors import VitedgeError

MAX_IMGSZ = 2048     # the largest --imgsz: the parity set at 2048 px is already 50 MB an image, 3.2 GB at 64 samples


class SizeLimitError(VitedgeError):
    """A size beyond MAX_IMGSZ: its own message is the one line to show (the flag parser shows it as it is)."""


def check_size_limit(side: int, flag: str = "--imgsz") -> None:
    """Raise VitedgeError when an image side is beyond MAX_IMGSZ."""
    if side > MAX_IMGSZ:
        raise SizeLimitError(f"{flag} {side} is beyond the largest size vitedge takes, {MAX_IMGSZ} (one float32 image "
                           f"alone is {3 * 4 * side * side / 1e9:.1f} GB); give a size up to {MAX_IMGSZ}")
