"""Which targets a run builds: the --target list, --precision and every target-specific flag, checked against the
TARGETS table before any work (a bad value is a VitedgeError, exit 2, nothing written)."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from ...errors import VitedgeError
from ...precisions import names  # each target lists its own (its row's precisions)
from ...targets import ALIASES, TARGETS, Target, get_target
from ...targets.labels import CarriedLabels, read_labels

BASE_HOPS = ("onnx", "onnx-simplified")  # the hops of the fp32 base graph, raw and simplified


@dataclass
class TargetPlan:
    name: str
    target: Target | None
    precision: str | None
    options: dict = field(default_factory=dict)
    missing: str | None = None  # why the target's module could not be imported

    def hop(self) -> str:
        return self.target.hop_name(self.precision) if self.target else self.name

    def existing_hop(self) -> str:
        """The hop name of an existing artifact of this plan, as `parity --artifact` checks it."""
        named = self.target.existing_hop_names.get(self.precision) if self.target else None
        return named or self.hop()


def artifact_key(hop_name: str) -> str:
    """report.artifacts is keyed by target, with the fp32 ONNX (hops onnx / onnx-simplified) as "onnx"."""
    return BASE_HOPS[0] if hop_name in BASE_HOPS else hop_name


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def check_precision(precision: str | None) -> None:
    if precision is not None and precision not in names():
        raise VitedgeError(f"--precision must be one of {', '.join(names())}; got {precision!r}")


def supporting(precision: str) -> list[str]:
    """The targets whose `precisions` list `precision` (those importable here)."""
    return [n for n in TARGETS if (t := load_target(n)[0]) is not None and precision in t.precisions]


def load_target(name: str) -> tuple[Target | None, str | None]:
    try:
        return get_target(name), None
    except ImportError as e:  # its backend package or module is missing: the hop becomes "unverified"
        return None, f"target module for {name} is not available ({type(e).__name__}: {e})"


def resolve_targets(targets, precision: str | None = None, dynamic_batch: bool = False,
                    options: dict | None = None, labels=None, batch: int | None = None) -> list[TargetPlan]:
    """Validate the target list and every target-specific flag against the TARGETS table. `labels` (--labels, class
    names in index order) applies to every target: it is read here, and handed to the targets that build something
    from it (CoreML: a classifier); the pipeline writes the names into every artifact's metadata. `batch` (--batch,
    default 1) is checked against what each target's input can take (`check_inputs`)."""
    names = targets.split(",") if isinstance(targets, str) else list(targets)
    names = [ALIASES.get(n.strip().lower(), n.strip().lower()) for n in names if n.strip()]
    if not names:
        raise VitedgeError(f"--target needs at least one of {', '.join(TARGETS)}")
    for n in names:
        if n not in TARGETS:
            close = difflib.get_close_matches(n, list(TARGETS) + list(ALIASES), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise VitedgeError(f"unknown target {n!r}{hint}; choose from {', '.join(TARGETS)}")
    names = list(dict.fromkeys(names))
    check_precision(precision)

    plans = []
    for n in names:
        t, missing = load_target(n)
        plans.append(TargetPlan(n, t, None, {}, missing))
    loaded = [p for p in plans if p.target is not None]
    all_loaded = len(loaded) == len(plans)

    if precision is not None and all_loaded and not any(precision in p.target.precisions for p in loaded):
        raise VitedgeError(f"--precision {precision} is not supported by {', '.join(names)}; it applies to "
                           f"{', '.join(supporting(precision)) or 'no target'}")
    for p in plans:
        if p.target is None:
            p.precision = precision
        else:
            p.precision = precision if precision in p.target.precisions else p.target.default_precision

    if dynamic_batch:
        static = [p.name for p in loaded if not p.target.dynamic_batch]
        if static:
            raise VitedgeError(f"--dynamic-batch is not supported by {', '.join(static)} (static shapes only, e.g. to "
                               "keep the Neural Engine usable); export that target in a separate run without it")

    for key, value in (options or {}).items():
        if value is None:
            continue
        owners = [p for p in loaded if key in p.target.options]
        if not owners:
            if not all_loaded:
                continue  # the owner may be a target whose module is missing; its hop will say so
            every = {n: load_target(n)[0] for n in TARGETS}
            accepting = [n for n, t in every.items() if t is not None and key in t.options]
            unknown = [n for n, t in every.items() if t is None]
            where = (f"it applies to {', '.join(accepting)} only" if accepting else
                     f"no available target accepts it (not importable here: {', '.join(unknown)})" if unknown else
                     "no target accepts it")
            raise VitedgeError(f"{flag(key)} does not apply to --target {','.join(names)}: {where}")
        for p in owners:
            p.options[key] = value
    if labels is not None:
        read_labels(labels)  # the file must exist and hold one unique name per line, whatever the targets
        for p in loaded:
            if "labels" in p.target.options:
                p.options["labels"] = labels if isinstance(labels, CarriedLabels) else str(labels)
    for p in loaded:  # what a precision needs of the options (w8a8: iOS 17+), then target-specific values
        p.options = p.target.plan_precision(p.precision, p.options)
        p.target.validate_options(p.options)
    size = None if dynamic_batch else (batch or 1)
    if size is None or size > 0:  # (a non-positive --batch is the pipeline's own error)
        check_inputs(plans, size)
    return plans


def check_inputs(plans: list[TargetPlan], batch: int | None) -> None:
    """Each target's check of what its input can take at `batch` (None: dynamic) with its options, before any work
    (`Target.validate_input`: CoreML's image input or classifier at batch > 1, ...)."""
    for p in plans:
        if p.target is not None:
            p.target.validate_input(batch, p.options)
