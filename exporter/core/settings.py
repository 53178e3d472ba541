"""What a run was asked to do, as one typed object: `ExportSettings`.

It is built once, where the request comes in: from the command line and its `--config` file
(exporter/command_line/settings_args.py), from a Python keyword call (`export(model=..., targets=..., ...)`
builds it with `ExportSettings.build`), or from a matrix cell (exporter/matrix/cell.py); then `export`, `parity`,
`bench`, `package` and `vitedge reparam` read it instead of spelling the same settings out again. Commands that take a subset say
which fields they read (`only`), so a setting they would silently ignore is an error instead.

`imgsz` holds input sizes as (height, width) pairs, square or not. Several sizes in one export run the single-size
pipeline once per size (`per_size`: one settings object per size, exporter/flow/sizes.py); the commands that
read one size refuse several (`one_size`). `features` asks for the backbone's feature maps
instead of the logits (models/features.py).

Torch-free: the command line builds it before any heavy import.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from numbers import Integral
from pathlib import Path

from ...errors import VitedgeError
from ...models.input_size import canonical, size_text
from ...models.size_limit import check_size_limit

DEMO_SEED = 0  # trained-like demo weights when no checkpoint is given

Size = tuple  # (height, width), both positive ints


def parse_sizes(value, flag: str = "--imgsz") -> tuple[Size, ...] | None:
    """Input sizes as ((H, W), ...), in the order given, duplicates dropped; None stays None (the model's default).
    Accepts an int S (S x S), "S", "HxW", a comma list of those ("224,256x320"), an (H, W) pair, or a list of any
    of them: a tuple of two ints is one size, (256, 320); several sizes are a list, [224, 256]. Raises
    VitedgeError naming `flag` for anything else."""
    if value is None:
        return None
    bad = VitedgeError(f"{flag} takes sizes S or HxW (positive integers; e.g. 224 or 256x320), or a comma list of "
                       f"them; got {value!r}")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    elif isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, Integral) for v in value):
        items = [value]  # one (H, W) pair
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        items = [value]
    sizes = []
    for item in items:
        if isinstance(item, str):
            parts = item.lower().split("x")
            if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
                raise bad
            hw = tuple(int(p) for p in parts)
        elif isinstance(item, (list, tuple)) and len(item) == 2:
            hw = tuple(item)
        else:
            hw = (item,)
        if not all(isinstance(v, Integral) and not isinstance(v, bool) and v > 0 for v in hw):
            raise bad
        hw = tuple(int(v) for v in hw)  # (numpy integers too)
        for side in hw:
            check_size_limit(side, flag)  # before any work: 100000 would ask for terabytes of parity inputs
        sizes.append(hw * 2 if len(hw) == 1 else hw)
    if not sizes:
        raise bad
    return tuple(dict.fromkeys(sizes))


def parse_features(value) -> str | tuple[int, ...] | None:
    """--features as given: None / False (the logits), True / "" / "default" (the backbone's official detection
    outputs: "default"), or positions of its feature maps ("1,2,3", an int or a list of ints: a sorted tuple)."""
    if value is None or value is False:
        return None
    if value is True or (isinstance(value, str) and value.strip().lower() in ("", "default")):
        return "default"
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else (
        list(value) if isinstance(value, (list, tuple)) else [value])
    try:
        got = tuple(sorted({int(v) for v in items if not isinstance(v, bool)}))
    except (TypeError, ValueError):
        got = ()
    if not got or len(got) != len(items) or any(i < 0 for i in got):
        raise VitedgeError(f"--features takes nothing (the backbone's official detection outputs) or distinct "
                           f"comma-separated feature map positions (e.g. 1,2,3); got {value!r}")
    return got


def as_size(value) -> Size:
    """(H, W) of a size given as S, "HxW", or an (H, W) pair / list (a record read back)."""
    sizes = parse_sizes(tuple(value) if isinstance(value, list) else value)
    if len(sizes) != 1:
        raise VitedgeError(f"one input size expected; got {value!r}")
    return sizes[0]


def written(value) -> str:
    """A recorded size (S, an (H, W) pair or a JSON [H, W]) as the command line writes it: 224, 256x320 (None: -)."""
    return "-" if value is None else size_text(as_size(value))


def size_side(value) -> float:
    """Where a recorded size sits on a latency-vs-size axis: the side of the square of as many pixels, sqrt(H W)
    (a square size's own side), so 256x320 plots between 256 and 320."""
    h, w = as_size(value)
    return float(h) if h == w else (h * w) ** 0.5


def size_label(size: Size) -> str:
    """HxW, square sizes too (224x224): how a multi-size export names a size's files, functions and methods."""
    h, w = size
    return f"{h}x{w}"


def size_entry(size: Size) -> str:
    """The function (CoreML) or method (ExecuTorch) serving `size` in a one-file multi-size artifact: size_224x224
    (an identifier: both name their entry points that way)."""
    return f"size_{size_label(size)}"


@dataclass(frozen=True)
class ExportSettings:
    """Everything `export` is asked to do; `parity`, `bench` and `package` read the fields they share with it.
    The fields are the keywords of `export` and the flags of `vitedge export` of the same name; None means "the
    default" (for `parity`: what the artifact says). `imgsz` takes anything `parse_sizes` accepts (224, "256x320",
    "224,256", (256, 320)) and holds ((H, W), ...). Frozen: derive a changed copy with `replace(**changes)`.
    """
    model: object = None                   # a registered name, an nn.Module, or None: the one the checkpoint names
    targets: object = None                 # comma list or list of targets; None: onnx (parity: the artifact's)
    checkpoint: str | Path | None = None   # train-form weights (file, transformers folder, hf-hub:, timm:)
    imgsz: tuple | None = None             # input sizes ((H, W), ...); None: the model's default size
    batch: int | None = None               # static batch; None: 1 (bench --artifact: the artifact's)
    dynamic_batch: bool = False            # a dynamic batch axis (targets that have one)
    opset: int | None = None               # ONNX opset; None: the exporter's default
    precision: str | None = None           # None: each target's default (parity: the artifact's)
    out: str | Path | None = None          # output folder; None: runs/NAME
    reparam: bool = True                   # False: export the train-form as is
    force: bool = False                    # replace an output that holds vitedge's files
    clean: bool = False                    # with force: also delete files vitedge did not write
    attn_order: str | None = None          # auto | qk_first | kv_first; None: auto (parity: the artifact's)
    strict_schedule: bool = False          # an unfinished LN->RepBN schedule is an error, not a warning
    samples: int | None = None             # parity inputs; None: the GMACs rule
    tolerances: object = None              # {profile: {key: value}} or ["profile.key=value", ...]
    require_verified: bool = False         # an unverified hop of a requested target fails the run
    overrides: dict | None = None          # constructor overrides, official keyword names
    options: dict | None = None            # the targets' own options (their rows' flags: ios, input, ...)
    seed: int = DEMO_SEED                  # the seeded demo weights' seed (no checkpoint)
    rewrites: object = True                # deploy-form rewrites: True (all), False (none) or [names]
    require_ane: bool = False              # coreml on macOS: fail a hop that mostly runs off the Neural Engine
    images: str | Path | None = None       # a folder of the user's images as the parity set
    labels: str | Path | None = None       # class names in index order, one per line
    calib: int | None = None               # int8 / w8a8: calibration images; None: 64
    calib_images: str | Path | None = None  # int8 / w8a8: the folder calibration images come from
    exporter: str | None = None            # ONNX exporter; None: the default (parity: the artifact's)
    truth_cache: bool = True               # read and keep the float64 ground truth in the disk cache
    preprocess: dict | None = None         # crop_pct, interpolation, mean, std over the model's own
    features: object = None                # the backbone's feature maps: None (logits), "default" or positions

    # keyword spellings the commands have used for the same field
    ALIASES = {"model_or_name": "model", "target": "targets"}

    def __post_init__(self):
        object.__setattr__(self, "imgsz", parse_sizes(self.imgsz))
        object.__setattr__(self, "features", parse_features(self.features))
        object.__setattr__(self, "seed", DEMO_SEED if self.seed is None else self.seed)

    @classmethod
    def of(cls, keywords: dict, who: str = "ExportSettings") -> dict:
        """`keywords` by field name: each is a field or an alias (model_or_name, target); an unknown one is a
        TypeError naming `who`, as Python's own would be."""
        names, given = {f.name for f in fields(cls)}, {}
        for key, value in keywords.items():
            name = cls.ALIASES.get(key, key)
            if name not in names:
                raise TypeError(f"{who}() got an unexpected keyword argument {key!r}")
            if name in given:
                raise TypeError(f"{who}() got {key!r} and another spelling of {name!r}; give one")
            given[name] = value
        return given

    @classmethod
    def build(cls, first=None, keywords: dict | None = None, who: str = "ExportSettings",
              **positional) -> "ExportSettings":
        """A command's settings from its call (`export(model=..., targets=..., imgsz=...)`): `first` is an
        ExportSettings, whose fields the keywords then change, or the model; `positional`: the command's other
        positional arguments by field name (None: not given)."""
        keywords = {**(keywords or {}), **{k: v for k, v in positional.items() if v is not None}}
        if isinstance(first, cls):
            return first.replace(**cls.of(keywords, who))
        if first is not None:
            keywords["model"] = first
        return cls(**cls.of(keywords, who))

    def replace(self, **changes) -> "ExportSettings":
        bad = sorted(set(changes) - {f.name for f in fields(self)})
        if bad:
            raise TypeError(f"ExportSettings has no field {bad[0]!r}")
        return dataclasses.replace(self, **changes)

    def given(self) -> list[str]:
        """The fields set to something other than their default."""
        return [f.name for f in fields(self) if getattr(self, f.name) != f.default]

    def only(self, allowed, command: str) -> None:
        """A command that reads a subset of the settings refuses the rest, so nothing is silently ignored."""
        extra = [n for n in self.given() if n not in allowed]
        if extra:
            raise VitedgeError(f"{command} does not take {', '.join(extra)} (settings of `export`); drop "
                               f"{'it' if len(extra) == 1 else 'them'}")

    # -- sizes: what today's pipeline runs, checked in one place --------------------------------------------

    def sizes(self) -> list | None:
        """The sizes as the pipeline takes them (S square, (H, W) otherwise: models/input_size.py `canonical`), in
        the order given; None: the model's default."""
        return None if self.imgsz is None else [canonical(z) for z in self.imgsz]

    def one_size(self):
        """The one size of a single-size run, S or (H, W) (None: the model's default). Several sizes are for
        `export` and `package` (`per_size`) and `bench`; the commands that read one size (parity, reparam) refuse
        them."""
        if self.several_sizes():
            raise VitedgeError(f"--imgsz {','.join(map(size_text, self.imgsz))}: this command takes one size; run it "
                               "once per size (`vitedge export` and `vitedge package` take several)")
        return None if self.imgsz is None else canonical(self.imgsz[0])

    def several_sizes(self) -> bool:
        """More than one input size: one export (and one CoreML / ExecuTorch file) for all of them."""
        return self.imgsz is not None and len(self.imgsz) > 1

    def per_size(self) -> list["ExportSettings"]:
        """One settings object per input size, each read by the single-size pipeline as it reads any run's."""
        return [self.replace(imgsz=[size]) for size in self.imgsz or ()]

    def imgsz_or(self, default):
        """The run's size (S or (H, W)), else `default` (e.g. the size an artifact records)."""
        size = self.one_size()
        return default if size is None else size

    # -- the side-length readers of the previous release, kept for callers of the Python API ----------------

    def square_sizes(self) -> list[int] | None:
        """The sizes as side lengths (None: the model's default), refusing a non-square one (read `sizes()`)."""
        if self.imgsz is None:
            return None
        wide = [z for z in self.imgsz if z[0] != z[1]]
        if wide:
            raise VitedgeError(f"--imgsz {size_text(wide[0])}: a non-square size has no side length; read "
                               "ExportSettings.sizes() (S or (H, W)) instead of square_sizes()")
        return [h for h, _ in self.imgsz]

    def square_size(self) -> int | None:
        """The one square size (None: the model's default), refusing a non-square one (read `one_size()`)."""
        self.square_sizes()
        return self.one_size()
