"""The `vitedge` command line: parsing and dispatch over the Python API (vitedge.export, parity, bench, package,
matrix, models, and the reparam engine). The parsers, shared flags, `--config` files, the summary printer and the
crash report are in exporter/command_line/; each target's flags come from its row (targets/rows.py).

Exit codes: 0 every executed parity hop passed; 1 a hop failed (artifacts quarantined, the report says
which and where); 2 bad usage or bad input (nothing written); 3 an internal error (a bug): one line, and the
traceback saved to a file (CRASH_DIR_ENV, else the system's temporary folder) to attach to a report.

Each subcommand is one `add_<name>(subparsers)` parser (exporter/command_line/parsers.py PARSERS) and one
`cmd_<name>(args)` here that runs it (COMMANDS). Every subcommand also takes `-q/--quiet` (anywhere on the line)
and `--config FILE` (its options from a YAML / TOML / JSON file; flags on the command line win).
"""
from __future__ import annotations

import argparse
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

# (the names re-exported here are the ones scripts and tests read from vitedge.cli)
from vitedge.exporter.command_line.config_file import (CONFIG_ALIASES, apply_config,  # noqa: E402,F401
                                                       subparsers as _subparsers)
from vitedge.exporter.command_line.crash import CRASH_DIR_ENV, crash as _crash, one_line_warnings  # noqa: E402,F401
from vitedge.exporter.command_line.flags import (ATTN_ORDERS, BENCH_DEFAULT, Parser,  # noqa: E402,F401
                                                 add_global_flags, bench_backends, target_options)
from vitedge.exporter.command_line.parsers import PARSERS  # noqa: E402
from vitedge.exporter.command_line.settings_args import settings_of  # noqa: E402
from vitedge.exporter.command_line.summary import format_summary, table as _table  # noqa: E402,F401
from vitedge.models.input_size import size_text  # noqa: E402

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


# ---- the commands ---------------------------------------------------------------------------------

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


def cmd_export(args) -> int:
    from vitedge.exporter.flow.pipeline import export

    report = export(settings_of(args), progress=args.progress)
    print(format_summary(report, os.path.join(report.out_dir, "report.json")))
    return report.exit_code


def cmd_parity(args) -> int:
    from vitedge.exporter.flow.verify import parity

    given = args.artifact or []  # (--artifact repeats: a multi-size export's per-size files)
    report = parity(settings_of(args), given[0] if len(given) == 1 else given or None,
                    deploy_checkpoint=args.deploy_checkpoint,
                    report_path=args.report, mode=args.mode, progress=args.progress)
    print(format_summary(report, args.report))
    return report.exit_code


def cmd_reparam(args) -> int:
    from vitedge.exporter.flow.deploy_checkpoint import reparam_checkpoint

    # (--out: the deploy checkpoint to write, not an export folder)
    result = reparam_checkpoint(settings_of(args, out=None), args.out, progress=args.progress)
    eq, s = result.equivalence, result.summary
    if not eq.passed:
        print(f"FAILED: re-parameterization changed the function: first diverging block {eq.diverging_module} "
              f"({eq.describe()}); nothing written")
        return EXIT_FAILED
    folded = ", ".join(f"{k} {v}" for k, v in sorted(s.folded.items())) or "nothing"
    orders = list(s.attention_order.values())
    print(f"{result.model} @ {size_text(result.imgsz)}: folded {folded}; {len(s.unfolded)} unfolded; attention "
          f"{orders.count('qk_first')} qk_first, {orders.count('kv_first')} kv_first; weights: {result.weights}")
    print(f"equivalence gate (float64) passed: logits max|diff| {eq.max_abs:.2e} (allowance {eq.allowed:.2e}: "
          f"max({eq.rtol:.0e}*max|y|, {eq.k64:g} x float64's estimated own rounding))")
    print(f"wrote {result.path} (load it with vitedge.load_deploy_checkpoint)")
    return EXIT_OK


def cmd_bench(args) -> int:
    from vitedge.exporter.timing.bench_api import bench
    from vitedge.exporter.timing.bench_report import format_table

    report = bench(settings_of(args, options=None), artifact=args.artifact, providers=args.providers,
                   backends=args.backends, threads=args.threads, warmup_s=args.warmup_s, min_iters=args.min_iters,
                   max_s=args.max_s, baseline=args.baseline, max_regression=args.max_regression, order=args.order,
                   ort_spinning={"default": None, "on": True, "off": False}[args.ort_spinning],
                   device=args.device, team_id=args.team_id, bundle_id=args.bundle_id, input=args.input,
                   report_path=args.report, plot=args.plot,
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


def cmd_package(args) -> int:
    from vitedge.exporter.packaging.package import package

    # --out is the bundle; --ios is the bundle's own setting, not a target option given to export
    res = package(settings_of(args, out=None, options=None), args.out, ios=args.ios,
                  executorch_rewrites=args.executorch_rewrites, progress=args.progress)
    if res.exit_code != 0:
        print(f"FAILED: {res.reason}; no bundle written. The export is kept in {res.export_dir}")
        return res.exit_code
    hop = res.report.hop(res.hop)
    demo = " (DEMO: untrained seeded weights)" if res.manifest["weights"] == "untrained" else ""
    m = hop.metrics
    print(f"{res.manifest['model']} @ {res.manifest['imgsz']}{demo}: {res.hop} hop {hop.status} ({hop.mode_label()}, "
          f"{hop.samples} samples, cosine {m.cosine:.6f}, PSNR {m.psnr_db:.1f} dB); golden vectors "
          f"{'passed' if res.manifest['golden']['verified']['passed'] else 'FAILED'}")
    print(f"wrote {res.path} ({res.path.stat().st_size / 1e6:.2f} MB, {len(res.manifest['files']) + 1} files)")
    return EXIT_OK


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

COMMANDS = {"models": cmd_models, "export": cmd_export, "parity": cmd_parity, "reparam": cmd_reparam,
            "bench": cmd_bench, "package": cmd_package, "matrix": cmd_matrix}


def build_parser() -> argparse.ArgumentParser:
    from vitedge import __version__

    parser = Parser(prog="vitedge", description="Re-parameterize, export and verify efficient "
                                    "vision transformers (SwiftFormer, SLAB, SimA). Exit codes: 0 passed, "
                                    "1 a parity hop failed, 2 bad usage or input, 3 internal error (a bug: the "
                                    "traceback is saved to a file to report).")
    parser.add_argument("--version", action="version", version=f"vitedge {__version__}")
    add_global_flags(parser, main=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=Parser)
    for name, add in PARSERS.items():
        add(sub).set_defaults(func=COMMANDS[name])
    for p in sub.choices.values():
        add_global_flags(p)
    return parser


def _run(argv: list[str]) -> int:
    from vitedge.errors import VitedgeError

    parser = build_parser()
    applied = apply_config(parser, argv)
    args = parser.parse_args(argv)  # bad usage: argparse prints it and exits 2
    if getattr(args, "config", None) != applied:
        raise VitedgeError("give --config once, as --config FILE")
    from vitedge.exporter.core.progress import Progress

    args.progress = Progress(enabled=not args.quiet)
    warnings.showwarning = one_line_warnings
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 passed, 1 a hop failed (or a regression, or a matrix cell failed), 2 bad usage or input,
    3 an internal error (its traceback saved to a file), 130 interrupted."""
    from vitedge.errors import VitedgeError
    from vitedge.exporter.core.allocator import keep_freed_memory
    from vitedge.targets.coreml.coremltools_import import lean_coremltools_import

    keep_freed_memory()  # this process is vitedge's own: freed activations are reused, not page-faulted back
    lean_coremltools_import()  # and no user code here wants coremltools' converters for other libraries
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
        from vitedge.exporter.core.writable import environment_error

        if environment_error(e) is not None:  # a full or read-only disk: the user's environment, not a bug
            print(f"vitedge: error: {environment_error(e)}", file=sys.stderr)
            return EXIT_USAGE
        if os.environ.get("VITEDGE_DEBUG"):
            raise
        return _crash(e, argv)


if __name__ == "__main__":
    sys.exit(main())
