"""Window-taking commands default to something in the log and say which window they used."""

from __future__ import annotations

import json

import pytest

from projections import windows
from replay import whatif
from data_helpers import workload_records, write_jsonl, xirang

EPOCH_2026_11_01_MS = 1_793_491_200_000


def test_whatif_without_a_window_replays_the_logs_whole_span_and_says_so(tmp_path):
    records = workload_records()
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    alt = tmp_path / "alt.toml"
    alt.write_text("net_benefit_min = 1e12\n")
    result = xirang("whatif", "--policy", str(alt), "--log", path, "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    first_t = records[0].event.t
    assert out["window"]["from_t"] == first_t and out["window"]["chosen"] == "the log's whole span"
    assert out["window"]["jobs"] == sum(1 for r in records if type(r.event).__name__ == "JobSubmitted")
    assert out["cards"]["simulated_recorded_policy"]["util"] > 0.1  # not diluted by a window from epoch 0
    assert "(the log's whole span)" in whatif.render(out).splitlines()[0]  # what the table prints


def test_a_partial_window_is_filled_from_the_log_and_named():
    span = windows.resolve(500, None, 100, 900)
    assert (span.from_t, span.to_t) == (500, 900) and "log's end" in span.chosen
    assert windows.resolve(None, None, 100, 900).chosen == "the log's whole span"


@pytest.mark.parametrize(
    "quarter, start_iso, end_iso",
    [
        ("2026Q4", "2026-10-01", "2026-12-31"),
        ("2026q1", "2026-01-01", "2026-03-31"),
    ],
)
def test_quarter_bounds_cover_the_calendar_quarter(quarter, start_iso, end_iso):
    start, end = windows.quarter_bounds(quarter)
    assert windows.fmt_t(start).startswith(start_iso) and windows.fmt_t(end).startswith(end_iso + " 23:59:59")


def test_the_last_full_quarter_is_the_newest_one_the_log_covers_whole():
    q3_start, q3_end = windows.quarter_bounds("2026Q3")
    span = windows.last_full_quarter(q3_start - 5, EPOCH_2026_11_01_MS)  # Q4 only begun
    assert (span.from_t, span.to_t) == (q3_start, q3_end) and "2026Q3" in span.chosen
    short = windows.last_full_quarter(q3_start + 5, q3_end)
    assert "covers no full quarter" in short.chosen and short.from_t == q3_start + 5


def test_a_malformed_quarter_says_how_to_write_one():
    with pytest.raises(ValueError, match="YEARQn"):
        windows.quarter_bounds("Q4-2026")
