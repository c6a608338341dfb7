"""Where the example jobs shipped with xirang live, so that a command naming
`examples/train_numpy.py` works from any directory (the README's commands, the demo)."""

from __future__ import annotations

from pathlib import Path

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"


def example_path(word: str) -> str | None:
    """The shipped example a command word names (`examples/NAME.py`), when the word is no
    file relative to the current directory; else None (the word stays as it is)."""
    path = Path(word)
    if path.parts[:1] != ("examples",) or len(path.parts) != 2 or path.exists():
        return None
    shipped = EXAMPLES_DIR / path.name
    return str(shipped) if shipped.is_file() else None
