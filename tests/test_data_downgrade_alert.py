"""A downgraded urgent job that waits is visible: an alert while it waits at the lower
level, and its return to its level in the job's history."""

import duckdb

from core import types as T
from prometheus_client.parser import text_string_to_metric_families

from projections import alerts, metrics
from projections.projector import Projector

from scenario import MIN, Run, node, of, submit, tick
from test_core_preemption import prod_preempted_twice


def _project(run) -> Projector:
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(run.records, 1)])
    return proj


def test_a_downgraded_job_waiting_raises_an_alert_until_its_level_comes_back():
    run = prod_preempted_twice()
    until = run.events(T.TeamDowngraded)[0].until_t
    run.at(24 * MIN, node("h9", "H100"), T.NodeDown(node="h9"))  # its model's only node is down
    run.at(24 * MIN, submit("p4", 1, 8, team="prod", user="d", models=["H100"]))  # so it waits
    proj = _project(run)
    waiting = [a for a in alerts.evaluate(proj.con, 30 * MIN) if a.kind == "downgraded_waiting"]
    assert [a.subject for a in waiting] == ["job p4"] and "level 2" in waiting[0].message
    restored = of(run.at(until, tick(until)), T.JobLevelRestored)
    assert [e.job for e in restored] == ["p4"]
    proj = _project(run)
    assert not [a for a in alerts.evaluate(proj.con, until) if a.kind == "downgraded_waiting"]
    assert proj.con.execute("SELECT level FROM jobs WHERE job = 'p4'").fetchone() == (1,)


def test_an_owner_lowering_their_own_job_raises_no_downgrade_alert():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("runner", 5, 8, user="ana"))
    run.at(2000, submit("waiter", 6, 4, team="nlp", user="bo"))  # the pool is full: it queues
    assert of(run.at(3000, T.SetLevel(job="waiter", level=7, by="bo")), T.JobLevelSet)
    proj = _project(run)
    assert proj.con.execute("SELECT level, requested_level FROM jobs WHERE job = 'waiter'").fetchone() == (
        7,
        7,
    )
    assert [a.kind for a in alerts.evaluate(proj.con, 4000)] == []


def test_metrics_count_a_jobs_alerts_without_naming_the_job_or_its_user():
    run = prod_preempted_twice()
    run.at(24 * MIN, node("h9", "H100"), T.NodeDown(node="h9"))
    run.at(24 * MIN, submit("p4", 1, 8, team="prod", user="d", models=["H100"]))
    proj = _project(run)
    text = metrics.prometheus(proj.con)
    samples = [
        (s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples
    ]
    assert ("xirang_alert_firing", {"kind": "downgraded_waiting", "subject": "jobs"}, 1.0) in samples
    users = {u for (u,) in proj.con.execute('SELECT DISTINCT "user" FROM jobs').fetchall()}
    jobs = {j for (j,) in proj.con.execute("SELECT job FROM jobs").fetchall()}
    labels = {value for _, labelset, _ in samples for value in labelset.values()}
    assert "p4" in jobs and "d" in users and not labels & (jobs | users)
    assert not {name for _, labelset, _ in samples for name in labelset} & {"job", "user"}
