"""Preemption sagas on the live system: real training jobs (the example, with the SDK)
checkpoint to the JetStream object store, release and resume; a stuck victim rolls the
whole saga back; a corrupted checkpoint is detected and the job falls back."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import pytest

from transport import checkpoints as ckptstore
from agents import ckptcopy, sdk
from agents.local_cluster import Cluster, matching, sleep_command, train_command
from live_helpers import metrics, run_folder, stuck_command
from core import rebuild
from core import types as T
from projections.notices import Notifier

pytestmark = pytest.mark.timeout(120)


def urgent(job: str = "urgent", seconds: float = 1.0, level: int = 0) -> T.Submit:
    return T.Submit(
        job=job,
        team="ops",
        user="kim",
        level=level,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=10,
        command=sleep_command(seconds),
    )


def low(
    job: str, gpus: int, command: list[str], level: int = 6, ckpt_cost_s: float = 1, team: str = ""
) -> T.Submit:
    return T.Submit(
        job=job,
        team=team or f"team-{job}",
        user=f"user-{job}",
        level=level,
        gpus=gpus,
        gpu_models=["H100"],
        est_runtime_s=600,
        ckpt_interval_s=5,
        ckpt_cost_s=ckpt_cost_s,
        restore_cost_s=ckpt_cost_s,
        command=command,
    )


UNTRAINED_LOSS = math.log(2)  # logistic loss of the zero model the example starts from


def wait_metrics(path: Path, timeout_s: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and metrics(path):
            return metrics(path)
        time.sleep(0.1)
    raise AssertionError(f"no metrics in {path}")


def run_dir(cluster: Cluster, job: str, n: int) -> Path:
    return run_folder(cluster.root / "hosts" / "h1" / "runs", job, n)


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        yield c


def test_multi_victim_preemption_commits_and_victims_resume_from_their_checkpoints(cluster):
    victims = ["v1", "v2", "v3"]
    # Saving takes a tenth of a second: past a couple of seconds of training, a save is
    # cheaper than the progress it keeps. The victims are of the preemptor's own team: a
    # level-3 job of another team could take only what they hold beyond their fair shares.
    cluster.send(
        low("v1", 4, train_command(100_000, seed=1), ckpt_cost_s=0.1, team="ops"),
        low("v2", 2, train_command(100_000, seed=2), ckpt_cost_s=0.1, team="ops"),
        low("v3", 2, train_command(100_000, seed=3), level=7, ckpt_cost_s=0.1, team="ops"),
    )
    records = cluster.wait(
        lambda rs: all(matching(rs, T.JobRunning, job=v) for v in victims), what="victims running"
    )
    for v in victims:  # each has trained a little
        first_run = run_dir(cluster, v, matching(records, T.JobStartRequested, job=v)[0].n)
        wait_metrics(first_run / "output.log")
    time.sleep(3)
    # A level-3 job: its wait is cheap next to the victims' unsaved progress, so each victim
    # is told to save a checkpoint before it lets go (a level-0 job would not wait for that).
    cluster.send(urgent(seconds=1.5, level=3))
    records = cluster.wait_for(T.PreemptionCommitted, timeout_s=20)
    planned = matching(records, T.PreemptionPlanned)[0].event
    assert sorted(planned.victims) == victims and planned.benefit > planned.cost
    assert all(n.event.checkpoint_needed for n in matching(records, T.VictimNotified))
    records = cluster.wait(
        lambda rs: all(len(matching(rs, T.JobRunning, job=v)) == 2 for v in victims),
        timeout_s=30,
        what="victims resumed",
    )
    assert matching(records, T.JobFinished, job="urgent")
    for v in victims:
        saved = matching(records, T.CheckpointRecorded, job=v)[-1].event
        resume = matching(records, T.JobResumeRequested, job=v)[0]
        assert resume.event.ckpt_digest == saved.digest
        # The loss carries on: the resumed run starts at the checkpoint's step, not at 0.
        lines = wait_metrics(run_dir(cluster, v, resume.n) / "output.log")
        assert saved.step > 0 and lines[0]["step"] == saved.step and lines[0].get("resumed") == 1
        assert lines[0]["loss"] < UNTRAINED_LOSS
    rebuild(records)


def test_victim_that_never_releases_rolls_everything_back(cluster):
    cluster.send(low("stuck", 2, stuck_command()), low("good", 6, train_command(100_000)))
    cluster.wait(
        lambda rs: all(matching(rs, T.JobRunning, job=v) for v in ("stuck", "good")), what="victims running"
    )
    cluster.send(urgent())
    records = cluster.wait_for(T.PreemptionRolledBack, timeout_s=25)
    rolled = matching(records, T.PreemptionRolledBack)[0].event
    assert rolled.reason == "deadline_passed"
    assert matching(records, T.VictimReleased, job="good")
    assert matching(records, T.NoticeWithdrawn, job="stuck")
    back = matching(records, T.JobResumeRequested, job="good")
    assert back and back[0].event.reason == "rolled_back"
    assert not matching(records, T.JobStartRequested, job="urgent")
    assert not matching(records, T.PreemptionCommitted)
    records = cluster.wait(lambda rs: len(matching(rs, T.JobRunning, job="good")) == 2, what="good resumed")
    state = rebuild(records)
    assert (
        state.canonical.jobs["stuck"].state == "running" and state.canonical.jobs["urgent"].state == "queued"
    )
    assert state.canonical.jobs["good"].state == "running"


def test_a_checkpoint_corrupted_in_both_copies_falls_back_to_the_previous_one(cluster):
    cluster.send(low("c1", 8, train_command(100_000, ckpt_s=0.5, step_ms=20)))
    cluster.wait_for(T.CheckpointRecorded, count=2, job="c1")
    cluster.send(urgent(seconds=2))
    records = cluster.wait_for(T.PreemptionCommitted)
    # Its last periodic checkpoint is under a second old: it lets go without saving again.
    assert [n.event.checkpoint_needed for n in matching(records, T.VictimNotified)] == [False]
    ckpts = [r.event for r in matching(records, T.CheckpointRecorded, job="c1")]
    newest, previous = ckpts[-1], ckpts[-2]

    async def corrupt(nc, js):
        # where the log recorded it: `xr-ckpt:<node>/<its run's slot>`
        node, _, slot = newest.path[len("xr-ckpt:") :].rpartition("/")
        found = await ckptstore.get_located(js, "c1", slot, node)
        assert found is not None and sdk.digest_of(found[1]) == newest.digest
        data = bytearray(found[1])
        data[len(data) // 2] ^= 0xFF
        await ckptstore.put(js, "c1", found[0], slot, bytes(data))
        # and its second copy, on the disk of the host that wrote it
        copy = ckptcopy.job_folder(cluster.root / "hosts" / node / ckptcopy.COPIES_DIR, "c1") / slot
        copy.write_bytes(bytes(data))

    cluster._run(corrupt)

    records = cluster.wait(
        lambda rs: len(matching(rs, T.JobRunning, job="c1")) == 2, timeout_s=30, what="c1 resumed"
    )
    fallback = matching(records, T.CheckpointFallback, job="c1")[0].event
    assert fallback.bad_digest == newest.digest
    assert (fallback.to_step, fallback.to_digest) == (previous.step, previous.digest)
    resume = matching(records, T.JobResumeRequested, job="c1")[0]
    lines = wait_metrics(run_dir(cluster, "c1", resume.n) / "output.log")
    assert lines[0]["step"] == previous.step and lines[0]["resumed"] == 1
    # and c1's user is told, from this real log: the notice, the requeue, and the fallback
    # with the progress it lost
    user = matching(records, T.JobSubmitted, job="c1")[0].event.user
    told = {n.kind: n for n in Notifier().all(enumerate(records, 1)) if n.job == "c1"}
    assert {"preemption_notice", "preempted", "checkpoint_fallback"} <= set(told)
    assert all(n.user == user for n in told.values())
    assert f"from step {previous.step}" in told["checkpoint_fallback"].message
    assert "of progress" in told["checkpoint_fallback"].message


STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, lambda *a: None)  # no SDK, and deaf to SIGTERM
time.sleep(120)
"""


def test_victim_without_the_sdk_gets_sigterm_then_sigkill_and_is_released(cluster):
    cluster.send(
        T.Submit(
            job="plain",
            team="a",
            user="u",
            level=6,
            gpus=8,
            gpu_models=["H100"],
            est_runtime_s=600,
            ckpt_interval_s=0,
            command=[sys.executable, "-c", STUBBORN],
        )
    )
    records = cluster.wait_for(T.JobRunning, job="plain")
    time.sleep(3)  # past most of the agent's wait for an SDK to show up
    cluster.send(urgent())
    records = cluster.wait_for(T.JobRunning, job="urgent", timeout_s=20)
    assert matching(records, T.VictimReleased, job="plain") and matching(records, T.PreemptionCommitted)
    run = run_dir(cluster, "plain", matching(records, T.JobStartRequested, job="plain")[0].n)
    assert not (run / "exit.json").exists()  # killed with its wrapper: SIGKILL, not an exit
    assert not (run / "sdk").exists()
