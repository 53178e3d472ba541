"""Render the measurement tables of the README and docs/ (docs/benchmarks/: each benchmark's page) from
benchmarks/results/*.json.

A rendered block sits between two marker comments,

    <!-- rendered: NAME ARG ... -->
    ...
    <!-- /rendered -->

(or, for figures inside a sentence, `<!-- rendered: NAME ARG -->...<!-- /rendered -->` on one line) and is replaced
by RENDERERS[NAME](*ARGS). A figure quoted in a code comment or docstring is written `[FIGURE](rendered: NAME ARG)`
and its FIGURE is replaced alike: every .py file of the package, benchmarks/ and scripts/ is checked (CODE), so a
comment's figure cannot drift from its JSON either. Each benchmark script renders its own tables, beside the code that writes its JSON (its
`TABLES`: one function per table or figure, reading the JSON's own fields, so no figure in a block is typed by
hand; shared formatting in benchmarks/_tables.py); this script only collects them and rewrites the blocks. Prose
outside the markers is not touched. `python scripts/render_benchmarks.py` rewrites the files; `--check` only
compares (exit 1 on drift). tests/test_rendered_tables.py re-renders and fails on drift.
"""
from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
# the files that hold rendered blocks
FILES = ("README.md", "docs/onnx.md", "docs/parity.md", "docs/parity_criteria.md", "docs/quantization.md",
         "docs/executorch.md", "docs/models.md", "docs/export_profile.md", *(f"docs/benchmarks/{page}.md" for page in (
             "index", "attention_order", "export_time", "deploy_speed", "resolution_scaling", "rewrite_ablation",
             "executorch_speed")))
# a block (the markers on lines of their own) or a fragment inside a sentence (markers and figures on one line:
# Markdown ends a paragraph at a line that starts with a comment)
BLOCK = re.compile(r"<!-- rendered: ([^>]*?) -->(\n?)(.*?)<!-- /rendered -->", re.S)
# a figure quoted in code: [FIGURE](rendered: NAME ARG ...), on one line
CITED = re.compile(r"\[([^\]\n]*)\]\(rendered: ([^)\n]*)\)")
# the code whose comments and docstrings may quote figures (tests/ quote none: their numbers are literal on purpose)
CODE = ("*.py", "exporter/**/*.py", "models/**/*.py", "targets/**/*.py", "benchmarks/*.py", "scripts/*.py")

if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # the scripts import their siblings (_tables, _script, ...) as top-level modules
tables = importlib.import_module("_tables")
RenderError = tables.RenderError


def collect() -> dict:
    """Every benchmark script's TABLES, by name; two scripts naming the same table is an error."""
    found: dict = {}
    for path in sorted(BENCH.glob("[!_]*.py")):
        for name, render in getattr(importlib.import_module(path.stem), "TABLES", {}).items():
            if name in found:
                raise RenderError(f"{path.name} and another script both render {name!r}")
            found[name] = render
    return found


RENDERERS = collect()


def _render(spec: str) -> str:
    name, *args = spec.split()
    if name not in RENDERERS:
        raise RenderError(f"no renderer named {name!r} (known: {', '.join(sorted(RENDERERS))})")
    try:
        return RENDERERS[name](*args)
    except (KeyError, IndexError, StopIteration, TypeError, ValueError) as e:
        raise RenderError(f"{spec}: {type(e).__name__}: {e}") from e


def render_text(text: str) -> str:
    """`text` with every rendered block and every quoted figure replaced by its renderer's output."""
    def one(match: re.Match) -> str:
        nl = match.group(2)
        return f"<!-- rendered: {match.group(1)} -->{nl}{_render(match.group(1))}{nl}<!-- /rendered -->"

    def cited(match: re.Match) -> str:
        return f"[{_render(match.group(2))}](rendered: {match.group(2)})"
    return CITED.sub(cited, BLOCK.sub(one, text))


def code_files() -> list[str]:
    """The code files that quote a figure (see CODE; this file names the form, it quotes none)."""
    paths = {p for pattern in CODE for p in REPO.glob(pattern)} - {Path(__file__).resolve()}
    return sorted(str(p.relative_to(REPO)) for p in paths if CITED.search(p.read_text()))


def blocks(text: str) -> list[str]:
    """The marker lines (`NAME ARG ...`) of `text`, in order: its blocks, then its quoted figures."""
    return [m.group(1) for m in BLOCK.finditer(text)] + [m.group(2) for m in CITED.finditer(text)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a file differs from its render")
    args = ap.parse_args(argv)
    drift = []
    for rel in (*FILES, *code_files()):
        path = REPO / rel
        text = path.read_text()
        new = render_text(text)
        if new != text:
            drift.append(rel)
            if not args.check:
                path.write_text(new)
    verb = "out of date" if args.check else "re-rendered"
    for rel in drift:
        print(f"{rel}: {verb}")
    return 1 if (drift and args.check) else 0


if __name__ == "__main__":
    sys.exit(main())
