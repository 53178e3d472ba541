"""Parity: the metrics, the tolerance profiles, the float64 ground truth and one ladder hop (candidate vs
train-form on the parity set).

Every hop is compared with the train-form eval model on the same inputs (exporter/verdict/inputs.py), never with
the previous hop, so errors cannot hide by accumulating in small steps. Given `GroundTruth` (the train-form in
float64 and float32, exporter/verdict/criteria.py), a hop is judged against float64 per input set, with the per-sample
noise rule on top of the metric thresholds (both must pass): that is what the ladder does. Without it (tests of
the metrics alone), against the float32 train-form.
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping
from dataclasses import asdict, replace

import numpy as np

from ...errors import VitedgeError
from ...models.features import as_outputs, output_names, pack
from ...precisions import (EMULATED, FP16_ERROR, MEDIAN_MIN_SAMPLES, NOISE, Profile, profile_for,  # noqa: F401
                           profiles)  # profile_for: the precision table's, re-exported
from ...targets.base import Runner, chunk_size, pad_batch
from .criteria import GroundTruth, NoiseRule, accuracy, accuracy_delta, effective_noise, sample_errors
from .emulate import fp16_reference
# The second float32 computation draws a random rounding of ROUNDING_ULPS float32 ulps at every module output,
# seeded (rounding.py): see docs/parity_criteria.md for how it was measured against other implementations.
from .rounding import ROUNDING_SEED, ROUNDING_ULPS, rounding_draw  # noqa: F401  (re-exported)
from .float64_kernels import float64_depthwise  # for _in_dtype only: callers import it from float64_kernels
from .metrics import COMPRESSED_ERROR, PSNR_CAP_DB, REFERENCES, compute_metrics, set_bounds  # noqa: F401  (re-exported)
from ..core.report import Hop, Metrics, Tolerance, allowed_count

# the Tolerance keys of each rule's floor, K and median bound (the noise rule has no median bound)
RULE_KEYS = {NOISE: Tolerance.NOISE, FP16_ERROR: Tolerance.FP16, EMULATED: Tolerance.COMPRESSED}


def _tolerance(profile: Profile, against_float64: bool) -> Tolerance:
    """A profile row of precisions.py as the Tolerance it judges with: against the float32 train-form its metric
    bounds alone; against float64 ground truth its per-sample rule too (and its bounds unless the row says not)."""
    bounds = profile.bounds if profile.bounds_against_float64 or not against_float64 else {}
    if not against_float64:
        return Tolerance(profile.name, **bounds)
    r = profile.rule
    rule = dict(zip(RULE_KEYS[r.reference], (r.floor, r.k, r.median)))
    return Tolerance(profile.name, **bounds, **rule)


class _Tolerances(Mapping):
    """Profile name -> its Tolerance, read from the precision table at each lookup (a precision registered after
    import has its profile here too; nothing is built or changed at import)."""

    def __init__(self, against_float64: bool, compressed_only: bool = False):
        self.against_float64, self.compressed_only = against_float64, compressed_only

    def _profiles(self) -> dict[str, Profile]:
        return {n: p for n, p in profiles().items() if not self.compressed_only or p.rule.reference == EMULATED}

    def __getitem__(self, name: str) -> Tolerance:
        return _tolerance(self._profiles()[name], self.against_float64)

    def __iter__(self):
        return iter(self._profiles())

    def __len__(self) -> int:
        return len(self._profiles())


# The documented defaults (README "Tolerances"), one per profile of precisions.py; `--tol PROFILE.KEY=VALUE`
# overrides any of them. Against the float32 train-form: the metric bounds only.
DEFAULT_TOLERANCES: Mapping[str, Tolerance] = _Tolerances(against_float64=False)
# The defaults once hops are judged against float64 ground truth (GroundTruth given): fp32 by the per-sample noise
# rule alone (docs/parity_criteria.md); fp16 and the compressed kinds by their metric thresholds, against float64,
# per input set, and their per-sample rule (an independent fp16 computation or emulation of the kind sets each
# sample's allowance: exporter/verdict/emulate.py). Compressed kinds are judged on natural images and a user's
# --images only (exporter/quantize/compressed.py), with the accuracy drop where labels exist.
FLOAT64_TOLERANCES: Mapping[str, Tolerance] = _Tolerances(against_float64=True)
COMPRESSED_TOLERANCES: Mapping[str, Tolerance] = _Tolerances(against_float64=True, compressed_only=True)
TOL_KEYS = Tolerance.UPPER + Tolerance.LOWER + Tolerance.NOISE + Tolerance.FP16 + Tolerance.COMPRESSED + Tolerance.LABELLED


REFERENCE_BATCH = 32
# The float32 train-form's intra-op threads: its rounding (hence each sample's noise, hence the allowance) depends
# on the reduction order. One thread takes a different conv/GEMM path that lands ~2x closer to float64 for
# SwiftFormer-XS and SLAB-DeiT-T (1.4e-7 vs 3.6e-7 median) than the multi-thread runs every runtime does; 2 and 4
# threads gave identical noise, and the rule was calibrated at 2 (docs/parity_criteria.md). Fixed, so the verdict
# does not depend on the machine's core count; reported as report.json `reference.float32_threads`.
REFERENCE_THREADS = 2
GROUND_TRUTH_BATCH = 8   # float64 chunk: bounds the float64 run's memory on big models (fewer on large inputs)


def parse_tol(spec: str) -> tuple[str, str, float | None]:
    """`"fp16.psnr_db=30"` -> ("fp16", "psnr_db", 30.0); a value of `none` disables that check."""
    try:
        lhs, value = spec.split("=", 1)
        profile, key = lhs.strip().split(".", 1)
    except ValueError:
        raise VitedgeError(f"--tol expects PROFILE.KEY=VALUE (e.g. fp16.psnr_db=30); got {spec!r}") from None
    if profile not in DEFAULT_TOLERANCES:
        raise VitedgeError(f"--tol profile must be one of {', '.join(DEFAULT_TOLERANCES)}; got {profile!r}")
    if key not in TOL_KEYS:
        raise VitedgeError(f"--tol key must be one of {', '.join(TOL_KEYS)}; got {key!r}")
    if value.strip().lower() == "none":
        return profile, key, None
    try:
        return profile, key, float(value)
    except ValueError:
        raise VitedgeError(f"--tol value must be a number or 'none'; got {value!r} in {spec!r}") from None


def tolerances(overrides: dict | list | None = None,
               defaults: dict[str, Tolerance] | None = None) -> dict[str, Tolerance]:
    """The default profiles (DEFAULT_TOLERANCES, or `defaults` such as FLOAT64_TOLERANCES) with overrides
    applied: `{"fp16": {"psnr_db": 30}}` or a list of `--tol` strings."""
    if isinstance(overrides, (list, tuple)):
        parsed: dict = {}
        for spec in overrides:
            p, k, v = parse_tol(spec)
            parsed.setdefault(p, {})[k] = v
        overrides = parsed
    out = dict(DEFAULT_TOLERANCES if defaults is None else defaults)
    for profile, values in (overrides or {}).items():
        if profile not in out:
            raise VitedgeError(f"unknown tolerance profile {profile!r}; use one of {', '.join(out)}")
        bad = set(values) - set(TOL_KEYS)
        if bad:
            raise VitedgeError(f"unknown tolerance key(s) {sorted(bad)}; use {', '.join(TOL_KEYS)}")
        out[profile] = replace(out[profile], **values)
    return out


def run_batched(runner: Runner, x: np.ndarray, batch: int = REFERENCE_BATCH) -> np.ndarray:
    """Run `x` through `runner` in chunks (`batch` samples, fewer for large inputs: chunk_size); a static-batch
    artifact gets exactly its batch (last chunk padded)."""
    static = runner.max_batch()
    step = static or chunk_size(batch, np.shape(x))
    outs = []
    for i in range(0, len(x), step):
        chunk = x[i:i + step]
        n = len(chunk)
        if static:
            chunk = pad_batch(chunk, static)
        outs.append(np.asarray(runner.run(np.ascontiguousarray(chunk)))[:n])
    return np.concatenate(outs)


def noise_rule(tolerance: Tolerance | None) -> NoiseRule | None:
    """The per-sample float32 rule a tolerance profile sets (None where it sets none: fp16, or both keys disabled)."""
    if tolerance is None or not tolerance.noise_rule():
        return None
    return NoiseRule(floor=tolerance.noise_floor or 0.0, k=tolerance.noise_k or 0.0)


def sample_rule(tolerance: Tolerance, truth: GroundTruth) -> tuple[NoiseRule, np.ndarray, str] | None:
    """The per-sample rule a profile sets, with each sample's reference error: the float32 noise (fp32), the
    independent fp16 computation's error (fp16: truth.y16), or the compressed kind's emulation's error (compressed
    kinds: truth.yq), both computed by the caller; None where none is set."""
    rule = noise_rule(tolerance)
    if rule is not None:
        return rule, truth.noise, "noise"
    if tolerance.fp16_rule():
        return NoiseRule(floor=tolerance.fp16_floor or 0.0, k=tolerance.fp16_k or 0.0), truth.noise16, FP16_ERROR
    if tolerance.compressed_rule():
        return (NoiseRule(floor=tolerance.compressed_floor or 0.0, k=tolerance.compressed_k or 0.0),
                truth.noise_q, COMPRESSED_ERROR)
    return None


def with_fp16_reference(truth: GroundTruth, model, x: np.ndarray) -> GroundTruth:
    """`truth` with the fp16 rule's reference outputs of `model` on `x` (the inputs `truth` was computed on)."""
    return replace(truth, y16=fp16_reference(model, x))


def judge(truth: GroundTruth, out: np.ndarray, tolerance: Tolerance,
          names: tuple[str, ...] | None = None) -> tuple[Metrics, dict, list[str]]:
    """Judge candidate logits `out` against float64 ground truth, per input set: the metric thresholds of
    `tolerance` (vs float64) and, when set, the per-sample noise rule. Returns (metrics over all samples,
    {set: details}, problems); a failure in any set is a problem. `names` (per sample) name the worst sample."""
    per_sample = sample_rule(tolerance, truth)
    rule, noise, what = per_sample if per_sample is not None else (None, truth.noise, "noise")
    metrics = compute_metrics(truth.y64, out)
    # each output is its own set of rows (a feature map's error is judged on its own scale and noise)
    per_output = [(name, sample_errors(part.y64, out[:, truth.columns(name)]),
                   sample_rule(tolerance, part)[1] if per_sample is not None else part.noise)
                  for name, part in truth.parts()]
    sets, problems = {}, []
    for s in truth.present():
        idx = truth.indices(s)
        m = compute_metrics(truth.y64[idx], out[idx])
        bounds, basis = set_bounds(tolerance, truth, idx, what, FLOAT64_TOLERANCES.get(tolerance.profile))
        found = [f"{s}: {v}{basis.get(v.split()[0], '')}" for v in bounds.violations(m)]
        ratio = worst = None
        by_output = {}
        if rule is not None:
            for name, errors, noise in per_output:  # the worst output decides
                r, allowed, eff = rule.judge_set(errors[idx], noise[idx])
                w = int(np.argmax(r))
                by_output[name] = float(r[w])
                if ratio is None or not float(r[w]) <= ratio:
                    ratio, i, err_w, allow_w, eff_w, out_w = float(r[w]), int(idx[w]), errors, allowed[w], eff[w], name
            worst = {"index": i, "name": names[i] if names is not None else None, "error": float(err_w[i]),
                     "allowance": float(allow_w), **({"output": out_w} if out_w is not None else {})}
            if not ratio <= 1.0:
                who = (names[i] if names is not None else f"sample {i}") + (f", output {out_w}" if out_w else "")
                found.append(f"{s}: noise_ratio {ratio:.3g} > 1 ({who}: error {err_w[i]:.3g} vs allowance "
                             f"max({rule.floor:.3g}, {rule.k:.3g} x {what} {eff_w:.3g}))")
        median = None
        ref = REFERENCES.get(what)
        bound_key, median_key, ref_key, ref_name = ((ref.median, ref.median_key, ref.error_key, ref.name) if ref
                                                    else (None,) * 4)
        bound = getattr(tolerance, bound_key) if bound_key else None
        if bound is not None and len(idx) >= MEDIAN_MIN_SAMPLES:
            # each sample's error over its (floored) reference error: the rule's allowance at K = 1; the worst
            # output's median
            median = max(float(np.median(errors[idx] / replace(rule, k=1.0).allowance(noise[idx])))
                         for _, errors, noise in per_output)
            if not median <= bound:
                found.append(f"{s}: {median_key.removesuffix('_ratio').replace('_', ' ')} ratio {median:.3g} > "
                             f"{bound:.3g} (the typical sample's error over the {ref_name}'s: a systematic error)")
        lab = None if truth.labels is None else truth.labels[idx]
        acc = accuracy_delta(truth.y64[idx], out[idx], lab)
        if acc is not None and tolerance.accuracy_drop is not None:
            lost = acc["reference_correct"] - acc["correct"]  # in samples: counts, never rounded fractions
            if lost > allowed_count(tolerance.accuracy_drop, acc["labelled"]):
                found.append(f"{s}: accuracy_drop {acc['accuracy_drop']:.4g} > {tolerance.accuracy_drop:.4g} (top-1 "
                             f"{acc['correct']}/{acc['labelled']} vs float64 {acc['reference_correct']}/"
                             f"{acc['labelled']} labelled samples: {lost} more misclassified, "
                             f"{allowed_count(tolerance.accuracy_drop, acc['labelled'])} allowed)")
        sets[s] = {"samples": int(len(idx)), "metrics": asdict(m), "reference_noise": float(truth.noise[idx].max()),
                   "noise_ratio": ratio, **({median_key: median} if median_key else {}),
                   "top1_accuracy": accuracy(out[idx], lab, 1),
                   "top5_accuracy": accuracy(out[idx], lab, 5), "worst_sample": worst, "problems": found,
                   **(acc or {})}
        if acc is not None:  # the reference on exactly these samples: accuracies are compared on the same images
            sets[s]["reference_top5_accuracy"] = accuracy(truth.y64[idx], lab, 5)
        if ref_key:
            sets[s][ref_key] = max(float(noise[idx].max()) for _, _, noise in per_output)
        if None not in by_output:  # several outputs: each one's noise_ratio
            sets[s]["outputs"] = by_output
        if basis:
            sets[s]["metric_bounds"] = {k: getattr(bounds, k) for k in basis}
        problems += found
    return metrics, sets, problems


def check_hop(hop: str, runner: Runner, inputs: np.ndarray, reference: np.ndarray | None, tolerance: Tolerance,
              truth: GroundTruth | None = None, names: tuple[str, ...] | None = None) -> Hop:
    """Run one hop on the parity set and judge it against `tolerance`: against `truth` (float64 ground truth,
    per set, noise rule included) when given, else against the float32 `reference` (metric thresholds only)."""
    t0 = time.perf_counter()
    cap = getattr(runner, "max_samples", None)  # e.g. an emulator runs a documented subset of the parity set
    if cap:
        inputs = inputs[:cap]
        reference = None if reference is None else reference[:cap]
        truth = None if truth is None else truth.head(cap)
        names = None if names is None else names[:cap]
    out = run_batched(runner, inputs)
    want = truth.y64 if truth is not None else reference
    if want is not None and np.shape(out) != np.shape(want):  # another head or class count: never comparable
        return failed(hop, runner.backend, f"output shape {np.shape(out)} differs from the reference's "
                      f"{np.shape(want)}: the artifact computes another function (another head or class count); "
                      "check it against the checkpoint it was exported from", runner.mode, tolerance)
    sets = None
    if truth is not None:
        metrics, sets, problems = judge(truth, out, tolerance, names)
    else:
        if tolerance.noise_rule() or tolerance.fp16_rule() or tolerance.compressed_rule():
            raise VitedgeError(f"{tolerance.profile}.noise_*, fp16_* and compressed_* keys need the float64 ground "
                               "truth; this run compares with the float32 train-form: drop those --tol keys")
        metrics = compute_metrics(reference, out)
        problems = tolerance.violations(metrics)
    nonfinite = int((~np.isfinite(out)).any(axis=1).sum())
    if nonfinite:
        problems.insert(0, f"non-finite outputs (NaN/Inf) in {nonfinite} of {len(out)} samples")
    outputs = None
    if sets and any(d.get("outputs") for d in sets.values()):  # each output's worst noise_ratio over the sets
        outputs = {}
        for d in sets.values():
            for name, r in (d.get("outputs") or {}).items():
                outputs[name] = max(outputs.get(name, r), r)
    return Hop(hop=hop, backend=runner.backend, status="failed" if problems else "passed", mode=runner.mode,
               reason="; ".join(problems) or None, samples=int(len(inputs)), metrics=metrics, tolerance=tolerance,
               seconds=round(time.perf_counter() - t0, 3), sets=sets, outputs=outputs)


def unverified(hop: str, backend: str, reason: str, tolerance: Tolerance | None = None) -> Hop:
    return Hop(hop=hop, backend=backend, status="unverified", mode=None, reason=reason, tolerance=tolerance)


def failed(hop: str, backend: str, reason: str, mode: str | None = None, tolerance: Tolerance | None = None,
           diverging_module: str | None = None) -> Hop:
    return Hop(hop=hop, backend=backend, status="failed", mode=mode, reason=reason, tolerance=tolerance,
               diverging_module=diverging_module)


def ground_truth(model, x, sets: tuple[str, ...], labels=None, batch: int = GROUND_TRUTH_BATCH,
                 threads: int = REFERENCE_THREADS, threads64: int | None = None) -> GroundTruth:
    """The train-form `model` run on `x` in float64 (the truth) and in float32, in the default and the channels-last
    layout (each sample's noise: their envelope, criteria.GroundTruth.noise), in chunks of `batch` (fewer samples
    for large inputs: chunk_size). The float32
    runs use exactly `threads` intra-op threads (their rounding depends on them: REFERENCE_THREADS); the float64 run, which dominates the cost and whose rounding is negligible, `threads64`
    (default: torch's setting, every core unless the caller lowered it; tiny models run faster on one). The model
    is not changed; torch's thread setting is restored."""
    import torch

    xt = torch.as_tensor(np.asarray(x))
    batch = chunk_size(batch, tuple(xt.shape))
    outs, columns = {}, []
    before = torch.get_num_threads()

    def packed(y):  # several outputs side by side per sample; which columns are which, from the first chunk
        ys = as_outputs(y)
        if not columns and len(ys) > 1:
            columns.extend(zip(output_names(model, len(ys)), (int(np.prod(o.shape[1:])) for o in ys)))
        return pack(ys)

    try:
        with torch.no_grad():
            for run, dtype, n in (("64", torch.float64, threads64 or before), ("32", torch.float32, threads),
                                  ("32cl", torch.float32, threads)):
                torch.set_num_threads(max(1, int(n)))
                m = _in_dtype(model, dtype)
                draw = None
                if run == "32cl":  # the second float32 computation: channels-last layout, other conv kernels,
                    m = copy.deepcopy(m).to(memory_format=torch.channels_last)  # and rounding drawn at every depth
                    draw = rounding_draw(m, ROUNDING_SEED)
                chunks = []
                for i in range(0, len(xt), batch):
                    xi = _layout(xt[i:i + batch].to(dtype), run == "32cl")
                    with draw.chunk(i, len(xi)) if draw else contextlib.nullcontext():
                        chunks.append(packed(m(xi)).double().numpy())
                outs[run] = np.concatenate(chunks)
                del m, draw
    finally:
        torch.set_num_threads(before)
    return GroundTruth(outs["64"], outs["32"], tuple(sets),
                       None if labels is None else np.asarray(labels, dtype=np.int64), float32_threads=int(threads),
                       y32_alt=outs["32cl"], outputs=tuple(columns) or None)


def _layout(x, channels_last: bool):
    import torch

    return x.contiguous(memory_format=torch.channels_last) if channels_last and x.dim() == 4 else x


def _in_dtype(model, dtype):
    """`model` itself when it already is an eval model in `dtype`, else an eval copy in `dtype`; a float64 copy
    runs its depthwise convolutions as shifted multiply-adds (float64_depthwise)."""
    import torch

    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()]
    if not model.training and all(t.dtype == dtype for t in tensors):
        return model
    m = copy.deepcopy(model).to(dtype).eval()
    return float64_depthwise(m) if dtype == torch.float64 else m
