"""A full disk costs new work, never the cluster: on `xirang up` in a small tmpfs, a job
printing without end has its output capped and rotated, the cluster keeps scheduling and
loses nothing; a bus store that a full disk left failing is restarted by `xirang up` once
there is room; a host agent whose disk is full refuses new runs, keeps managing its
running ones (a cancel still stops them) and says so. Real nats-server, real processes, a
real tmpfs (mounted here: needs root)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents import client
from agents.host import pid_alive
from agents.local_cluster import REPO, Cluster
from core import types as T

pytestmark = pytest.mark.timeout(240)

SPEW = "python -c \"import sys; [sys.stdout.write('x' * 4000 + chr(10)) for _ in iter(int, 1)]\""


@contextlib.contextmanager
def tmpfs(path: Path, size_mb: int):
    """A tmpfs of `size_mb` MiB mounted at `path`, unmounted on the way out."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a {size_mb} MiB tmpfs (needs root): {done.stderr.strip()}")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextlib.contextmanager
def up(data: Path, log: Path, hosts: int = 1, simulate: str = "4xH100"):
    """`xirang up --json` as a real process, its output in `log`; yields its first line."""
    out = open(log, "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "xirang.cli", "up", "--json", "--data-dir", str(data)]
        + ["--hosts", str(hosts), "--simulate", simulate, "--tick-ms", "200"],
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    out.close()
    try:
        deadline = time.monotonic() + 30
        while not log.read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)
        yield json.loads(log.read_text().splitlines()[0])
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


def submit(data: Path, job: str, command: str, gpus: int = 1) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "xirang.cli", "submit", job, "--team", "a", "--level", "5"]
        + ["--gpus", str(gpus), "--command", command, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.stdout.startswith("accepted"), done.stdout + done.stderr


def wait_events(url: str, predicate, timeout_s: float = 60.0) -> list[T.Record]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, records = client.state_and_records(url)
        except Exception:  # noqa: BLE001 - the bus may be restarting
            records = []
        if predicate(records):
            return records
        assert time.monotonic() < deadline, [T.type_name(r.event) for r in records[-20:]]
        time.sleep(0.5)


def ended(records, job: str) -> list[str]:
    return [
        T.type_name(r.event)
        for r in records
        if isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled)) and r.event.job == job
    ]


def outputs(data: Path, job: str) -> list[Path]:
    return sorted(data.glob(f"hosts/*/runs/{job}*/output.log*"))


def test_up_in_a_40_mb_tmpfs_caps_a_job_printing_without_end_and_keeps_scheduling(tmp_path):
    with tmpfs(tmp_path / "disk", 40) as disk, up(disk / "xr", tmp_path / "up.log") as info:
        data, url = disk / "xr", info["nats"]
        submit(data, "spew", SPEW)
        wait_events(
            url, lambda rs: any(isinstance(r.event, T.JobRunning) and r.event.job == "spew" for r in rs)
        )
        time.sleep(5)  # it prints far more than the disk holds by now
        for i in range(4):
            submit(data, f"short{i}", "python -c 'print(1)'")
        records = wait_events(
            url, lambda rs: all(ended(rs, f"short{i}") == ["JobFinished"] for i in range(4))
        )
        assert ended(records, "spew") == []  # still printing, never blocked or failed
        kept = sum(p.stat().st_size for p in outputs(data, "spew"))
        assert 0 < kept <= 40 * 2**20 // 8 + 64 * 1024, kept  # xirang up's cap: an eighth of the disk
        assert "output rotated" in outputs(data, "spew")[0].read_text()[:200]
        audit = subprocess.run(
            [sys.executable, "-m", "xirang.cli", "audit", "--nats", url, "--json"]
            + ["--public-key", str(data / "keys" / "scheduler.pub")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert audit.stdout.startswith("{"), audit.stderr
        summary = json.loads(audit.stdout)
        assert summary["ok"] and summary["foreign_messages"] == 0, summary
        assert summary["signatures"] != "not checked (no public key)"


def fill(path: Path) -> Path:
    filler = path / "filler"
    with open(filler, "wb") as fh:
        with contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 2**20)
                fh.flush()
    return filler


def test_up_restarts_its_bus_once_a_full_disk_has_room_again(tmp_path):
    with tmpfs(tmp_path / "disk", 40) as disk, up(disk / "xr", tmp_path / "up.log") as info:
        data, url = disk / "xr", info["nats"]
        submit(data, "before", "sleep 300")
        wait_events(
            url, lambda rs: any(isinstance(r.event, T.JobRunning) and r.event.job == "before" for r in rs)
        )
        filler = fill(disk)
        deadline = time.monotonic() + 90
        scheduler_log = data / "logs" / "scheduler.log"
        # `xirang up` says the disk is full; the scheduler, that its appends go unanswered.
        while (
            "cannot store anything" not in (tmp_path / "up.log").read_text()
            or "its JetStream store cannot write" not in scheduler_log.read_text()
        ):
            assert time.monotonic() < deadline, (tmp_path / "up.log").read_text() + scheduler_log.read_text()[
                -2000:
            ]
            time.sleep(0.5)
        filler.unlink()
        while "restarting the embedded nats-server" not in (tmp_path / "up.log").read_text():
            assert time.monotonic() < deadline + 60, (tmp_path / "up.log").read_text()
            time.sleep(0.5)
        assert all(pid_alive(pid) for pid in info["pids"].values())
        submit(data, "after", "python -c 'print(1)'")
        records = wait_events(url, lambda rs: ended(rs, "after") == ["JobFinished"], timeout_s=90)
        assert ended(records, "before") == []  # still running through it all


def test_an_agent_on_a_full_disk_refuses_new_runs_and_still_manages_its_running_ones(tmp_path):
    with tmpfs(tmp_path / "disk", 16) as disk, Cluster(tmp_path / "c") as c:
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.pub").exists(), 20, "the key")
        agent = c._spawn(
            ["agent", "--nats", c.url, "--node", "h1", "--simulate", "2xH100", "--data-dir", str(disk)]
            + ["--public-key", str(tmp_path / "c" / "keys" / "scheduler.pub"), "--disk-floor-mb", "4"],
            "h1.log",
        )
        c.wait_for(T.NodeJoined, node="h1")
        c.send(T.Submit(job="a", team="t", user="u", level=5, gpus=1, command=["sleep", "300"]))
        c.wait_for(T.JobRunning, job="a")
        filler = fill(disk)
        c.send(T.Submit(job="b", team="t", user="u", level=5, gpus=1, command=["sleep", "1"]))
        # Two orders are right: the host's heartbeat cordons h1 before b is placed (b waits),
        # or b is placed first and the agent refuses the run (b is requeued).
        records = c.wait(
            lambda rs: (
                any(isinstance(r.event, T.JobRequeued) and r.event.job == "b" for r in rs)
                or any(isinstance(r.event, T.NodeCordoned) for r in rs)
                and any(isinstance(r.event, T.JobSubmitted) and r.event.job == "b" for r in rs)
            ),
            20,
            "b refused by the agent or held off by the cordon",
        )
        if any(isinstance(r.event, T.JobStartRequested) and r.event.job == "b" for r in records):
            c.wait_for(T.JobRequeued, job="b")
            log = (c.logs / "h1.log").read_text()
            assert "refusing new runs" in log and "not starting b" in log
        deadline = time.monotonic() + 10  # its next heartbeats say so
        while "host h1 reports itself unhealthy: disk almost full" not in (c.logs / "s1.log").read_text():
            assert time.monotonic() < deadline, (c.logs / "s1.log").read_text()
            time.sleep(0.2)
        c.send(T.Cancel(job="a"))
        c.wait_for(T.JobCancelled, job="a")
        run = next(disk.glob("hosts/h1/runs/a*"))
        deadline = time.monotonic() + 20
        while not (run / "exit.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert agent.poll() is None and "Traceback" not in (c.logs / "h1.log").read_text()
        filler.unlink()
        c.wait_for(T.JobFinished, job="b", timeout_s=60)


def test_the_output_keeper_never_writes_where_a_job_points_its_output_file(tmp_path):
    """The run's folder is the job's: a job that replaces `output.log` with a symlink to
    another file, then prints past a rotation, gets its output kept in a fresh file; the
    file it pointed at is untouched."""
    target = tmp_path / "not-the-jobs"
    target.write_text("keep me\n")
    code = (
        "import os, sys, time; d = os.environ['XR_JOB_DIR']; out = os.path.join(d, 'output.log'); "
        "[time.sleep(0.05) for _ in range(200) if not os.path.exists(out)]; "  # the keeper's file
        f"os.remove(out); os.symlink({str(target)!r}, out); "
        "[sys.stdout.write('x' * 1000 + chr(10)) for _ in range(400)]; sys.stdout.flush()"
    )
    with Cluster(tmp_path / "c") as c:
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.pub").exists(), 20, "the key")
        c._spawn(
            [
                "agent",
                "--nats",
                c.url,
                "--node",
                "h1",
                "--simulate",
                "1xH100",
                "--data-dir",
                str(tmp_path / "c"),
            ]
            + ["--job-output-max-mb", "0.1"],
            "h1.log",
        )
        c.wait_for(T.NodeJoined, node="h1")
        c.send(T.Submit(job="sly", team="t", user="u", level=5, gpus=1, command=[sys.executable, "-c", code]))
        c.wait_for(T.JobFinished, job="sly")
        time.sleep(1)  # the keeper writes what is left, then ends
        assert target.read_text() == "keep me\n"
        kept = next((tmp_path / "c" / "hosts").glob("h1/runs/sly*/output.log"))
        assert not kept.is_symlink() and "output rotated" in kept.read_text()


def test_the_output_keeper_refuses_a_symlink_or_a_hard_link_planted_before_it_opens(tmp_path):
    from agents.outcap import Keeper

    target = tmp_path / "not-the-jobs"
    target.write_text("keep me\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "output.log").symlink_to(target)
    Keeper(str(run / "output.log"), max_bytes=2**20, floor_bytes=0).write(b"evil\n")
    (run / "output.log").unlink()
    os.link(target, run / "output.log")
    Keeper(str(run / "output.log"), max_bytes=2**20, floor_bytes=0).write(b"evil\n")
    assert target.read_text() == "keep me\n"


def test_the_policys_output_cap_holds_on_a_host_whose_own_cap_is_larger(tmp_path):
    """`job_output_max_mb` is a policy parameter: it reaches the host with the job's start,
    and a job printing past it (but not past the host's own `--job-output-max-mb`, the
    machine's floor) keeps at most the policy's cap, and runs to its end all the same."""
    printed = 800 * 1000  # past the policy's 256 KiB, short of the host's 2 MiB
    code = "import sys; [sys.stdout.write('y' * 999 + chr(10)) for _ in range(800)]; sys.stdout.flush()"
    with Cluster(tmp_path / "c", policy="job_output_max_mb = 0.25\n") as c:
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.pub").exists(), 20, "the key")
        c._spawn(
            [
                "agent",
                "--nats",
                c.url,
                "--node",
                "h1",
                "--simulate",
                "1xH100",
                "--data-dir",
                str(tmp_path / "c"),
            ]
            + ["--job-output-max-mb", "2"],
            "h1.log",
        )
        c.wait_for(T.NodeJoined, node="h1")
        c.send(
            T.Submit(job="loud", team="t", user="u", level=5, gpus=1, command=[sys.executable, "-c", code])
        )
        records = c.wait_for(T.JobFinished, job="loud")
        start = next(
            r.event for r in records if isinstance(r.event, T.JobStartRequested) and r.event.job == "loud"
        )
        assert start.output_max_bytes == 2**18
        kept_files = sorted((tmp_path / "c" / "hosts").glob("h1/runs/loud*/output.log*"))
        deadline = time.monotonic() + 10  # the keeper writes what is left, then ends
        sizes = None
        while sizes != [p.stat().st_size for p in kept_files] and time.monotonic() < deadline:
            sizes = [p.stat().st_size for p in kept_files]
            time.sleep(0.5)
        kept = sum(p.stat().st_size for p in kept_files)
        assert printed > 2**18 and 0 < kept <= 2**18 + 1024, kept  # two halves and their notice lines
        assert "output rotated" in kept_files[0].read_text()[:200]
        assert "Traceback" not in (c.logs / "h1.log").read_text()


def test_a_host_whose_disk_fills_is_cordoned_new_work_goes_elsewhere_and_it_is_uncordoned_with_room(tmp_path):
    """The host agent's health is a scheduler input: a full disk cordons its node (no new
    work is offered it, so no start waits on its refusal), a job that fits either host lands
    on the other one at once, the running job there goes on; once there is room the node
    is uncordoned and takes work again."""
    with tmpfs(tmp_path / "disk", 16) as disk, Cluster(tmp_path / "c") as c:
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.pub").exists(), 20, "the key")
        key = ["--public-key", str(tmp_path / "c" / "keys" / "scheduler.pub")]
        c._spawn(
            ["agent", "--nats", c.url, "--node", "h1", "--simulate", "2xA100", "--data-dir", str(disk)]
            + key
            + ["--disk-floor-mb", "4"],
            "h1.log",
        )
        c._spawn(
            [
                "agent",
                "--nats",
                c.url,
                "--node",
                "h2",
                "--simulate",
                "2xH100",
                "--data-dir",
                str(tmp_path / "c"),
            ]
            + key,
            "h2.log",
        )
        c.wait_for(T.NodeJoined, node="h1")
        c.wait_for(T.NodeJoined, node="h2")
        c.send(
            T.Submit(
                job="a", team="t", user="u", level=5, gpus=1, gpu_models=["A100"], command=["sleep", "300"]
            )
        )
        c.wait_for(T.JobRunning, job="a")
        filler = fill(disk)
        cordoned = c.wait_for(T.NodeCordoned, node="h1", timeout_s=30)
        event = next(r.event for r in cordoned if isinstance(r.event, T.NodeCordoned))
        assert event.by == "host:h1" and "disk almost full" in event.reason
        # A job that fits either host (h1 has a GPU free) lands on h2, never offered to h1.
        c.send(T.Submit(job="b", team="t", user="u", level=5, gpus=1, command=["sleep", "1"]))
        records = c.wait_for(T.JobFinished, job="b", timeout_s=30)
        starts = [
            r.event.nodes for r in records if isinstance(r.event, T.JobStartRequested) and r.event.job == "b"
        ]
        assert starts == [["h2"]]
        assert not any(isinstance(r.event, T.JobRequeued) and r.event.job == "b" for r in records)
        assert not any(
            isinstance(r.event, (T.JobRequeued, T.JobStopRequested)) and r.event.job == "a" for r in records
        )
        # A job only h1 fits waits, and is told why.
        c.send(
            T.Submit(
                job="c", team="t", user="u", level=5, gpus=1, gpu_models=["A100"], command=["sleep", "1"]
            )
        )
        c.wait(
            lambda rs: any(isinstance(r.event, T.JobSubmitted) and r.event.job == "c" for r in rs), 20, "c"
        )
        why = subprocess.run(
            [sys.executable, "-m", "xirang.cli", "jobs", "--nats", c.url, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert "cordoned" in why.stdout and "h1 (by host:h1: disk almost full" in why.stdout, (
            why.stdout + why.stderr
        )
        filler.unlink()
        c.wait_for(T.NodeUncordoned, node="h1", timeout_s=30)
        records = c.wait_for(T.JobFinished, job="c", timeout_s=30)
        assert [
            r.event.nodes for r in records if isinstance(r.event, T.JobStartRequested) and r.event.job == "c"
        ] == [["h1"]]
        assert not any(
            isinstance(r.event, T.JobFinished) and r.event.job == "a" for r in records
        )  # still running


def test_a_host_cordoned_for_its_disk_is_uncordoned_by_its_restarted_agent_once_there_is_room(tmp_path):
    """The node's own cordon does not outlive the problem: an agent killed while its disk was
    full, restarted once there is room, says it is healthy at start (it saw no change of
    its disk to report), and the node takes work again."""
    with tmpfs(tmp_path / "disk", 16) as disk, Cluster(tmp_path / "c") as c:
        c.scheduler()
        c.wait(lambda rs: (tmp_path / "c" / "keys" / "scheduler.pub").exists(), 20, "the key")
        args = ["agent", "--nats", c.url, "--node", "h1", "--simulate", "1xH100", "--data-dir", str(disk)]
        args += ["--public-key", str(tmp_path / "c" / "keys" / "scheduler.pub"), "--disk-floor-mb", "4"]
        agent = c._spawn(args, "h1.log")
        c.wait_for(T.NodeJoined, node="h1")
        filler = fill(disk)
        c.wait_for(T.NodeCordoned, node="h1", timeout_s=30)
        c.kill(agent)
        filler.unlink()
        c._spawn(args, "h1.log")
        c.wait_for(T.NodeUncordoned, node="h1", timeout_s=30)
        c.send(T.Submit(job="after", team="t", user="u", level=5, gpus=1, command=["sleep", "0.1"]))
        c.wait_for(T.JobFinished, job="after", timeout_s=30)
