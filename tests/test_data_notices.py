"""Users told: notices per user from a real log (projection, `xirang notices`, unread marks
in `xirang jobs`), and the survey's answers per team and level."""

from __future__ import annotations

import json

import duckdb

from core import types as T
from projections.notices import Notifier
from projections.projector import Projector
from data_helpers import publish, start_nats, write_jsonl, xirang
from replay.synthetic_log import Spec, generate

HOUR = 3_600_000


def _storm_log():
    """A day of jobs with a burst of urgent ones at 4 h (preemptions, requeues), and survey
    answers on two jobs."""
    spec = Spec(jobs=150, seed=7, storm_t=4 * HOUR, storm_jobs=6)
    first = generate(spec).records
    jobs = [r.event for r in first if isinstance(r.event, T.JobSubmitted)]
    spec.extra_inputs = [
        T.Feedback(t=20 * HOUR, job=jobs[0].job, user=jobs[0].user, score=2, comment="slow"),
        T.Feedback(t=20 * HOUR, job=jobs[1].job, user="lead", score=5),
    ]
    return generate(spec).records


def _victims(records) -> dict[str, str]:
    users = {r.event.job: r.event.user for r in records if isinstance(r.event, T.JobSubmitted)}
    return {r.event.job: users[r.event.job] for r in records if isinstance(r.event, T.VictimNotified)}


def test_the_projection_tells_each_victims_user_with_the_progress_lost_and_keeps_survey_answers():
    records = _storm_log()
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    victims = _victims(records)
    assert victims, "the storm must preempt"
    rows = proj.con.execute('SELECT job, "user", kind, message FROM notices').fetchall()
    notified = {(job, user) for job, user, kind, _ in rows if kind == "preemption_notice"}
    assert notified == set(victims.items())
    preempted = [m for _, _, kind, m in rows if kind == "preempted"]
    requeues = [
        r.event for r in records if isinstance(r.event, T.JobRequeued) and r.event.reason == "preempted"
    ]
    assert len(preempted) == len(requeues) and all("of progress" in m for m in preempted)
    # the survey: attributed answers, and per team and level in the satisfaction view
    answers = proj.con.execute('SELECT "user", score, comment FROM feedback ORDER BY score').fetchall()
    assert [a[1] for a in answers] == [2, 5] and answers[1][0] == "lead" and answers[0][2] == "slow"
    (teams,) = proj.con.execute("SELECT count(*) FROM satisfaction WHERE answers > 0").fetchone()
    assert teams >= 1


def test_notices_shows_a_user_theirs_once_and_all_again_on_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records = _storm_log()
    log = write_jsonl(str(tmp_path / "log.jsonl"), records)
    victims = _victims(records)
    job, user = sorted(victims.items())[0]
    first = xirang("notices", "--log", log, "--user", user, "--json")
    assert first.returncode == 0, first.stderr
    shown = [json.loads(line) for line in first.stdout.splitlines()]
    assert shown and all(n["user"] == user for n in shown)
    assert any(n["job"] == job and n["kind"] == "preemption_notice" for n in shown)
    again = xirang("notices", "--log", log, "--user", user)
    assert f"no unread notices for {user}" in again.stdout  # read now
    everything = xirang("notices", "--log", log, "--user", user, "--all")
    assert len(everything.stdout.splitlines()) == len(shown) and "preemption_notice" in everything.stdout


def test_jobs_marks_open_jobs_with_unread_notices_until_they_are_read(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records = _storm_log()
    cut = (
        next(
            i
            for i, r in enumerate(records)
            if isinstance(r.event, T.JobRequeued) and r.event.reason == "preempted"
        )
        + 1
    )
    head = records[:cut]  # the log as it stood just after the first preemption
    requeued = head[-1].event.job
    user = next(r.event.user for r in head if isinstance(r.event, T.JobSubmitted) and r.event.job == requeued)
    server = start_nats(tmp_path)
    try:
        publish(server.url, head)
        jobs = json.loads(xirang("jobs", "--nats", server.url, "--json").stdout)["jobs"]
        marked = {j["job"] for j in jobs if j["unread_notices"]}
        expected = {n.job for n in Notifier().all(enumerate(head, 1))} & {j["job"] for j in jobs}
        assert requeued in marked and marked == expected
        table = xirang("jobs", "--nats", server.url).stdout
        assert any(line.split()[:2] == ["!", requeued] for line in table.splitlines())
        assert xirang("notices", "--nats", server.url, "--user", user).returncode == 0
        after = json.loads(xirang("jobs", "--nats", server.url, "--json", "--user", user).stdout)["jobs"]
        assert all(j["unread_notices"] == 0 for j in after)
    finally:
        server.stop()


def test_the_dashboard_shows_satisfaction_per_team_and_level():
    from projections import dashboard, metrics

    records = _storm_log()
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    snap = metrics.snapshot(proj.con)
    answered = {(r.event.job) for r in records if isinstance(r.event, T.FeedbackRecorded)}
    assert sum(row["answers"] for row in snap["satisfaction"]) == len(answered)
    page = dashboard.render_page(snap)
    assert 'id="satisfaction"' in page and "mean score" in page


def test_publish_sends_each_user_their_notices_on_their_own_subject(tmp_path):
    import asyncio
    import threading
    import time

    from projections.notices import subject
    from transport import bus

    records = _storm_log()
    victims = _victims(records)
    job, user = sorted(victims.items())[0]
    expected = [n for n in Notifier().all(enumerate(records, 1)) if n.user == user]
    server = start_nats(tmp_path)
    got: list[dict] = []
    ready, done = threading.Event(), threading.Event()

    def listen() -> None:
        async def go():
            nc, _ = await bus.connect(server.url)
            await nc.subscribe(subject(user), cb=_collect)
            await nc.subscribe("xr.notice.>", cb=_other)
            await nc.flush()
            ready.set()
            while not done.is_set():
                await asyncio.sleep(0.05)
            await nc.close()

        asyncio.run(go())

    others: list[str] = []

    async def _collect(msg) -> None:
        got.append(json.loads(msg.data))

    async def _other(msg) -> None:
        others.append(msg.subject)

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    try:
        publish(server.url, records)
        assert ready.wait(10)
        result = xirang("notices", "--nats", server.url, "--publish", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["published"][user] == len(expected)
        deadline = time.monotonic() + 10
        while len(got) < len(expected) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join(10)
        server.stop()
    assert [(n["job"], n["kind"]) for n in got] == [(n.job, n.kind) for n in expected]
    assert any(n["job"] == job and n["kind"] == "preemption_notice" for n in got)
    assert len(set(others)) > 1  # other users' notices went to their own subjects
