"""The `vitedge` command line: a thin layer over vitedge.export / vitedge.parity / the reparam engine.

Exit codes: 0 every executed parity hop passed; 1 a hop failed (artifacts quarantined, the report says
which and where); 2 bad usage or bad input (nothing written).

Each subcommand is one `add_<name>(subparsers)` function that builds its parser and one `cmd_<name>(args)`
that runs it; register new subcommands in SUBCOMMANDS.

Length: one job, the command line: the parsers and printed outputs of seven subcommands, kept together so
that shared flags are defined once.
"""
from __future__ import annotations

import argparse
import ast
import os
import sys
import warnings

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

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
ATTN_ORDERS = ("auto", "qk_first", "kv_first")
# exporter.target_plans.PRECISIONS (each target applies those it lists); kept here so parsers import no torch
PRECISIONS = ("fp32", "fp16", "int8", "w8", "palette4", "palette6", "w8a8")
COREML_COMPRESSED = ("w8", "palette4", "palette6", "w8a8")


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


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="model name (see `vitedge models`)")
    p.add_argument("--checkpoint", help="train-form checkpoint; without it, seeded trained-like demo weights "
                                        "are used and the report says weights: untrained")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--imgsz", type=_positive_int, help="input size (default: the model's)")
    p.add_argument("--attn-order", choices=ATTN_ORDERS, default=None,
                   help="SLA/SimA attention order for the export size (default auto: the FLOP rule)")


def _add_rewrites_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rewrites", type=_rewrites, default=True, metavar="all|none|NAME[,NAME]",
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
                   help="parity inputs (default: the documented set, vitedge.exporter.inputs.DEFAULT_SAMPLES)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE",
                   help="override a tolerance, e.g. --tol fp32.max_rel=2e-4 --tol fp16.psnr_db=30 (value none "
                        "disables a check); repeatable")
    p.add_argument("--require-verified", action="store_true",
                   help="exit 1 if any hop of a requested target is unverified (could not run here)")
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


def _overrides(args) -> dict:
    return dict(args.overrides)


def _samples(args) -> int:
    from vitedge.exporter.inputs import DEFAULT_SAMPLES

    return args.samples or DEFAULT_SAMPLES


# ---- models ---------------------------------------------------------------------------------------

def add_models(sub) -> None:
    p = sub.add_parser("models", help="list the model zoo: params, GMACs, sizes")
    p.set_defaults(func=cmd_models)


def cmd_models(args) -> int:
    from vitedge.models.catalog import model_table

    rows = [("name", "family", "params", "GMACs", "imgsz", "accepted sizes")]
    rows += [(r["name"], r["family"], f"{r['params'] / 1e6:.2f} M", f"{r['gmacs']:.2f}", str(r["default_imgsz"]),
              r["accepted_sizes"]) for r in model_table()]
    print(_table(rows))
    return EXIT_OK


# ---- export ---------------------------------------------------------------------------------------

def add_export(sub) -> None:
    from vitedge.targets.coreml.options import INPUT_KINDS, IOS_TARGETS  # torch-free

    p = sub.add_parser("export", help="re-parameterize, export and check parity at every hop",
                       description="Export a model to ONNX (always: the hub graph) and the requested targets, "
                                   "with the parity ladder; writes OUT/NAME.onnx, other artifacts and OUT/report.json.")
    _add_model_flags(p)
    p.add_argument("--target", default="onnx", help="comma list of onnx,coreml,tensorrt (default onnx)")
    p.add_argument("--batch", type=_positive_int, help="static batch size (default 1)")
    p.add_argument("--dynamic-batch", action="store_true", help="dynamic batch axis (onnx, tensorrt)")
    p.add_argument("--opset", type=int, default=None, help="ONNX opset (default 17)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="default per target: onnx fp32, coreml fp16, tensorrt fp16; given, it applies to every "
                        "listed target that supports it: onnx fp32|fp16|int8 (OUT/NAME.fp16.onnx, OUT/NAME.int8.onnx), "
                        "coreml fp16|fp32|w8|palette4|palette6|w8a8, tensorrt fp32|fp16|int8 (built from "
                        "OUT/NAME.int8.tensorrt.onnx)")
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
    p.add_argument("--force", action="store_true", help="replace an output folder that already holds artifacts")
    _add_parity_flags(p)
    _add_inputs_flags(p, "; coreml: a classifier")
    g = p.add_argument_group("coreml")
    g.add_argument("--ios", type=int, choices=IOS_TARGETS, help="minimum deployment target")
    g.add_argument("--input", choices=INPUT_KINDS, help="input type (image: RGB pixels, normalization built in)")
    g = p.add_argument_group("tensorrt")
    g.add_argument("--max-batch", type=_positive_int, help="largest batch of the dynamic-batch profile")
    g.add_argument("--workspace", type=float, help="builder workspace in GiB")
    g.add_argument("--timing-cache", help="timing cache file (read and updated)")
    p.set_defaults(func=cmd_export)


TARGET_OPTIONS = ("ios", "input", "max_batch", "workspace", "timing_cache")


def cmd_export(args) -> int:
    from vitedge.exporter.onnx_export import DEFAULT_OPSET
    from vitedge.exporter.pipeline import export

    report = export(args.model, args.target, checkpoint=args.checkpoint, imgsz=args.imgsz, batch=args.batch,
                    dynamic_batch=args.dynamic_batch, opset=args.opset or DEFAULT_OPSET, precision=args.precision,
                    out=args.out, reparam=not args.no_reparam, force=args.force,
                    attn_order=args.attn_order or "auto", strict_schedule=args.strict_schedule,
                    samples=_samples(args), tolerances=args.tol, require_verified=args.require_verified,
                    overrides=_overrides(args), options={k: getattr(args, k) for k in TARGET_OPTIONS},
                    progress=args.progress, rewrites=args.rewrites, require_ane=args.require_ane,
                    images=args.images, labels=args.labels, calib=args.calib, calib_images=args.calib_images)
    print(format_summary(report, os.path.join(report.out_dir, "report.json")))
    return report.exit_code


# ---- parity ---------------------------------------------------------------------------------------

def add_parity(sub) -> None:
    p = sub.add_parser("parity", help="run the parity ladder on an existing artifact",
                       description="Compare an existing artifact (and/or a deploy-form checkpoint) with the "
                                   "train-form on the parity input set.")
    _add_model_flags(p)
    p.add_argument("--artifact", help="artifact to check (.onnx, .mlpackage, .engine)")
    p.add_argument("--deploy-checkpoint", help="deploy-form checkpoint from `vitedge reparam` to check as the "
                                               "deploy-form hop")
    p.add_argument("--target", help="the artifact's target when its suffix does not tell")
    p.add_argument("--precision", choices=PRECISIONS, help="tolerance profile for the artifact "
                                                           "(default: read from the artifact)")
    p.add_argument("--report", help="write report.json here")
    p.add_argument("--mode", choices=("device", "emulated"),
                   help="insist on how the artifact runs (device: the target's own runtime, e.g. CoreML on macOS); "
                        "otherwise the hop is unverified")
    _add_parity_flags(p)
    _add_inputs_flags(p)
    p.set_defaults(func=cmd_parity)


def cmd_parity(args) -> int:
    from vitedge.exporter.verify import parity

    report = parity(args.model, args.artifact, checkpoint=args.checkpoint, deploy_checkpoint=args.deploy_checkpoint,
                    target=args.target, imgsz=args.imgsz, precision=args.precision, attn_order=args.attn_order,
                    samples=_samples(args), tolerances=args.tol, require_verified=args.require_verified,
                    overrides=_overrides(args) or None, report_path=args.report, mode=args.mode,
                    progress=args.progress, require_ane=args.require_ane, images=args.images, labels=args.labels)
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


def _accuracy(sets: dict, key: str):
    """A hop's accuracy over its labelled samples (only a labelled --images set carries labels)."""
    return next((d[key] for d in sets.values() if d.get(key) is not None), None)


def _reference_line(ref: dict) -> str:
    parts = [f"{k} median {d['reference_noise_median']:.1e} max {d['reference_noise']:.1e}"
             for k, d in ref.get("sets", {}).items()]
    line = (f"reference: train-form float32 vs float64 ({ref.get('float32_threads')} threads), noise per set: "
            + "; ".join(parts))
    if ref.get("top1_accuracy") is not None:
        line += f"; accuracy (float64) top-1 {ref['top1_accuracy']:.1%}, top-5 {ref['top5_accuracy']:.1%}"
    return line


def format_summary(report, report_path: str | None = None) -> str:
    from vitedge.exporter.onnx_export import norm_nodes

    lines = [f"{report.model}  imgsz {report.imgsz}  batch {report.batch or 'dynamic'}  weights: {report.weights}"
             + (" (seeded trained-like demo weights)" if report.weights == "untrained" else "")]
    r = report.reparam
    if r.folded or r.attention_order:
        orders = list(r.attention_order.values())
        lines.append(f"re-parameterization: folded {sum(r.folded.values())} ({', '.join(f'{k} {v}' for k, v in r.folded.items())}); "
                     f"unfolded {len(r.unfolded)}; attention: {orders.count('qk_first')} qk_first, "
                     f"{orders.count('kv_first')} kv_first; rewrites: {', '.join(r.rewrites) or 'none'}")
    ref = report.reference
    if ref:
        lines.append(_reference_line(ref))
    # per input set: the worst sample's error / allowance (<= 1 passes); with labels, accuracy on labelled images
    sets = [k for k in ("natural", "user", "stress") if any(k in (h.sets or {}) for h in report.parity)]
    labelled = bool(ref and ref.get("top1_accuracy") is not None)
    rows = [("hop", "status", "mode", *(f"ratio {k}" for k in sets), "max_rel", "cosine", "PSNR dB", "top-1",
             "top-5", *(("acc@1", "acc@5") if labelled else ()), "backend")]
    for h in report.parity:
        m, hs = h.metrics, h.sets or {}
        acc = [_accuracy(hs, k) for k in ("top1_accuracy", "top5_accuracy")] if labelled else []
        rows.append((h.hop, h.status, h.mode or "-", *(_fmt(hs.get(k, {}).get("noise_ratio"), ".2f") for k in sets),
                     _fmt(m and m.max_rel, ".2e"), _fmt(m and m.cosine, ".6f"), _fmt(m and m.psnr_db, ".1f"),
                     _fmt(m and m.top1_agreement, ".1%"), _fmt(m and m.top5_agreement, ".1%"),
                     *(_fmt(a, ".1%") for a in acc), h.backend))
    lines += ["", _table(rows)]
    if sets:
        lines.append("(vs the train-form in float64; ratio = worst sample's error / its allowance max(floor, K x "
                     "float32 noise), <= 1 passes" + ("; acc = top-k accuracy on the labelled images" if labelled
                                                       else "") + ")")
    notes = [f"  {h.hop}: {h.status}: {h.reason}" for h in report.parity if h.reason]
    notes += [f"  {h.hop}: Neural Engine residency {h.ane_residency['status'].upper()}: {h.ane_residency['reason']}"
              for h in report.parity if h.ane_residency]
    if notes:
        lines += [""] + notes
    if report.artifacts:
        lines.append("")
        for key, a in report.artifacts.items():
            where = os.path.join(report.out_dir, a.path) if report.out_dir else a.path
            extra = ""
            if a.nodes is not None:
                extra = f"  {sum(a.nodes.values())} nodes, {norm_nodes(a.nodes)} normalization"
            lines.append(f"  {key:<12} {a.precision:<5} {_size(a.bytes):>9}  sha256 {a.sha256[:12]}  {where}{extra}")
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

BENCH_BACKENDS = ("torch", "torch-deploy", "onnxruntime", "coreml", "tensorrt")  # validated in exporter.bench
BENCH_DEFAULT = ("torch", "torch-deploy", "onnxruntime")


def add_bench(sub) -> None:
    from vitedge.targets.coreml.options import INPUT_KINDS  # torch-free

    BACKENDS, DEFAULT_BACKENDS = BENCH_BACKENDS, BENCH_DEFAULT  # no torch import while building the parser
    p = sub.add_parser("bench", help="latency per backend and size: paired, parity-checked, regression gate",
                       description="Exit codes: 0 measured (and no regression), 1 a p50 regression beyond "
                                   "--max-regression against --baseline or a failed golden-vector parity on the "
                                   "phone (--device), 2 bad usage or input.")
    p.add_argument("--model", required=True, help="model name (see `vitedge models`)")
    p.add_argument("--checkpoint", help="train-form checkpoint (default: seeded trained-like demo weights)")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names; repeatable")
    p.add_argument("--backends", default=",".join(DEFAULT_BACKENDS),
                   help=f"comma list of {','.join(BACKENDS)} (default {','.join(DEFAULT_BACKENDS)})")
    p.add_argument("--imgsz", default=None, help="comma list of input sizes (default: the model's)")
    p.add_argument("--batch", type=_positive_int, default=1)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0 = all cores; default 1)")
    _add_rewrites_flag(p)
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
    p.add_argument("--plot", help="write a PNG plot (latency vs size per backend, CI bars) here")
    p.add_argument("--baseline", help="an earlier --report JSON to gate p50 regressions against")
    p.add_argument("--max-regression", type=float, help="allowed p50 slow-down in percent (with --baseline)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    import json

    from vitedge.exporter.bench import run_bench
    from vitedge.exporter.bench_report import format_table, write_plot

    report = run_bench(args.model, checkpoint=args.checkpoint, backends=args.backends, imgsz=args.imgsz,
                       batch=args.batch, threads=args.threads, warmup_s=args.warmup_s, min_iters=args.min_iters,
                       max_s=args.max_s, baseline=args.baseline, max_regression=args.max_regression,
                       order=args.order, attn_order=args.attn_order, overrides=_overrides(args), device=args.device,
                       ort_spinning={"default": None, "on": True, "off": False}[args.ort_spinning],
                       rewrites=args.rewrites, team_id=args.team_id,
                       coreml_options={"input": args.input}, images=args.images, labels=args.labels,
                       log=(lambda s: None) if args.quiet else (lambda s: print(s, file=sys.stderr)))
    print(format_table(report))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    if args.plot:
        write_plot(report, args.plot)
    return report.exit_code


# ---- package --------------------------------------------------------------------------------------

def add_package(sub) -> None:
    from vitedge.targets.coreml.options import DEFAULT_IOS, IOS_TARGETS

    p = sub.add_parser("package", help="app-ready CoreML bundle (.zip): image-input .mlpackage, golden vectors, "
                                       "manifest, Swift README",
                       description="Export to CoreML (image input; classifier with --labels), run the parity ladder "
                                   "and write a deterministic BUNDLE.zip. Exit 1 (nothing written) if a hop fails.")
    p.add_argument("--model", required=True, help="model name (see `vitedge models`)")
    p.add_argument("--checkpoint", help="train-form checkpoint; without it the bundle holds seeded demo weights "
                                        "(untrained, said in the manifest and README)")
    _add_inputs_flags(p, "; the model becomes a classifier and the bundle holds labels.txt")
    p.add_argument("--ios", type=int, choices=IOS_TARGETS, default=None,
                   help=f"minimum deployment target (default {DEFAULT_IOS}; 17 with --precision w8a8)")
    p.add_argument("--precision", choices=("fp16",) + COREML_COMPRESSED, default="fp16",
                   help="fp16 (default) or a compressed kind: w8, palette4, palette6, w8a8 (iOS 17+)")
    p.add_argument("--calib", type=int, default=None, metavar="N", help="--precision w8a8: calibration images "
                                                                       "(default 64)")
    p.add_argument("--calib-images", metavar="DIR", help="--precision w8a8: calibrate on images of DIR")
    p.add_argument("--imgsz", type=int, help="input size (default: the model's)")
    p.add_argument("--set", dest="overrides", action="append", type=_kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--samples", type=int, help="parity inputs for the ladder (default: the documented set)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE", help="tolerance override")
    p.add_argument("--out", required=True, help="the bundle to write (BUNDLE.zip)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    p.set_defaults(func=cmd_package)


def cmd_package(args) -> int:
    from vitedge.exporter.package import package

    res = package(args.model, args.out, checkpoint=args.checkpoint, labels=args.labels, ios=args.ios,
                  imgsz=args.imgsz, samples=args.samples, overrides=_overrides(args),
                  tolerances=args.tol or None, force=args.force, progress=args.progress, precision=args.precision,
                  calib=args.calib, calib_images=args.calib_images, images=args.images)
    if res.exit_code != 0:
        bad = ", ".join(h.hop for h in res.report.failed_hops()) or "coreml"
        print(f"FAILED: parity hop {bad} did not pass; no bundle written. The export is kept in {res.export_dir}")
        return res.exit_code
    hop = res.report.hop("coreml")
    demo = " (DEMO: untrained seeded weights)" if res.manifest["weights"] == "untrained" else ""
    m = hop.metrics
    print(f"{res.manifest['model']} @ {res.manifest['imgsz']}{demo}: coreml hop {hop.status} ({hop.mode}, "
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
    p.add_argument("plan", help="plan file (.yaml, .yml, .toml or .json)")
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
    p.add_argument("--require-verified", action="store_true", help="exit 1 if any cell is unverified")
    p.set_defaults(func=cmd_matrix)


def cmd_matrix(args) -> int:
    from vitedge.exporter.matrix import matrix
    from vitedge.exporter.matrix.results import format_dry_run, format_summary

    result = matrix(args.plan, out=args.out, workers=args.workers, ray=args.ray, rebuild=args.rebuild,
                    dry_run=args.dry_run, bench=args.bench, cache=args.cache, resource_timeout=args.resource_timeout,
                    require_verified=args.require_verified, progress=not args.quiet)
    print(format_dry_run(result) if args.dry_run else format_summary(result))
    return result.exit_code


# ---- entry point ----------------------------------------------------------------------------------

SUBCOMMANDS = [add_models, add_export, add_parity, add_reparam, add_bench, add_package, add_matrix]


def build_parser() -> argparse.ArgumentParser:
    from vitedge import __version__

    parser = argparse.ArgumentParser(prog="vitedge", description="Re-parameterize, export and verify efficient "
                                     "vision transformers (SwiftFormer, SLAB, SimA). Exit codes: 0 passed, "
                                     "1 a parity hop failed, 2 bad usage or input.")
    parser.add_argument("--version", action="version", version=f"vitedge {__version__}")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _one_line_warnings(message, category, filename, lineno, file=None, line=None):
    print(f"vitedge: warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad usage: argparse prints it and exits 2
    from vitedge.exporter.progress import Progress
    from vitedge.errors import VitedgeError

    args.progress = Progress(enabled=not args.quiet)
    warnings.showwarning = _one_line_warnings
    try:
        return args.func(args)
    except VitedgeError as e:
        print(f"vitedge: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vitedge: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if os.environ.get("VITEDGE_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"vitedge: internal error: {type(e).__name__}: {first} (set VITEDGE_DEBUG=1 for the traceback)",
              file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
