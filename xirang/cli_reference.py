"""The CLI reference, docs/CLI.md, written from the same argument parsers that `xirang ...
--help` prints, so the reference cannot drift from the commands.

`python -m xirang.cli_reference --write` rewrites docs/CLI.md; without `--write` it prints
the reference. `tests/test_cli_reference.py` regenerates it and fails when the file in the
repository differs. The text is built from the parsers' own fields (option strings,
metavars, help, choices), not from argparse's formatted help, whose layout changes between
Python releases and terminal widths: the same code gives the same file everywhere.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xirang.cli import build_parser

REFERENCE_PATH = Path(__file__).resolve().parent.parent / "docs" / "CLI.md"

HEADER = """# CLI reference

Every `xirang` command and its options, generated from the command line's own parsers
(`python -m xirang.cli_reference --write`; a test fails when this file is out of date).
`xirang COMMAND --help` prints the same. What the commands are for: the
[user guide](USER-GUIDE.md), the [operator guide](OPERATOR-GUIDE.md) and the
[simulator guide](SIMULATOR.md).

Options shared by the commands that talk to a cluster: `--nats URL` (default
`$XIRANG_NATS`, else the server `xirang up` started, found through `.xirang/nats.url`),
`--data-dir DIR` (the folder of `xirang up`), `--json` (JSON only on stdout).
Credentials and TLS come from `$XIRANG_CREDS` and `$XIRANG_TLS_CA`.
"""


def _subparsers(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            seen: set[int] = set()
            found = []
            for name, sub in action.choices.items():
                if id(sub) in seen:  # an alias of a command already listed
                    continue
                seen.add(id(sub))
                found.append((name, helps.get(name, ""), sub))
            return found
    return []


def _words(action: argparse.Action) -> str:
    """How the argument is written: `--team TEAM`, `--follow, -f`, `job`, `{core,sim}`."""
    if not action.option_strings:
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            name = "{" + ",".join(str(c) for c in action.choices) + "}"
        else:
            name = str(action.metavar or action.dest)
        if action.nargs == "?":
            return f"[{name}]"
        return f"{name} ..." if action.nargs in ("*", "+") else name
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    if action.metavar is not None:
        metavar = action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    elif action.choices:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    else:
        metavar = action.dest.upper()
    if action.nargs == "?":
        metavar = f"[{metavar}]"
    elif action.nargs in ("*", "+"):
        metavar = f"{metavar} ..."
    return ", ".join(f"{option} {metavar}" for option in action.option_strings)


def _notes(action: argparse.Action) -> str:
    """The help text, and what the parser says besides: required, repeatable."""
    text = " ".join((action.help or "").split()) if action.help != argparse.SUPPRESS else ""
    extra = []
    if action.required and action.option_strings:
        extra.append("required")
    if isinstance(action, (argparse._AppendAction, argparse._AppendConstAction)) and "repeatable" not in text:
        extra.append("repeatable")
    if extra:
        text = f"{text} ({', '.join(extra)})" if text else ", ".join(extra)
    return text.replace("|", "\\|")


def _groups(parser: argparse.ArgumentParser) -> list[list[str]]:
    """Options of which at most one may be given (`--nats URL | --log FILE`)."""
    return [
        [a.option_strings[0] for a in g._group_actions if a.option_strings]
        for g in parser._mutually_exclusive_groups
    ]


def _command(lines: list[str], path: list[str], summary: str, parser: argparse.ArgumentParser) -> None:
    """The section of one command, then its subcommands' sections."""
    subs = _subparsers(parser)
    lines += [f"{'#' * min(len(path) + 1, 4)} xirang {' '.join(path)}", ""]
    if summary:
        lines += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    rows = [
        a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
    ]
    if rows:
        lines += ["| argument | what it is |", "| --- | --- |"]
        lines += [f"| `{_words(a)}` | {_notes(a)} |" for a in rows if a.help != argparse.SUPPRESS]
        lines.append("")
    for group in _groups(parser):
        if len(group) > 1:
            lines += ["At most one of " + ", ".join(f"`{o}`" for o in group) + ".", ""]
    if parser.epilog:
        lines += ["```text", *parser.epilog.strip("\n").splitlines(), "```", ""]
    for name, help_text, sub in subs:
        _command(lines, [*path, name], help_text, sub)


def reference() -> str:
    """docs/CLI.md's text: an index, then one section per command."""
    top = build_parser()
    commands = _subparsers(top)
    lines = [HEADER.rstrip("\n"), "", "## Commands", ""]
    lines += [f"- [`xirang {name}`](#xirang-{name}): {help_text}" for name, help_text, _ in commands]
    lines.append("")
    for name, help_text, sub in commands:
        _command(lines, [name], help_text, sub)
    return "\n".join(line.rstrip() for line in lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or with `--write` rewrite docs/CLI.md."""
    parser = argparse.ArgumentParser(
        prog="python -m xirang.cli_reference", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--write", action="store_true", help=f"rewrite {REFERENCE_PATH}")
    args = parser.parse_args(argv)
    text = reference()
    if args.write:
        REFERENCE_PATH.write_text(text)
        print(f"wrote {REFERENCE_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
