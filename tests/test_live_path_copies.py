"""Two verified copies of the checkpoints a job writes itself (`xirang job checkpoint-saved
--path`), on the live system: the host copies each (a folder of shards here) to a second
storage before it reports it, and a resume whose first copy is spoilt or gone restores the
same step from the second (from this host's disk, a second checkpoint root, or the disk of
the host that wrote it), falling back to an older checkpoint only when both are bad. A link
the job planted is never copied nor served."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import msgspec
import pytest

from agents import ckptpath, pathcopy
from agents.local_cluster import Cluster, matching, sleep_command
from agents.runfolders import run_folders
from core import types as T

pytestmark = pytest.mark.timeout(240)

# A plain Python job that checkpoints a folder of two shards every second (and at the
# notice), and resumes from $XR_RESUME_PATH. With $LINK_AT it plants a link in that step's
# checkpoint, pointing out of its folder.
JOB = """\
import os, pathlib, signal, subprocess, sys, time
ckdir = pathlib.Path(os.environ["XR_CKPT_DIR"])
resume = os.environ.get("XR_RESUME_PATH", "")
step = int((pathlib.Path(resume) / "model.bin").read_text().split()[0]) if resume else 0
print("resumed from", resume or "scratch", "at step", step, flush=True)
notice = []
signal.signal(signal.SIGUSR1, lambda *a: notice.append(1))
link_at = int(os.environ.get("LINK_AT", "-1"))

def save(step):
    path = ckdir / f"step-{step}"
    (path / "shards").mkdir(parents=True, exist_ok=True)
    (path / "model.bin").write_text(f"{step} weights")
    (path / "shards" / "optim-0.bin").write_bytes(os.urandom(600 * 1024))  # two served chunks
    if step >= link_at >= 0:
        (path / "peek").symlink_to("/etc/hostname")
    subprocess.run(["xirang", "job", "checkpoint-saved", "--step", str(step), "--path", str(path)], check=True)

last = time.monotonic()
while step < 100000:
    time.sleep(0.02)
    step += 1
    if notice:
        save(step)
        print("saved at the notice, step", step, flush=True)
        sys.exit(0)
    if time.monotonic() - last > 1.0:
        save(step)
        last = time.monotonic()
"""


def victim(**env: str) -> T.Submit:
    prefix = [f"{k}={v}" for k, v in env.items()]
    return T.Submit(
        job="v",
        team="research",
        user="ana",
        level=6,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=600,
        ckpt_interval_s=1,
        ckpt_cost_s=1,
        restore_cost_s=1,
        preempt_signal="USR1",
        grace_s=30,
        command=(["env", *prefix] if prefix else []) + [sys.executable, "-c", JOB],
    )


def urgent(job: str, seconds: float = 4) -> T.Submit:
    return T.Submit(
        job=job,
        team="ops",
        user="kim",
        level=0,
        gpus=8,
        gpu_models=["H100"],
        est_runtime_s=5,
        command=sleep_command(seconds),
    )


def output_of(cluster: Cluster, node: str, n: int, wanted: str = "resumed from") -> str:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = run_folders(cluster.root / "hosts" / node / "runs", "v", n)
        if found and (found[-1] / "output.log").exists() and wanted in (found[-1] / "output.log").read_text():
            return (found[-1] / "output.log").read_text()
        time.sleep(0.1)
    raise AssertionError(f"no {wanted!r} in the output of run {n} on {node}")


def host_copy(cluster: Cluster, node: str, ckpt: T.CheckpointRecorded) -> Path:
    return (
        pathcopy.host_job_folder(cluster.root / "hosts" / node, "v")
        / pathcopy.digest_hex(ckpt.digest)
        / Path(ckpt.path).name
    )


def preempt_and_resume(cluster: Cluster, urgent_job: str, round_: int) -> list[T.Record]:
    """Preempt v with an urgent job; returns the records once v was released."""
    cluster.wait_for(T.CheckpointRecorded, job="v", count=2 * round_, timeout_s=40)
    cluster.send(urgent(urgent_job))
    return cluster.wait_for(T.VictimReleased, job="v", count=round_, timeout_s=40)


def test_a_spoilt_or_lost_first_copy_restores_the_same_step_from_the_hosts_copy_and_both_bad_fall_back(
    tmp_path,
):
    with Cluster(tmp_path) as cluster:
        cluster.scheduler()
        cluster.agent("h1", "8xH100", 2)
        cluster.wait_for(T.NodeJoined, node="h1")
        cluster.send(victim())
        records = preempt_and_resume(cluster, "u1", 1)
        newest = matching(records, T.CheckpointRecorded, job="v")[-1].event
        # Reported once its second copy on the host's disk read back as the reported digest.
        copy = host_copy(cluster, "h1", newest)
        assert ckptpath.digest_path(copy)[0] == newest.digest
        (Path(newest.path) / "shards" / "optim-0.bin").write_bytes(b"bit rot")
        records = cluster.wait_for(T.JobRunning, job="v", count=2, timeout_s=40)
        resume = matching(records, T.JobResumeRequested, job="v")[-1]
        text = output_of(cluster, "h1", resume.n)
        assert f"checkpoint of step {newest.step} at {newest.path}: its content no longer matches" in text
        assert "its second copy on h1's disk matches" in text
        restored = Path(ckptpath.job_roots([tmp_path / "ckpt"], "v")[0]) / ".xr-copies"
        assert f"resumed from {restored}" in text and f"at step {newest.step}" in text
        assert matching(records, T.JobRunning, job="v")[-1].event.restored_copy == 2
        assert not matching(records, T.CheckpointFallback, job="v")

        # Again, the first copy gone and the second spoilt: the one before is resumed from.
        records = preempt_and_resume(cluster, "u2", 2)
        saved = [r.event for r in matching(records, T.CheckpointRecorded, job="v")]
        spoilt, previous = saved[-1], saved[-2]
        shutil.rmtree(spoilt.path)
        (host_copy(cluster, "h1", spoilt) / "model.bin").write_text("0 garbage")
        records = cluster.wait_for(T.CheckpointFallback, job="v", timeout_s=40)
        fallback = matching(records, T.CheckpointFallback, job="v")[0].event
        assert (fallback.bad_digest, fallback.to_step) == (spoilt.digest, previous.step)
        resume = matching(records, T.JobResumeRequested, job="v")[-1]
        text = output_of(cluster, "h1", resume.n)
        assert "no second copy of it is left" in text
        assert f"resumed from {previous.path} at step {previous.step}" in text
        records = cluster.wait_for(T.JobRunning, job="v", count=3, timeout_s=40)
        assert matching(records, T.JobRunning, job="v")[-1].event.restored_copy == 1

        # The host keeps copies of the job's last few checkpoints only.
        records = cluster.wait_for(T.CheckpointRecorded, job="v", count=8, timeout_s=40)
        folder = pathcopy.host_job_folder(cluster.root / "hosts" / "h1", "v")
        deadline = time.monotonic() + 10
        while len(list(folder.iterdir())) > pathcopy.COPIES_KEPT and time.monotonic() < deadline:
            time.sleep(0.1)
        kept = sorted(p.name for p in folder.iterdir())
        assert len(kept) <= pathcopy.COPIES_KEPT
        assert pathcopy.digest_hex(matching(records, T.CheckpointRecorded, job="v")[-1].event.digest) in kept

        # The job ends: its copies on the host's disk go.
        cluster.send(T.Cancel(job="v"))
        cluster.wait_for(T.JobCancelled, job="v")
        deadline = time.monotonic() + 20
        while folder.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not folder.exists()


def test_a_second_root_holds_the_copy_and_a_checkpoint_with_a_planted_link_keeps_one_copy(tmp_path):
    first, second = tmp_path / "shared-a", tmp_path / "shared-b"
    with Cluster(tmp_path) as cluster:
        cluster.scheduler()
        cluster.agent("h1", "8xH100", 2, "--ckpt-root", str(first), "--ckpt-root", str(second))
        cluster.wait_for(T.NodeJoined, node="h1")
        cluster.send(victim())
        records = preempt_and_resume(cluster, "u1", 1)
        newest = matching(records, T.CheckpointRecorded, job="v")[-1].event
        assert newest.path.startswith(str(first))
        in_second = pathcopy.root_copy(
            ckptpath.job_roots([second], "v")[0], newest.digest, Path(newest.path).name
        )
        assert ckptpath.digest_path(in_second)[0] == newest.digest
        shutil.rmtree(newest.path)
        records = cluster.wait_for(T.JobRunning, job="v", count=2, timeout_s=40)
        text = output_of(cluster, "h1", matching(records, T.JobResumeRequested, job="v")[-1].n)
        assert f"resuming from step {newest.step} at {in_second} (copy 2)" in text
        assert f"resumed from {in_second} at step {newest.step}" in text
        cluster.send(T.Cancel(job="v"))
        cluster.wait_for(T.JobCancelled, job="v")

        # A job that plants a link in its checkpoint: reported with one copy, said so; the
        # link's target is copied nowhere.
        cluster.send(msgspec.structs.replace(victim(LINK_AT="0"), job="w"))
        records = cluster.wait_for(T.CheckpointRecorded, job="w", count=2, timeout_s=40)
        linked = matching(records, T.CheckpointRecorded, job="w")[-1].event
        assert (Path(linked.path) / "peek").is_symlink()
        found = run_folders(
            cluster.root / "hosts" / "h1" / "runs", "w", matching(records, T.JobStartRequested, job="w")[-1].n
        )
        text = (found[-1] / "output.log").read_text()
        assert (
            f"checkpoint of step {linked.step} at {linked.path} keeps one copy: no second copy (peek is a link)"
            in text
        )
        assert not pathcopy.root_copy(
            ckptpath.job_roots([second], "w")[0], linked.digest, "x"
        ).parent.exists()
        assert "keeps one copy" in (cluster.logs / "h1.log").read_text()
        cluster.send(T.Cancel(job="w"))
        cluster.wait_for(T.JobCancelled, job="w")


def test_a_resume_on_another_host_reads_the_second_copy_from_the_host_that_wrote_it(tmp_path):
    with Cluster(tmp_path) as cluster:
        cluster.scheduler()
        cluster.agent("h1", "8xH100", 2)
        cluster.wait_for(T.NodeJoined, node="h1")
        cluster.send(victim())
        cluster.wait_for(T.CheckpointRecorded, job="v", count=2, timeout_s=40)
        cluster.send(urgent("u1", seconds=600))  # keeps h1's GPUs: v resumes elsewhere
        records = cluster.wait_for(T.VictimReleased, job="v", timeout_s=40)
        newest = matching(records, T.CheckpointRecorded, job="v")[-1].event
        shutil.rmtree(newest.path)  # the first copy is lost; the second lies on h1's disk
        cluster.agent("h2", "8xH100", 2)
        records = cluster.wait_for(T.JobRunning, job="v", count=2, timeout_s=60)
        resume = matching(records, T.JobResumeRequested, job="v")[-1]
        assert resume.event.placement[0].node == "h2"
        assert resume.event.resume_points[0].node == "h1"
        text = output_of(cluster, "h2", resume.n)
        assert "its second copy, read from h1's disk, matches" in text
        assert f"at step {newest.step}" in text.split("resumed from")[-1]
        assert matching(records, T.JobRunning, job="v")[-1].event.restored_copy == 2
        cluster.send(T.Cancel(job="v"), T.Cancel(job="u1"))
        cluster.wait_for(T.JobCancelled, job="v")


def test_the_agent_serves_no_link_and_nothing_outside_a_jobs_own_copy(tmp_path):
    paths_root = tmp_path / "ckpt-paths"
    digest_hex = "ab" * 32
    mine = paths_root / "v" / digest_hex / "step-3"
    mine.mkdir(parents=True)
    (mine / "model.bin").write_text("3 weights")
    (tmp_path / "secret").write_text("another job's")
    (mine / "peek").symlink_to(tmp_path / "secret")
    (paths_root / "other" / digest_hex / "step-9").mkdir(parents=True)
    (paths_root / "other" / digest_hex / "step-9" / "model.bin").write_text("9 theirs")

    def ask(job_tok: str, **body) -> tuple[dict, bytes]:
        head, _, data = pathcopy.reply_for(paths_root, job_tok, {"copy": digest_hex, **body}).partition(b"\n")
        return json.loads(head), data

    assert "is a link" in ask("v", list=True)[0]["error"]  # a copy holding a link is not served
    assert "is a link" in ask("v", file="peek")[0]["error"]
    assert "not a path inside" in ask("v", file="../../other/" + digest_hex + "/step-9/model.bin")[0]["error"]
    assert ask("v", file="model.bin") == ({"size": 9}, b"3 weights")
    os.unlink(mine / "peek")
    assert ask("v", list=True)[0] == {"name": "step-3", "files": [["model.bin", 9]]}
    (paths_root / "w").symlink_to(paths_root / "other")  # a job's folder that is a link
    assert "error" in ask("w", list=True)[0]


def test_a_copy_that_would_leave_its_disk_below_the_floor_is_refused_and_says_why(tmp_path):
    job_root = tmp_path / "ckpt" / "v"
    (job_root / "step-5").mkdir(parents=True)
    (job_root / "step-5" / "model.bin").write_bytes(b"5" * 2**20)
    digest, _ = ckptpath.digest_path(job_root / "step-5")
    dest = tmp_path / "copies"
    dest.mkdir()
    rel = f"{pathcopy.digest_hex(digest)}/step-5"
    floor = shutil.disk_usage(dest).free  # any copy at all would go below it
    with pytest.raises(pathcopy.CopyRefused, match="below the host's floor"):
        pathcopy.copy_verified(job_root, "step-5", dest, rel, digest, floor)
    assert not (dest / pathcopy.digest_hex(digest)).exists()
    assert pathcopy.copy_verified(job_root, "step-5", dest, rel, digest, 0) == 2**20
    (dest / rel / "model.bin").write_bytes(b"spoilt")  # a spoilt copy is replaced by a good one
    assert pathcopy.copy_verified(job_root, "step-5", dest, rel, digest, 0) == 2**20
    assert pathcopy.digest_at(dest, rel) == digest


@pytest.mark.timeout(30)
def test_a_fifo_or_a_link_planted_in_a_checkpoint_is_refused_without_waiting_on_it(tmp_path):
    job_root = tmp_path / "ckpt" / "v"
    (job_root / "step-5").mkdir(parents=True)
    (job_root / "step-5" / "model.bin").write_text("5 weights")
    os.mkfifo(job_root / "step-5" / "queue")  # opening it for reading would wait for a writer
    os.mkfifo(job_root / "step-6")
    (job_root / "step-7").symlink_to(tmp_path / "elsewhere")
    dest = tmp_path / "copies"
    for name, digest in (("step-5", "sha256-tree:" + "a" * 64), ("step-6", "sha256:" + "a" * 64)):
        with pytest.raises(pathcopy.CopyRefused, match="not a plain file or folder"):
            pathcopy.copy_verified(job_root, name, dest, f"{'a' * 64}/{name}", digest, 0)
    with pytest.raises(pathcopy.CopyRefused, match="link"):
        pathcopy.copy_verified(job_root, "step-7", dest, f"{'a' * 64}/step-7", "sha256:" + "a" * 64, 0)
    assert not list(dest.rglob("*step-*"))
