"""The README's command index ("## Command line") names every command the CLI has, each
subcommand too, and nothing the CLI does not have: a new command, or one renamed, shows
here until the README says where it is described."""

from __future__ import annotations

import os
import re

from data_helpers import REPO
from xirang.cli import build_parser


def commands() -> dict[str, set[str]]:
    """Each top-level command and the names of its subcommands, or of the choices of its
    first positional argument (`bench core`); empty for a plain one."""

    def choices(parser) -> dict:
        for action in parser._actions:
            if not action.option_strings and action.choices:
                return action.choices
        return {}

    return {name: set(choices(sub)) for name, sub in choices(build_parser()).items()}


def index() -> dict[str, set[str]]:
    """What the README's index names: `xirang CMD` or `xirang CMD SUB/SUB/...`."""
    with open(os.path.join(REPO, "README.md")) as fh:
        text = fh.read()
    section = text.split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n### ", 1)[0]
    named: dict[str, set[str]] = {}
    for command, subs in re.findall(r"`xirang ([a-z-]+)((?: [a-z/-]+)?)`", table):
        named.setdefault(command, set()).update(s for s in subs.strip().split("/") if s)
    return named


def test_the_readme_index_names_every_command_and_subcommand():
    have, named = commands(), index()
    assert sorted(set(have) - set(named)) == [], "commands the README's index does not name"
    assert sorted(set(named) - set(have)) == [], "the README's index names commands the CLI lacks"
    for command, subs in have.items():
        assert subs == named[command], (command, sorted(subs), sorted(named[command]))
