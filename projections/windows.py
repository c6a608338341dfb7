"""Windows of log time: which span a command looks at, and how it says so.

Every command that reads a window of the log (`whatif`, `report`, `review`, `ab report`,
`tune`) defaults to something that exists in the log (its own span, the last full
quarter, the recent past), never to epoch 0, and prints the window it used with how it
was chosen, so that a reader of the output never has to guess.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from .audit import fmt_t

UTC = dt.timezone.utc


@dataclass(frozen=True)
class Span:
    """A closed window [from_t, to_t] of log milliseconds and how it was chosen."""

    from_t: int
    to_t: int
    chosen: str  # e.g. "given", "the log's whole span", "the last full quarter (2026Q3)"

    def describe(self) -> str:
        """The window in words, with how it was chosen."""
        return f"window {fmt_t(self.from_t)} .. {fmt_t(self.to_t)} ({self.chosen})"

    def as_dict(self) -> dict:
        """The window as JSON-ready data (times as numbers and in words)."""
        return {
            "from_t": self.from_t,
            "to_t": self.to_t,
            "from": fmt_t(self.from_t),
            "to": fmt_t(self.to_t),
            "chosen": self.chosen,
        }


def resolve(given_from: int | None, given_to: int | None, log_first_t: int, log_last_t: int) -> Span:
    """The window a user asked for, with the log's own span filling what they left out."""
    if given_from is None and given_to is None:
        return Span(log_first_t, log_last_t, "the log's whole span")
    from_t = log_first_t if given_from is None else given_from
    to_t = log_last_t if given_to is None else given_to
    if given_from is None:
        chosen = "from the log's start to the given end"
    elif given_to is None:
        chosen = "from the given start to the log's end"
    else:
        chosen = "given"
    return Span(from_t, to_t, chosen)


def log_span(con) -> tuple[int, int]:
    """First and last log time in a projection (0, 0 when it is empty)."""
    first, last = con.execute("SELECT min(t), max(t) FROM events").fetchone()
    return int(first or 0), int(last or 0)


def record_span(records) -> tuple[int, int]:
    """First and last time of a list of decoded records (0, 0 when empty)."""
    if not records:
        return 0, 0
    return records[0].event.t, max(r.event.t for r in records)


# ------------------------------------------------------------------ quarters


def quarter_bounds(quarter: str) -> tuple[int, int]:
    """'2026Q4' -> (first ms of the quarter, last ms of the quarter), UTC."""
    text = quarter.strip().upper()
    try:
        year_text, q_text = text.split("Q")
        year, q = int(year_text), int(q_text)
    except ValueError:
        raise ValueError(f"quarter {quarter!r}: write it as YEARQn, e.g. 2026Q4") from None
    if not 1 <= q <= 4:
        raise ValueError(f"quarter {quarter!r}: the quarter is 1..4")
    start = dt.datetime(year, 3 * (q - 1) + 1, 1, tzinfo=UTC)
    end = dt.datetime(year + (q == 4), 1 if q == 4 else 3 * q + 1, 1, tzinfo=UTC)
    return int(start.timestamp() * 1000), int(end.timestamp() * 1000) - 1


def quarter_of(t: int) -> str:
    """The calendar quarter (UTC) of a log time, as 2026Q4."""
    when = dt.datetime.fromtimestamp(t / 1000, UTC)
    return f"{when.year}Q{(when.month - 1) // 3 + 1}"


def previous_quarter(quarter: str) -> str:
    """The quarter before, as 2026Q3."""
    year, q = int(quarter[:4]), int(quarter[5:])
    return f"{year - 1}Q4" if q == 1 else f"{year}Q{q - 1}"


def last_full_quarter(log_first_t: int, log_last_t: int) -> Span:
    """The newest calendar quarter the log covers from its first day to its last; when the
    log covers no quarter whole, the log's whole span (and it says so)."""
    quarter = quarter_of(log_last_t)
    for _ in range(2):
        start, end = quarter_bounds(quarter)
        if log_first_t <= start and end <= log_last_t:
            return Span(start, end, f"the last full quarter in the log ({quarter})")
        quarter = previous_quarter(quarter)
    return Span(log_first_t, log_last_t, "the log's whole span: it covers no full quarter")
