"""The report.json schema, defined once: the CLI writes it, the Python API returns it, tests read it.

Field names here are a public contract (documented in the README); add fields, never rename them.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import platform
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path

from ...models.input_size import as_hw, canonical, size_json

STATUSES = ("passed", "failed", "unverified")
MODES = ("reference", "device", "emulated")
WEIGHTS = ("untrained", "checkpoint", "module")  # "module": an in-memory nn.Module given to the Python API

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


@dataclass
class Metrics:
    """Candidate vs train-form logits over the whole parity set.

    max_rel is max|y - ref| / max|ref|; cosine is the lowest per-sample cosine similarity; psnr_db is
    20*log10(max|ref| / RMSE); top-k agreement is the fraction of samples whose top-k class sets match.
    """
    max_abs: float
    max_rel: float
    cosine: float
    psnr_db: float
    top1_agreement: float
    top5_agreement: float
    # The counts behind the agreements (k of `samples`): bounds are judged on these integers, never on the rounded
    # fractions (None in reports written before they were recorded).
    samples: int | None = None
    top1_agreeing: int | None = None
    top5_agreeing: int | None = None


def required_count(fraction: float, n: int) -> int:
    """The fewest of `n` samples that meet a lower bound `fraction` on a proportion, in integers: the bound is read
    as the rational it stands for (0.99 as 99/100, a (n-1)/n bound as exactly that), so no float step decides."""
    return math.ceil(_rational(fraction) * n)


def allowed_count(fraction: float, n: int) -> int:
    """The most of `n` samples an upper bound `fraction` on a proportion allows, in integers (see required_count)."""
    return math.floor(_rational(fraction) * n)


def _rational(fraction: float) -> Fraction:
    # the closest fraction with a denominator up to a million: the decimal a profile states, or the exact k/n a
    # resolution bound computed (distinct fractions of such denominators lie >= 1e-12 apart; float error ~1e-16)
    return Fraction(float(fraction)).limit_denominator(10 ** 6)


@dataclass
class Tolerance:
    """Thresholds of one precision profile; None = not checked. max_* are upper bounds, the rest lower bounds."""
    profile: str
    max_abs: float | None = None
    max_rel: float | None = None
    cosine: float | None = None
    psnr_db: float | None = None
    top1_agreement: float | None = None
    top5_agreement: float | None = None
    # The per-sample noise rule (exporter/verdict/criteria.py): error <= max(noise_floor, noise_k * the sample's float32
    # noise); judged against float64 ground truth only. None for both = no noise rule.
    noise_floor: float | None = None
    noise_k: float | None = None
    # The fp16 rule: the same per-sample form with the error of an independent fp16 computation (the deploy-form
    # rounded to fp16) in place of the float32 noise: error <= max(fp16_floor, fp16_k * that error).
    fp16_floor: float | None = None
    fp16_k: float | None = None
    # and, over a set of at least MEDIAN_MIN_SAMPLES samples (precisions.py), the median of error / that error: a systematic
    # error moves most samples, where a correct artifact's median stays near 1
    fp16_median: float | None = None
    # Compressed kinds (int8, w8, palette4/6, w8a8): the same per-sample form with the error of an independent
    # emulation of the kind in torch (exporter/verdict/emulate.compressed_reference): error <= max(compressed_floor,
    # compressed_k * that error), and over a set of at least MEDIAN_MIN_SAMPLES samples (precisions.py) the median of error /
    # that error within compressed_median: an artifact far beyond what a correct one of its kind does fails.
    compressed_floor: float | None = None
    compressed_k: float | None = None
    compressed_median: float | None = None
    # With labels (a labelled --images folder): the largest allowed drop of top-1 accuracy against the float64
    # train-form on the same labelled samples (a fraction: 0.005 = half a point); judged per input set.
    accuracy_drop: float | None = None

    UPPER = ("max_abs", "max_rel")
    LOWER = ("cosine", "psnr_db", "top1_agreement", "top5_agreement")
    NOISE = ("noise_floor", "noise_k")
    FP16 = ("fp16_floor", "fp16_k", "fp16_median")
    COMPRESSED = ("compressed_floor", "compressed_k", "compressed_median")
    LABELLED = ("accuracy_drop",)
    COUNTED = ("top1_agreement", "top5_agreement")   # proportions of samples: judged as counts (required_count)

    def noise_rule(self) -> bool:
        return self.noise_floor is not None or self.noise_k is not None

    def fp16_rule(self) -> bool:
        return self.fp16_floor is not None or self.fp16_k is not None or self.fp16_median is not None

    def compressed_rule(self) -> bool:
        return any(getattr(self, k) is not None for k in self.COMPRESSED)

    def violations(self, m: Metrics) -> list[str]:
        """Human-readable list of the metric thresholds `m` misses (empty = within tolerance); the noise rule
        needs per-sample data and is judged by exporter/verdict/parity.judge."""
        out = []
        for key in self.UPPER + self.LOWER:
            limit = getattr(self, key)
            if limit is None:
                continue
            value = getattr(m, key)
            counted = getattr(m, key.replace("_agreement", "_agreeing"), None) if key in self.COUNTED else None
            if counted is not None and m.samples is not None and value == value:  # NaN outputs fall through
                need = required_count(limit, m.samples)
                if counted < need:
                    out.append(f"{key} {counted}/{m.samples} < {need}/{m.samples} (bound {limit:.4g})")
                continue
            bad = not (value <= limit) if key in self.UPPER else not (value >= limit)  # NaN counts as bad
            if bad:
                out.append(f"{key} {value:.4g} {'>' if key in self.UPPER else '<'} {limit:.4g}")
        return out


@dataclass
class Hop:
    hop: str
    backend: str
    status: str
    mode: str | None = None
    reason: str | None = None
    samples: int = 0
    metrics: Metrics | None = None
    tolerance: Tolerance | None = None
    diverging_module: str | None = None
    seconds: float | None = None  # wall time of the hop (lowering + running)
    ane_residency: dict | None = None  # --require-ane on a CoreML hop: passed / failed / inconclusive and why
    runner: dict | None = None    # what the runner says about how it ran (Runner.info(): compute units, ...)
    # `vitedge parity` on an artifact carrying class names (vitedge.labels): its top-1 on the first parity inputs,
    # [{"sample", "top1", "name", "reference", "reference_name"}] (exporter/verdict/predictions.py); None otherwise.
    predictions: list | None = None
    # Judged against float64 ground truth: per input set (natural / stress / user) {"samples", "metrics" (vs
    # float64), "reference_noise", "noise_ratio", "top1_accuracy", "top5_accuracy", "worst_sample", "problems"; fp16
    # hops also "reference_fp16_error" and "fp16_median_ratio" (the fp16 rule); with
    # labels also "top1_accuracy_ci95" (Wilson), "reference_top1_accuracy" and "reference_top5_accuracy" (the float64
    # train-form on exactly the hop's samples), "accuracy_drop", and the counts "correct", "reference_correct",
    # "labelled"}; None where the hop did not run.
    sets: dict | None = None
    # ONNX hops under the noise rule: the feature probe (exporter/verdict/probe.py) {"status" (passed / failed / not run /
    # not applicable: several outputs, each judged itself /
    # error: it raised, and the hop is unverified),
    # "module", "tensor", "samples", "noise_ratio", "worst_sample", "sets", "why"}; None where it does not apply.
    probe: dict | None = None
    # A hop run on part of the parity set because a later hop runs the same graph on all of it (the deploy-form and
    # raw onnx hops of `vitedge export`): which part, and why; None where the hop ran every sample it could.
    subset: str | None = None
    # fp16 and compressed artifacts: their stored weights against the deploy-form's, per output channel
    # (exporter/verdict/weight_check.py) {"status" (passed / failed / not run / error: it raised, and the hop is
    # unverified / not applicable: a TensorRT engine), "checked", "unmatched", "worst" {"weight", "channel",
    # "deviation", "allowance", "ratio"}, "why"};
    # None where it does not apply.
    weights: dict | None = None
    # A multi-size export (`--imgsz 224,256x320`): the size this hop judged, "HxW"; None in a single-size export.
    size: str | None = None
    # A multi-size export's one artifact of every size: the CoreML function or ExecuTorch method the hop ran.
    entry: str | None = None
    # Several outputs (--features, a user's heads): each output's worst noise_ratio over the input sets, in output
    # order (the worst decides the hop; `sets[...]["outputs"]` per set); None for one output.
    outputs: dict | None = None

    def label(self) -> str:
        """The hop as the summary names it: "coreml @256x320" in a multi-size export, else its name."""
        return f"{self.hop} @{self.size}" if self.size else self.hop

    def mode_label(self) -> str:
        """The mode as displayed: "device (x86 host)" where the runner ran on this machine's CPU rather than on the
        device the artifact is for (ExecuTorch's runtime here: `runner.host`); `mode` itself stays "device"."""
        host = (self.runner or {}).get("host")
        return f"{self.mode or '-'} ({host} host)" if host and self.mode == "device" else self.mode or "-"

    @classmethod
    def from_dict(cls, d: dict) -> "Hop":
        d = dict(d)
        d["metrics"] = Metrics(**d["metrics"]) if d.get("metrics") else None
        d["tolerance"] = Tolerance(**d["tolerance"]) if d.get("tolerance") else None
        return cls(**d)


@dataclass
class ArtifactEntry:
    path: str           # relative to the output folder (it is renamed into place after the build)
    sha256: str
    bytes: int
    precision: str
    nodes: dict | None = None       # ONNX artifacts: node count per op type
    info: dict = field(default_factory=dict)  # target-specific facts (precision policy, compute units, ...)


@dataclass
class ReparamInfo:
    folded: dict = field(default_factory=dict)            # kind -> count
    unfolded: list = field(default_factory=list)          # [{"module", "why"}]
    attention_order: dict = field(default_factory=dict)   # module path -> "qk_first" | "kv_first"
    attention_reason: dict = field(default_factory=dict)  # module path -> why
    # module path -> each SLA / SimA block's rule ("sla" | "sima"), its real token counts n, n_kv and head width d
    # at the export's size, the multiplies per head of either order, the rule's order and the one used
    attention_blocks: dict = field(default_factory=dict)
    schedule: list = field(default_factory=list)          # unfinished LN->RepBN schedules found
    rewrites: list = field(default_factory=list)          # deploy-form rewrites applied (beyond folding)
    equivalence: dict | None = None                      # the fp64 gate's result
    fp16: dict | None = None                             # fp16 range analysis (when an fp16 target was built)


@dataclass
class Report:
    model: str
    # The input size: in report.json the int S of a square S x S input (as always) and, for a non-square one, the
    # text "HxW" as `--imgsz` takes it (`input_size` holds [H, W] for both); in Python S or (H, W)
    # (models/input_size.py `canonical`).
    imgsz: int | tuple
    batch: int | None                 # None = dynamic batch
    weights: str                      # WEIGHTS
    checkpoint_sha256: str | None
    reparam: ReparamInfo
    artifacts: dict = field(default_factory=dict)   # target -> ArtifactEntry
    parity: list = field(default_factory=list)      # [Hop]
    versions: dict = field(default_factory=dict)
    # Beyond the fields: how to read the outcome without re-deriving it.
    command: str = "export"
    targets: list = field(default_factory=list)     # requested targets
    overrides: dict = field(default_factory=dict)   # create_model overrides
    samples: int = 0
    # How `samples` was chosen when none was asked for (exporter/verdict/parity_cost.py: the GMACs rule); None when given
    samples_rule: str | None = None
    inputs: str = ""                                # which parity input set (vitedge.exporter.verdict.inputs)
    # The train-form (not a hop) on the parity set: float32 thread count, float32 noise vs float64 per set,
    # accuracy with labels (criteria.reference_block); None when no ladder ran.
    reference: dict | None = None
    images: str | None = None                       # --images folder (the user set), if given
    labels: str | None = None                       # --labels file (class names in index order), if given
    require_verified: bool = False
    require_ane: bool = False
    # Compressed precisions (--precision int8 | w8a8): which samples calibrated activations (ids, sha256, source,
    # what the evaluation leaves out) and, for every compressed kind, which samples the hops were judged on.
    calibration: dict | None = None
    compressed_inputs: str | None = None
    out_dir: str | None = None                      # the export's output folder
    quarantine: str | None = None                   # folder (relative to out_dir) holding a failed run's artifacts
    exporter: str | None = None                     # ONNX exporter that wrote the graph: torchscript | dynamo
    exporter_fallback: str | None = None            # why dynamo, asked for, did not write it (None: no fallback)
    opset: int | None = None                        # the ONNX graph's opset
    # The eval preprocessing the images were fed with (models/preprocess.Recipe: mean, std, crop_pct,
    # interpolation, crop_mode, source): the model's official one, a checkpoint's, or the user's overrides.
    preprocess: dict | None = None
    # What the checkpoint determined and where from (layout, model, num_classes, labels, preprocess): None
    # without a checkpoint (models/checkpoints/identify_model.py).
    from_checkpoint: dict | None = None
    # [H, W] of the input, for every size (set from `imgsz`)
    input_size: list | None = None
    # What the train-form changed to run at this size, per tensor ({"tensor", "how", "from", "to"}: a position table
    # resampled on its grid, a token map padded to window multiples); [] at its own size (docs/models.md)
    resized: list = field(default_factory=list)
    # A multi-size export: one entry per size, in the order asked, {"size" ("HxW"), "imgsz" ([H, W]), "entry" (the
    # CoreML function / ExecuTorch method serving it), "files" ({artifact key: path} of its own files), "samples",
    # "reparam" (that size's attention order and float64 gate), "reference"}; `imgsz`, `reparam`, `samples`,
    # `reference` above are the first size's. None in a single-size export.
    sizes: list | None = None
    # The exported module's outputs, in order: [{"name", "shape" (per sample), "stride" (feature maps; else
    # None)}]: `logits` for a classifier, the feature maps for --features (models/outputs.py).
    outputs: list | None = None
    features: object = None                         # --features as asked: None, "default" or the positions
    exit_code: int = EXIT_OK
    status: str = "passed"                          # "passed" | "failed"

    # ---- outcome -------------------------------------------------------------------------------
    def __post_init__(self):
        self.imgsz = canonical(self.imgsz)
        self.input_size = None if self.imgsz is None else list(as_hw(self.imgsz))

    def failed_hops(self) -> list[Hop]:
        return [h for h in self.parity if h.status == "failed"]

    def unverified_hops(self) -> list[Hop]:
        return [h for h in self.parity if h.status == "unverified"]

    def inconclusive_checks(self) -> list[Hop]:
        """Hops whose --require-ane residency check could not decide (never counted as passed or failed)."""
        return [h for h in self.parity if (h.ane_residency or {}).get("status") == "inconclusive"]

    def finalize(self) -> "Report":
        """Set `exit_code` / `status` from the hops: 1 if any failed (or, with require_verified, is unverified or
        has an inconclusive --require-ane check). With require_verified a passed hop whose feature probe or weights
        check did not run is unverified: nothing counts as checked that was not."""
        if self.require_verified:
            for h in self.parity:
                for what, check in (("feature probe", h.probe), ("weights check", h.weights)):
                    if h.status == "passed" and (check or {}).get("status") == "not run":
                        h.status = "unverified"
                        h.reason = f"--require-verified: the {what} did not run ({check.get('why')})"
        bad = bool(self.failed_hops()) or (self.require_verified and bool(self.unverified_hops()
                                                                          or self.inconclusive_checks()))
        self.exit_code = EXIT_FAILED if bad else EXIT_OK
        self.status = "failed" if bad else "passed"
        return self

    def hop(self, name: str) -> Hop | None:
        return next((h for h in self.parity if h.hop == name), None)

    # ---- (de)serialization ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = finite(asdict(self))
        d["imgsz"] = size_json(self.imgsz)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=_json_default, allow_nan=False) + "\n"

    def write(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Report":
        d = dict(d)
        d["reparam"] = ReparamInfo(**d["reparam"])
        d["artifacts"] = {k: ArtifactEntry(**v) for k, v in d.get("artifacts", {}).items()}
        d["parity"] = [Hop.from_dict(h) for h in d.get("parity", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def read(cls, path: str | Path) -> "Report":
        return cls.from_dict(json.loads(Path(path).read_text()))


def finite(o):
    """NaN/Inf become null: strict JSON has no spelling for them (the hop's reason says what happened)."""
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [finite(v) for v in o]
    return o


def _json_default(o):
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):  # numpy / torch scalars
        return o.item()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


CORE_PACKAGES = ("torch", "numpy", "onnx", "onnxruntime", "onnxsim")  # every run's; each target's row adds its own


def _versioned() -> tuple[str, ...]:
    from ...targets import rows

    return tuple(dict.fromkeys(CORE_PACKAGES + tuple(p for r in rows() for p in r.packages)))


def versions() -> dict:
    """Versions of everything that shaped the artifacts (read from package metadata: no imports)."""
    from ... import __version__

    out = {"vitedge": __version__, "python": platform.python_version(), "platform": platform.platform()}
    for pkg in _versioned():
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out
