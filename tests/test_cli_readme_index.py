"""The documentation stays true to the code it describes:

- the README's command index ("## Command line") names every command the CLI has, each
  subcommand too, and nothing the CLI does not have: a new command, or one renamed, shows
  here until the README says which guide describes it;
- every `xirang` command line in a ```sh block of the README or a guide parses with the
  CLI's own parser, and every ```toml block is a policy the scheduler accepts;
- every source file the guides name exists (a module moved or renamed shows here until the
  guides follow it), and every link between the README and the guides leads to a file and
  heading that exist;
- the README's Guides list links every guide in docs/."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import tempfile
from pathlib import Path

import pytest

from doc_blocks import REPO, commands, doc_paths, fenced_blocks
from core.model.policy import PolicyError
from xirang.cli import build_parser
from xirang.policy_file import load_policy_file

# Records of their time: they name modules as they were when the measurement was made.
DATED_RECORDS = ("EXPERIMENTS.md", "SPEED.md", "SCALE.md")


def cli_commands() -> dict[str, set[str]]:
    """Each top-level command and the names of its subcommands, or of the choices of its
    first positional argument (`bench core`); empty for a plain one."""

    def choices(parser) -> dict:
        for action in parser._actions:
            if not action.option_strings and action.choices:
                return action.choices
        return {}

    return {name: set(choices(sub)) for name, sub in choices(build_parser()).items()}


def readme_index() -> dict[str, set[str]]:
    """What the README's index names: `xirang CMD` or `xirang CMD SUB/SUB/...`."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("\n### ", 1)[0]
    named: dict[str, set[str]] = {}
    for command, subs in re.findall(r"`xirang ([a-z-]+)((?: [a-z/-]+)?)`", table):
        named.setdefault(command, set()).update(s for s in subs.strip().split("/") if s)
    return named


def test_the_readme_index_names_every_command_and_subcommand():
    have, named = cli_commands(), readme_index()
    assert sorted(set(have) - set(named)) == [], "commands the README's index does not name"
    assert sorted(set(named) - set(have)) == [], "the README's index names commands the CLI lacks"
    for command, subs in have.items():
        assert subs == named[command], (command, sorted(subs), sorted(named[command]))


def sh_command_lines() -> list[tuple[str, list[str]]]:
    """(where, words) of every `xirang` line of every ```sh block of the docs."""
    found = []
    for path in doc_paths():
        for language, body, _ in fenced_blocks(path):
            if language == "sh":
                found += [(path.name, words) for words in commands(body) if words[0] == "xirang"]
    return found


def test_the_docs_show_commands_to_type():
    """The README and the user guide have blocks of commands to type (so the parse test below
    checks something)."""
    where = {name for name, _ in sh_command_lines()}
    assert {"README.md", "USER-GUIDE.md", "OPERATOR-GUIDE.md", "SIMULATOR.md"} <= where


@pytest.mark.parametrize(
    "where,words", sh_command_lines(), ids=lambda v: " ".join(v) if isinstance(v, list) else v
)
def test_every_command_in_the_docs_parses(where, words):
    said = io.StringIO()
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        try:
            build_parser().parse_args(words[1:])
        except SystemExit as exit_:
            pytest.fail(
                f"{where}: `{shlex.join(words)}` does not parse (exit {exit_.code}): {said.getvalue()}"
            )


def test_every_policy_in_the_docs_loads():
    blocks = [(p.name, body) for p in doc_paths() for lang, body, _ in fenced_blocks(p) if lang == "toml"]
    assert blocks, "the operator guide shows a policy file"
    for where, body in blocks:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as fh:
            fh.write(body)
            fh.flush()
            try:
                load_policy_file(fh.name)
            except PolicyError as err:
                pytest.fail(f"{where}: the policy example is refused: {err}")


SOURCE_PATH = re.compile(
    r"(?<![\w./-])((?:core|agents|trust|transport|replay|projections|xirang|tests|scripts|deploy|examples|docs)"
    r"/[\w./-]*\.(?:py|md|toml|ya?ml|json|jsonl|service|timer|conf|csv|gz))\b"
)


def test_every_source_file_the_guides_name_exists():
    missing = []
    for path in doc_paths():
        if path.name in DATED_RECORDS:
            continue
        for name in sorted(set(SOURCE_PATH.findall(path.read_text()))):
            if "*" in name or "-N." in name:
                continue  # a pattern (`cluster-N.conf`)
            if not (REPO / name).exists():
                missing.append(f"{path.name}: {name}")
    assert missing == [], "the guides name files that are not in the repository"


def test_the_readme_lists_every_guide():
    text = (REPO / "README.md").read_text()
    guides = text.split("\n## Guides\n", 1)[1].split("\n## ", 1)[0]
    linked = set(re.findall(r"\]\((docs/[^)#\s]+)\)", guides))
    present = {f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")}
    assert sorted(present - linked) == [], "guides in docs/ the README's Guides list does not link"


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file."""
    anchors = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for title in re.findall(r"^#{1,6} (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_links_between_the_docs_lead_somewhere():
    broken = []
    for path in doc_paths():
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # a web address
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            shown = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
            if not dest.exists():
                broken.append(f"{path.name}: {target} ({shown})")
            elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert broken == [], "links to files or headings that do not exist"


LAB_NOTEBOOK = re.compile(r"[Ii]ssue ?#?[0-9]+|\b[Ss]ession [0-9]+\b")
COMMIT_ID = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


def test_the_guides_and_the_code_carry_no_issue_numbers_or_commit_ids():
    """Guides and comments say what is and why, not which issue or commit brought it: that
    history is in git and, with dates, in docs/EXPERIMENTS.md, docs/SPEED.md and docs/SCALE.md."""
    found = []
    for path in doc_paths():
        if path.name in DATED_RECORDS:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if LAB_NOTEBOOK.search(line) or COMMIT_ID.search(line):
                found.append(f"{path.name}:{n}: {line.strip()}")
    for pattern in (
        "*.py",
        "*.toml",
        "*.yaml",
        "*.yml",
        "*.service",
        "*.timer",
        "*.conf",
        "Makefile",
        "Dockerfile",
    ):
        for path in sorted(REPO.rglob(pattern)):
            name = path.relative_to(REPO).as_posix()
            if name.startswith((".venv/", ".git/")) or "/." in f"/{name}":
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if LAB_NOTEBOOK.search(line):
                    found.append(f"{name}:{n}: {line.strip()}")
    assert found == [], "issue numbers, session numbers or commit ids outside the dated records"
