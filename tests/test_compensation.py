"""When a preempted job is compensated (core/rules/compensation.py), as a table, and the
switch to the spec's wording (the count exceeds the threshold) in a scenario."""

from __future__ import annotations

import msgspec
import pytest

from core import types as T
from core.model.policy import Policy
from core.rules.compensation import BELOW, DUE, compensation_due, first_compensation, ordinal

from scenario import MIN, Run, node, of, start_all, submit

REACHES = msgspec.structs.replace(Policy(), compensation_when_exceeded=False)
EXCEEDS = msgspec.structs.replace(Policy(), compensation_when_exceeded=True)


@pytest.mark.parametrize(
    ("policy", "count", "verdict"),
    [
        (REACHES, 2, (False, BELOW)),
        (REACHES, 3, (True, DUE)),  # the count reaches the threshold (3)
        (REACHES, 4, (True, DUE)),
        (EXCEEDS, 3, (False, BELOW)),  # the spec: the count exceeds it
        (EXCEEDS, 4, (True, DUE)),
        (msgspec.structs.replace(REACHES, compensation_after_preemptions=0), 1, (True, DUE)),
    ],
)
def test_compensation_due_table(policy, count, verdict):
    assert compensation_due(policy, count) == verdict


def test_first_compensation_and_its_words():
    assert (first_compensation(REACHES), first_compensation(EXCEEDS)) == (3, 4)
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st",
    ]  # fmt: skip


def preempted_times(count: int, **params) -> list[T.CompensationGranted]:
    """A level-6 job preempted `count` times by level-1 jobs; the grants it got."""
    run = Run(**params)
    run.at(0, node("a1"))
    run.at(1000, submit("batch", 6, 8, team="search", user="li", est_runtime_s=100 * 3600, ckpt_cost_s=10))
    start_all(run, 2000)
    t = 2000
    for i in range(count):
        t += 60 * MIN
        run.at(t, T.CheckpointSaved(job="batch", step=i + 1, digest=f"sha256:{i}", bytes=1))
        events = run.at(t + 1000, submit(f"urgent-{i}", 1, 8, team="safety", user="ana", est_runtime_s=60))
        assert of(events, T.PreemptionPlanned), f"preemption {i + 1} not planned"
        run.at(t + 2000, T.SafePoint(job="batch"), T.Released(job="batch"))
        run.at(t + 3000, T.Started(job=f"urgent-{i}"))
        run.at(t + 63_000, T.Finished(job=f"urgent-{i}", ok=True))
        start_all(run, t + 64_000)
    return run.events(T.CompensationGranted)


def test_compensation_starts_at_the_threshold_by_default_and_past_it_with_the_switch():
    assert {e.preempt_count for e in preempted_times(3, compensation_when_exceeded=False)} == {3}
    assert preempted_times(3, compensation_when_exceeded=True) == []
    assert {e.preempt_count for e in preempted_times(4, compensation_when_exceeded=True)} == {4}
