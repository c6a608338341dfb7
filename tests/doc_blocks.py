"""Reading the documentation as the tests check it: the README and the guides in docs/, their
fenced blocks, and the `xirang` command lines in them.

A block fenced as ```sh holds commands a reader may type as written: the tests parse every
`xirang` line of every such block, and run the README's quickstart and the user guide's
everyday block against a real local cluster. A block fenced as ```text is a synopsis
(`[--limit N]`, `(--nats URL | --log FILE)`) and is not parsed."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```([A-Za-z0-9_-]*)[^\n]*\n(.*?)^```", re.S | re.M)


def doc_paths() -> list[Path]:
    """The README and every guide in docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fenced_blocks(path: Path) -> list[tuple[str, str, int]]:
    """(language, body, offset of the fence) of each fenced block of a markdown file."""
    text = path.read_text()
    return [(m.group(1), m.group(2), m.start()) for m in FENCE.finditer(text)]


def commands(body: str) -> list[list[str]]:
    """The command lines of a block: continuation lines joined, comments dropped, each split
    as the shell would."""
    joined = re.sub(r"\\\n\s*", "", body)
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(words)
    return found


def block_after(path: Path, marker: str) -> list[list[str]]:
    """The commands of the first fenced block after `marker` in the file."""
    offset = path.read_text().index(marker)
    for _, body, at in fenced_blocks(path):
        if at > offset:
            return commands(body)
    raise AssertionError(f"no fenced block after {marker!r} in {path.name}")
