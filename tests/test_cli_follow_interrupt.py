"""One Ctrl-C (or a supervisor's SIGTERM) ends every command that follows the log, at once:
`dashboard`, `project --follow`, `notices --follow`, `logs --follow`, `tune --every`. Real
processes, a real nats-server, real signals. Python 3.11's asyncio.run turns Ctrl-C into a
cancellation that can be lost (nats-py's next_msg is a wait_for whose inner future may
complete as the cancel comes): one test loses the first cancellation on purpose, one every
cancellation, and the command must still end."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from agents.interrupts import Interrupted, run_until_stopped, stop_signals_raise
from agents.runfolders import new_run_folder
from core import types as T
from data_helpers import REPO, publish, start_nats, workload_records
from transport.bus import node_token

pytestmark = pytest.mark.timeout(120)

RECORDS = 300  # the first notice is record 253; jobs have started and not ended by then
EXIT_WITHIN_S = 15.0

# The command run with nats-py's next_msg losing the first cancellation, as a wait_for whose
# inner future completes as the cancel comes does: asyncio.run's Ctrl-C handler cancels once,
# so before the fix one SIGINT left the command following forever.
LOSES_A_CANCELLATION = """\
import asyncio, sys
from nats.errors import TimeoutError as NatsTimeout
from nats.js.client import JetStreamContext

real_next_msg = JetStreamContext.PushSubscription.next_msg
lost = []

async def next_msg_losing_a_cancellation(self, timeout=1.0):
    try:
        return await real_next_msg(self, timeout)
    except asyncio.CancelledError:
        if lost:
            raise
        lost.append(1)
        print("cancellation lost", file=sys.stderr, flush=True)
        raise NatsTimeout  # as if the wait had ended first: the follow loop waits again

JetStreamContext.PushSubscription.next_msg = next_msg_losing_a_cancellation
from xirang.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """A nats-server whose log holds the first RECORDS records of a simulated workload."""
    tmp = tmp_path_factory.mktemp("follow")
    server = start_nats(tmp)
    try:
        publish(server.url, workload_records()[:RECORDS])
        yield server.url, tmp
    finally:
        server.stop()


def start(*argv: str, script: str | None = None) -> subprocess.Popen:
    head = [sys.executable, "-c", script] if script else [sys.executable, "-m", "xirang.cli"]
    return subprocess.Popen(
        [*head, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
    )


def wait_for_line(proc: subprocess.Popen, text: str) -> None:
    """Read stdout until a line holding `text` (the command is following by then)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before '{text}': {proc.stderr.read()}")
    raise AssertionError(f"no '{text}' within 60 s")


def stop_and_wait(proc: subprocess.Popen, signum: int) -> tuple[int, str]:
    """Send `signum` once; (exit code, stderr). A process still there after
    EXIT_WITHIN_S is killed (by its pid) and the test fails."""
    os.kill(proc.pid, signum)
    try:
        _, err = proc.communicate(timeout=EXIT_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise AssertionError(
            f"still running {EXIT_WITHIN_S:g} s after one {signal.Signals(signum).name}: {err}"
        ) from None
    return proc.returncode, err


def stop_all(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_one_ctrl_c_ends_a_follow_whose_cancellation_is_lost(log, tmp_path):
    url, _ = log
    proc = start(
        "project",
        "--nats",
        url,
        "--follow",
        "--progress",
        "--db",
        str(tmp_path / "p.duckdb"),
        script=LOSES_A_CANCELLATION,
    )
    try:
        wait_for_line(proc, "committed seq")
        code, err = stop_and_wait(proc, signal.SIGINT)
        assert code == 130, err
        assert "cancellation lost" in err and "Traceback" not in err, err
    finally:
        stop_all([proc])


def test_follow_commands_end_at_once_on_one_signal(log, tmp_path):
    url, _ = log
    records = workload_records()[:RECORDS]
    ended = {
        r.event.job for r in records if isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled))
    }
    started = next(
        r for r in records if isinstance(r.event, T.JobStartRequested) and r.event.job not in ended
    )
    job, node = started.event.job, started.event.placement[0].node
    run = new_run_folder(tmp_path / "hosts" / node_token(node) / "runs", job, started.n)
    run.mkdir(parents=True)
    (run / "output.log").write_text("step 1\n")

    cases = [  # (command, line that says it follows, signal, exit code)
        (
            ["dashboard", "--nats", url, "--db", str(tmp_path / "d.duckdb"), "--port", "0"],
            "dashboard on",
            signal.SIGINT,
            0,
        ),
        (
            ["dashboard", "--nats", url, "--db", str(tmp_path / "e.duckdb"), "--port", "0"],
            "dashboard on",
            signal.SIGTERM,
            0,
        ),
        (
            ["project", "--nats", url, "--follow", "--progress", "--db", str(tmp_path / "p.duckdb")],
            "committed seq",
            signal.SIGTERM,
            143,
        ),
        (["notices", "--nats", url, "--follow", "--everyone"], "", signal.SIGINT, 130),
        (["logs", job, "--follow", "--nats", url, "--data-dir", str(tmp_path)], "step 1", signal.SIGINT, 130),
        (
            ["tune", "--nats", url, "--evals", "1", "--param", "net_benefit_min", "--apply", "--every", "60"],
            "tune:",
            signal.SIGTERM,
            143,
        ),
    ]
    procs = [start(*argv) for argv, *_ in cases]
    try:
        for proc, (argv, ready, signum, expected) in zip(procs, cases):
            wait_for_line(proc, ready)
            time.sleep(0.5)  # well inside its follow loop
            code, err = stop_and_wait(proc, signum)
            assert code == expected, (argv[0], signum, code, err)
            assert "Traceback" not in err, (argv[0], err)
    finally:
        stop_all(procs)


def interrupt_in(seconds: float, signum: int = signal.SIGINT) -> threading.Timer:
    """A real signal to this process after `seconds` (from a thread, so SIGALRM stays
    pytest-timeout's)."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signum))
    timer.start()
    return timer


async def deaf_to_cancellation() -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # every cancellation lost


def test_a_loop_that_loses_every_cancellation_ends_within_its_wind_down():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    began = time.monotonic()
    interrupt_in(0.2, signal.SIGTERM)
    with pytest.raises(Interrupted) as stopped:
        run_until_stopped(deaf_to_cancellation(), wind_down_s=1.0)
    assert stopped.value.exit_code == 143
    assert time.monotonic() - began < 5  # 0.2 s, then at most 1 s for the task, 1 s of wind-down
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_swallowed_interrupt_is_raised_again_when_the_block_ends():
    async def sleeps() -> None:
        await asyncio.sleep(30)

    swallowed = []
    interrupt_in(0.2)
    with pytest.raises(Interrupted):
        with stop_signals_raise():
            try:
                run_until_stopped(sleeps())
            except KeyboardInterrupt:
                swallowed.append(1)  # a careless caller: the block still ends with the interrupt
    assert swallowed == [1]
