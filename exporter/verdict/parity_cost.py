"""How many parity samples an export gets when none is asked for: a deterministic rule on the model's GMACs.

Every hop runs the whole parity set, and the float64 ground truth runs it once more, so the parity work grows
with samples x GMACs. For sima_large_24_p8 (142 GMACs) even 64 samples would take many minutes here (issue 17). The
rule keeps samples x GMACs within PARITY_BUDGET_GMACS:

    n = clamp(4 * floor(PARITY_BUDGET_GMACS / (4 * G)), MIN_SAMPLES, DEFAULT_SAMPLES)

G is the model's GMACs at the export's size, batch 1 (matmul/conv/linear, as `vitedge models` counts them).
Multiples of 4 keep the default set's 3 natural : 1 stress interleave whole; the floor of 8 keeps two stress
samples. Models up to 8 GMACs get all 64. The cap was 256 (rule gmacs-v1). Judged on the first 64 of those 256
inputs, every correct artifact measured still passes and every zeroed, sign-flipped or 1 % channel that 256 catch
is caught; two plants at the rule's edge are not (benchmarks/parity_set_size.py, docs/parity.md "Why 64"). The
ground truth's cost falls by 4x. The budget did not change, so no model gets fewer samples than under
gmacs-v1 unless it got more than 64. It is never a wall-time budget, so the parity set stays a function of
(n, imgsz, seed) and `vitedge matrix` cache keys stay stable (they record SAMPLES_RULE instead of a count). An
explicit `--samples N` always wins. Torch-free at import; `default_samples` counts MACs only when the shipped
catalog does not already hold them (another size, overrides, a module that is not a registered name).
"""
from __future__ import annotations

import math

from ...models.input_size import size_text

DEFAULT_SAMPLES = 64         # exporter.verdict.inputs.DEFAULT_SAMPLES (kept equal by a test; that module imports torch)
MIN_SAMPLES = 8
PARITY_BUDGET_GMACS = 512.0  # samples x GMACs per hop: 64 samples up to 8 GMACs
SAMPLES_RULE = "gmacs-v2"    # names this rule in cache keys and reports; change it when the rule changes


def samples_for_gmacs(gmacs: float) -> int:
    """The rule above for a model of `gmacs` GMACs."""
    if not gmacs > 0 or not math.isfinite(gmacs):
        return DEFAULT_SAMPLES
    n = 4 * int(PARITY_BUDGET_GMACS / (4 * gmacs))
    return max(MIN_SAMPLES, min(DEFAULT_SAMPLES, n))


def model_gmacs(model_or_name, imgsz: int, overrides: dict | None = None, module=None) -> float:
    """GMACs of one eval forward at `imgsz`, batch 1: from the shipped catalog for a registered name at its default
    size without overrides, else counted on the meta device (a name) or on `module` itself (a model object)."""
    if isinstance(model_or_name, str):
        from ...models.catalog import stored_table

        row = (stored_table() or {}).get(model_or_name)
        if row is not None and not overrides and row["default_imgsz"] == imgsz:
            return float(row["gmacs"])
        from ...models.flops import model_macs

        return model_macs(model_or_name, imgsz, **(overrides or {})) / 1e9
    from ...models.flops import count_macs

    return count_macs(module if module is not None else model_or_name, imgsz) / 1e9


def default_samples(model_or_name, imgsz: int, overrides: dict | None = None, module=None) -> tuple[int, str]:
    """(samples, how they were chosen: the report's `samples_rule`) for an export that asked for none."""
    g = model_gmacs(model_or_name, imgsz, overrides, module)
    n = samples_for_gmacs(g)
    at = size_text(imgsz)
    return n, (f"{SAMPLES_RULE}: {g:.3g} GMACs at {at}px -> clamp(4*floor({PARITY_BUDGET_GMACS:g}/(4*G)), "
               f"{MIN_SAMPLES}, {DEFAULT_SAMPLES}) = {n}")


def check_samples(samples: int | None) -> None:
    """A bad --samples, before any work."""
    if samples is not None and not samples > 0:
        from ...errors import VitedgeError

        raise VitedgeError(f"--samples must be positive; got {samples}")


def choose_samples(samples: int | None, model_or_name, imgsz: int, overrides: dict | None, module,
                   images=None) -> tuple[int, str | None]:
    """(samples, `samples_rule`): `samples` as given (rule None), the rule's count when None, and the default
    count, unused, with `images` (a user set holds all its images)."""
    check_samples(samples)
    if samples is not None:
        return samples, None
    if images is not None:
        return DEFAULT_SAMPLES, None
    return default_samples(model_or_name, imgsz, overrides, module)
