"""Resolve a matrix plan into cells, every key and value validated (imports the registry and TARGETS table).

Precision support, target options and hop names come from the TARGETS table (each target's `precisions`,
`options`, `hop_name`), so a precision or option a target gains later needs no change here. Model names,
`set` overrides (built on the meta device: no weights allocated), sizes and rewrites are checked against the
registry and the fold plans. Rules for pairs (README "Plan format"):
- a `targets` item without a precision is crossed with the `precisions` in scope; a pair from that cross
  product that its target does not support is skipped and listed;
- an explicit `target-precision` item the target does not support, a precision listed on a model that none of
  its targets supports, or a top-level precision no target of the plan supports is a PlanError;
- an empty matrix is a PlanError.
"""
from __future__ import annotations

import difflib
import re
from pathlib import Path

from ...errors import VitedgeError
from ..core.settings import parse_sizes
from ..onnx.onnx_choice import DEFAULT_EXPORTER, EXPORTERS, default_opset
from .plan import Cell, PlanError, ResolvedPlan

TOP_KEYS = ("models", "defaults", "targets", "precisions", "trt_arch")
MODEL_AXES = ("name", "label", "checkpoint", "imgsz", "set", "targets", "precisions", "trt_arch")
SETTINGS = ("samples", "tol", "batch", "opset", "rewrites", "attn_order", "coreml_mode", "tensorrt_version",
            "exporter")
DEFAULT_AXES = ("imgsz", "set")
CHOICES = {"attn_order": ("auto", "qk_first", "kv_first"), "coreml_mode": ("device", "emulated"),
           "exporter": EXPORTERS}
_ARCH = re.compile(r"^sm_\d{2,3}[a-z]?$")
_LABEL = re.compile(r"^[A-Za-z0-9_.-]+$")


def resolve_plan(doc: dict, base_dir: str | Path, exporter: str | None = None) -> ResolvedPlan:
    """`exporter`: the ONNX exporter of cells whose plan entry (or `defaults`) names none (None: the default)."""
    return _Resolver(doc, Path(base_dir).resolve(), exporter or DEFAULT_EXPORTER).run()


def _unknown(where: str, key, allowed, hint: str = "") -> PlanError:
    close = difflib.get_close_matches(str(key), list(allowed), n=1)
    did = f" (did you mean {close[0]!r}?)" if close else ""
    fix = hint or f"valid keys here: {', '.join(allowed)}"
    return PlanError(f"{where}: unknown key {key!r}{did}; {fix}")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _positive(where: str, v) -> int:
    if not _is_int(v) or v <= 0:
        raise PlanError(f"{where} must be a positive integer; got {v!r}")
    return v


def _str_list(where: str, v) -> list[str]:
    if isinstance(v, str):
        v = [s for s in v.split(",")]
    if not isinstance(v, list) or not all(isinstance(s, str) and s.strip() for s in v):
        raise PlanError(f"{where} must be a list of names (or one comma-separated string); got {v!r}")
    return [s.strip() for s in v]


def _target(name: str):
    """The target's class instance from the TARGETS table, or None when its module cannot be imported here
    (its cells then run and report their hop unverified, as `vitedge export` does)."""
    from ...targets import get_target

    try:
        return get_target(name)
    except ImportError:
        return None


def _row(name: str):
    """The target's row (None: a bare "module:Class" entry whose module cannot be imported here)."""
    from ...targets import row_of

    try:
        return row_of(name)
    except ImportError:
        return None


class _Resolver:
    def __init__(self, doc: dict, base: Path, exporter: str = DEFAULT_EXPORTER):
        from ...targets import ALIASES, TARGETS

        self.doc, self.base, self.aliases, self.exporter = doc, base, ALIASES, exporter
        self.targets = {n: _target(n) for n in TARGETS}  # None: module not importable here
        self.rows = {n: _row(n) for n in TARGETS}
        self.option_names = tuple(dict.fromkeys(o for t in self.targets.values() if t for o in t.options))
        self.settings = SETTINGS + self.option_names
        self.known_precisions = tuple(dict.fromkeys(p for t in self.targets.values() if t for p in t.precisions))

    # -- values --------------------------------------------------------------------------------------
    def target_name(self, where: str, name: str) -> str:
        n = self.aliases.get(name.lower(), name.lower())
        if n not in self.targets:
            close = difflib.get_close_matches(n, list(self.targets) + list(self.aliases), n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            raise PlanError(f"{where}: unknown target {name!r}{did}; choose from {', '.join(self.targets)}")
        return n

    def target_items(self, where: str, v) -> list[tuple[str, str | None]]:
        """[(target, precision or None)]: `coreml` is crossed with the precisions, `coreml-fp32` is explicit."""
        out = []
        for i, item in enumerate(_str_list(where, v)):
            t, _, p = item.partition("-")
            t = self.target_name(f"{where}[{i}]", t)
            if p:
                self.precision_name(f"{where}[{i}]", p)
            out.append((t, p or None))
        return out

    def precision_name(self, where: str, p: str) -> str:
        if p not in self.known_precisions:
            raise PlanError(f"{where}: unknown precision {p!r}; the targets support {', '.join(self.known_precisions)}")
        return p

    def per_arch(self, target: str) -> bool:
        """Whether a plan's trt_arch list makes one cell of `target` per GPU architecture (its row says)."""
        return bool(self.rows[target] and self.rows[target].per_arch)

    def own_setting(self, target: str, s: dict, key: str):
        """A target-only plan setting (coreml_mode, tensorrt_version) for a cell of `target`: None for the others."""
        row = self.rows[target]
        return s.get(key) if row is not None and key in row.matrix_settings else None

    def supports(self, target: str, precision: str) -> bool:
        t = self.targets[target]
        return t is None or precision in t.precisions  # a target not importable here: its hop will say why

    def setting(self, where: str, key: str, v):
        if key == "samples" or key == "batch":
            return _positive(where, v)
        if key == "opset":  # checked per cell, against the cell's exporter
            if not _is_int(v):
                raise PlanError(f"{where} must be an integer ONNX opset; got {v!r}")
            return v
        if key == "tol":
            return self.tolerance_overrides(where, v)
        if key == "rewrites":
            if v is True or v == "all":
                return True
            if v is False or v == "none":
                return False
            return _str_list(where, v)
        if key in CHOICES:
            if v not in CHOICES[key]:
                raise PlanError(f"{where} must be one of {', '.join(CHOICES[key])}; got {v!r}")
            return v
        if key == "tensorrt_version":
            if not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise PlanError(f"{where} must be a TensorRT version string such as \"10.13\"; got {v!r}")
            return str(v)
        if key == "labels" or key == "timing_cache":  # file paths, relative to the plan's folder
            if not isinstance(v, str):
                raise PlanError(f"{where} must be a file path; got {v!r}")
            return str((self.base / v).resolve())
        return v  # other target options: each target's validate_options checks them per cell

    def tolerance_overrides(self, where: str, v) -> dict:
        from ..verdict.parity import parse_tol, tolerances

        out: dict = {}
        if isinstance(v, (str, list)):
            for i, s in enumerate([v] if isinstance(v, str) else v):
                if not isinstance(s, str):
                    raise PlanError(f"{where}[{i}] must be a string like \"fp16.psnr_db=30\"; got {s!r}")
                p, k, val = self.wrap(f"{where}[{i}]", parse_tol, s)
                out.setdefault(p, {})[k] = val
        elif isinstance(v, dict):
            for p, values in v.items():
                if not isinstance(values, dict):
                    raise PlanError(f"{where}.{p} must map tolerance keys to numbers (or none); got {values!r}")
                for k, val in values.items():
                    if val is not None and (isinstance(val, bool) or not isinstance(val, (int, float))):
                        raise PlanError(f"{where}.{p}.{k} must be a number or null; got {val!r}")
                    out.setdefault(p, {})[k] = None if val is None else float(val)
        else:
            raise PlanError(f"{where} must be a list like [\"fp16.psnr_db=30\"] or a mapping {{fp16: {{psnr_db: 30}}}}")
        self.wrap(where, tolerances, out)
        return out

    @staticmethod
    def wrap(where: str, fn, *args):
        try:
            return fn(*args)
        except PlanError:
            raise
        except VitedgeError as e:
            raise PlanError(f"{where}: {e}") from None

    def settings_of(self, where: str, entry: dict, allowed: tuple) -> dict:
        out = {}
        for k, v in entry.items():
            if k not in allowed:
                hint = ("put it at the top level of the plan (or on a model entry)"
                        if where == "defaults" and k in ("targets", "precisions", "trt_arch") else "")
                raise _unknown(where, k, allowed, hint)
            if k in self.settings:
                out[k] = self.setting(f"{where}.{k}", k, v)
        return out

    # -- the plan ------------------------------------------------------------------------------------
    def run(self) -> ResolvedPlan:
        doc = self.doc
        for k in doc:
            if k not in TOP_KEYS:
                raise _unknown("plan", k, TOP_KEYS)
        models = doc.get("models")
        if not isinstance(models, list) or not models:
            raise PlanError("plan: `models` must be a non-empty list of {name: MODEL, ...} entries")
        defaults = doc.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise PlanError("plan: `defaults` must be a mapping of settings")
        dset = self.settings_of("defaults", defaults, self.settings + DEFAULT_AXES)
        top_targets = self.target_items("targets", doc["targets"]) if "targets" in doc else None
        top_prec = [self.precision_name(f"precisions[{i}]", p)
                    for i, p in enumerate(_str_list("precisions", doc["precisions"]))] if "precisions" in doc else None
        top_arch = self.archs("trt_arch", doc["trt_arch"]) if "trt_arch" in doc else None

        cells, skipped, seen, used = [], [], {}, set()
        for i, m in enumerate(models):
            where = f"models[{i}]"
            if not isinstance(m, dict):
                raise PlanError(f"{where} must be a mapping like {{name: swiftformer_xs}}; got {m!r}")
            mset = self.settings_of(where, m, self.settings + MODEL_AXES)
            targets = self.target_items(f"{where}.targets", m["targets"]) if "targets" in m else top_targets
            targets = targets or [("onnx", None)]
            prec = ([self.precision_name(f"{where}.precisions[{j}]", p)
                     for j, p in enumerate(_str_list(f"{where}.precisions", m["precisions"]))]
                    if "precisions" in m else top_prec)
            if "precisions" in m:
                self.check_precisions(f"{where}.precisions", prec, [t for t, p in targets if p is None])
            archs = self.archs(f"{where}.trt_arch", m["trt_arch"]) if "trt_arch" in m else top_arch
            if "trt_arch" in m and not any(self.per_arch(t) for t, _ in targets):
                raise PlanError(f"{where}.trt_arch: this model exports no tensorrt cell; remove trt_arch or add "
                                "tensorrt to its targets")
            for t, _ in targets:
                used.add(t)
            merged = {**dset, **mset}
            if "tol" in dset and "tol" in mset:  # per profile and key: the model's values win
                merged["tol"] = {p: {**dset["tol"].get(p, {}), **mset["tol"].get(p, {})}
                                 for p in {*dset["tol"], *mset["tol"]}}
            new, skip = self.model_cells(where, m, merged, defaults, targets, prec, archs)
            for c in new:
                if c.id in seen and seen[c.id] != where:
                    raise PlanError(f"{where}: cell {c.id} is also made by {seen[c.id]}; give one entry a distinct "
                                    "`label`")
                seen[c.id] = where
            cells += new
            skipped += skip
        self.check_plan_wide(top_prec, top_arch, used, dset)
        if not cells:
            pairs = ", ".join(f"{s['target']}-{s['precision']}" for s in skipped)
            why = f" (skipped: {pairs})" if skipped else ""
            raise PlanError(f"plan: the matrix is empty{why}; list targets and precisions the targets support")
        return ResolvedPlan(cells, skipped)

    def archs(self, where: str, v) -> list[str]:
        archs = _str_list(where, v)
        for a in archs:
            if not _ARCH.match(a):
                raise PlanError(f"{where}: {a!r} is not a GPU architecture label; use sm_XY (e.g. sm_80, sm_89)")
        return list(dict.fromkeys(archs))

    def check_precisions(self, where: str, precisions: list[str] | None, crossed: list[str]) -> None:
        for p in precisions or []:
            if crossed and not any(self.supports(t, p) for t in crossed):
                raise PlanError(f"{where}: {p} is supported by none of {', '.join(crossed)}; drop it or add a "
                                f"target that supports it ({', '.join(self.supporters(p))})")

    def supporters(self, p: str) -> list[str]:
        return [n for n, t in self.targets.items() if t is not None and p in t.precisions]

    def check_plan_wide(self, top_prec, top_arch, used: set, dset: dict) -> None:
        self.check_precisions("precisions", top_prec, sorted(used))
        if top_arch and not any(self.per_arch(t) for t in used):
            raise PlanError("trt_arch: the plan exports no tensorrt cell; remove trt_arch or add tensorrt to targets")
        for k in dset:
            if k in self.option_names:
                owners = [n for n, t in self.targets.items() if t is not None and k in t.options]
                if not used & set(owners):
                    raise PlanError(f"defaults.{k} applies to {', '.join(owners)} only, which the plan does not "
                                    "export; remove it")

    def model_cells(self, where: str, m: dict, s: dict, defaults: dict, targets, prec, archs):
        import torch

        from ...models.registry import create_model, get_spec
        from ..reparam.engine import resolve_rewrites

        name = m.get("name")
        if not isinstance(name, str):
            raise PlanError(f"{where}.name is required: a model name from `vitedge models`")
        spec = self.wrap(f"{where}.name", get_spec, name)
        label = m.get("label", name)
        if not isinstance(label, str) or not _LABEL.match(label):
            raise PlanError(f"{where}.label must be a folder name (letters, digits, _ . -); got {label!r}")
        ckpt = None
        if "checkpoint" in m:
            if not isinstance(m["checkpoint"], str):
                raise PlanError(f"{where}.checkpoint must be a file path; got {m['checkpoint']!r}")
            ckpt = (self.base / m["checkpoint"]).resolve()
            if not ckpt.is_file():
                raise PlanError(f"{where}.checkpoint: {ckpt} not found; paths are relative to the plan's folder")
        overrides = {}
        for src, val in (("defaults.set", defaults.get("set")), (f"{where}.set", m.get("set"))):
            if val is not None and not isinstance(val, dict):
                raise PlanError(f"{src} must map constructor keywords to values, e.g. {{depth: 2}}")
            overrides.update(val or {})
        with torch.device("meta"):  # the overrides must build; no memory is allocated for the weights
            model = self.wrap(f"{where}.set", lambda: create_model(name, **overrides))
        sizes = m.get("imgsz", defaults.get("imgsz"))
        src = f"{where}.imgsz" if "imgsz" in m else "defaults.imgsz"
        if sizes is None:
            sizes = [spec.default_size(overrides)]
        sizes = [sizes] if _is_int(sizes) or isinstance(sizes, str) else sizes
        if not isinstance(sizes, list) or not sizes:
            raise PlanError(f"{src} must be a size (S or \"HxW\") or a list of sizes; got {sizes!r}")
        for z in sizes:
            if not isinstance(z, str):
                _positive(src, z)
        sizes = self.wrap(src, parse_sizes, sizes, "imgsz")  # ((H, W), ...): S and "HxW" alike
        for z in sizes:
            self.wrap(src, spec.check_imgsz, z, overrides)
        rewrites = s.get("rewrites", True)
        self.wrap(f"{where}.rewrites", resolve_rewrites, model, rewrites)
        exporter = s.get("exporter", self.exporter)
        opset = s.get("opset", default_opset(exporter))
        self.wrap(f"{where}.opset" if "opset" in m else ("defaults.opset" if "opset" in defaults else where),
                  _check_opset, opset, exporter)

        pairs, skipped = [], []
        for t, p in targets:
            tcls = self.targets[t]
            if p is not None:
                if not self.supports(t, p):
                    raise PlanError(f"{where}.targets: {t}-{p} is not supported ({t} supports "
                                    f"{', '.join(tcls.precisions)}); drop it or pick one of those")
                pairs.append((t, p))
                continue
            for q in prec or [tcls.default_precision if tcls else "fp32"]:
                if self.supports(t, q):
                    pairs.append((t, q))
                else:
                    skipped.append({"model": label, "target": t, "precision": q,
                                    "why": f"{t} does not support {q} (it supports {', '.join(tcls.precisions)})"})
        for k in m:  # an option set on the model itself must apply to one of its targets (defaults: plan-wide)
            if k in self.option_names and not any(k in (self.targets[t].options if self.targets[t] else ())
                                                  for t, _ in pairs):
                raise PlanError(f"{where}: {k} applies to no target of this model; remove it")
        cells = []
        for t, p in dict.fromkeys(pairs):
            tcls = self.targets[t]
            options = {k: v for k, v in s.items() if tcls is not None and k in tcls.options}
            if tcls is not None:
                self.wrap(where, tcls.validate_options, options)
            hop = tcls.hop_name(p) if tcls else t
            for z in sizes:
                for a in (archs or [None]) if self.per_arch(t) else [None]:
                    cells.append(Cell(model=name, label=label, imgsz=z, target=t, precision=p, hop=hop, trt_arch=a,
                                      checkpoint=str(ckpt) if ckpt else None, overrides=dict(overrides),
                                      samples=s.get("samples"), batch=s.get("batch", 1),
                                      opset=opset, exporter=exporter, rewrites=rewrites,
                                      attn_order=s.get("attn_order", "auto"), tolerances=s.get("tol", {}),
                                      options=options, coreml_mode=self.own_setting(t, s, "coreml_mode"),
                                      tensorrt_version=self.own_setting(t, s, "tensorrt_version")))
        return cells, skipped


def _check_opset(opset: int, exporter: str) -> None:
    from ..onnx.onnx_export import check_opset

    check_opset(opset, exporter)
