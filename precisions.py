"""The one table of precisions: every `--precision` value, what kind of arithmetic it is, whether it calibrates,
the tolerance profile that judges it and what it needs installed beyond vitedge's own dependencies.

Every other place reads this table (the CLI's choices, the target plans, calibration, the parity profiles, the
targets' own precision lists, CoreML compression), so a new precision is one row here plus the code that makes it;
tests/test_precisions.py fails on a copy of these names anywhere else. Torch-free: the CLI builds its parsers
from it.
"""
from __future__ import annotations

from dataclasses import dataclass

FLOAT, HALF, COMPRESSED = "float", "fp16", "compressed"


@dataclass(frozen=True)
class Precision:
    name: str
    kind: str                 # FLOAT (full precision), HALF (fp16 arithmetic) or COMPRESSED (quantized storage)
    calibrates: bool = False  # activations are quantized: calibration samples set their ranges
    profile: str = ""         # the tolerance profile judging it (default: its own name)
    extra: str | None = None  # the vitedge extra it needs beyond the target's own (None: nothing more)

    @property
    def tolerance_profile(self) -> str:
        return self.profile or self.name

    @property
    def compressed(self) -> bool:
        return self.kind == COMPRESSED

    @property
    def weight_only(self) -> bool:
        """Quantized weights, float activations: nothing to calibrate."""
        return self.compressed and not self.calibrates


TABLE: dict[str, Precision] = {p.name: p for p in (
    Precision("fp32", FLOAT),
    Precision("fp16", HALF),
    Precision("int8", COMPRESSED, calibrates=True),
    Precision("w8", COMPRESSED),
    Precision("palette4", COMPRESSED, profile="palette", extra="compress"),  # k-means through scikit-learn
    Precision("palette6", COMPRESSED, profile="palette", extra="compress"),
    Precision("w8a8", COMPRESSED, calibrates=True),
)}

NAMES: tuple[str, ...] = tuple(TABLE)
FLOATS: tuple[str, ...] = tuple(n for n, p in TABLE.items() if not p.compressed)         # judged by the float rules
COMPRESSED_NAMES: tuple[str, ...] = tuple(n for n, p in TABLE.items() if p.compressed)
CALIBRATED: tuple[str, ...] = tuple(n for n, p in TABLE.items() if p.calibrates)
WEIGHT_ONLY: tuple[str, ...] = tuple(n for n, p in TABLE.items() if p.weight_only)
PROFILE_OF: dict[str, str] = {n: p.tolerance_profile for n, p in TABLE.items() if p.compressed}


def profile_for(precision: str | None) -> str | None:
    """The tolerance profile of an artifact precision (palette4 and palette6 share "palette"); an unknown name is
    its own profile."""
    return TABLE[precision].tolerance_profile if precision in TABLE else precision


def names(*kinds: str) -> tuple[str, ...]:
    """The precisions of the given kinds, in table order (all without kinds)."""
    return tuple(n for n, p in TABLE.items() if not kinds or p.kind in kinds)


def pick(*chosen: str) -> tuple[str, ...]:
    """A target's own precisions, each checked against the table (a name not in it is a bug, raised at import)."""
    unknown = [n for n in chosen if n not in TABLE]
    if unknown:
        raise ValueError(f"not in the precision table: {', '.join(unknown)} (precisions.py)")
    return chosen
