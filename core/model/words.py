"""How the core words what it explains: durations as people say them."""

from __future__ import annotations


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
