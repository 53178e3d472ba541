"""The parser of every subcommand (`add_<name>(subparsers)` returns it; vitedge/cli.py attaches the command that
runs it). Target-specific flags, target names and precisions come from the target rows and the precision table."""
from __future__ import annotations

import argparse

from .flags import (ATTN_ORDERS, BENCH_DEFAULT, add_exporter_flag, add_features_flag, add_inputs_flags, add_model_flags,
                    add_parity_flags, add_preprocess_flags, add_rewrites_flag, add_target_flags, bench_backends,
                    image_sizes, kv, positive_float, positive_int)


def add_models(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("models", help="list the model zoo: params, GMACs, sizes",
                       description="Every registered model: family, parameters, GMACs at its default size, default "
                                   "and accepted input sizes.")
    p.add_argument("--json", action="store_true",
                   help="print the rows as a JSON list (the fields of vitedge.models(): name, family, params, gmacs, "
                        "default_imgsz, accepted_sizes)")
    p.add_argument("--family", help="only this family's models (swiftformer, slab, sima, sima_deit)")
    return p


def add_export(sub) -> argparse.ArgumentParser:
    from vitedge.precisions import names  # torch-free, as are the rows; read when the parser is built
    from vitedge.targets import TARGETS, rows

    p = sub.add_parser("export", help="re-parameterize, export and check parity at every hop",
                       description="Export a model to ONNX (always: the base graph) and the requested targets, "
                                   "with the parity ladder; writes OUT/NAME.onnx, other artifacts and OUT/report.json.")
    add_model_flags(p, named=True)
    p.add_argument("--target", default="onnx", help=f"comma list of {','.join(TARGETS)} (default onnx)")
    add_features_flag(p)
    p.add_argument("--batch", type=positive_int, help="static batch size (default 1)")
    p.add_argument("--dynamic-batch", action="store_true",
                   help=f"dynamic batch axis ({', '.join(r.name for r in rows() if r.dynamic_batch)})")
    add_exporter_flag(p, opset=True)
    p.add_argument("--precision", choices=names(),
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
    add_rewrites_flag(p)
    p.add_argument("--strict-schedule", action="store_true",
                   help="error (instead of warn) on a checkpoint whose LN->RepBN schedule had not finished")
    p.add_argument("--force", action="store_true", help="replace an output folder that already holds artifacts "
                   "(only files vitedge wrote there: a folder holding others is refused, naming them)")
    p.add_argument("--clean", action="store_true", help="with --force: also delete files vitedge did not write")
    add_parity_flags(p)
    add_inputs_flags(p, "; coreml: a classifier")
    add_preprocess_flags(p)
    add_target_flags(p)
    return p


def add_parity(sub) -> argparse.ArgumentParser:
    from vitedge.precisions import names
    from vitedge.targets import rows

    p = sub.add_parser("parity", help="run the parity ladder on an existing artifact",
                       description="Compare an existing artifact (and/or a deploy-form checkpoint) with the "
                                   "train-form on the parity input set. The artifact's metadata names the model, "
                                   "size, overrides, checkpoint hash and ONNX exporter it was made with.")
    add_model_flags(p, required=False)
    p.add_argument("--artifact", action="append",
                   help=f"artifact to check ({', '.join(r.suffix for r in rows() if r.suffix)}); every function / "
                        "method of a multi-size one is checked at its own size; repeat it for a multi-size export's "
                        "per-size files (NAME_HxW.onnx), each checked at its size")
    p.add_argument("--deploy-checkpoint", help="deploy-form checkpoint from `vitedge reparam` to check as the "
                                               "deploy-form hop")
    p.add_argument("--target", help="the artifact's target when its suffix does not tell")
    p.add_argument("--precision", choices=names(), help="tolerance profile for the artifact "
                                                           "(default: read from the artifact)")
    p.add_argument("--report", help="write report.json here")
    p.add_argument("--mode", choices=("device", "emulated"),
                   help="insist on how the artifact runs (device: the target's own runtime, e.g. CoreML on macOS); "
                        "otherwise the hop is unverified")
    add_exporter_flag(p, what="the ONNX exporter the artifact was written with, recorded in the report where its "
                               "metadata does not say (one that contradicts the metadata is an error)")
    add_parity_flags(p)
    add_inputs_flags(p)
    return p


def add_reparam(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("reparam", help="write a deploy-form checkpoint (folded, verified in float64)")
    add_model_flags(p)
    p.add_argument("--out", required=True, help="deploy-form checkpoint to write (.pth)")
    add_rewrites_flag(p)
    p.add_argument("--strict-schedule", action="store_true",
                   help="error (instead of warn) on a checkpoint whose LN->RepBN schedule had not finished")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    return p


def add_bench(sub) -> argparse.ArgumentParser:
    from vitedge.targets.rows import INPUT_KINDS  # torch-free

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
    p.add_argument("--set", dest="overrides", action="append", type=kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names; repeatable")
    p.add_argument("--backends", default=None,
                   help=f"comma list of {','.join(BACKENDS)} (default {','.join(DEFAULT_BACKENDS)})")
    p.add_argument("--imgsz", type=image_sizes, default=None, metavar="S[,S]",
                   help="comma list of input sizes (default: the model's; with --artifact, one size for a graph "
                        "whose input size is symbolic)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="batch size (default 1; with --artifact, its static batch)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (0 = all cores; default 1)")
    add_rewrites_flag(p)
    add_exporter_flag(p)
    p.add_argument("--ort-spinning", choices=("default", "on", "off"), default="default",
                   help="ONNX Runtime intra-op spinning with --threads 0 or > 1 (off: steadier on small shared "
                        "or virtual machines; default: ONNX Runtime's, on)")
    p.add_argument("--warmup-s", type=float, default=0.5, help="time-based warm-up per size (s)")
    p.add_argument("--min-iters", type=positive_int, default=50, help="at least this many timed runs")
    p.add_argument("--max-s", type=float, default=5.0, help="time budget per size once --min-iters is met (s)")
    p.add_argument("--attn-order", choices=ATTN_ORDERS, default="auto")
    p.add_argument("--order", choices=("auto", "measured"), default="auto",
                   help="measured: time both SLA/SimA attention orders per size and report the faster")
    p.add_argument("--device", help="iphone or iphone:NAME: also time load and predict on a tethered iPhone and run "
                                    "the golden vectors there (macOS, Xcode, a developer-mode iPhone, --team-id)")
    p.add_argument("--team-id", help="Apple Developer Team ID that signs coremltools' model-runner app for the phone "
                                     "(default: $VITEDGE_TEAM_ID)")
    p.add_argument("--bundle-id", help="bundle identifier of that app, registered for your team by Xcode "
                                       "(default: com.<team id, lower case>.vitedge.modelrunner)")
    p.add_argument("--input", choices=INPUT_KINDS, default=None,
                   help="--device iphone: the phone's package input (image: RGB pixels, normalization built in)")
    add_inputs_flags(p, "; with --device iphone the phone's package is a classifier")
    p.add_argument("--report", help="write the JSON report here")
    p.add_argument("--plot", help="write a PNG plot (latency vs size per backend, CI bars) here (needs "
                                  "vitedge[plot])")
    p.add_argument("--baseline", help="an earlier --report JSON to gate p50 regressions against")
    p.add_argument("--max-regression", type=float, help="allowed p50 slow-down in percent (with --baseline)")
    p.add_argument("--fail-on-parity", action="store_true",
                   help="exit 1 when a backend's parity check failed or, with --artifact, could not run (default: "
                        "such a backend is reported failed and not timed, and the exit code reflects regressions "
                        "only)")
    return p


def add_package(sub) -> argparse.ArgumentParser:
    from vitedge.exporter.packaging import bundles  # torch-free
    from vitedge.precisions import names
    from vitedge.targets.rows import DEFAULT_IOS, EXECUTORCH_ROW, IOS_TARGETS

    p = sub.add_parser("package", help="app-ready bundle (.zip): CoreML for iOS (image-input .mlpackage, Swift "
                                       "README) or ExecuTorch for Android (.pte, Kotlin README); golden vectors, manifest",
                       description="Export to CoreML (image input; classifier with --labels) or ExecuTorch, run the "
                                   "parity ladder and write a deterministic BUNDLE.zip. Exit 1 (nothing written) if a "
                                   "hop fails.")
    p.add_argument("--target", choices=tuple(bundles()), default="coreml",
                   help="coreml (default: iOS) or executorch (Android, and iOS through ExecuTorch)")
    add_features_flag(p)
    p.add_argument("--model", help="model name (see `vitedge models`); optional with a --checkpoint that names its "
                                   "model (a transformers folder or hf-hub: repo with config.json, or timm:NAME)")
    p.add_argument("--checkpoint", help="train-form checkpoint (as for export); without it the bundle holds seeded "
                                        "demo weights (untrained, said in the manifest and README)")
    add_inputs_flags(p, "; the model becomes a classifier and the bundle holds labels.txt")
    add_preprocess_flags(p)
    p.add_argument("--ios", type=int, choices=IOS_TARGETS, default=None,
                   help=f"minimum deployment target (default {DEFAULT_IOS}; 17 with --precision w8a8; 18 with "
                        "several --imgsz sizes)")
    p.add_argument("--precision", choices=names(), default=None,
                   help="coreml: fp16 (default) or a compressed kind: w8, palette4, palette6, w8a8 (iOS 17+); "
                        "executorch: fp32 (default) or int8")
    p.add_argument("--calib", type=int, default=None, metavar="N", help="--precision w8a8: calibration images "
                                                                       "(default 64)")
    p.add_argument("--calib-images", metavar="DIR", help="--precision w8a8: calibrate on images of DIR")
    p.add_argument("--imgsz", type=image_sizes, metavar="S[,S]",
                   help="input size (default: the model's); a comma list: one bundle of every size (a CoreML "
                        "function / ExecuTorch method per size, golden vectors per size)")
    p.add_argument("--set", dest="overrides", action="append", type=kv, default=[], metavar="KEY=VALUE",
                   help="constructor override, official keyword names (e.g. --set depth=2); repeatable")
    p.add_argument("--samples", type=positive_int, help="parity inputs for the ladder (default: as for export)")
    p.add_argument("--tol", action="append", default=[], metavar="PROFILE.KEY=VALUE", help="tolerance override")
    p.add_argument("--out", required=True, help="the bundle to write (BUNDLE.zip)")
    p.add_argument("--force", action="store_true", help="replace an existing --out")
    add_exporter_flag(p, what="ONNX exporter of the parity ladder's base graph (the CoreML package itself is "
                               "converted from the deploy-form); default and fallback as for export")
    rewrites = EXECUTORCH_ROW.option("executorch_rewrites")
    p.add_argument(rewrites.flag, choices=rewrites.choices, default=None,
                   help=f"--target executorch: {rewrites.help}; as for export")
    return p


def add_matrix(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("matrix", help="export a plan of models x sizes x targets x precisions (cached; local "
                                      "pool or Ray)",
                       description="Run every cell of PLAN (YAML or TOML) through the export pipeline into "
                                   "OUT/<model>/<imgsz>/<target>-<precision>/, reusing cached cells; writes "
                                   "OUT/matrix.json and OUT/matrix.md. Exit codes: 0 every executed cell passed, "
                                   "1 a cell failed or crashed (or is unverified, with --require-verified), "
                                   "2 bad plan or usage (nothing written).")
    p.add_argument("plan", nargs="?", help="plan file (.yaml, .yml, .toml or .json); not needed with --verify-cache")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--workers", type=positive_int,
                   help="local pool processes (default from the cores; intra-op threads = cores // workers); with "
                        "--ray: most cells in flight")
    p.add_argument("--ray", nargs="?", const=True, default=None, metavar="ADDRESS",
                   help="run cells as Ray tasks: a new local Ray instance, or the cluster at ADDRESS "
                        "(pip install 'vitedge[ray]')")
    p.add_argument("--rebuild", action="store_true", help="ignore the cache: build every cell again")
    p.add_argument("--dry-run", action="store_true", help="list the cells and which the cache holds; run nothing")
    p.add_argument("--bench", action="store_true", help="time each passed cell's artifact on its own runtime")
    p.add_argument("--cache", help="cache folder (default OUT/.cache); may be a shared path for CI runs and drivers")
    p.add_argument("--resource-timeout", type=positive_float, default=300.0, metavar="S",
                   help="with --ray: how long a cell waits for a node with its resources (GPU, sm_XY, macos) "
                        "before it is reported unverified (default 300)")
    p.add_argument("--require-verified", action="store_true", help="exit 1 if any cell is unverified; a cached "
                   "cell whose artifacts do not match their report is failed instead of rebuilt")
    p.add_argument("--verify-cache", action="store_true",
                   help="re-hash every cached cell's artifacts against its report (and every shared verified base's "
                        "files against its hub.json) and build nothing: one line per entry, exit 1 if any cannot be trusted (the cache is --cache, default OUT/.cache)")
    add_exporter_flag(p, what="ONNX exporter of the cells whose plan entry (or defaults) names none (plan key "
                               "`exporter`); default and fallback as for export")
    return p


PARSERS = {"models": add_models, "export": add_export, "parity": add_parity, "reparam": add_reparam,
           "bench": add_bench, "package": add_package, "matrix": add_matrix}
