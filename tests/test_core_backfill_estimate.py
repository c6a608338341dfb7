"""Scenario tests of backfill under a hold by the job's own estimate (the opt-in
`backfill_by_own_estimate`, core/rules/holds.py `backfill_view`)."""

from core import types as T
from core.explain import explain
from core.passes.placement import reserved_nodes

from scenario import HOUR, Run, node, of, start_all, submit


def started_order(events) -> list[str]:
    return [e.job for e in of(events, T.JobStartRequested)]


def _held_node_and_a_team_that_ran_long(gang_level: int = 2, **params) -> Run:
    """a1 runs a 6-GPU level-3 job for ten minutes; a level-2 gang holds a1 for when it ends
    (2 GPUs free there meanwhile). Team f has run one job of kind `probe` for five hours,
    so the learned runtime of its `probe` jobs is five hours."""
    run = Run(estimate_samples_min=1, fair_share_guarantee=False, **params)
    run.at(0, node("a1"))
    run.at(1, submit("history", 6, 1, team="f", kind="probe", est_runtime_s=5 * 3600))
    start_all(run, 2)
    run.at(2 + 5 * HOUR, T.Finished(job="history", ok=True))
    t = 3 + 5 * HOUR
    run.at(t, submit("short-b", 3, 6, team="ops", est_runtime_s=600, preemptible=False))
    start_all(run, t + 1)
    run.at(t + 10, submit("gang", gang_level, 8, team="g", est_runtime_s=3600))
    assert reserved_nodes(run.state)["a1"][1] == "gang"
    return run


def test_a_job_whose_own_estimate_ends_before_the_hold_backfills_under_it():
    """The `probe` job says it runs a minute; the learned runtime of its kind is five hours.
    By the learned runtime it would outlast the gang's hold and may not start on a1; by its
    own estimate (as Slurm reads a time limit) it ends first and starts."""
    t = 20 + 5 * HOUR
    learned = _held_node_and_a_team_that_ran_long()
    assert started_order(learned.at(t, submit("tiny", 6, 2, team="f", kind="probe", est_runtime_s=60))) == []
    assert explain(learned.state, "tiny").code == "reservation"
    own = _held_node_and_a_team_that_ran_long(backfill_by_own_estimate=True)
    # A job whose own estimate outlasts the hold still may not start there.
    assert started_order(own.at(t, submit("long", 6, 2, team="f", kind="probe", est_runtime_s=3600))) == []
    assert explain(own.state, "long").code == "reservation"
    assert started_order(own.at(t + 1, submit("tiny", 6, 2, team="f", kind="probe", est_runtime_s=60))) == [
        "tiny"
    ]


def test_under_an_urgent_holders_hold_the_longer_forecast_counts():
    """The same with an urgent (level-1) gang holding a1: by its own estimate the `probe` job
    would end first, by its kind's learned runtime it would not, and the urgent job's wait
    is not staked on a user's estimate: it does not start there."""
    t = 20 + 5 * HOUR
    own = _held_node_and_a_team_that_ran_long(gang_level=1, backfill_by_own_estimate=True)
    assert started_order(own.at(t, submit("tiny", 6, 2, team="f", kind="probe", est_runtime_s=60))) == []
    assert explain(own.state, "tiny").code == "reservation"
    # A job of a kind with no history is forecast by its estimate either way.
    assert started_order(own.at(t + 1, submit("new", 6, 2, team="n", kind="fresh", est_runtime_s=60))) == [
        "new"
    ]
