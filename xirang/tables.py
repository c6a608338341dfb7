"""Tables for people: columns as wide as their widest cell (tabulate), numbers right-aligned,
durations in words (`1h58m`), times as the local clock reads them beside how far away they are."""

from __future__ import annotations

import datetime as dt

from tabulate import tabulate


def table(headers: list[str], rows: list[list], right: tuple[str, ...] = ()) -> str:
    """`rows` under `headers`, each column as wide as it needs; the columns named in `right`
    aligned right. Cells are shown as they are (no number parsing); None as '-'."""
    align = tuple("right" if h in right else "left" for h in headers)
    cells = [["-" if v is None else str(v) for v in row] for row in rows]
    return tabulate(cells, headers=headers, tablefmt="plain", colalign=align, disable_numparse=True)


def duration(seconds: float | None, prefix: str = "") -> str:
    """Seconds in words (`45s`, `1h58m`, `3d4h`), '-' when unknown."""
    from core.explain import human_duration

    if seconds is None:
        return "-"
    if prefix == "in " and seconds <= 0:
        return "now"
    return prefix + human_duration(int(seconds * 1000))


def clock(t_ms: int | None, now_ms: int | None = None) -> str:
    """A log time as the local clock reads it (HH:MM, with the date when it is not today)."""
    if t_ms is None:
        return "-"
    when = dt.datetime.fromtimestamp(t_ms / 1000).astimezone()
    today = dt.datetime.fromtimestamp((now_ms or t_ms) / 1000).astimezone().date()
    return when.strftime("%H:%M" if when.date() == today else "%Y-%m-%d %H:%M")


def start_estimate(start_in_s: float | None, now_ms: int) -> str:
    """An expected start both ways: `in 1h58m (14:32)`."""
    if start_in_s is None:
        return "-"
    if start_in_s <= 0:
        return "now"
    return f"in {duration(start_in_s)} ({clock(int(now_ms + start_in_s * 1000), now_ms)})"
