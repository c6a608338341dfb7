"""The survey input: bounded, attributed to the user who sends it, about a real job, and it
changes no scheduling state."""

from __future__ import annotations

import pytest

import msgspec

from core import types as T
from tests.scenario import Run, node, of, start_all, submit


def _run_with_a_job() -> Run:
    run = Run()
    run.at(0, node("n1"))
    run.at(1000, submit("train-1", 5, 2, team="vision", user="ann"))
    start_all(run, 2000)
    return run


def _scheduling_state(run: Run) -> bytes:
    """The canonical state less the log's own bookkeeping (time, position, chain)."""
    c = msgspec.structs.replace(run.state.canonical, t=0, events_n=0, chain="", last_input_seq=0)
    return msgspec.json.encode(c, order="sorted")


def test_feedback_on_a_job_is_recorded_with_the_user_who_sent_it_and_changes_no_state():
    run = _run_with_a_job()
    before = _scheduling_state(run)
    events = run.at(
        5000, T.Feedback(job="train-1", user="bob", score=2, comment="preempted twice in an hour")
    )
    (recorded,) = of(events, T.FeedbackRecorded)
    assert (recorded.job, recorded.user, recorded.score, recorded.comment) == (
        "train-1",
        "bob",
        2,
        "preempted twice in an hour",
    )
    assert not of(events, T.InputRejected)
    assert _scheduling_state(run) == before


def test_feedback_on_a_finished_job_is_accepted():
    run = _run_with_a_job()
    run.at(3000, T.Finished(job="train-1", ok=True))
    assert of(run.at(4000, T.Feedback(job="train-1", user="ann", score=5)), T.FeedbackRecorded)


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"job": "nope", "user": "ann", "score": 3}, "unknown_job"),
        ({"job": "train-1", "user": "", "score": 3}, "user_must_be_set"),
        ({"job": "train-1", "user": "ann", "score": 0}, "score_must_be_1_to_5"),
        ({"job": "train-1", "user": "ann", "score": 6}, "score_must_be_1_to_5"),
        ({"job": "train-1", "user": "ann", "score": 3, "comment": "x" * 501}, "comment_too_long"),
    ],
)
def test_bad_feedback_is_rejected_with_a_reason(fields, reason):
    run = _run_with_a_job()
    events = run.at(5000, T.Feedback(**fields))
    rejected = of(events, T.InputRejected)
    assert rejected and rejected[0].reason == reason and not of(events, T.FeedbackRecorded)
