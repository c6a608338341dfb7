"""A whole xirang cluster on this machine, for `xirang bench live`, `xirang chaos` and the
integration tests: a real nats-server on a free port, the scheduler and host agents as
real OS processes (started and stopped by pid), small synchronous helpers to send inputs
and read the log, and the example jobs' command lines (`train_command`, `sleep_command`).
Test-only helpers are in tests/live_helpers.py."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core import types as T

from transport import bus
from .cluster import local_agent_env
from .host import stop_job_processes
from .interrupts import run_until_stopped
from transport.natsd import EmbeddedNats

REPO = Path(__file__).resolve().parent.parent

FAST_POLICY = """\
safe_point_ms = 1000
deadline_slack_ms = 2000
deadline_min_ms = 5000
"""


@contextmanager
def scratch_folder(prefix: str) -> Iterator[Path]:
    """A temporary folder for a local cluster: removed when the block succeeds, kept when it
    fails (its logs explain the failure, and a message naming them must not name a folder
    that is gone by the time it is read); stderr says where it is."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    except BaseException:
        print(f"the cluster's files and logs are kept in {root}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(root, ignore_errors=True)


class Cluster:
    """A nats-server under `root` plus the scheduler and agent processes started through
    it; `close()` (or leaving the `with` block) stops them by pid, then the server."""

    def __init__(
        self,
        root: Path,
        policy: str = FAST_POLICY,
        tick_ms: int = 200,
        lease_ms: int = 1000,
        node_timeout_ms: int = 10_000,
    ) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.policy_path = self.root / "policy.toml"
        self.policy_path.write_text(policy)
        self.tick_ms = tick_ms
        self.lease_ms = lease_ms
        self.node_timeout_ms = node_timeout_ms
        self.nats = EmbeddedNats(self.root / "nats").start()
        self.url = self.nats.url
        self.procs: list[subprocess.Popen] = []
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)

    # ------------------------------------------------------------ processes

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen:
        out = open(self.logs / log_name, "ab")
        proc = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "xirang.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO,
                env=local_agent_env(),  # jobs run as whoever started the cluster, as `xirang up`'s
            )
        finally:  # a stop signal raised right after the start must not lose the process
            out.close()
            if proc is not None:
                self.procs.append(proc)
        return proc

    def scheduler(self, instance: str = "s1", *extra: str) -> subprocess.Popen:
        """Start a scheduler process (`instance` its id) on this cluster."""
        return self._spawn(
            [
                "scheduler",
                *extra,
                "--nats",
                self.url,
                "--id",
                instance,
                "--data-dir",
                str(self.root),
                "--tick-ms",
                str(self.tick_ms),
                "--lease-ms",
                str(self.lease_ms),
                "--node-timeout-ms",
                str(self.node_timeout_ms),
                "--policy",
                str(self.policy_path),
            ],
            f"{instance}.log",
        )

    def agent(
        self, node: str = "h1", spec: str = "8xH100", grace_s: float = 1.0, *extra: str
    ) -> subprocess.Popen:
        """Start a host agent process for `node` with simulated GPUs `spec` (`extra`: more of
        `xirang agent`'s options)."""
        return self._spawn(
            [
                "agent",
                "--nats",
                self.url,
                "--node",
                node,
                "--simulate",
                spec,
                "--data-dir",
                str(self.root),
                "--grace-s",
                str(grace_s),
                *extra,
            ],
            f"{node}.log",
        )

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL a process this cluster started, by pid, and reap it."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM a process this cluster started, SIGKILL if it has not exited in 10 s."""
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            self.kill(proc)

    def close(self) -> None:
        """Stop every process this cluster started (newest first), the jobs under its folder,
        then the server."""
        for proc in reversed(self.procs):
            self.terminate(proc)
        self._kill_job_processes()
        self.nats.stop()

    def _kill_job_processes(self) -> None:
        # Again until none is left: a wrapper killed in one pass may have forked meanwhile.
        for _ in range(5):
            if not stop_job_processes(self.root):
                return
            time.sleep(0.1)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ bus helpers

    def _run(self, coro_fn):
        async def go():
            nc, js = await bus.connect(self.url, reconnects=3)
            try:
                await bus.ensure_streams(js)
                return await coro_fn(nc, js)
            finally:
                await nc.close()

        return run_until_stopped(go())

    def send(self, *inputs: T.Input) -> list[tuple[str, int, bool]]:
        """Publish inputs on XR_IN: (subject, stream seq, duplicate) for each."""

        async def go(nc, js):
            return [await bus.send_input(js, inp) for inp in inputs]

        return self._run(go)

    def records(self) -> list[T.Record]:
        """Every record of the log so far."""

        async def go(nc, js):
            return [r for _, r in await bus.all_records(js)]

        return self._run(go)

    def raw_log(self) -> list[tuple[str, bytes, dict]]:
        """Every XR_EV message: (subject, data, headers)."""

        async def go(nc, js):
            end = await bus.stream_last_seq(js, bus.EV_STREAM)
            out = []
            for seq in range(1, end + 1):
                msg = await js.get_msg(bus.EV_STREAM, seq)
                out.append((msg.subject, msg.data, msg.headers or {}))
            return out

        return self._run(go)

    def inputs(self) -> list[tuple[int, T.Input]]:
        """Every message of XR_IN so far, decoded: (stream seq, input)."""

        async def go(nc, js):
            end = await bus.stream_last_seq(js, bus.IN_STREAM)
            out = []
            for seq in range(1, end + 1):
                msg = await js.get_msg(bus.IN_STREAM, seq)
                out.append((seq, T.parse_input(msg.data)))
            return out

        return self._run(go)

    def wait(self, predicate, timeout_s: float = 20.0, what: str = "condition") -> list[T.Record]:
        """Poll the log until predicate(records) holds; returns the records."""
        deadline = time.monotonic() + timeout_s
        while True:
            records = self.records()
            if predicate(records):
                return records
            if time.monotonic() > deadline:
                tail = [_described(r) for r in records[-15:]]
                raise AssertionError(
                    f"{what} not reached in {timeout_s} s; log tail: {tail}; logs in {self.logs}"
                    + self._log_tails()
                )
            time.sleep(0.2)

    def _log_tails(self, lines: int = 12) -> str:
        """The last lines of every process's log: CI keeps what a failure prints, not the
        temporary folder the logs were in."""
        out = []
        for path in sorted(self.logs.glob("*.log")):
            with contextlib.suppress(OSError):
                out.append(f"\n--- {path.name}:\n" + "\n".join(path.read_text().splitlines()[-lines:]))
        return "".join(out)

    def wait_for(self, kind, timeout_s: float = 20.0, count: int = 1, **fields) -> list[T.Record]:
        """Wait until the log holds `count` events of `kind` with these field values."""
        return self.wait(
            lambda rs: len(matching(rs, kind, **fields)) >= count,
            timeout_s,
            f"{count} x {kind.__name__} {fields}",
        )


def matching(records, kind, **fields) -> list[T.Record]:
    """The records whose event is a `kind` with these field values."""
    return [
        r
        for r in records
        if isinstance(r.event, kind) and all(getattr(r.event, k) == v for k, v in fields.items())
    ]


def train_command(
    steps: int, step_ms: float = 10, ckpt_s: float | None = None, seed: int = 1, log_every: int = 10
) -> list[str]:
    """examples/train_numpy.py (the SDK: safe points and checkpoints) as a job's command."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "train_numpy.py"),
        "--steps",
        str(steps),
        "--step-ms",
        str(step_ms),
        "--seed",
        str(seed),
        "--log-every",
        str(log_every),
    ]
    if ckpt_s:
        cmd += ["--checkpoint-every-s", str(ckpt_s)]
    return cmd


def sleep_command(seconds: float, trace: Path | None = None) -> list[str]:
    """A job without the SDK; appends its pid to `trace` each time it starts."""
    code = "import os, sys, time\n"
    if trace:
        code += f"open({str(trace)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
    code += f"time.sleep({seconds})\n"
    return [sys.executable, "-c", code]


def _described(record: T.Record) -> str:
    """One record in a line: its number, type, job and, for an ending, why."""
    ev = record.event
    why = getattr(ev, "reason", "")
    return f"{record.n} {T.type_name(ev)} {getattr(ev, 'job', '')}" + (f" ({why})" if why else "")
