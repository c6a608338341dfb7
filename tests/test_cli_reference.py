"""docs/CLI.md is the command line as it is: regenerating it from the parsers gives the file in
the repository, and every option `xirang COMMAND --help` prints is in it."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from doc_blocks import REPO
from xirang.cli import build_parser
from xirang.cli_reference import REFERENCE_PATH, reference


def test_the_cli_reference_is_current():
    assert REFERENCE_PATH == REPO / "docs" / "CLI.md"
    assert REFERENCE_PATH.read_text() == reference(), (
        "docs/CLI.md is out of date: run `python -m xirang.cli_reference --write` and commit it"
    )


def every_parser(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command words, parser) of the top parser and every subcommand's, depth first."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, (*path, name))


def test_every_option_of_every_help_is_in_the_reference():
    text = REFERENCE_PATH.read_text()
    sections = re.split(r"^#+ xirang ", text, flags=re.M)
    by_command = {s.split("\n", 1)[0].strip(): s for s in sections[1:]}
    checked = 0
    for path, parser in every_parser(build_parser()):
        if not path:
            continue
        section = by_command[" ".join(path)]
        # the options as --help lists them, one a line: "  --team TEAM", "  -f, --follow"
        for option in re.findall(
            r"^  (?:-\w[^,\n]*, )?(--[a-z][a-z0-9-]*)", parser.format_help(), flags=re.M
        ):
            if option != "--help":
                assert f"`{option}" in section or f", {option}" in section, (path, option)
            checked += 1
    assert checked > 200


def test_the_reference_script_writes_what_it_prints(tmp_path):
    printed = subprocess.run(
        [sys.executable, "-m", "xirang.cli_reference"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert printed == reference()
