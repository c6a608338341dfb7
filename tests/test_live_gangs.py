"""Gang runs on the live system: the parts of a multi-node job rendezvous (torchrun's
variables), train as one (examples/train_ddp.py, real processes all-reducing over TCP), are
preempted and resumed as one, and stop as one when a part is killed or cannot start."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from agents.local_cluster import REPO, Cluster, matching, sleep_command
from agents.runfolders import run_folders
from core import types as T
from live_helpers import xirang_up

pytestmark = pytest.mark.timeout(240)

DDP = str(REPO / "examples" / "train_ddp.py")


def ddp_command(steps: int, out: Path, step_ms: float = 20, ranks_per_node: int = 0) -> list[str]:
    cmd = [sys.executable, DDP, "--steps", str(steps), "--step-ms", str(step_ms), "--out", str(out)]
    cmd += ["--checkpoint-every-s", "1", "--log-every", "50"]
    return cmd + (["--ranks-per-node", str(ranks_per_node)] if ranks_per_node else [])


def gang(job: str, command: list[str], level: int = 6, gpus: int = 16, **kw) -> T.Submit:
    return T.Submit(
        job=job,
        team="research",
        user="ana",
        level=level,
        gpus=gpus,
        gpu_models=["H100"],
        est_runtime_s=600,
        ckpt_interval_s=1,
        ckpt_cost_s=1,
        restore_cost_s=1,
        command=command,
        **kw,
    )


def on_bus(url: str, root: Path) -> Cluster:
    """The helpers of agents/local_cluster.Cluster on a bus someone else started."""
    view = Cluster.__new__(Cluster)
    view.url, view.logs, view.root = url, root, root
    return view


def starts(records, job: str) -> list[T.Record]:
    return [
        r
        for r in records
        if isinstance(r.event, (T.JobStartRequested, T.JobResumeRequested)) and r.event.job == job
    ]


def part_output(root: Path, node: str, job: str, n: int) -> str:
    found = run_folders(root / "hosts" / node / "runs", job, n)
    try:  # the run's folder exists a moment before the host opens its output file
        return (found[-1] / "output.log").read_text() if found else ""
    except FileNotFoundError:
        return ""


def job_processes(job: str) -> list[int]:
    """Pids of processes (wrappers and jobs) of `job` still alive on this machine."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{entry.name}/stat") as fh:
                zombie = fh.read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            continue
        if f"XR_JOB={job}".encode() in env and not zombie:
            pids.append(int(entry.name))
    return pids


def reference_parameters(tmp: Path, steps: int, world: int) -> np.ndarray:
    """The parameters of the same training run uninterrupted, outside xirang."""
    out = tmp / "reference.npz"
    env = dict(os.environ, NNODES="1", NODE_RANK="0", LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1")
    with __import__("socket").socket() as sock:
        sock.bind(("127.0.0.1", 0))
        env["MASTER_PORT"] = str(sock.getsockname()[1])
    subprocess.run(
        [sys.executable, DDP, "--steps", str(steps), "--out", str(out)], env=env, check=True, timeout=120
    )
    return np.load(out)["params"]


def test_a_16_gpu_gang_preempted_by_a_level_0_job_resumes_to_the_parameters_of_an_uninterrupted_run(tmp_path):
    steps, final = 400, tmp_path / "final.npz"
    with xirang_up(str(tmp_path / "up"), 2, "8xH100,8xH100") as info:
        root = Path(info["data_dir"])
        bus = on_bus(info["nats"], root)
        bus.wait_for(T.NodeJoined, count=2, timeout_s=30)
        bus.send(gang("ddp", ddp_command(steps, final)))
        bus.wait_for(T.JobRunning, job="ddp", timeout_s=60)
        bus.wait_for(T.CheckpointRecorded, job="ddp", timeout_s=60)
        bus.send(
            T.Submit(
                job="fix",
                team="ops",
                user="kim",
                level=0,
                gpus=8,
                gpu_models=["H100"],
                est_runtime_s=5,
                command=sleep_command(2),
            )
        )
        bus.wait_for(T.VictimReleased, job="ddp", timeout_s=60)
        bus.wait_for(T.JobFinished, job="fix", timeout_s=60)
        records = bus.wait_for(T.JobFinished, job="ddp", timeout_s=180)
        first, resumed = starts(records, "ddp")[0], starts(records, "ddp")[-1]
        assert isinstance(resumed.event, T.JobResumeRequested) and resumed.event.ckpt_step > 0
        assert first.event.addrs == ["127.0.0.1", "127.0.0.1"]
        primary = resumed.event.placement[0].node
        text = part_output(root, primary, "ddp", resumed.n)
        assert f"resumed at step {resumed.event.ckpt_step}" in text and "16 ranks met" in text, text
        # A new run, a new rendezvous: its own port (and the first node of its placement).
        assert f"at 127.0.0.1:{20000 + resumed.n % 10000}" in text
        first_text = part_output(root, first.event.placement[0].node, "ddp", first.n)
        assert f"16 ranks met at step 0 at 127.0.0.1:{20000 + first.n % 10000}" in first_text
        assert not matching(records, T.JobFailed, job="ddp")
    params = np.load(final)["params"]
    assert int(np.load(final)["step"]) == steps
    assert np.array_equal(params, reference_parameters(tmp_path, steps, 16))


@pytest.fixture
def two_hosts(tmp_path):
    with Cluster(tmp_path) as c:
        c.scheduler()
        c.agent("h1", "8xH100", grace_s=2)
        c.agent("h2", "8xH100", grace_s=2)
        c.wait_for(T.NodeJoined, count=2)
        yield c


def test_every_part_gets_the_rendezvous_variables_of_its_run(two_hosts, tmp_path):
    show = "import os; print({k: os.environ.get(k) for k in %r}); import time; time.sleep(30)" % (
        ["MASTER_ADDR", "MASTER_PORT", "NNODES", "NODE_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "XR_NODES"],
    )
    two_hosts.send(gang("env", [sys.executable, "-c", show], gpus=12))
    records = two_hosts.wait_for(T.JobRunning, job="env")
    start = starts(records, "env")[0]
    order = [slot.node for slot in start.event.placement]
    seen = {}
    deadline = time.monotonic() + 40
    while len(seen) < 2 and time.monotonic() < deadline:
        for node in ("h1", "h2"):
            text = part_output(two_hosts.root, node, "env", start.n)
            lines = [ln for ln in text.splitlines() if ln.startswith("{'MASTER_ADDR'") and ln.endswith("}")]
            if lines:  # a whole line (the output reaches the file through a pipe)
                seen[node] = ast.literal_eval(lines[-1])
        time.sleep(0.2)
    assert sorted(seen) == ["h1", "h2"], f"outputs seen: {seen}"
    port = str(20000 + start.n % 10000)
    for rank, node in enumerate(order):
        got = seen[node]
        assert (got["MASTER_ADDR"], got["MASTER_PORT"], got["NNODES"]) == ("127.0.0.1", port, "2")
        assert got["NODE_RANK"] == str(rank) and got["WORLD_SIZE"] == "12"
        assert got["LOCAL_WORLD_SIZE"] == str(
            sum(len(s.gpus) for s in start.event.placement if s.node == node)
        )
        assert got["XR_NODES"] == ",".join(order)


def test_a_gang_part_killed_stops_the_other_part_and_the_gang_runs_again_never_twice(two_hosts, tmp_path):
    two_hosts.send(gang("g", ddp_command(100_000, tmp_path / "never.npz", step_ms=50, ranks_per_node=1)))
    records = two_hosts.wait_for(T.JobRunning, job="g")
    first = starts(records, "g")[0]
    other = first.event.placement[-1].node
    deadline = time.monotonic() + 20
    victim = 0
    while not victim and time.monotonic() < deadline:
        for pid in job_processes("g"):
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            if f"XR_RUN={other}/g/{first.n}".encode() in env and b"agents.jobwrap" not in cmd:
                victim = pid
        time.sleep(0.2)
    assert victim
    os.kill(victim, signal.SIGKILL)
    records = two_hosts.wait_for(T.JobRequeued, job="g", reason="gang_part_lost")
    stop = matching(records, T.JobStopRequested, job="g")[-1]
    assert sorted(stop.event.nodes) == ["h1", "h2"]
    records = two_hosts.wait(lambda rs: len(starts(rs, "g")) >= 2, 30, "the gang's second run")
    assert not matching(records, T.JobFailed, job="g")
    second = starts(records, "g")[-1]
    # Each host ran the first run's part to its end before it started the second's.
    for node in ("h1", "h2"):
        ends = []
        for n in (first.n, second.n):
            deadline = time.monotonic() + 20
            while (
                not run_folders(two_hosts.root / "hosts" / node / "runs", "g", n)
                and time.monotonic() < deadline
            ):
                time.sleep(0.1)
            ends.append(run_folders(two_hosts.root / "hosts" / node / "runs", "g", n)[-1])
        old_exit, new_start = ends[0] / "exit.json", ends[1] / "started.json"
        deadline = time.monotonic() + 10
        while not new_start.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        import json

        ended = json.loads(old_exit.read_text())["t"] if old_exit.exists() else None
        assert ended is not None, f"{node}: the first run's part has no recorded end"
        assert ended <= json.loads(new_start.read_text())["t"]
    two_hosts.send(T.Cancel(job="g"))
    two_hosts.wait_for(T.JobCancelled, job="g")
    deadline = time.monotonic() + 15
    while job_processes("g") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes("g") == []


def test_a_gang_part_that_cannot_start_leaves_nothing_running(two_hosts):
    script = 'if [ "$NODE_RANK" = 1 ]; then exec /nonexistent/train; fi; exec sleep 60'
    two_hosts.send(gang("bad", ["sh", "-c", script]))
    records = two_hosts.wait_for(T.JobFailed, job="bad", timeout_s=30)
    assert matching(records, T.JobFailed, job="bad")[0].event.reason == "exit_code_127"
    deadline = time.monotonic() + 15
    while job_processes("bad") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_processes("bad") == []
