"""No input stops the live cluster: inputs out of bounds are refused with a reason and the
next job starts, the scheduler never restarts; a stray message on a host's decision
subject or on the log's subjects is skipped by the agent, the scheduler and the projector."""

from __future__ import annotations

import json

import pytest

from transport import bus
from agents.local_cluster import Cluster, matching, sleep_command
from core import types as T

pytestmark = pytest.mark.timeout(120)


def submit(job: str, **fields) -> bytes:
    body = {
        "type": "submit",
        "job": job,
        "team": "t",
        "user": "u",
        "level": 3,
        "gpus": 1,
        "gpu_models": ["H100"],
        "command": sleep_command(0.2),
    }
    body.update(fields)
    return json.dumps(body).encode()


def send_raw(cluster: Cluster, *raws: bytes) -> None:
    async def go(nc, js):
        for raw in raws:
            await bus.send_raw_input(js, raw)

    cluster._run(go)


def publish_plain(cluster: Cluster, subject: str, data: bytes) -> None:
    async def go(nc, js):
        await js.publish(subject, data)

    cluster._run(go)


def test_inputs_that_halted_the_scheduler_are_refused_and_a_later_job_runs(tmp_path):
    with Cluster(tmp_path) as c:
        sched = c.scheduler("s1")
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        deep = submit("deep")[:-1] + b', "kind": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        huge = submit("huge", command=["echo", "x" * (8 * 1024 * 1024 - 8192)])
        send_raw(c, submit("overflow", est_runtime_s=1e308), deep, huge)
        records = c.wait_for(T.InputRejected, count=3)
        reasons = sorted(r.event.reason for r in matching(records, T.InputRejected))
        assert reasons == ["est_runtime_s_too_large", "input_nested_too_deep", "input_too_large"]
        send_raw(c, submit("after"))
        c.wait_for(T.JobFinished, job="after", timeout_s=30)
        assert sched.poll() is None and agent.poll() is None  # never restarted


def test_stray_messages_on_decision_and_log_subjects_are_skipped(tmp_path):
    with Cluster(tmp_path) as c:
        sched = c.scheduler("s1")
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        publish_plain(c, f"{bus.HOST_PREFIX}.h1.JobStartRequested", b"{not a record")
        publish_plain(c, f"{bus.LOG_PREFIX}.JobStartRequested", b'{"n": "x"}')
        send_raw(c, submit("after"))
        records = c.wait_for(T.JobFinished, job="after", timeout_s=30)
        assert [r.n for r in records] == list(range(1, len(records) + 1))
        assert sched.poll() is None and agent.poll() is None
        assert "skipping undecodable" in (c.logs / "h1.log").read_text()
        # A second scheduler folds the log with the stray message in it.
        sched.terminate()
        sched.wait(10)
        c.scheduler("s2")
        send_raw(c, submit("after-restart"))
        c.wait_for(T.JobFinished, job="after-restart", timeout_s=30)


def test_the_projector_skips_a_message_it_cannot_decode(tmp_path):
    from core import run_inputs
    from projections.projector import Projector

    records = list(
        run_inputs(
            [
                T.NodeUp(t=1, node="n1", gpu_model="H100", gpus=8),
                T.Submit(t=2, job="a", team="t", user="u", level=3, gpus=1),
            ]
        )
    )
    items = [(1, T.encode(records[0])), (2, b"\x00garbage")] + [
        (seq, T.encode(r)) for seq, r in enumerate(records[1:], 3)
    ]
    projector = Projector(str(tmp_path / "p.duckdb"))
    assert projector.apply(items) == len(records)
    assert projector.skipped == 1 and projector.last_n == records[-1].n


def test_an_input_rejected_as_internal_error_raises_an_alert(tmp_path):
    from core import new_state, step
    from core.machine import reject_input
    from projections import alerts
    from projections.projector import Projector

    state = new_state()
    records = step(state, T.NodeUp(t=1000, node="n1", gpu_model="H100", gpus=8, seq=1))[1]
    records += reject_input(state, T.Tick(t=2000, seq=2), "internal_error", "ZeroDivisionError: boom")
    projector = Projector(str(tmp_path / "p.duckdb"))
    projector.apply([(seq, T.encode(r)) for seq, r in enumerate(records, 1)])
    fired = [a for a in alerts.evaluate(projector.con, 3000) if a.kind == "internal_error"]
    assert len(fired) == 1 and "ZeroDivisionError: boom" in fired[0].message and "seq 2" in fired[0].message


def test_the_live_scheduler_rejects_an_input_that_makes_step_raise_and_goes_on(tmp_path, monkeypatch):
    """The scheduler's own path, in process against a real nats-server: a handler that
    half-changes the state and raises. The input is recorded as internal_error, the state
    is the log's, an alert goes out, and the next job is scheduled."""
    import asyncio

    from agents.scheduler import Scheduler
    from core import inputs, rebuild, state_digest
    from transport.natsd import EmbeddedNats

    def explode(ctx, inp):
        ctx.state.canonical.jobs.clear()
        raise ZeroDivisionError("boom in a handler")

    async def scenario(url: str) -> None:
        sched = Scheduler(url, instance="s1", tick_ms=100, lease_ms=1000)
        task = asyncio.create_task(sched.run())
        nc, js = await bus.connect(url, reconnects=3)
        alerts = []

        async def on_alert(msg) -> None:
            alerts.append(json.loads(msg.data))

        await nc.subscribe(f"{bus.ALERT_PREFIX}.>", cb=on_alert)
        await sched.leading.wait()
        await bus.send_input(js, T.NodeUp(node="n1", gpu_model="H100", gpus=8))
        await bus.send_input(js, T.Submit(job="a", team="t", user="u", level=3, gpus=1))
        monkeypatch.setitem(inputs.HANDLERS, T.Cancel, explode)
        await bus.send_input(js, T.Cancel(job="a"))
        await bus.wait_for(lambda: _records_with(js, T.InputRejected), 20)
        monkeypatch.undo()
        await bus.send_input(js, T.Submit(job="b", team="t", user="u", level=3, gpus=1))
        records = await bus.wait_for(lambda: _records_with(js, T.JobStartRequested, count=2), 20)
        rejected = [r.event for r in records if isinstance(r.event, T.InputRejected)]
        assert [(e.reason, e.input_type) for e in rejected] == [("internal_error", "cancel")]
        assert "ZeroDivisionError: boom in a handler" in rejected[0].detail
        assert alerts and alerts[0]["kind"] == "internal_error"
        assert not task.done() and sched.internal_errors == 1
        assert "a" in sched.state.canonical.jobs  # the half change is gone
        assert state_digest(rebuild(records).canonical) == state_digest(sched.state.canonical)
        sched.stop()
        await asyncio.wait_for(task, 20)
        await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(scenario(server.url))


async def _records_with(js, kind, count: int = 1):
    records = [r for _, r in await bus.all_records(js)]
    return records if sum(isinstance(r.event, kind) for r in records) >= count else None


def test_an_input_whose_records_would_not_fit_one_batch_is_rejected_not_retried(tmp_path, monkeypatch):
    import asyncio

    from agents.scheduler import Scheduler
    from transport.natsd import EmbeddedNats

    async def scenario(url: str) -> None:
        sched = Scheduler(url, instance="s1", tick_ms=100, lease_ms=1000)
        task = asyncio.create_task(sched.run())
        nc, js = await bus.connect(url, reconnects=3)
        await sched.leading.wait()
        await bus.send_input(js, T.NodeUp(node="n1", gpu_model="H100", gpus=8))
        await bus.wait_for(lambda: _records_with(js, T.NodeJoined), 20)
        monkeypatch.setattr(bus, "BATCH_MESSAGES_MAX", 3)  # a submit that starts makes 4
        await bus.send_input(js, T.Submit(job="a", team="t", user="u", level=3, gpus=1))
        records = await bus.wait_for(lambda: _records_with(js, T.InputRejected), 20)
        rejected = [r.event for r in records if isinstance(r.event, T.InputRejected)]
        assert rejected[0].reason == "internal_error" and "EffectsTooLarge" in rejected[0].detail
        monkeypatch.undo()
        await bus.send_input(js, T.Submit(job="a", team="t", user="u", level=3, gpus=1))
        await bus.wait_for(lambda: _records_with(js, T.JobStartRequested), 20)
        assert not task.done()
        sched.stop()
        await asyncio.wait_for(task, 20)
        await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(scenario(server.url))
