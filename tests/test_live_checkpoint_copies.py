"""Two verified copies of every SDK checkpoint, on the live system (a real nats-server, the
scheduler, host agents and training jobs as processes): by default each checkpoint lies in
the bus's store and on the disk of the host that wrote it, both read back before it is
reported; a resume whose bus copy is gone or corrupt restores the same step from the host's
copy (served by that host's agent to the job, on whichever host it now runs), and says so
to the job and in the log; only both copies lost fall back to the checkpoint before."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import msgspec
import pytest

from agents import ckptcopy, sdk
from agents.local_cluster import Cluster, matching, sleep_command, train_command
from core import types as T
from data_helpers import write_jsonl, xirang
from live_helpers import metrics, run_folder
from transport import checkpoints as ckptstore

pytestmark = pytest.mark.timeout(120)

SCHEME = "xr-ckpt:"


def trainer(job: str) -> T.Submit:
    return T.Submit(
        job=job,
        team=f"team-{job}",
        user=f"user-{job}",
        level=6,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=600,
        ckpt_interval_s=5,
        ckpt_cost_s=1,
        restore_cost_s=1,
        command=train_command(100_000, ckpt_s=0.5, step_ms=20),
    )


def urgent(seconds: float) -> T.Submit:
    return T.Submit(
        job="urgent",
        team="ops",
        user="kim",
        level=0,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=10,
        command=sleep_command(seconds),
    )


def located(ckpt: T.CheckpointRecorded) -> tuple[str, str]:
    """(node, slot) where the log says the checkpoint lies (`xr-ckpt:<node>/<slot>`)."""
    node, _, slot = ckpt.path[len(SCHEME) :].rpartition("/")
    return node, slot


def host_copy(cluster: Cluster, node: str, job: str, name: str) -> Path:
    return ckptcopy.job_folder(cluster.root / "hosts" / node / ckptcopy.COPIES_DIR, job) / name


def bus_copy(cluster: Cluster, job: str, node: str, name: str) -> bytes | None:
    async def get(nc, js):
        return await ckptstore.get(js, job, name, node)

    return cluster._run(get)


def spoil_bus_copy(cluster: Cluster, job: str, node: str, name: str) -> None:
    """Overwrite the bus's copy of object `name` with other bytes (its digest then fails)."""

    async def corrupt(nc, js):
        found = await ckptstore.get_located(js, job, name, node)
        assert found is not None
        data = bytearray(found[1])
        data[len(data) // 2] ^= 0xFF
        await ckptstore.put(js, job, found[0], name, bytes(data))

    cluster._run(corrupt)


def spoil_file(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def output_of(
    cluster: Cluster, node: str, job: str, n: int, timeout_s: float = 20.0
) -> tuple[str, list[dict]]:
    path = run_folder(cluster.root / "hosts" / node / "runs", job, n) / "output.log"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and metrics(path):
            return path.read_text(), metrics(path)
        time.sleep(0.1)
    raise AssertionError(f"no metrics in {path}")


@pytest.fixture
def cluster(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        yield c


def test_by_default_every_checkpoint_has_two_verified_copies_the_bus_and_the_hosts_disk(cluster):
    cluster.send(trainer("c2"))
    records = cluster.wait_for(T.CheckpointRecorded, count=2, job="c2")
    assert matching(records, T.JobStartRequested, job="c2")[0].event.ckpt_copies == 2
    for ckpt in [r.event for r in matching(records, T.CheckpointRecorded, job="c2")]:
        node, slot = located(ckpt)
        assert node == "h1"
        on_bus = bus_copy(cluster, "c2", node, slot)
        on_disk = host_copy(cluster, node, "c2", slot).read_bytes()
        # The manifest, the same bytes in both places, under the digest the log recorded ...
        assert on_bus == on_disk and sdk.digest_of(on_disk) == ckpt.digest
        # ... and so is every tensor object it names (the SDK wrote them both ways too).
        tensors = sorted(p.name for p in host_copy(cluster, node, "c2", slot).parent.glob(f"{slot}_*"))
        assert tensors
        for name in tensors:
            assert bus_copy(cluster, "c2", node, name) == host_copy(cluster, node, "c2", name).read_bytes()


def test_a_lost_bus_copy_restores_the_same_step_from_the_writing_hosts_copy_on_another_host(
    cluster, tmp_path
):
    cluster.send(trainer("c1"))
    cluster.wait_for(T.CheckpointRecorded, count=2, job="c1")
    # The urgent job takes h1 for long enough that c1 resumes on h2, once h2 is there.
    cluster.send(urgent(seconds=15))
    records = cluster.wait_for(T.PreemptionCommitted)
    newest = matching(records, T.CheckpointRecorded, job="c1")[-1].event
    node, slot = located(newest)
    spoil_bus_copy(cluster, "c1", node, slot)
    assert bus_copy(cluster, "c1", node, slot) is not None
    assert sdk.digest_of(bus_copy(cluster, "c1", node, slot)) != newest.digest

    cluster.agent("h2", "8xH100")
    records = cluster.wait(
        lambda rs: len(matching(rs, T.JobRunning, job="c1")) == 2, timeout_s=40, what="c1 resumed"
    )
    resume = matching(records, T.JobResumeRequested, job="c1")[0]
    assert resume.event.nodes == ["h2"] and resume.event.ckpt_digest == newest.digest
    # The same step, no fallback; the log says the second copy was read ...
    assert not matching(records, T.CheckpointFallback, job="c1")
    assert matching(records, T.JobRunning, job="c1")[-1].event.restored_copy == 2
    # ... and so is the job told, on h2, from h1's disk.
    text, lines = output_of(cluster, "h2", "c1", resume.n)
    assert lines[0]["step"] == newest.step and lines[0]["resumed"] == 1
    assert f"restored step {newest.step} (the resume named step {newest.step}) from copy 2" in text, text[
        -800:
    ]
    assert "the bus's copy fails its digest check; read the copy on h1's disk" in text
    # ... and the job's story, from this real log
    story = xirang("audit", "--log", write_jsonl(str(tmp_path / "log.jsonl"), records), "--job", "c1").stdout
    assert "its checkpoint read from copy 2 (the disk of the host that wrote it)" in story, story


def test_both_copies_lost_fall_back_to_the_previous_checkpoint_and_say_so(cluster):
    cluster.send(trainer("c3"))
    cluster.wait_for(T.CheckpointRecorded, count=2, job="c3")
    cluster.send(urgent(seconds=2))
    records = cluster.wait_for(T.PreemptionCommitted)
    ckpts = [r.event for r in matching(records, T.CheckpointRecorded, job="c3")]
    newest, previous = ckpts[-1], ckpts[-2]
    node, slot = located(newest)
    spoil_bus_copy(cluster, "c3", node, slot)
    spoil_file(host_copy(cluster, node, "c3", slot))
    assert hashlib.sha256(host_copy(cluster, node, "c3", slot).read_bytes()).hexdigest() != newest.digest[7:]

    records = cluster.wait(
        lambda rs: len(matching(rs, T.JobRunning, job="c3")) == 2, timeout_s=30, what="c3 resumed"
    )
    fallback = matching(records, T.CheckpointFallback, job="c3")[0].event
    assert fallback.bad_digest == newest.digest
    assert (fallback.to_step, fallback.to_digest) == (previous.step, previous.digest)
    # The previous checkpoint's own first copy was whole.
    assert matching(records, T.JobRunning, job="c3")[-1].event.restored_copy == 1
    resume = matching(records, T.JobResumeRequested, job="c3")[0]
    text, lines = output_of(cluster, "h1", "c3", resume.n)
    assert lines[0]["step"] == previous.step and lines[0]["resumed"] == 1
    assert (
        f"checkpoint step {newest.step}: the bus's copy fails its digest check, and h1's copy fails its digest check"
        in text
    )
    assert f"restored step {previous.step} (the resume named step {newest.step}) from copy 1" in text


def test_a_job_that_ends_leaves_no_copies_on_its_hosts_disk(cluster):
    short = msgspec.structs.replace(trainer("c4"), command=train_command(250, ckpt_s=0.3, step_ms=20))
    cluster.send(short)
    records = cluster.wait_for(T.CheckpointRecorded, job="c4")
    node, slot = located(matching(records, T.CheckpointRecorded, job="c4")[0].event)
    folder = host_copy(cluster, node, "c4", slot).parent
    assert (folder / slot).exists()
    cluster.wait_for(T.JobFinished, job="c4", timeout_s=60)
    deadline = time.monotonic() + 15
    while folder.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not folder.exists(), sorted(p.name for p in folder.iterdir())
