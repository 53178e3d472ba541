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
