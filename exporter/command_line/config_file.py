"""`--config FILE`: a command's options from a YAML / TOML / JSON file. Keys are the command's flag names (or the
Python API's where they differ); each value is checked as argparse checks the flag, and becomes the flag's default,
so flags given on the command line win."""
from __future__ import annotations

import argparse
import difflib
import json
import os

from .flags import kv, rewrites


CONFIG_ALIASES = {"targets": "target", "tolerances": "tol", "report_path": "report"}


_NOT_CONFIG = ("help", "config", "version")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
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
            if a.type is kv:  # --set: {depth: 2, embed_dims: [16, 24]}
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
        if a.type is rewrites:
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
    subs = subparsers(parser)
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

