"""How the core words what it explains: durations as people say them, numbers without
exponents, and a sentence's millisecond counts as durations (for the readers' tables; JSON
keeps the raw numbers, with their units in the key)."""

from __future__ import annotations

import re

_MS_IN_TEXT = re.compile(r"\b(\d+(?:\.\d+)?) ms\b")


def human_duration(ms: int) -> str:
    """A duration as people say it: 45s, 12m, 1h12m, 2d3h."""
    if 0 < ms < 10_000 and ms % 1000:
        return f"{ms / 1000:.1f}s"
    seconds = max(0, int(ms // 1000))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s" if seconds and minutes < 10 else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if hours else f"{days}d"


def readable_number(value) -> str:
    """A number without an exponent: thousands grouped, a few significant digits below."""
    if value is None:
        return "–"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def readable_ms_text(text: str) -> str:
    """`text` with every `N ms` of a second or more written as a duration (`saves 58m`)."""

    def one(match: re.Match) -> str:
        ms = float(match.group(1))
        return match.group(0) if ms < 1000 else human_duration(int(ms))

    return _MS_IN_TEXT.sub(one, text or "")
