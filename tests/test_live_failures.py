"""Failure tests on the live system: processes killed with SIGKILL at the worst moments."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from nats.js import api

from transport import bus
from agents.host import pid_alive
from agents.local_cluster import Cluster, matching, sleep_command, train_command
from core import rebuild
from core import types as T
from projections.redecide import Redecide

pytestmark = pytest.mark.timeout(150)


def low(job: str, gpus: int, command: list[str]) -> T.Submit:
    return T.Submit(
        job=job,
        team=f"team-{job}",
        user=f"user-{job}",
        level=6,
        gpus=gpus,
        gpu_models=["H100"],
        est_runtime_s=600,
        ckpt_interval_s=5,
        ckpt_cost_s=1,
        restore_cost_s=1,
        command=command,
    )


def assert_no_gpu_held_twice(records) -> None:
    """Replaying the log, a GPU is never handed to a second job while the first holds it."""
    holder: dict[tuple[str, int], str] = {}
    for r in records:
        ev = r.event
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            for slot in ev.placement:
                for g in slot.gpus:
                    assert holder.get((slot.node, g)) in (None, ev.job), (
                        f"{slot.node}:{g} held twice at {r.n}"
                    )
                    holder[(slot.node, g)] = ev.job
        elif isinstance(ev, (T.JobFinished, T.JobFailed, T.JobCancelled, T.VictimReleased, T.JobRequeued)):
            for key in [k for k, job in holder.items() if job == ev.job]:
                del holder[key]


def kill_scheduler_when(cluster: Cluster, proc, kind) -> int:
    """SIGKILL the scheduler the moment an event of `kind` reaches the log; returns its n."""

    async def go(nc, js):
        seen = asyncio.get_running_loop().create_future()

        async def on_msg(msg):
            record = T.decode_record(msg.data)
            if isinstance(record.event, kind) and not seen.done():
                os.kill(proc.pid, signal.SIGKILL)
                seen.set_result(record.n)

        sub = await js.subscribe(
            f"{bus.LOG_PREFIX}.>",
            stream=bus.EV_STREAM,
            ordered_consumer=True,
            cb=on_msg,
            config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
        )
        n = await asyncio.wait_for(seen, 30)
        await sub.unsubscribe()
        return n

    return cluster._run(go)


def test_scheduler_killed_mid_saga_loses_nothing_and_the_saga_ends(tmp_path):
    with Cluster(tmp_path) as c:
        s1 = c.scheduler("s1")
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        # Slow steps: the victims reach their safe point while no scheduler runs.
        c.send(
            low("v1", 4, train_command(100_000, step_ms=400)),
            low("v2", 4, train_command(100_000, step_ms=400)),
        )
        c.wait(lambda rs: len(matching(rs, T.JobRunning)) == 2, what="victims running")
        time.sleep(1.5)  # the SDK is loaded
        c.send(
            T.Submit(
                job="urgent",
                team="ops",
                user="kim",
                level=0,
                gpus=8,
                gpu_models=["H100"],
                est_runtime_s=10,
                command=sleep_command(1),
            )
        )
        planned_n = kill_scheduler_when(c, s1, T.PreemptionPlanned)
        s1.wait(10)
        before = c.records()
        assert not matching(before, T.PreemptionCommitted)
        c.scheduler("s2")
        records = c.wait(
            lambda rs: matching(rs, T.PreemptionCommitted) or matching(rs, T.PreemptionRolledBack),
            timeout_s=30,
            what="saga ended",
        )
        records = c.wait_for(T.JobFinished, job="urgent", timeout_s=20)
        assert [r.n for r in records] == list(range(1, len(records) + 1))  # nothing lost or doubled
        assert records[: len(before)] == before and planned_n <= len(before)
        rebuild(records)  # hash chain and digests hold across the takeover
        assert_no_gpu_held_twice(records)
        accepted = [r.input_seq for r in records if isinstance(r.event, T.InputAccepted) and r.input_seq]
        assert len(accepted) == len(set(accepted))  # no input applied twice
        writers = {h.get(bus.WRITER_HEADER) for _, _, h in c.raw_log()}
        assert writers == {"s1", "s2"}
        # Each leader recorded its start, so the log re-decides exactly across the takeover.
        starts = [r.event.instance for r in records if isinstance(r.event, T.SchedulerStarted)]
        assert starts == ["s1", "s2"]
        redecide = Redecide()
        for record in records:
            redecide.feed(record.n, T.encode(record))
        redecide.finish()
        assert redecide.summary()["same"], redecide.words()


def test_second_scheduler_beside_the_first_never_appends(tmp_path):
    with Cluster(tmp_path) as c:
        s1 = c.scheduler("s1")
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")  # s1 leads: it has appended
        c.scheduler("s2")
        c.send(*[T.Submit(job=f"j{i}", team="a", user="u", level=7, gpus=8) for i in range(30)])
        c.wait_for(T.JobSubmitted, count=30)
        time.sleep(1.0)  # several lease renewals and ticks of both
        assert {h.get(bus.WRITER_HEADER) for _, _, h in c.raw_log()} == {"s1"}
        # The standby takes over when the leader stops, and only then appends.
        c.terminate(s1)
        c.send(T.Submit(job="after", team="a", user="u", level=7, gpus=8))
        records = c.wait_for(T.JobSubmitted, job="after")
        writers = [h.get(bus.WRITER_HEADER) for _, _, h in c.raw_log()]
        assert writers[-1] == "s2" and set(writers) == {"s1", "s2"}
        assert writers == sorted(writers)  # s1's records, then s2's: never interleaved
        rebuild(records)


def test_host_agent_killed_and_restarted_repeats_no_action(tmp_path):
    trace = tmp_path / "starts.txt"
    # A node timeout no restart takes, even on a loaded machine: a host declared lost would
    # have its job requeued and rightly started again.
    with Cluster(tmp_path, node_timeout_ms=60_000) as c:
        c.scheduler()
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(
            T.Submit(job="long", team="a", user="u", level=5, gpus=2, command=sleep_command(4, trace)),
            T.Submit(job="other", team="a", user="u", level=5, gpus=2, command=sleep_command(60)),
        )
        c.wait(lambda rs: len(matching(rs, T.JobRunning)) == 2, what="jobs running")
        c.kill(agent)
        c.send(T.Cancel(job="other"))  # decided while the agent is down
        c.wait_for(T.JobCancelled, job="other")
        c.agent("h1", "8xH100")
        records = c.wait_for(T.JobFinished, job="long", timeout_s=20)
        assert len(trace.read_text().split()) == 1  # started once, not again after the restart
        started = [inp for _, inp in c.inputs() if isinstance(inp, T.Started) and inp.job == "long"]
        assert len(started) == 1
        time.sleep(1.0)
        records = c.records()
        assert len(matching(records, T.JobFinished, job="long")) == 1
        assert not [r for r in matching(records, T.InputRejected) if r.event.job in ("long", "other")]
        # The cancelled job's process, adopted after the restart, was stopped.
        other_dir = next((tmp_path / "hosts" / "h1" / "runs").glob("other-*"))
        deadline = time.monotonic() + 10
        while not (other_dir / "exit.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (other_dir / "exit.json").exists()


def test_restarted_scheduler_starts_from_its_snapshot_and_the_tail(tmp_path):
    with Cluster(tmp_path) as c:
        s1 = c.scheduler("s1", "--snapshot-every-events", "20")
        c.send(T.NodeUp(node="n1", gpu_model="H100", gpus=8))
        c.send(*[T.Submit(job=f"j{i}", team="a", user="u", level=7, gpus=8) for i in range(30)])
        c.wait_for(T.JobSubmitted, count=30)

        async def snapshot(nc, js):
            return await bus.load_snapshot_obj(js)

        state, covered = c._run(snapshot)
        assert state is not None and 0 < covered and state.canonical.events_n >= 20
        c.kill(s1)
        c.send(*[T.Submit(job=f"k{i}", team="a", user="u", level=7, gpus=8) for i in range(5)])
        c.scheduler("s2")
        records = c.wait_for(T.JobSubmitted, count=35)
        full = rebuild(records)
        assert sorted(j for j in full.canonical.jobs) == sorted(
            [f"j{i}" for i in range(30)] + [f"k{i}" for i in range(5)]
        )
        assert f"(snapshot at XR_EV seq {covered} + " in (c.logs / "s2.log").read_text()


def test_silent_host_is_lost_its_jobs_requeued_and_it_rejoins_when_back(tmp_path):
    with Cluster(tmp_path, node_timeout_ms=2000) as c:
        c.scheduler()
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        trace = tmp_path / "starts.txt"
        c.send(T.Submit(job="j", team="a", user="u", level=5, gpus=4, command=sleep_command(60, trace)))
        c.wait_for(T.JobRunning, job="j")
        c.kill(agent)
        records = c.wait_for(T.NodeLost, node="h1", timeout_s=15)
        assert matching(records, T.NodeLost, node="h1")[0].event.jobs == ["j"]
        assert matching(records, T.JobRequeued, job="j")
        c.agent("h1", "8xH100")  # back: stops the orphaned run, rejoins, gets the job again
        records = c.wait_for(T.NodeJoined, node="h1", count=2, timeout_s=20)
        records = c.wait_for(T.JobRunning, job="j", count=2, timeout_s=20)
        deadline = time.monotonic() + 10
        while (
            len(trace.read_text().split()) < 2 or pid_alive(int(trace.read_text().split()[0]))
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        first, second = (int(pid) for pid in trace.read_text().split())
        assert not pid_alive(first) and pid_alive(second)  # the orphan was stopped, not doubled
        rebuild(records)
