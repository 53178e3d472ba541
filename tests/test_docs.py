"""docs/api.md and docs/cli.md are generated (scripts/gen_docs.py) from the public API's docstrings and the argparse
parser: regenerated here and compared, so neither can drift from the code."""
from __future__ import annotations

import pytest

import vitedge
from vitedge.tests._scripts import load_script


@pytest.fixture(scope="module")
def gen():
    return load_script("gen_docs")


def test_generated_pages_are_current(gen):
    for path, text in gen.generated().items():
        assert path.is_file(), f"{path.name} is missing: run python scripts/gen_docs.py"
        assert path.read_text() == text, f"{path.name} is out of date: run python scripts/gen_docs.py"


def test_the_pages_cover_every_public_call_and_every_flag(gen):
    api, cli_md = gen.render_api(), gen.render_cli()
    for name in vitedge.__all__:
        if name != "__version__":
            assert f"### vitedge.{name}\n" in api, name
    from vitedge import cli

    parser = cli.build_parser()
    for command, sub in cli._subparsers(parser).items():
        assert f"## vitedge {command}\n" in cli_md
        for action in sub._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in cli_md, (command, flag)


def test_exit_codes_are_described_on_one_page():
    """docs/commands.md#exit-codes is the one description; every other hand-written page that speaks of exit codes
    links there (cli.md and api.md are generated from the command line's and the API's own help)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    commands = (root / "docs" / "commands.md").read_text()
    assert "## Exit codes" in commands and all(f"| {code} |" in commands for code in range(4))
    pages = [root / "README.md"] + sorted((root / "docs").glob("*.md"))
    unlinked = [p.name for p in pages if p.name not in ("commands.md", "cli.md", "api.md")
                and "exit code" in p.read_text().lower() and "commands.md#exit-codes" not in p.read_text()]
    assert unlinked == [], "link the exit codes to docs/commands.md#exit-codes instead of describing them"
    tables = [p.name for p in pages if p.name != "commands.md" and "| 2 | bad usage" in p.read_text()]
    assert tables == []  # the table itself is not copied
