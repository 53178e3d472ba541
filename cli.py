"""The `vitedge` command line: a thin layer over the Python API (vitedge.export, parity, bench, package, matrix,
models, and the reparam engine).

Exit codes: 0 every executed parity hop passed; 1 a hop failed (artifacts quarantined, the report says
which and where); 2 bad usage or bad input (nothing written); 3 an internal error (a bug): one line, and the
traceback saved to a file (CRASH_DIR_ENV, else the system's temporary folder) to attach to a report.

Each subcommand is one `add_<name>(subparsers)` function that builds its parser and one `cmd_<name>(args)`
that runs it; register new subcommands in SUBCOMMANDS. Every subcommand also takes `-q/--quiet` (anywhere on
the line) and `--config FILE` (its options from a YAML / TOML / JSON file; flags on the command line win).

Length: one job, the command line: the parsers and printed outputs of seven subcommands, the config file that
stands for their flags and the exit-code policy, kept together so that shared flags are defined once.
"""
from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import sys
import warnings
from pathlib import Path

if __package__ in (None, ""):
    # `python cli.py ...` from the repo root: the root folder IS the package, so load it as `vitedge`.
    import importlib.util

    _root = os.path.dirname(os.path.abspath(__file__))
    # The root on sys.path would expose `models`, `tests`, ... as top-level packages: only `vitedge` is meant.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _root]
    if "vitedge" not in sys.modules:
        _spec = importlib.util.spec_from_file_location("vitedge", os.path.join(_root, "__init__.py"),
                                                       submodule_search_locations=[_root])
        _pkg = importlib.util.module_from_spec(_spec)
        sys.modules["vitedge"] = _pkg
        _spec.loader.exec_module(_pkg)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
ATTN_ORDERS = ("auto", "qk_first", "kv_first")
CRASH_DIR_ENV = "VITEDGE_CRASH_DIR"  # where an internal error's traceback is saved (default: the temp folder)


# ---- shared flag groups ---------------------------------------------------------------------------

def _kv(text: str) -> tuple[str, object]:
    """`key=value` with a Python-literal value (`depth=2`, `embed_dims=[48,56]`); non-literals stay strings."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value, got {text!r}")
    key, value = text.split("=", 1)
    try:
        return key.strip(), ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key.strip(), value


def _positive(cast: type, what: str):
    """An argparse type: `cast(text)`, which must be > 0."""
    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            v = None
        if v is None or not v > 0:
            raise argparse.ArgumentTypeError(f"expected a positive {what}, got {text!r}")
        return v
    return parse


_positive_int = _positive(int, "integer")
_positive_float = _positive(float, "number")


def _add_model_flags(p: argparse.ArgumentParser, required: bool = True, named: bool = False) -> None:
    p.add_argument("--model", required=required and not named,
                   help=("model name (see `vitedge models`); optional with a --checkpoint that names its model (a "
                         "transformers folder or hf-hub: repo with config.json, or timm:NAME)") if named else
                   "model name (see `vitedge models`)" if required else
                   "model name (default: the one the artifact's or deploy checkpoint's metadata names)")
    p.add_argument("--checkpoint", help="train-form checkpoint: a .pth/.safetensors file (official or timm "
                                        "layout), a transformers save_pretrained folder or its weight file, "
                                        "hf-hub:ORG/REPO[:FILE] or timm:NAME; without it, seeded trained-like demo "
                                        "weights are used and the report says weights: untrained")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--imgsz", type=_positive_int, help="input size (default: the model's)")
    p.add_argument("--attn-order", choices=ATTN_ORDERS, default=None,
                   help="SLA/SimA attention order for the export size (default auto: the FLOP rule)")


def _three(text: str):
    from vitedge.errors import VitedgeError
    from vitedge.models.preprocess import three  # torch-free

    try:
        return three(text, "R,G,B")
    except VitedgeError:
        raise argparse.ArgumentTypeError(f"expected three numbers R,G,B (e.g. 0.5,0.5,0.5), got {text!r}") from None


def _add_preprocess_flags(p: argparse.ArgumentParser) -> None:
    from vitedge.models.preprocess import INTERPOLATIONS  # torch-free

    g = p.add_argument_group("preprocessing", "the model's eval preprocessing (default: its official one, or a "
                                              "transformers checkpoint's preprocessor_config.json); used for --images, "
                                              "calibration and the bundle, recorded in report.json and the artifacts")
    g.add_argument("--crop-pct", type=_positive_float, metavar="F",
                   help="resize the shorter side to imgsz / F, then centre-crop imgsz (1.0: resize only)")
    g.add_argument("--interpolation", choices=tuple(INTERPOLATIONS), help="resize filter")
    g.add_argument("--mean", type=_three, metavar="R,G,B", help="per-channel mean of pixels scaled to [0, 1]")
    g.add_argument("--std", type=_three, metavar="R,G,B", help="per-channel std of pixels scaled to [0, 1]")


def _preprocess(args) -> dict:
    return {k: getattr(args, k) for k in ("crop_pct", "interpolation", "mean", "std") if getattr(args, k) is not None}


def _add_rewrites_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rewrites", type=_rewrites, default="all", metavar="all|none|NAME[,NAME]",
                   help="deploy-form speed rewrites beyond folding (default all; each exact; names per family "
                        "in the README), e.g. --rewrites none for the folded-only ablation")


def _rewrites(value: str):
    v = value.strip()
    if v == "all":
        return True
    if v == "none":
        return False
    names = [n.strip() for n in v.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give all, none or a comma list of rewrite names")
    return names


def _add_parity_flags(p: argparse.ArgumentParser) -> None:
    # Building the parser imports no torch, so `vitedge --help` and usage errors stay instant.
    p.add_argument("--samples", type=_positive_int, default=None,
                   help="parity inputs (default: 256, fewer for models over 2 GMACs by a fixed rule on GMACs, "
                        "reported as samples_rule)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE",
                   help="override a tolerance, e.g. --tol fp32.max_rel=2e-4 --tol fp16.psnr_db=30 (value none "
                        "disables a check); repeatable")
    p.add_argument("--require-verified", action="store_true",
                   help="exit 1 if any hop of a requested target is unverified (could not run here)")
    p.add_argument("--no-truth-cache", action="store_true",
                   help="compute the float64 ground truth again instead of reading it from the cache "
                        "(~/.cache/vitedge/truth, or $VITEDGE_CACHE_DIR/truth; keyed by weights, model code, inputs "
                        "and toolchain), and do not store it; also $VITEDGE_TRUTH_CACHE=off")
    p.add_argument("--require-ane", action="store_true",
                   help="coreml on macOS: fail the hop when under half of the model's estimated cost prefers the "
                        "Neural Engine (CoreML's compute plan); inconclusive where no Neural Engine exists")


def _add_inputs_flags(p: argparse.ArgumentParser, labels_extra: str = "") -> None:
    p.add_argument("--images", metavar="DIR",
                   help="judge on your own images: every jpg/png in DIR (flat, or DIR/<class>/<image>, which also "
                        "gives labels and top-1/top-5 accuracy per hop) plus 16 stress images, instead of the "
                        "default parity set")
    p.add_argument("--labels", metavar="FILE",
                   help="class names in index order, one per line: stored with the artifacts (ONNX metadata "
                        "vitedge.labels" + labels_extra + "); an ImageFolder --images maps each folder name to its "
                        "line (default: sorted folder order)")


def _add_exporter_flag(p: argparse.ArgumentParser, opset: bool = False, what: str = "") -> None:
    from vitedge.exporter.onnx_choice import DEFAULT_EXPORTER, DEFAULT_OPSET, DYNAMO_OPSET, EXPORTERS  # torch-free

    p.add_argument("--exporter", choices=EXPORTERS, default=None,
                   help=what or f"ONNX exporter (default {DEFAULT_EXPORTER}): torchscript (torch.onnx.export("
                                "dynamo=False)) or dynamo (the torch.export-based one); where dynamo cannot export "
                                "the model, TorchScript is used and the report says why (exporter_fallback)")
    if opset:
        p.add_argument("--opset", type=int, default=None,
                       help=f"ONNX opset (default {DEFAULT_OPSET} with torchscript, {DYNAMO_OPSET} with dynamo, which "
                            f"takes {DYNAMO_OPSET} or newer)")


def _exporter(args) -> dict:
    """The exporter keyword for the API: only when given (the API's own default otherwise)."""
    return {"exporter": args.exporter} if args.exporter else {}


def _overrides(args) -> dict:
    return dict(args.overrides)


def _samples(args) -> int | None:
    """--samples, or None: the API's default (the GMACs rule, exporter/parity_cost.py)."""
    return args.samples


# ---- models ---------------------------------------------------------------------------------------

def add_models(sub) -> None:
    p = sub.add_parser("models", help="list the model zoo: params, GMACs, sizes",
                       description="Every registered model: family, parameters, GMACs at its default size, default "
                                   "and accepted input sizes.")
    p.add_argument("--json", action="store_true",
                   help="print the rows as a JSON list (the fields of vitedge.models(): name, family, params, gmacs, "
                        "default_imgsz, accepted_sizes)")
    p.add_argument("--family", help="only this family's models (swiftformer, slab, sima, sima_deit)")
    p.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from vitedge.models.catalog import models

    table = models(args.family)
    if args.json:
        print(json.dumps(table, indent=2))
        return EXIT_OK
    rows = [("name", "family", "params", "GMACs", "imgsz", "accepted sizes")]
    rows += [(r["name"], r["family"], f"{r['params'] / 1e6:.2f} M", f"{r['gmacs']:.2f}", str(r["default_imgsz"]),
              r["accepted_sizes"]) for r in table]
    print(_table(rows))
    return EXIT_OK


# ---- export ---------------------------------------------------------------------------------------

def add_export(sub) -> None:
    from vitedge.precisions import NAMES as PRECISIONS  # torch-free, as are the rows
    from vitedge.targets import TARGETS, rows

    p = sub.add_parser("export", help="re-parameterize, export and check parity at every hop",
                       description="Export a model to ONNX (always: the hub graph) and the requested targets, "
                                   "with the parity ladder; writes OUT/NAME.onnx, other artifacts and OUT/report.json.")
    _add_model_flags(p, named=True)
    p.add_argument("--target", default="onnx", help=f"comma list of {','.join(TARGETS)} (default onnx)")
    p.add_argument("--batch", type=_positive_int, help="static batch size (default 1)")
    p.add_argument("--dynamic-batch", action="store_true",
                   help=f"dynamic batch axis ({', '.join(r.name for r in rows() if r.dynamic_batch)})")
    _add_exporter_flag(p, opset=True)
    p.add_argument("--precision", choices=PRECISIONS,
                   help=f"default per target: {', '.join(f'{r.name} {r.default_precision}' for r in rows())}; given, "
                        "it applies to every listed target that supports it: " + ", ".join(
                            f"{r.name} {'|'.join(r.precisions)}" + (f" {r.precision_help}" if r.precision_help else "")
                            for r in rows()))
    p.add_argument("--calib", type=int, default=None, metavar="N",
                   help="--precision int8 | w8a8: calibration images (default 64), never among the judged ones")
    p.add_argument("--calib-images", metavar="DIR",
                   help="--precision int8 | w8a8: calibrate on N images of DIR (default: views of shipped photos "
                        "that the compressed hops are not judged on)")
    p.add_argument("--out", help="output folder (default runs/NAME)")
    p.add_argument("--no-reparam", action="store_true", help="export the train-form as is (no folding)")
    _add_rewrites_flag(p)
    p.add_argument("--strict-schedule", action="store_true",
                   help="error (instead of warn) on a checkpoint whose LN->RepBN schedule had not finished")
    p.add_argument("--force", action="store_true", help="replace an output folder that already holds artifacts "
                   "(only files vitedge wrote there: a folder holding others is refused, naming them)")
    p.add_argument("--clean", action="store_true", help="with --force: also delete files vitedge did not write")
    _add_parity_flags(p)
    _add_inputs_flags(p, "; coreml: a classifier")
    _add_preprocess_flags(p)
    for r in rows():  # each target's own flags, as its row declares them
        if r.options:
            g = p.add_argument_group(r.name)
            for o in r.options:
                g.add_argument(o.flag, type=o.type, choices=o.choices, default=o.default, metavar=o.metavar,
                               dest=o.key, help=o.help)
    p.set_defaults(func=cmd_export)


def target_options() -> tuple[str, ...]:
    """The dests of every target's own flags (handed to export as `options`)."""
    from vitedge.targets import rows

    return tuple(dict.fromkeys(o.key for r in rows() for o in r.options))


def cmd_export(args) -> int:
    from vitedge.exporter.pipeline import export

    report = export(args.model, args.target, checkpoint=args.checkpoint, imgsz=args.imgsz, batch=args.batch,
                    dynamic_batch=args.dynamic_batch, opset=args.opset, precision=args.precision,
                    out=args.out, reparam=not args.no_reparam, force=args.force, clean=args.clean,
                    attn_order=args.attn_order or "auto", strict_schedule=args.strict_schedule,
                    samples=_samples(args), tolerances=args.tol, require_verified=args.require_verified,
                    overrides=_overrides(args), options={k: getattr(args, k, None) for k in target_options()},
                    progress=args.progress, rewrites=args.rewrites, require_ane=args.require_ane,
                    images=args.images, labels=args.labels, calib=args.calib, calib_images=args.calib_images,
                    truth_cache=not args.no_truth_cache, preprocess=_preprocess(args), **_exporter(args))
    print(format_summary(report, os.path.join(report.out_dir, "report.json")))
    return report.exit_code


# ---- parity ---------------------------------------------------------------------------------------

def add_parity(sub) -> None:
    from vitedge.precisions import NAMES

    p = sub.add_parser("parity", help="run the parity ladder on an existing artifact",
                       description="Compare an existing artifact (and/or a deploy-form checkpoint) with the "
                                   "train-form on the parity input set. The artifact's metadata names the model, "
                                   "size, overrides, checkpoint hash and ONNX exporter it was made with.")
    _add_model_flags(p, required=False)
    p.add_argument("--artifact", help="artifact to check (.onnx, .mlpackage, .engine)")
    p.add_argument("--deploy-checkpoint", help="deploy-form checkpoint from `vitedge reparam` to check as the "
                                               "deploy-form hop")
    p.add_argument("--target", help="the artifact's target when its suffix does not tell")
    p.add_argument("--precision", choices=NAMES, help="tolerance profile for the artifact "
                                                           "(default: read from the artifact)")
    p.add_argument("--report", help="write report.json here")
    p.add_argument("--mode", choices=("device", "emulated"),
                   help="insist on how the artifact runs (device: the target's own runtime, e.g. CoreML on macOS); "
                        "otherwise the hop is unverified")
    _add_exporter_flag(p, what="the ONNX exporter the artifact was written with, recorded in the report where its "
                               "metadata does not say (one that contradicts the metadata is an error)")
    _add_parity_flags(p)
    _add_inputs_flags(p)
    p.set_defaults(func=cmd_parity)


def cmd_parity(args) -> int:
    from vitedge.exporter.verify import parity

    report = parity(args.model, args.artifact, checkpoint=args.checkpoint, deploy_checkpoint=args.deploy_checkpoint,
                    target=args.target, imgsz=args.imgsz, precision=args.precision, attn_order=args.attn_order,
                    samples=_samples(args), tolerances=args.tol, require_verified=args.require_verified,
                    overrides=_overrides(args) or None, report_path=args.report, mode=args.mode,
                    progress=args.progress, require_ane=args.require_ane, images=args.images, labels=args.labels,
                    truth_cache=not args.no_truth_cache, **_exporter(args))
    print(format_summary(report, args.report))
    return report.exit_code


# ---- reparam --------------------------------------------------------------------------------------

def add_reparam(sub) -> None:
    p = sub.add_parser("reparam", help="write a deploy-form checkpoint (folded, verified in float64)")
    _add_model_flags(p)
    p.add_argument("--out", required=True, help="deploy-form checkpoint to write (.pth)")
    _add_rewrites_flag(p)
    p.add_argument("--strict-schedule", action="store_true",
                   help="error (instead of warn) on a checkpoint whose LN->RepBN schedule had not finished")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(func=cmd_reparam)


def cmd_reparam(args) -> int:
    from vitedge.exporter.deploy_checkpoint import reparam_checkpoint

    result = reparam_checkpoint(args.model, args.out, checkpoint=args.checkpoint, imgsz=args.imgsz,
                                attn_order=args.attn_order or "auto", strict_schedule=args.strict_schedule,
                                overrides=_overrides(args), force=args.force, progress=args.progress,
                                rewrites=args.rewrites)
    eq, s = result.equivalence, result.summary
    if not eq.passed:
        print(f"FAILED: re-parameterization changed the function: first diverging block {eq.diverging_module} "
              f"({eq.describe()}); nothing written")
        return EXIT_FAILED
    folded = ", ".join(f"{k} {v}" for k, v in sorted(s.folded.items())) or "nothing"
    orders = list(s.attention_order.values())
    print(f"{result.model} @ {result.imgsz}: folded {folded}; {len(s.unfolded)} unfolded; attention "
          f"{orders.count('qk_first')} qk_first, {orders.count('kv_first')} kv_first; weights: {result.weights}")
    print(f"equivalence gate (float64) passed: logits max|diff| {eq.max_abs:.2e} (allowance {eq.allowed:.2e}: "
          f"max({eq.rtol:.0e}*max|y|, {eq.k64:g} x float64's estimated own rounding))")
    print(f"wrote {result.path} (load it with vitedge.load_deploy_checkpoint)")
    return EXIT_OK


# ---- the summary table ----------------------------------------------------------------------------

def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


def _accuracy(sets: dict, key: str) -> str:
    """A hop's accuracy over its labelled samples (only a labelled --images set carries labels) beside the float64
    train-form's on exactly the same samples: "hop / reference"."""
    d = next((d for d in sets.values() if d.get(key) is not None), None)
    if d is None:
        return "-"
    ref = d.get(f"reference_{key}")
    return _fmt(d[key], ".1%") + (f" / {ref:.1%}" if ref is not None else "")


def _reference_line(ref: dict) -> str:
    parts = [f"{k} median {d['reference_noise_median']:.1e} max {d['reference_noise']:.1e}"
             for k, d in ref.get("sets", {}).items()]
    line = (f"reference: train-form float32 vs float64 ({ref.get('float32_threads')} threads), noise per set: "
            + "; ".join(parts))
    if ref.get("top1_accuracy") is not None:
        line += f"; accuracy (float64) top-1 {ref['top1_accuracy']:.1%}, top-5 {ref['top5_accuracy']:.1%}"
    return line


def format_summary(report, report_path: str | None = None) -> str:
    from vitedge.exporter.classes import describe
    from vitedge.exporter.onnx_export import norm_nodes

    lines = [f"{report.model}  imgsz {report.imgsz}  batch {report.batch or 'dynamic'}  weights: {report.weights}"
             + (" (seeded trained-like demo weights)" if report.weights == "untrained" else "")]
    r = report.reparam
    if r.folded or r.attention_order:
        orders = list(r.attention_order.values())
        lines.append(f"re-parameterization: folded {sum(r.folded.values())} ({', '.join(f'{k} {v}' for k, v in r.folded.items())}); "
                     f"unfolded {len(r.unfolded)}; attention: {orders.count('qk_first')} qk_first, "
                     f"{orders.count('kv_first')} kv_first; rewrites: {', '.join(r.rewrites) or 'none'}")
    if report.exporter:
        lines.append(f"ONNX exporter: {report.exporter}" + (f" (opset {report.opset})" if report.opset else "")
                     + (f"; dynamo could not export it: {report.exporter_fallback}" if report.exporter_fallback
                        else ""))
    ref = report.reference
    if ref:
        lines.append(_reference_line(ref))
    # per input set: the worst sample's error / allowance (<= 1 passes); with labels, accuracy on labelled images
    sets = [k for k in ("natural", "user", "stress") if any(k in (h.sets or {}) for h in report.parity)]
    labelled = bool(ref and ref.get("top1_accuracy") is not None)
    probed = any(h.probe for h in report.parity)
    weighed = any(h.weights for h in report.parity)
    rows = [("hop", "status", "mode", *(f"ratio {k}" for k in sets), *(("probe",) if probed else ()),
             *(("weights",) if weighed else ()), "max_rel",
             "cosine", "PSNR dB", "top-1", "top-5", *(("acc@1 hop / ref", "acc@5 hop / ref") if labelled else ()),
             "backend")]
    for h in report.parity:
        m, hs = h.metrics, h.sets or {}
        acc = [_accuracy(hs, k) for k in ("top1_accuracy", "top5_accuracy")] if labelled else []
        rows.append((h.hop, h.status, h.mode or "-", *(_fmt(hs.get(k, {}).get("noise_ratio"), ".2f") for k in sets),
                     *(((h.probe or {}).get("status", "-"),) if probed else ()),
                     *(((h.weights or {}).get("status", "-"),) if weighed else ()),
                     _fmt(m and m.max_rel, ".2e"), _fmt(m and m.cosine, ".6f"), _fmt(m and m.psnr_db, ".1f"),
                     _fmt(m and m.top1_agreement, ".1%"), _fmt(m and m.top5_agreement, ".1%"), *acc, h.backend))
    lines += ["", _table(rows)]
    if sets:
        lines.append("(vs the train-form in float64; ratio = worst sample's error / its allowance max(floor, K x "
                     "float32 noise), <= 1 passes" + ("; probe = the backbone's last feature map, judged alike"
                                                       if probed else "")
                     + ("; weights = the stored weights against the deploy-form's, per channel" if weighed else "")
                     + ("; acc = top-k accuracy on the labelled images the hop ran, beside the float64 train-form's "
                        "on the same images" if labelled else "") + ")")
    notes = [f"  {h.hop}: {h.status}: {h.reason}" for h in report.parity if h.reason]
    notes += [f"  {h.hop}: feature probe not run: {h.probe.get('why')}" for h in report.parity
              if (h.probe or {}).get("status") == "not run" and h.status == "passed"]
    notes += [f"  {h.hop}: weights check not run: {h.weights.get('why')}" for h in report.parity
              if (h.weights or {}).get("status") == "not run" and h.status == "passed"]
    notes += [f"  {h.hop}: Neural Engine residency {h.ane_residency['status'].upper()}: {h.ane_residency['reason']}"
              for h in report.parity if h.ane_residency]
    notes += [f"  {h.hop}: top-1 on the first parity inputs: {describe(h.predictions)}"
              for h in report.parity if h.predictions]
    if notes:
        lines += [""] + notes
    if report.artifacts:
        lines.append("")
        width = max(12, *(len(k) for k in report.artifacts))
        for key, a in report.artifacts.items():
            where = os.path.join(report.out_dir, a.path) if report.out_dir else a.path
            extra = ""
            if a.nodes is not None:
                extra = f"  {sum(a.nodes.values())} nodes, {norm_nodes(a.nodes)} normalization"
            elif "outside_delegate" in (a.info or {}):  # an ExecuTorch program: what its delegate left out
                left = a.info["outside_delegate"]
                extra = (f"  {a.info.get('backend')}: every op delegated" if a.info.get("fully_delegated") else
                         f"  {a.info.get('backend')}: outside the delegate: "
                         f"{', '.join(f'{k} x{v}' for k, v in left.items()) or 'every op (no delegate)'}")
            lines.append(f"  {key:<{width}} {a.precision:<5} {_size(a.bytes):>9}  sha256 {a.sha256[:12]}  {where}{extra}")
    unverified = [h.hop for h in report.unverified_hops()]
    lines.append("")
    if report.failed_hops():
        bad = report.failed_hops()[0]
        where = f" (diverging module: {bad.diverging_module})" if bad.diverging_module else ""
        q = f"; artifacts quarantined in {os.path.join(report.out_dir, report.quarantine)}" if report.quarantine else ""
        lines.append(f"FAILED: {', '.join(h.hop for h in report.failed_hops())}{where}{q}")
    elif report.exit_code:
        undecided = unverified + [f"{h.hop} (--require-ane inconclusive)" for h in report.inconclusive_checks()]
        lines.append(f"FAILED: --require-verified and unverified hops: {', '.join(undecided)}")
    else:
        lines.append("PASSED: every executed hop is within tolerance"
                     + (f"; UNVERIFIED (not counted as passed): {', '.join(unverified)}" if unverified else ""))
    if report_path:
        lines[-1] += f"   report: {report_path}"
    return "\n".join(lines)


# ---- bench ----------------------------------------------------------------------------------------

BENCH_DEFAULT = ("torch", "torch-deploy", "onnxruntime")


def bench_backends() -> tuple[str, ...]:
    """torch's two forms and every target row's bench name (validated again in exporter.bench)."""
    from vitedge.targets import rows

    return ("torch", "torch-deploy") + tuple(r.bench for r in rows() if r.bench)


def add_bench(sub) -> None:
    from vitedge.targets.coreml.options import INPUT_KINDS  # torch-free

    BACKENDS, DEFAULT_BACKENDS = bench_backends(), BENCH_DEFAULT  # no torch import while building the parser
    p = sub.add_parser("bench", help="latency per backend and size (or of an existing artifact): paired, "
                                     "parity-checked, regression gate",
                       description="Time a model's train-form, deploy-form and exports (--model), or an existing "
                                   ".onnx / .engine / .mlpackage (--artifact). Exit codes: 0 measured (and no "
                                   "regression), 1 a p50 regression beyond --max-regression against --baseline or a "
                                   "failed golden-vector parity on the phone (--device) or, with --fail-on-parity, a failed "
                                   "or unrun parity check, 2 bad usage or input.")
    p.add_argument("--model", help="model name (see `vitedge models`); with --artifact, a check of the model its "
                                   "metadata names")
    p.add_argument("--artifact", metavar="PATH",
                   help="time this existing artifact instead of exporting: .onnx (ONNX Runtime, per --providers), "
                        ".engine (TensorRT), .mlpackage (CoreML on macOS; --device iphone); parity runs first when "
                        "its vitedge metadata names the model")
    p.add_argument("--providers", metavar="EP[,EP]",
                   help="--artifact .onnx: ONNX Runtime execution providers to time it on, e.g. cpu,cuda,tensorrt,"
                        "coreml,openvino,dml (default cpu); one this onnxruntime build lacks is listed unavailable "
                        "with the reason")
    p.add_argument("--checkpoint", help="train-form checkpoint (default: seeded trained-like demo weights)")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names; repeatable")
    p.add_argument("--backends", default=None,
                   help=f"comma list of {','.join(BACKENDS)} (default {','.join(DEFAULT_BACKENDS)})")
    p.add_argument("--imgsz", default=None, help="comma list of input sizes (default: the model's; with --artifact, "
                                                 "one size for a graph whose input size is symbolic)")
    p.add_argument("--batch", type=_positive_int, default=None,
                   help="batch size (default 1; with --artifact, its static batch)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0 = all cores; default 1)")
    _add_rewrites_flag(p)
    _add_exporter_flag(p)
    p.add_argument("--ort-spinning", choices=("default", "on", "off"), default="default",
                   help="ONNX Runtime intra-op spinning with --threads 0 or > 1 (off: steadier on small shared "
                        "or virtual machines; default: ONNX Runtime's, on)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="time-based warm-up per size (s)")
    p.add_argument("--min-iters", type=_positive_int, default=50, help="at least this many timed runs")
    p.add_argument("--max-s", type=float, default=5.0, help="time budget per size once --min-iters is met (s)")
    p.add_argument("--attn-order", choices=ATTN_ORDERS, default="auto")
    p.add_argument("--order", choices=("auto", "measured"), default="auto",
                   help="measured: time both SLA/SimA attention orders per size and report the faster")
    p.add_argument("--device", help="iphone or iphone:NAME: also time load and predict on a tethered iPhone and run "
                                    "the golden vectors there (macOS, Xcode, a developer-mode iPhone, --team-id)")
    p.add_argument("--team-id", help="Apple Developer Team ID that signs coremltools' model-runner app for the phone "
                                     "(default: $VITEDGE_TEAM_ID)")
    p.add_argument("--input", choices=INPUT_KINDS, default=None,
                   help="--device iphone: the phone's package input (image: RGB pixels, normalization built in)")
    _add_inputs_flags(p, "; with --device iphone the phone's package is a classifier")
    p.add_argument("--report", help="write the JSON report here")
    p.add_argument("--plot", help="write a PNG plot (latency vs size per backend, CI bars) here (needs "
                                  "vitedge[plot])")
    p.add_argument("--baseline", help="an earlier --report JSON to gate p50 regressions against")
    p.add_argument("--max-regression", type=float, help="allowed p50 slow-down in percent (with --baseline)")
    p.add_argument("--fail-on-parity", action="store_true",
                   help="exit 1 when a backend's parity check failed or, with --artifact, could not run (default: "
                        "such a backend is reported failed and not timed, and the exit code reflects regressions "
                        "only)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    from vitedge.exporter.bench_api import bench
    from vitedge.exporter.bench_report import format_table

    report = bench(args.model, artifact=args.artifact, providers=args.providers, checkpoint=args.checkpoint,
                   backends=args.backends, imgsz=args.imgsz, batch=args.batch, threads=args.threads,
                   warmup_s=args.warmup_s, min_iters=args.min_iters, max_s=args.max_s, baseline=args.baseline,
                   max_regression=args.max_regression, order=args.order, attn_order=args.attn_order,
                   overrides=_overrides(args), rewrites=args.rewrites,
                   ort_spinning={"default": None, "on": True, "off": False}[args.ort_spinning],
                   exporter=args.exporter, device=args.device, team_id=args.team_id, input=args.input,
                   labels=args.labels, images=args.images, report_path=args.report, plot=args.plot,
                   log=(lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr)))
    print(format_table(report))
    if args.fail_on_parity:
        unchecked = _parity_not_passed(report)
        if unchecked:
            print(f"FAILED (--fail-on-parity): {'; '.join(unchecked)}")
            return max(report.exit_code, 1)
    return report.exit_code


def _parity_not_passed(report) -> list[str]:
    """What --fail-on-parity fails on: a backend whose parity failed, or an artifact whose parity could not run."""
    out = [f"{r.backend}: {r.reason}" for r in report.results if r.status == "failed"]
    art = getattr(report, "artifact", None) or {}
    if art.get("parity") == "not run":
        out.append(f"parity not run: {art.get('parity_reason')}")
    return out


# ---- package --------------------------------------------------------------------------------------

def add_package(sub) -> None:
    from vitedge.precisions import NAMES
    from vitedge.targets.coreml.options import DEFAULT_IOS, IOS_TARGETS

    p = sub.add_parser("package", help="app-ready bundle (.zip): CoreML for iOS (image-input .mlpackage, Swift "
                                       "README) or ExecuTorch for Android (.pte, Kotlin README); golden vectors, manifest",
                       description="Export to CoreML (image input; classifier with --labels) or ExecuTorch, run the "
                                   "parity ladder and write a deterministic BUNDLE.zip. Exit 1 (nothing written) if a "
                                   "hop fails.")
    p.add_argument("--target", choices=("coreml", "executorch"), default="coreml",
                   help="coreml (default: iOS) or executorch (Android, and iOS through ExecuTorch)")
    p.add_argument("--model", help="model name (see `vitedge models`); optional with a --checkpoint that names its "
                                   "model (a transformers folder or hf-hub: repo with config.json, or timm:NAME)")
    p.add_argument("--checkpoint", help="train-form checkpoint (as for export); without it the bundle holds seeded "
                                        "demo weights (untrained, said in the manifest and README)")
    _add_inputs_flags(p, "; the model becomes a classifier and the bundle holds labels.txt")
    _add_preprocess_flags(p)
    p.add_argument("--ios", type=int, choices=IOS_TARGETS, default=None,
                   help=f"minimum deployment target (default {DEFAULT_IOS}; 17 with --precision w8a8)")
    p.add_argument("--precision", choices=NAMES, default=None,
                   help="coreml: fp16 (default) or a compressed kind: w8, palette4, palette6, w8a8 (iOS 17+); "
                        "executorch: fp32 (default) or int8")
    p.add_argument("--calib", type=int, default=None, metavar="N", help="--precision w8a8: calibration images "
                                                                       "(default 64)")
    p.add_argument("--calib-images", metavar="DIR", help="--precision w8a8: calibrate on images of DIR")
    p.add_argument("--imgsz", type=int, help="input size (default: the model's)")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--samples", type=_positive_int, help="parity inputs for the ladder (default: as for export)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE", help="tolerance override")
    p.add_argument("--out", required=True, help="the bundle to write (BUNDLE.zip)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    _add_exporter_flag(p, what="ONNX exporter of the parity ladder's hub graph (the CoreML package itself is "
                               "converted from the deploy-form); default and fallback as for export")
    p.set_defaults(func=cmd_package)


def cmd_package(args) -> int:
    common = dict(checkpoint=args.checkpoint, labels=args.labels, imgsz=args.imgsz, samples=args.samples,
                  overrides=_overrides(args), tolerances=args.tol or None, force=args.force, progress=args.progress,
                  calib=args.calib, calib_images=args.calib_images, images=args.images, preprocess=_preprocess(args),
                  **_exporter(args))
    from vitedge.exporter.package import package

    res = package(args.model, args.out, ios=args.ios, precision=args.precision, target=args.target, **common)
    if res.exit_code != 0:
        print(f"FAILED: {res.reason}; no bundle written. The export is kept in {res.export_dir}")
        return res.exit_code
    hop = res.report.hop(res.hop)
    demo = " (DEMO: untrained seeded weights)" if res.manifest["weights"] == "untrained" else ""
    m = hop.metrics
    print(f"{res.manifest['model']} @ {res.manifest['imgsz']}{demo}: {res.hop} hop {hop.status} ({hop.mode}, "
          f"{hop.samples} samples, cosine {m.cosine:.6f}, PSNR {m.psnr_db:.1f} dB); golden vectors "
          f"{'passed' if res.manifest['golden']['verified']['passed'] else 'FAILED'}")
    print(f"wrote {res.path} ({res.path.stat().st_size / 1e6:.2f} MB, {len(res.manifest['files']) + 1} files)")
    return EXIT_OK


# ---- matrix ---------------------------------------------------------------------------------------

def add_matrix(sub) -> None:
    p = sub.add_parser("matrix", help="export a plan of models x sizes x targets x precisions (cached; local "
                                      "pool or Ray)",
                       description="Run every cell of PLAN (YAML or TOML) through the export pipeline into "
                                   "OUT/<model>/<imgsz>/<target>-<precision>/, reusing cached cells; writes "
                                   "OUT/matrix.json and OUT/matrix.md. Exit codes: 0 every executed cell passed, "
                                   "1 a cell failed or crashed (or is unverified, with --require-verified), "
                                   "2 bad plan or usage (nothing written).")
    p.add_argument("plan", nargs="?", help="plan file (.yaml, .yml, .toml or .json); not needed with --verify-cache")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--workers", type=_positive_int,
                   help="local pool processes (default from the cores; intra-op threads = cores // workers); with "
                        "--ray: most cells in flight")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="run cells as Ray tasks: a new local Ray instance, or the cluster at ADDRESS "
                        "(pip install 'vitedge[ray]')")
    p.add_argument("--rebuild", action="store_true", help="ignore the cache: build every cell again")
    p.add_argument("--dry-run", action="store_true", help="list the cells and which the cache holds; run nothing")
    p.add_argument("--bench", action="store_true", help="time each passed cell's artifact on its own runtime")
    p.add_argument("--cache", help="cache folder (default OUT/.cache); may be a shared path for CI runs and drivers")
    p.add_argument("--resource-timeout", type=_positive_float, default=300.0, metavar="S",
                   help="with --ray: how long a cell waits for a node with its resources (GPU, sm_XY, macos) "
                        "before it is reported unverified (default 300)")
    p.add_argument("--require-verified", action="store_true", help="exit 1 if any cell is unverified; a cached "
                   "cell whose artifacts do not match their report is failed instead of rebuilt")
    p.add_argument("--verify-cache", action="store_true",
                   help="re-hash every cached cell's artifacts against its report and build nothing: one line per "
                        "entry, exit 1 if any cannot be trusted (the cache is --cache, default OUT/.cache)")
    _add_exporter_flag(p, what="ONNX exporter of the cells whose plan entry (or defaults) names none (plan key "
                               "`exporter`); default and fallback as for export")
    p.set_defaults(func=cmd_matrix)


def cmd_matrix(args) -> int:
    from vitedge.errors import VitedgeError
    from vitedge.exporter.matrix import matrix
    from vitedge.exporter.matrix.results import format_dry_run, format_summary

    if args.verify_cache:
        return _verify_cache(args)
    if args.plan is None:
        raise VitedgeError("vitedge matrix needs a PLAN file; give one (or --verify-cache to check the cache)")
    result = matrix(args.plan, out=args.out, workers=args.workers, ray=args.ray, rebuild=args.rebuild,
                    dry_run=args.dry_run, bench=args.bench, cache=args.cache, resource_timeout=args.resource_timeout,
                    require_verified=args.require_verified, progress=not args.quiet, exporter=args.exporter)
    print(format_dry_run(result) if args.dry_run else format_summary(result))
    return result.exit_code


def _verify_cache(args) -> int:
    from vitedge.errors import VitedgeError
    from vitedge.exporter.matrix.cache import Cache

    root = Path(args.cache) if args.cache else Path(args.out) / ".cache"
    if not root.is_dir():
        raise VitedgeError(f"no matrix cache at {root}; give the cache folder with --cache (or the matrix's --out)")
    checked = Cache(root).verify()
    bad = [(k, why) for k, why in checked if why]
    for key, why in checked:
        print(f"{key[:16]}  {'UNTRUSTED: ' + why if why else 'ok'}")
    print(f"{len(checked)} cache entries checked in {root}: {len(checked) - len(bad)} ok, {len(bad)} cannot be trusted"
          + (" (a matrix run rebuilds them; --require-verified fails them)" if bad else ""))
    return 1 if bad else 0


# ---- entry point ----------------------------------------------------------------------------------

SUBCOMMANDS = [add_models, add_export, add_parity, add_reparam, add_bench, add_package, add_matrix]


def _add_global_flags(p: argparse.ArgumentParser, main: bool = False) -> None:
    """-q and --config, on the main parser and on every subcommand, so both work anywhere on the line. On a
    subcommand their default is SUPPRESS: a flag given before the subcommand is not reset by the subparser."""
    default = {} if main else {"default": argparse.SUPPRESS}
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines", **default)
    p.add_argument("--config", metavar="FILE", help="read this command's options from a YAML (or .toml / .json) "
                                                    "file: keys are the flag names (attn_order or attn-order); "
                                                    "flags on the command line win", **default)


class _Parser(argparse.ArgumentParser):
    """argparse with vitedge's one-line errors: the problem and where the flags are listed, not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}; run `{self.prog} --help` for the flags\n")


def build_parser() -> argparse.ArgumentParser:
    from vitedge import __version__

    parser = _Parser(prog="vitedge", description="Re-parameterize, export and verify efficient "
                                     "vision transformers (SwiftFormer, SLAB, SimA). Exit codes: 0 passed, "
                                     "1 a parity hop failed, 2 bad usage or input, 3 internal error (a bug: the "
                                     "traceback is saved to a file to report).")
    parser.add_argument("--version", action="version", version=f"vitedge {__version__}")
    _add_global_flags(parser, main=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)
    for add in SUBCOMMANDS:
        add(sub)
    for p in sub.choices.values():
        _add_global_flags(p)
    return parser


# ---- --config FILE: a command's options from a file ------------------------------------------------

# Python API keyword names accepted beside the flag names, where the two differ (e.g. export(targets=...)).
CONFIG_ALIASES = {"targets": "target", "tolerances": "tol", "report_path": "report"}
_NOT_CONFIG = ("help", "config", "version")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def _config_path(argv: list[str]) -> tuple[str | None, str | None]:
    """(the --config path, the subcommand) read from the raw command line (--config may be abbreviated, as
    argparse allows: --conf)."""
    path = command = None
    it = iter(argv)
    for tok in it:
        flag, eq, value = tok.partition("=")
        if len(flag) >= 5 and "--config".startswith(flag):
            path = value if eq else next(it, None)
        elif command is None and not tok.startswith("-"):
            command = tok
    return path, command


def _read_config(path: str) -> dict:
    from vitedge.errors import VitedgeError

    p = os.path.expanduser(path)
    try:
        with open(p) as f:
            text = f.read()
    except OSError as e:
        raise VitedgeError(f"--config {path}: cannot read it ({e.strerror or e}); check the path") from None
    try:
        if p.endswith(".toml"):
            try:
                import tomllib
            except ImportError:  # Python 3.10
                import tomli as tomllib
            doc = tomllib.loads(text)
        elif p.endswith(".json"):
            doc = json.loads(text)
        else:
            import yaml

            doc = yaml.safe_load(text)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise VitedgeError(f"--config {path} does not parse ({type(e).__name__}: {first}); fix its syntax") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise VitedgeError(f"--config {path} must be a mapping of option names to values (e.g. `model: "
                           "swiftformer_xs`)")
    return doc


def _config_keys(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every key a config may use for this command -> its flag: the long flag with underscores, its dest, and the
    Python API's name where it differs."""
    keys = {}
    for a in p._actions:
        if not a.option_strings or a.dest in _NOT_CONFIG:
            continue
        long = next((o for o in a.option_strings if o.startswith("--")), a.option_strings[0])
        keys[long.lstrip("-").replace("-", "_")] = a
        keys.setdefault(a.dest, a)
    for alias, key in CONFIG_ALIASES.items():
        if key in keys:
            keys.setdefault(alias, keys[key])
    return keys


def _config_value(a: argparse.Action, value, where: str):
    """A config value as argparse would have parsed it from the flag (same type checks and choices)."""
    from vitedge.errors import VitedgeError

    flag = a.option_strings[-1]

    def parse(text: str):
        try:
            v = a.type(text) if a.type else text
        except (argparse.ArgumentTypeError, ValueError, TypeError) as e:
            raise VitedgeError(f"{where}: {e} (as {flag} takes it)") from None
        if a.choices is not None and v not in a.choices:
            raise VitedgeError(f"{where}: {value!r} is not one of {', '.join(map(str, a.choices))}")
        return v

    if isinstance(a, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise VitedgeError(f"{where} is a switch ({flag}): give true or false; got {value!r}")
        return value
    if isinstance(a, argparse._AppendAction):  # repeatable flags: a YAML list (or one value), or a mapping
        if isinstance(value, dict):
            if a.type is _kv:  # --set: {depth: 2, embed_dims: [16, 24]}
                return list(value.items())
            # --tol: {fp16: {psnr_db: 30}} or {fp16.psnr_db: 30}
            value = [f"{k}.{kk}={_text(vv)}" if isinstance(d, dict) else f"{k}={_text(d)}"
                     for k, d in value.items() for kk, vv in (d.items() if isinstance(d, dict) else [(None, d)])]
        items = value if isinstance(value, list) else [value]
        if any(isinstance(v, (list, dict)) for v in items):
            raise VitedgeError(f"{where}: give a list of values ({flag} VALUE, repeated); got {value!r}")
        return [parse(_text(v)) for v in items]
    if a.nargs == "?" and a.const is not None and value is True:  # `--ray` alone
        return a.const
    if isinstance(value, bool):
        if a.type is _rewrites:
            return value
        raise VitedgeError(f"{where} takes a value ({flag} VALUE), not {str(value).lower()}")
    if isinstance(value, list):
        value = ",".join(_text(v) for v in value)  # comma-list flags (--target, --imgsz, --backends, ...)
    if isinstance(value, dict):
        raise VitedgeError(f"{where}: {value!r} is not a value {flag} takes")
    return parse(_text(value))


def _text(v) -> str:
    """A YAML scalar as it would be typed on the command line (null: none)."""
    return "none" if v is None else str(v)


def apply_config(parser: argparse.ArgumentParser, argv: list[str]) -> str | None:
    """Make the options of `--config FILE` the defaults of the command named in `argv`, so that flags given on
    the command line win (a repeatable flag's command-line items come after the file's). Raises VitedgeError
    (exit 2) naming an unknown key or a bad value. Returns the path applied (None without --config)."""
    from vitedge.errors import VitedgeError

    path, command = _config_path(argv)
    subs = _subparsers(parser)
    if path is None or command not in subs:
        return path  # no config, or no command: argparse says what is missing
    p, doc = subs[command], _read_config(path)
    keys, defaults = _config_keys(p), {}
    for key, value in doc.items():
        name = str(key).replace("-", "_")
        if name not in keys:
            close = difflib.get_close_matches(name, list(keys), n=1)
            did = f" (did you mean {close[0]!r}?)" if close else ""
            flags = sorted(k for k, act in keys.items() if f"--{k.replace('_', '-')}" in act.option_strings)
            raise VitedgeError(f"--config {path}: unknown key {key!r} for `vitedge {command}`{did}; keys are the "
                               f"command's flag names: {', '.join(flags)}")
        if value is None:
            continue
        a = keys[name]
        if a.dest in defaults:
            raise VitedgeError(f"--config {path}: {key!r} and another key both set {a.option_strings[-1]}; keep one")
        defaults[a.dest] = _config_value(a, value, f"--config {path}: {key}")
        a.required = False
    p.set_defaults(**defaults)
    return path


# ---- entry point ----------------------------------------------------------------------------------

def _one_line_warnings(message, category, filename, lineno, file=None, line=None):
    print(f"vitedge: warning: {message}", file=sys.stderr)


def _crash(e: BaseException, argv: list[str]) -> int:
    """Exit 3: one line on stderr, the traceback (with the command and versions) saved to a file to report."""
    import platform
    import shlex
    import tempfile
    import time
    import traceback

    from vitedge import __version__

    first = (str(e).strip().splitlines() or [""])[0][:300]
    text = (f"vitedge {__version__}: internal error\ncommand: vitedge {shlex.join(argv)}\n"
            f"python {platform.python_version()} on {platform.platform()}\n")
    try:
        from vitedge.exporter.report import versions

        text += f"versions: {json.dumps(versions(), sort_keys=True)}\n"
    except Exception:  # noqa: BLE001  (the crash report must not crash)
        pass
    text += "\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__))
    folder = os.environ.get(CRASH_DIR_ENV) or tempfile.gettempdir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"vitedge-crash-{time.strftime('%Y%m%d-%H%M%S')}-", suffix=".txt",
                                    dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        where = f"traceback saved to {path}"
    except OSError as w:
        where = f"the traceback could not be saved ({w}; rerun with VITEDGE_DEBUG=1 to see it)"
    print(f"vitedge: internal error: {type(e).__name__}: {first}; {where}. This is a bug in vitedge: please report "
          "it with that file.", file=sys.stderr)
    return EXIT_INTERNAL


def _run(argv: list[str]) -> int:
    from vitedge.errors import VitedgeError

    parser = build_parser()
    applied = apply_config(parser, argv)
    args = parser.parse_args(argv)  # bad usage: argparse prints it and exits 2
    if getattr(args, "config", None) != applied:
        raise VitedgeError("give --config once, as --config FILE")
    from vitedge.exporter.progress import Progress

    args.progress = Progress(enabled=not args.quiet)
    warnings.showwarning = _one_line_warnings
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 passed, 1 a hop failed (or a regression, or a matrix cell failed), 2 bad usage or input,
    3 an internal error (its traceback saved to a file), 130 interrupted."""
    from vitedge.errors import VitedgeError
    from vitedge.exporter.allocator import keep_freed_memory

    keep_freed_memory()  # this process is vitedge's own: freed activations are reused, not page-faulted back
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return _run(argv)
        except Exception as e:  # a Ctrl-C a library turned into another error (an import's "initialization
            from vitedge.targets.base import reraise_interrupt  # failed") is still an interrupt: 130

            reraise_interrupt(e)
            raise
    except VitedgeError as e:
        print(f"vitedge: error: {e.cli_text()}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vitedge: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("VITEDGE_DEBUG"):
            raise
        return _crash(e, argv)


if __name__ == "__main__":
    sys.exit(main())
