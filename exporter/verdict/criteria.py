"""Noise-aware parity criteria (pure numpy): every hop is judged against float64 ground truth, per sample.

Ground truth is the train-form run in float64 on the parity inputs. The same train-form run in float32 shows what
float32 arithmetic alone does to this model on each input: its error against float64 is the sample's intrinsic
float32 noise. One float32 computation is one legitimate implementation among many: another kernel or layout
(ONNX Runtime's blocked convolutions) rounds differently, and on a trained, confident model the default path's
noise can sit far below another correct implementation's error. So the noise is the envelope of two float32
computations, the default layout and channels-last (other convolution kernels), per sample. A candidate
(deploy-form, ONNX, a device artifact) is judged per sample:

    error_i     = max_c |cand_ic - y64_ic| / max_c |y64_ic|     (max-abs over classes, relative to the sample)
    noise_i     = error_i of the float32 train-form, raised to the median noise of its input set
    allowance_i = max(floor, K * noise_i)
    noise_ratio = max_i error_i / allowance_i                    (<= 1 passes; non-finite outputs fail)

Per-sample, because the conditioning of a model differs by input: a saturated synthetic image may make a deep
softmax stack chaotic (noise 1e-2) while a photo gives 1e-7. One global tolerance either fails correct artifacts
on the first or misses real errors on the second. A single float32 run is one draw of the rounding: on a sample
where that draw happens to be small, a correct artifact's equally legitimate draw looks large, so no sample's
noise counts as less than its set's median (this halves the worst correct ratio of the small configs in the
study, while a chaotic sample keeps its own, larger noise). Floor and K are chosen in docs/parity_criteria.md
from benchmarks/parity_noise.py. The same rule judges module outputs when a failed hop is localized.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...models.outputs import column_slices
from ...precisions import TABLE

# Each precision's floor, K and median bound, with the measurements that chose them, are its row of precisions.py.
FLOAT32_RULE = TABLE["fp32"].profile.rule   # the noise rule: hops against float64 and localized module outputs


def rows(a: np.ndarray) -> np.ndarray:
    """(n, ...) -> (n, m) float64: one row per sample."""
    a = np.asarray(a, dtype=np.float64)
    return a.reshape(a.shape[0], -1)


def sample_scale(truth: np.ndarray) -> np.ndarray:
    """Per-sample max|truth| (floored at the smallest normal float32, so an all-zero row stays defined)."""
    return np.maximum(np.abs(rows(truth)).max(axis=1), float(np.finfo(np.float32).tiny))


def sample_errors(truth: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """Per-sample max|candidate - truth| / max|truth|; +inf where the candidate has a non-finite value."""
    t, c = rows(truth), rows(candidate)
    if t.shape != c.shape:
        raise ValueError(f"output shape {np.shape(candidate)} differs from the reference {np.shape(truth)}")
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(c - t).max(axis=1) / sample_scale(truth)
    return np.where(np.isfinite(c).all(axis=1), err, np.inf)


def effective_noise(noise: np.ndarray) -> np.ndarray:
    """Each sample's noise, raised to the median over the samples given (one input set): see the module doc."""
    noise = np.asarray(noise, dtype=np.float64)
    if noise.size == 0:
        return noise
    finite = noise[np.isfinite(noise)]
    return np.maximum(noise, np.median(finite)) if finite.size else noise


def allowances(noise: np.ndarray, floor: float, k: float) -> np.ndarray:
    """Per-sample allowance max(floor, K * noise) (pass the effective noise). The one place this formula is
    written (tests/test_criteria.py checks no other module does): judges use NoiseRule.allowance."""
    return np.maximum(float(floor), float(k) * np.asarray(noise, dtype=np.float64))


@dataclass(frozen=True)
class NoiseRule:
    """The per-sample rule `error <= max(floor, K * noise)`; used for logits and for module outputs alike."""
    floor: float = FLOAT32_RULE.floor
    k: float = FLOAT32_RULE.k

    def allowance(self, noise: np.ndarray) -> np.ndarray:
        """Per-sample allowance from each sample's reference error `noise` (the samples given form one set):
        max(floor, K * that error raised to the set's median)."""
        return allowances(effective_noise(noise), self.floor, self.k)

    def ratios(self, truth: np.ndarray, candidate: np.ndarray, noisy: np.ndarray) -> np.ndarray:
        """Per-sample error / allowance, where `noisy` is the reference model's float32 output (its error vs
        `truth` is the sample's noise; the samples given form one set). NaN/Inf candidates give +inf."""
        return self.judge_set(sample_errors(truth, candidate), sample_errors(truth, noisy))[0]

    def judge_set(self, errors: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ratios, allowances, effective noise) of one input set's samples, from their errors and their raw
        per-sample noise (median-raised here): the one place the allowance is computed."""
        eff = effective_noise(noise)
        allowed = allowances(eff, self.floor, self.k)
        return np.asarray(errors, dtype=np.float64) / allowed, allowed, eff

    def worst(self, truth: np.ndarray, candidate: np.ndarray, noisy: np.ndarray) -> tuple[float, int]:
        """(worst ratio, index of that sample); passes iff the ratio is <= 1."""
        r = self.ratios(truth, candidate, noisy)
        i = int(np.argmax(r))
        return float(r[i]), i


@dataclass(frozen=True)
class GroundTruth:
    """The train-form's outputs on a parity set: float64 (the truth) and float32 (gives each sample's noise)."""
    y64: np.ndarray                      # (n, classes) float64 train-form
    y32: np.ndarray                      # (n, classes) float32 train-form, same inputs
    sets: tuple[str, ...]                # per-sample set tag (inputs.SETS)
    labels: np.ndarray | None = None     # per-sample class index, -1 where unknown; None without labels
    float32_threads: int | None = None   # intra-op threads of the float32 run (its rounding depends on them)
    y16: np.ndarray | None = None        # (n, classes) the deploy-form rounded to fp16 (the fp16 rule), where needed
    y32_alt: np.ndarray | None = None    # (n, classes) a second float32 computation (channels-last layout)
    yq: np.ndarray | None = None         # (n, classes) the compressed kind's emulation (the compressed rule)
    # several outputs (feature maps, a user's heads) packed side by side per sample (models/features.py pack):
    # (name, values per sample) of each, in column order; None for one output
    outputs: tuple | None = None

    def __post_init__(self):
        if np.shape(self.y64) != np.shape(self.y32) or len(self.sets) != len(self.y64):
            raise ValueError("y64, y32 and sets must describe the same samples")
        for extra in (self.y16, self.y32_alt, self.yq):
            if extra is not None and np.shape(extra) != np.shape(self.y64):
                raise ValueError("y16, y32_alt and yq must describe the same samples as y64")

    @property
    def noise(self) -> np.ndarray:
        """Per-sample intrinsic float32 noise: max|y32 - y64| / max|y64|, the envelope over the float32 computations
        run (the default layout and, where computed, channels-last: y32_alt)."""
        noise = sample_errors(self.y64, self.y32)
        return noise if self.y32_alt is None else np.maximum(noise, sample_errors(self.y64, self.y32_alt))

    @property
    def noise16(self) -> np.ndarray:
        """Per-sample error of the independent fp16 computation (y16) against float64."""
        if self.y16 is None:
            raise ValueError("the fp16 rule needs the fp16 reference (GroundTruth.y16): none was computed")
        return sample_errors(self.y64, self.y16)

    @property
    def noise_q(self) -> np.ndarray:
        """Per-sample error of the compressed kind's emulation (yq) against float64."""
        if self.yq is None:
            raise ValueError("the compressed rule needs the kind's emulation (GroundTruth.yq): none was computed")
        return sample_errors(self.y64, self.yq)

    def parts(self) -> list[tuple[str | None, "GroundTruth"]]:
        """(output name, the truth restricted to that output's columns) per output, the one output as (None,
        self): each output is judged as its own set of rows."""
        if not self.outputs or len(self.outputs) < 2:
            return [(None, self)]
        out = []
        for name, cols in column_slices(self.outputs):
            cut = {k: None if getattr(self, k) is None else getattr(self, k)[:, cols]
                   for k in ("y64", "y32", "y16", "y32_alt", "yq")}
            out.append((name, GroundTruth(sets=self.sets, labels=self.labels, float32_threads=self.float32_threads,
                                          **cut)))
        return out

    def columns(self, name: str | None) -> slice:
        """The columns of output `name` (all of them for None)."""
        return dict(column_slices(self.outputs or ())).get(name, slice(None))

    def present(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.sets))

    def indices(self, name: str) -> np.ndarray:
        return np.array([i for i, s in enumerate(self.sets) if s == name], dtype=np.int64)

    def head(self, n: int) -> "GroundTruth":
        """The first `n` samples (a runner that only runs a documented subset)."""
        return self.take(np.arange(min(n, len(self.y64))))

    def take(self, idx: np.ndarray) -> "GroundTruth":
        """The samples at `idx`, in that order."""
        idx = np.asarray(idx, dtype=np.int64)
        return GroundTruth(self.y64[idx], self.y32[idx], tuple(self.sets[i] for i in idx),
                           None if self.labels is None else self.labels[idx], self.float32_threads,
                           None if self.y16 is None else self.y16[idx],
                           None if self.y32_alt is None else self.y32_alt[idx],
                           None if self.yq is None else self.yq[idx], self.outputs)


def accuracy(logits: np.ndarray, labels: np.ndarray | None, k: int) -> float | None:
    """Fraction of the labelled samples (label >= 0) whose label is among the top-k logits; None if none is."""
    if labels is None:
        return None
    labels = np.asarray(labels)
    keep = labels >= 0
    if not keep.any():
        return None
    y = rows(logits)[keep]
    k = min(k, y.shape[1])
    top = np.argsort(-y, axis=1, kind="stable")[:, :k]
    return float(np.mean((top == labels[keep, None]).any(axis=1)))


def wilson(correct: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a proportion correct / n (sound near 0 and 1, unlike the normal one)."""
    if n <= 0:
        return 0.0, 1.0
    p = correct / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * float(np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy_delta(truth: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None) -> dict | None:
    """Top-1 accuracy of `candidate` on the labelled samples with its 95 % Wilson interval, the float64 truth's on
    the same samples, and the drop (truth - candidate), with the counts behind them (`correct`,
    `reference_correct` of `labelled`); None without labelled samples."""
    if labels is None:
        return None
    labels = np.asarray(labels)
    keep = labels >= 0
    n = int(keep.sum())
    if n == 0:
        return None
    correct = int((rows(candidate)[keep].argmax(1) == labels[keep]).sum())
    ref_correct = int((rows(truth)[keep].argmax(1) == labels[keep]).sum())
    lo, hi = wilson(correct, n)
    return {"top1_accuracy_ci95": [round(lo, 4), round(hi, 4)], "reference_top1_accuracy": ref_correct / n,
            "accuracy_drop": (ref_correct - correct) / n, "labelled": n, "correct": correct,
            "reference_correct": ref_correct}


def reference_summary(truth: GroundTruth) -> dict:
    """Per set: the train-form's float32 noise (max and median over samples) and, with labels, its accuracy
    (from the float64 outputs): report.json's `reference.sets`."""
    noise = truth.noise
    out = {}
    for s in truth.present():
        idx = truth.indices(s)
        lab = None if truth.labels is None else truth.labels[idx]
        out[s] = {"samples": int(len(idx)), "reference_noise": float(noise[idx].max()),
                  "reference_noise_median": float(np.median(noise[idx])),
                  "top1_accuracy": accuracy(truth.y64[idx], lab, 1), "top5_accuracy": accuracy(truth.y64[idx], lab, 5)}
    return out


def reference_block(truth: GroundTruth, classes: tuple[str, ...] | None = None) -> dict:
    """report.json's top-level `reference`: the train-form (not a hop) as the ladder measured it: the float32
    run's thread count, its noise per set, and with labels its accuracy (float64 outputs) over every labelled
    sample, the figure each hop's accuracy is compared with."""
    return {"float32_threads": truth.float32_threads, "sets": reference_summary(truth),
            "top1_accuracy": accuracy(truth.y64, truth.labels, 1), "top5_accuracy": accuracy(truth.y64, truth.labels, 5),
            "classes": None if classes is None else len(classes)}
