"""The GPU host agent, one per machine: it turns the scheduler's decisions for this host
into OS processes, and the processes' fates into facts on XR_IN.

- Inventory from pynvml (or `--simulate 8xH100`); `node_up` at start; a heartbeat on
  `xr.hb.<node>` every second (plain NATS: liveness is not history).
- A durable consumer on `xr.ev.host.<node>.>` delivers the decisions for this host.
  Each is acted on at most once: the agent keeps, in its state folder, the last record
  `n` it acted on and one file per job run (pid, what it was told), and every job process
  carries a marker in its environment, so an agent restarted after a crash re-adopts its
  processes instead of starting them again. Facts are sent with ids derived from the
  run (`<node>:<job>:<n>:finished`), so a repeated report is dropped by XR_IN's dedup.
- JobStartRequested / JobResumeRequested: start this host's part of the run in its own
  process group, under `agents.jobwrap` (which records the exit status), with
  CUDA_VISIBLE_DEVICES set to the placement's GPUs, XR_* variables for the job SDK and a
  gang's rendezvous variables (agents/rendezvous.py). An older run of the job, and runs
  still letting go of these GPUs, are gone first. A part that cannot start reports
  `finished {requeue}` (the whole gang is stopped and queued again); a resume from a
  checkpoint the job wrote itself is verified here first (agents/ckptpath.py).
- VictimNotified: an SDK job (it leaves a marker file) gets the notice in a file and
  SIGUSR1, and reports safe_point/checkpoint/released itself; any other job gets its own
  signal (SIGTERM by default), its grace time, then SIGKILL, and the agent reports
  `released`. Every process of a run goes with it, also those that left its process group.
- Another node's part of a gang reports only a failure (`finished`, with `requeue` when a
  signal killed it): the primary's part speaks for the run.
- NoticeWithdrawn: the notice file goes, the job keeps running.
- JobCancelled, or the job finished elsewhere: SIGTERM, grace, SIGKILL. NodeLost for this
  host: its jobs were requeued elsewhere, so they are stopped and the host rejoins.
- A process that exits on its own: `finished {ok: exit status == 0}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from pathlib import Path

import msgspec
from nats.js import api
from nats.js.errors import NotFoundError

from core import types as T

from trust.durable import remove_stale_temps, write_durably

from .diskwatch import DiskWatch, no_space
from trust.natsauth import CREDS_ENV, JobMinter
from trust.signing import KeyRing, verify_one

from . import ckptcopy, ckptfile, ckptpath, jobwrap, pathcopy, rendezvous
from transport import bus
from transport.locks import AlreadyRunning, InstanceLock
from .gpus import Inventory
from .jobuser import JobUser, JobUserError, UidPool, numeric_user, own_user_name, probe, warn_shared
from .outbox import JOB_MARKER, Outbox
from .runfolders import new_run_folder, run_folders

log = logging.getLogger("xirang.host")

HEARTBEAT_S = 1.0
# A run's output kept on disk at most (agents/outcap.py), and the free space below which
# the agent takes no new runs and job output is dropped (agents/diskwatch.py).
OUTPUT_MAX_BYTES_DEFAULT = 64 * 2**20
DISK_FLOOR_BYTES_DEFAULT = 16 * 2**20
# A run refused for want of disk is reported this long after (see `_start`).
REFUSAL_PAUSE_S = 5.0
# At start, an agent asks whether another answers for its node (`xr.agent.claim.<node>`).
CLAIM_PREFIX = "xr.agent.claim"
NODE_CLAIM_TIMEOUT_S = 0.5
# An orderly stop waits this long beyond the grace time for runs to exit and facts to go.
DRAIN_SLACK_S = 10.0
DRAIN_SDK_GRACE_MIN_S = 5.0
# A heartbeat loop that wakes this late means the agent was paused.
PAUSE_DETECT_S = 3 * HEARTBEAT_S
MONITOR_S = 0.2
# The outbox sender also looks for facts the job SDK left there this often.
OUTBOX_POLL_S = 0.1
FETCH_BATCH = 64
SDK_MARKER = "sdk"
RELEASED_MARKER = "released"
NOTICE_FILE = "notice.json"
EXIT_FILE = "exit.json"
MARKER_ENV = "XR_RUN"
# The run's own NATS credentials, in its private folder.
JOB_CREDS_FILE = "nats.creds"
# A job notified this soon after it started may still be loading the SDK: wait for its
# marker this long before treating it as a job without the SDK.
SDK_WAIT_S = 5.0
NO_KEY = "no_key"
# What the agent's environment may hold that its jobs must not see.
JOB_WITHHELD_ENV = (
    "XIRANG_CREDS",
    "XIRANG_JOB_CREDS",
    "XIRANG_SIGNING_KEY",
    "XIRANG_IDENTITY",
    "XIRANG_TLS_KEY",
    "XIRANG_CKPT_SECRET_FILE",
)


class Run(msgspec.Struct, kw_only=True):
    """One run of a job on this host, as kept in the state folder."""

    job: str
    n: int  # record that started it
    pid: int = 0
    dir: str = ""
    primary: bool = True
    resume: bool = False
    started_t: float = 0.0
    notified: bool = False
    notice_pending: bool = False  # notified, waiting to learn whether it uses the SDK
    withdrawn: bool = False
    stopping: str = ""  # why the agent is stopping it: cancelled | finished_elsewhere | node_lost
    term_sent_t: float = 0.0
    killed: bool = False
    job_uid: int = 0  # the run's own uid (and gid) from --job-uid-range; 0: none drawn
    gpus: list[int] = []  # this host's GPUs of the run
    gang: bool = False  # one part of a run over several nodes
    preempt_signal: str = ""  # the job's own signal at a notice ('' : SIGTERM)
    grace_s: float = 0.0  # the job's own time from the notice to SIGKILL (0: the host's)
    ckpt_copies: int = 2  # verified copies each of its checkpoints needs (the policy's)


class StateFileError(Exception):
    """A file of the agent's state folder cannot be read; the message names it and what to do."""


def _read_state_file(path: Path, kind, forgets: str):
    """The file decoded as `kind`, or StateFileError naming it (a disk fault, an edit by
    hand) and what moving it aside would make the agent forget."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=kind)
    except (OSError, msgspec.DecodeError) as err:
        raise StateFileError(
            f"cannot read {path} ({err}): restore it, or move it aside to go on without it ({forgets})"
        ) from err


class Acted(msgspec.Struct, kw_only=True):
    """How far in the log the agent has acted (kept on disk, so a restart does not act twice)."""

    last_n: int = 0


class HostAgent:
    """The agent of one GPU host: acts on the log's host-directed events for its node (start,
    notice, withdraw, stop, cancel), runs the jobs as processes, and reports their facts
    through its durable outbox."""

    def __init__(
        self,
        url: str,
        node: str,
        inventory: Inventory,
        state_dir: str | os.PathLike,
        grace_s: float = 10.0,
        default_command: list[str] | None = None,
        keyring_path: str | os.PathLike | None = None,
        job_minter: JobMinter | None = None,
        ckpt_secret: bytes | None = None,
        job_user: JobUser | UidPool | None = None,
        advertise_addr: str = "",
        ckpt_roots: list[str | os.PathLike] | None = None,
        output_max_bytes: int = OUTPUT_MAX_BYTES_DEFAULT,
        disk_floor_bytes: int = DISK_FLOOR_BYTES_DEFAULT,
    ) -> None:
        self.url = url
        # Where this host's jobs are reached (a gang's MASTER_ADDR when it is the first node).
        self.advertise_addr = advertise_addr or rendezvous.default_advertise_addr(url)
        # Each run's output (stdout and stderr) is kept by agents/outcap.py: at most this
        # much on disk, rotated; the disk's last `disk_floor_bytes` are never spent on it,
        # and below them the agent takes no new runs (agents/diskwatch.py).
        self.output_max_bytes = output_max_bytes
        self.disk_floor_bytes = disk_floor_bytes
        # Who the jobs run as: one user for all, one uid per run from a pool, or None (the
        # agent's own user). With other users, whatever the agent writes is its own only
        # (umask 077); each run's folder is handed to the run's user.
        self.job_user = job_user
        if job_user is not None:
            os.umask(0o077)
        # The hosts' shared secret from which each job's checkpoint key is derived.
        self.ckpt_secret = ckpt_secret
        # Mints each run's own short-lived NATS user (trust/natsauth.JobMinter, with this
        # node's scoped job signing key); jobs never get the host's own credentials.
        self.job_minter = job_minter
        # Every decision must carry the scheduler's valid signature before we act on it.
        # The keyring is read when the first record arrives (the scheduler may make its
        # key just after we start).
        self.keyring_path = Path(keyring_path) if keyring_path else None
        self.keyring = None
        self._warned_no_key = False
        self.node = node
        self.token = bus.node_token(node)
        self.inventory = inventory
        self.dir = Path(state_dir).resolve() / self.token
        self.runs_dir = self.dir / "runs"
        self.instance = uuid.uuid4().hex  # tells this agent's heartbeats from another's
        self.outbox = Outbox(self.dir / "outbox", sender=f"host:{node}")
        # Shared filesystems where jobs write checkpoints of their own (agents/ckptpath.py).
        roots = ckpt_roots or [Path(state_dir).resolve().parent / "ckpt"]
        self.ckpt_roots = [Path(root).resolve() for root in roots]
        self.outbox.path_roots = lambda job: ckptpath.job_roots(self.ckpt_roots, job)
        # The second copies of this host's jobs' SDK checkpoints (agents/ckptcopy.py).
        self.copies_root = self.dir / ckptcopy.COPIES_DIR
        # ... and of the checkpoints they write themselves, where no second root takes them
        # (agents/pathcopy.py): a folder of the agent's, which jobs cannot write.
        self.paths_root = self.dir / pathcopy.HOST_PATHS_DIR
        self.outbox.hold = self._hold_for_copy
        self._copying: dict[str, asyncio.Task] = {}  # fact file -> its second copy under way
        self._copied: set[str] = set()  # fact files whose second copy is done (or refused)
        self.outbox.on_dropped = self._facts_dropped
        self._outbox_wake: asyncio.Event | None = None
        self.grace_s = grace_s
        self.default_command = default_command or [sys.executable, "-c", "import time; time.sleep(60)"]
        self.stop_event = asyncio.Event()
        self.runs: dict[str, Run] = {}
        self.acted = Acted()
        self.actions = 0
        self.nc = self.js = None
        self._children: dict[int, object] = {}
        # Exit statuses of wrappers that ended, by pid, until their run's end is reported:
        # what a wrapper that could not write its exit file (a full disk) still tells.
        self._wrapper_status: dict[int, int] = {}
        self._keepers: list = []  # output keepers' first processes, reaped as they detach
        self._cleanups: set = set()  # removals of ended jobs' checkpoint copies under way
        # Facts the outbox could not keep (a full disk): sent from memory, in order.
        self._undurable: list[T.Input] = []
        self._refusals: list[tuple[float, T.Input, str]] = []  # (when, fact, id): runs refused
        self.facts_dropped: dict[str, int] = {}  # job -> facts of its runs dropped so far
        self.disk = DiskWatch(str(self.dir.parent), disk_floor_bytes)

    # ------------------------------------------------------------ state folder

    def _load(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self._lock_down_state()
        for folder in (self.dir, self.runs_dir, self.outbox.folder):
            for path in remove_stale_temps(folder):  # an agent killed mid-write left them
                log.info("host %s: removed %s, a write a killed agent left unfinished", self.node, path.name)
        acted = self.dir / "acted.json"
        if acted.exists():
            self.acted = _read_state_file(
                acted,
                Acted,
                "how far it acted on the log; decisions it acknowledged on the bus are not sent again",
            )
        for path in sorted(self.runs_dir.glob("*.json")):
            run = _read_state_file(
                path, Run, "that run: its processes, if any still run, are then neither watched nor stopped"
            )
            self._recover_uid(run)
            self.runs[run.job] = run
        self.outbox.watch_marked(self.runs_dir)  # runs' own outboxes, facts still waiting
        self._trust_own_records_over_markers()
        for folder in list(self.outbox.job_folders):
            if all(Path(run.dir) / "outbox" != folder for run in self.runs.values()):
                self.outbox.retire(folder)

    def _recover_uid(self, run: Run) -> None:
        """A run an older agent started as its one job user (no uid in its record) keeps
        running as that user under an agent now giving each run its own uid: its folder's
        owner says who, so its notices and renewed credentials still reach it."""
        if run.job_uid or not run.dir or not isinstance(self.job_user, UidPool):
            return
        try:
            owner = os.stat(run.dir).st_uid
        except FileNotFoundError:
            return
        if owner != os.geteuid():
            run.job_uid = owner

    def _trust_own_records_over_markers(self) -> None:
        """A run's outbox folder belongs to its job (user): the job named in its marker is
        taken from the agent's own run record, or from a marker the agent itself wrote (owned
        by the agent's user); a folder with a marker a job replaced is not delivered."""
        for folder in list(self.outbox.job_folders):
            run = next((r for r in self.runs.values() if Path(r.dir) / "outbox" == folder), None)
            if run is not None:
                self.outbox.job_folders[folder] = run.job
            elif (folder / JOB_MARKER).stat().st_uid != os.geteuid():
                log.warning(
                    "host %s: ignoring %s: its job marker was not written by this agent", self.node, folder
                )
                del self.outbox.job_folders[folder]

    def _lock_down_state(self) -> None:
        """The agent's state is its own: with jobs under another user, its folder and the runs
        folder are search-only for others (a job reaches its own run folder by name, lists
        nothing), its outbox 0700 and its files 0600 (also those an older agent left)."""
        if self.job_user is None:
            return
        os.chmod(self.dir.parent, 0o711)  # the hosts folder (shared by nodes' agents)
        for folder in (self.dir, self.runs_dir):
            os.chmod(folder, 0o711)
            for entry in folder.iterdir():
                if entry.is_file() and not entry.is_symlink():
                    os.chmod(entry, 0o600)
        os.chmod(self.outbox.folder, 0o700)

    def _save_acted(self) -> None:
        self._write_state(self.dir / "acted.json", msgspec.json.encode(self.acted))

    def _save_run(self, run: Run) -> None:
        self._write_state(self.runs_dir / f"{_safe(run.job)}.json", msgspec.json.encode(run))

    def _write_state(self, path: Path, data: bytes) -> None:
        """A state file written durably; on a full disk the agent goes on from memory (a
        restart re-adopts its runs by their markers) and takes no new runs meanwhile."""
        try:
            write_durably(path, data)
        except OSError as err:
            if not no_space(err):
                raise
            if not self.disk.low:  # said once an episode: every decision writes
                log.warning("host %s: cannot write %s: %s; going on from memory", self.node, path.name, err)
            self._disk_failed()

    def _disk_failed(self) -> None:
        if self.disk.write_failed():
            self._disk_changed()

    def _disk_changed(self) -> None:
        """Say so when the disk becomes low (log, alert) or good again; tell the scheduler,
        which cordons the node while it is low (no new work is placed here)."""
        if self.nc is not None:
            asyncio.ensure_future(self._report(self._node_health(), f"health-{uuid.uuid4().hex}"))
        if not self.disk.low:
            log.warning("host %s: the disk has room again: taking new runs", self.node)
            return
        log.error(
            "host %s: %s: refusing new runs (they queue again, elsewhere if they can); the %d"
            " running are still managed. Free space there (a job's files under %s?)",
            self.node,
            self.disk.problem,
            len(self.runs),
            self.runs_dir,
        )
        self._alert("node_unhealthy", {"problem": self.disk.problem})

    def _facts_dropped(self, job: str, dropped: int, why: str) -> None:
        """A run wrote facts beyond its bounds (agents/outbox.py): they are dropped."""
        log.warning("host %s: dropped %d fact(s) of job %s so far: %s", self.node, dropped, job, why)
        self.facts_dropped[job] = dropped
        self._alert("job_facts_dropped", {"job": job, "dropped": dropped, "why": why})

    def _alert(self, kind: str, fields: dict) -> None:
        """An alert on `xr.alert.<kind>` where this agent may publish one (an open bus); on a
        secured bus a host may not, and its heartbeats carry the news to the scheduler,
        which raises the alert (agents/scheduler.py)."""
        if self.nc is not None and not bus.default_sender():
            alert = {"kind": kind, "node": self.node, **fields}
            asyncio.ensure_future(self._publish_alert(kind, alert))

    async def _publish_alert(self, kind: str, alert: dict) -> None:
        try:
            await self.nc.publish(f"{bus.ALERT_PREFIX}.{kind}", json.dumps(alert).encode())
        except Exception:  # noqa: BLE001 - the heartbeats say it too
            pass

    def _drop_run(self, run: Run) -> None:
        self.runs.pop(run.job, None)
        if run.dir:
            self.outbox.retire(Path(run.dir) / "outbox")
            # The run's credentials die with it (they would expire soon anyway).
            (Path(run.dir) / JOB_CREDS_FILE).unlink(missing_ok=True)
            if run.job_uid:
                # Its uid is drawn again later: the next run holding it must not read this one's output.
                try:
                    _take_back(Path(run.dir))
                except OSError as err:  # e.g. the folder was removed by hand
                    log.warning("host %s: cannot take back %s's folder: %r", self.node, run.job, err)
        try:
            (self.runs_dir / f"{_safe(run.job)}.json").unlink()
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Hold the node (one agent per node and folder), connect, adopt runs left by a previous
        agent, and act until stopped."""
        # One agent per node name and state folder: two would start every job twice.
        lock = InstanceLock(self.dir / "agent.lock", f"an agent for node {self.node}").acquire()
        try:
            await self._run()
        finally:
            lock.release()

    async def _run(self) -> None:
        self._load()
        if self.job_user is None:
            warn_shared(own_user_name())
        else:
            sample = self.job_user.sample() if isinstance(self.job_user, UidPool) else self.job_user
            problem = probe(sample, self.runs_dir, os.getcwd())
            if problem:
                raise JobUserError(problem)
            if isinstance(self.job_user, UidPool):
                log.info("host %s: each job run has its own uid, from %s", self.node, self.job_user.name)
            else:
                log.info("host %s: jobs run as %s (uid %d)", self.node, self.job_user.name, self.job_user.uid)
        self._outbox_wake = asyncio.Event()
        self._caught_up = asyncio.Event()
        # Outages are waited out: the client reconnects forever, jobs keep running, facts
        # wait in the outbox, the consumer's fetches are retried.
        self.nc, self.js = await bus.connect_forever(self.url, name=f"host-{self.node}", stop=self.stop_event)
        await self._refuse_if_node_taken()
        await self._serve_copies()
        sub = await self._retry("opening the decision consumer", self._open)
        await self._report_up()
        log.info(
            "host %s: %d x %s up, %d runs adopted, last acted record %d",
            self.node,
            len(self.inventory.gpus),
            self.inventory.model,
            len(self.runs),
            self.acted.last_n,
        )
        tasks = [
            asyncio.create_task(self._heartbeats()),
            asyncio.create_task(self._monitor()),
            asyncio.create_task(self._send_outbox()),
        ]
        try:
            await self._consume(sub)
            if self.stop_event.is_set():
                await self._drain()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - a durable consumer outlives its subscription
                pass
            try:
                await self.outbox.deliver(self.js)  # what can go now; the rest waits on disk
                await self.nc.drain()
            except Exception:  # noqa: BLE001 - stopping while the bus is away
                await self.nc.close()

    async def _report_refusals(self, now: float) -> None:
        """The runs refused for want of disk whose pause is over (all of them when stopping)."""
        due = [item for item in self._refusals if item[0] <= now]
        self._refusals = [item for item in self._refusals if item[0] > now]
        for _, refusal, msg_id in due:
            await self._report(refusal, msg_id)

    async def _drain(self) -> None:
        """An orderly stop (SIGTERM, Ctrl-C): SDK jobs checkpoint and exit, the others get
        SIGTERM, then `node_down` tells the scheduler, which requeues them all from their
        newest checkpoints; when the agent starts again they resume. (A crash, SIGKILL,
        leaves the jobs running instead: a restarted agent adopts them.)"""
        if self.runs:
            log.info("host %s: stopping: checkpointing and stopping %d run(s)", self.node, len(self.runs))
        sdk_grace_s = max(self.grace_s, DRAIN_SDK_GRACE_MIN_S)  # time to reach a safe point and save
        deadline_ms = int((time.time() + sdk_grace_s) * 1000)
        for run in list(self.runs.values()):
            run.stopping = "agent_stopped"
            self._save_run(run)
            if run.primary and (Path(run.dir) / SDK_MARKER).exists():
                notice = {
                    "saga": f"drain-{run.n}",
                    "deadline_t": deadline_ms,
                    "checkpoint_needed": True,
                    "drain": True,
                }
                self._write_notice(run, notice)
                _signal_group(run.pid, signal.SIGUSR1)
                # SIGKILL (by the monitor) if it has not exited by the notice's deadline.
                run.term_sent_t = time.time() + sdk_grace_s - self.grace_s
                self._save_run(run)
            else:
                self._terminate(run)
        await self._report_refusals(float("inf"))
        give_up = time.monotonic() + sdk_grace_s + DRAIN_SLACK_S
        while self.runs and time.monotonic() < give_up:
            await asyncio.sleep(MONITOR_S)
        await self._report(T.NodeDown(node=self.node, reason="agent_stopped"), f"down-{uuid.uuid4().hex}")
        give_up = time.monotonic() + DRAIN_SLACK_S
        while len(self.outbox) and time.monotonic() < give_up:
            await asyncio.sleep(MONITOR_S)

    async def _open(self):
        await bus.ensure_streams(self.js)
        return await self._consumer()

    async def _retry(self, what: str, action):
        """Run `action` until it succeeds, with capped backoff: the bus may be away."""
        return await bus.retry_with_backoff(action, f"host {self.node}: {what}", self.stop_event)

    async def _send_outbox(self) -> None:
        """Deliver the outbox's facts as they come; while the bus is away, retry with
        backoff. Facts of this agent and of the SDK jobs it runs share the one outbox."""
        delay = 0.1
        while True:
            self._outbox_wake.clear()
            # After a start or a pause, the runs given away meanwhile are stopped first.
            await self._caught_up.wait()
            try:
                while self._undurable:
                    await bus.send_input(self.js, self._undurable[0], sender=self.outbox.sender or None)
                    self._undurable.pop(0)
                await self.outbox.deliver(self.js)
                delay = 0.1
                try:
                    await asyncio.wait_for(self._outbox_wake.wait(), timeout=OUTBOX_POLL_S)
                except asyncio.TimeoutError:
                    pass
            except Exception as err:  # noqa: BLE001 - the bus is away: the facts wait on disk
                log.warning("host %s: %d fact(s) wait for the bus (%r)", self.node, len(self.outbox), err)
                await asyncio.sleep(delay)
                delay = min(bus.CONNECT_BACKOFF_MAX_S, delay * 2)

    def stop(self) -> None:
        """Ask the agent to drain and stop."""
        self.stop_event.set()

    async def _consumer(self):
        durable = f"host-{self.token}"
        try:
            await self.js.consumer_info(bus.EV_STREAM, durable)
            deliver = api.DeliverPolicy.ALL
        except NotFoundError:
            # A new host only cares about decisions from now on; its node_up comes next.
            deliver = api.DeliverPolicy.NEW
        return await self.js.pull_subscribe(
            f"{bus.HOST_PREFIX}.{self.token}.>",
            durable=durable,
            stream=bus.EV_STREAM,
            config=api.ConsumerConfig(
                deliver_policy=deliver, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=30, max_deliver=-1
            ),
        )

    async def _refuse_if_node_taken(self) -> None:
        """Another agent answering for this node (from another folder or machine) means
        two agents would act on one node's decisions: refuse, naming it. Then answer for
        the node ourselves. With nobody there the server says so at once (no responders)."""
        subject = f"{CLAIM_PREFIX}.{self.token}"
        try:
            reply = await self.nc.request(subject, b"", timeout=NODE_CLAIM_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - no responders, a timeout, or not allowed: nobody claims it
            reply = None
        if reply is not None:
            try:
                other = json.loads(reply.data)
            except ValueError:
                other = {}
            if other.get("instance") != self.instance:
                raise AlreadyRunning(
                    f"an agent for node {self.node} is already running (pid {other.get('pid', '?')} on"
                    f" {other.get('host', '?')}): stop it first, or name this node differently"
                )

        async def answer(msg) -> None:
            body = {"instance": self.instance, "pid": os.getpid(), "host": socket.gethostname()}
            await msg.respond(json.dumps(body).encode())

        try:
            await self.nc.subscribe(subject, cb=answer)
        except Exception as err:  # noqa: BLE001 - a role without the subject: no claim check
            log.warning("host %s: cannot answer node claims (%r)", self.node, err)

    def _forget_copies(self, job: str) -> None:
        """A job that has ended resumes no more: its checkpoints' second copies here go.
        (Copies on hosts where earlier runs of it saved stay, as its bus copies do.)"""
        folders = [ckptcopy.job_folder(self.copies_root, job), pathcopy.host_job_folder(self.dir, job)]
        folders += [root / pathcopy.COPIES_SUBDIR for root in ckptpath.job_roots(self.ckpt_roots, job)]
        for folder in folders:
            if folder.exists():
                # rmtree never follows a link (one planted as the folder itself fails it).
                task = asyncio.get_running_loop().create_task(asyncio.to_thread(shutil.rmtree, folder, True))
                self._cleanups.add(task)  # a task nobody holds may be collected before it ends
                task.add_done_callback(self._cleanups.discard)

    def _hold_for_copy(self, inp: T.Input, job: str, fact: Path) -> bool:
        """Whether a run's fact waits for its checkpoint's second copy (the outbox asks before
        delivering it): a checkpoint the job wrote itself counts, and is reported, once both
        copies are verified, so a release at a notice (a later fact of the run) waits too."""
        if not (isinstance(inp, T.CheckpointSaved) and ckptpath.is_file_path(inp.path)):
            return False
        key = str(fact)
        if key in self._copied:
            self._copied.discard(key)
            return False
        run = self.runs.get(job)
        if run is not None and run.ckpt_copies < 2:
            return False
        if key not in self._copying:
            task = asyncio.get_running_loop().create_task(self._second_copy(inp, job, run, key))
            self._copying[key] = task
        return True

    async def _second_copy(self, inp: T.CheckpointSaved, job: str, run: Run | None, key: str) -> None:
        """Make and verify the second copy of a checkpoint the job wrote (agents/pathcopy.py),
        then let its fact go; a copy refused leaves the checkpoint with one copy, said in the
        agent's log and the run's output."""
        roots = ckptpath.job_roots(self.ckpt_roots, job)
        owner = self._job_owner(run) if run is not None else None
        try:
            src_root, rel = pathcopy.source_of(roots, inp.path)
            name = rel.rpartition("/")[2] or "checkpoint"
            if len(roots) > 1:
                dest_top = roots[(roots.index(src_root) + 1) % len(roots)]
                where = f"the checkpoint root {dest_top.parent}"
                copies = dest_top / pathcopy.COPIES_SUBDIR
                dest_rel = f"{pathcopy.COPIES_SUBDIR}/{pathcopy.digest_hex(inp.digest)}/{name}"
            else:
                dest_top, owner = pathcopy.host_job_folder(self.dir, job), None
                where = f"{self.node}'s disk"
                copies = dest_top
                dest_rel = f"{pathcopy.digest_hex(inp.digest)}/{name}"
            size = await asyncio.to_thread(
                pathcopy.copy_verified,
                src_root,
                rel,
                dest_top,
                dest_rel,
                inp.digest,
                self.disk_floor_bytes,
                owner,
            )
            await asyncio.to_thread(pathcopy.keep_newest, copies, pathcopy.digest_hex(inp.digest))
            log.info(
                "host %s: %s: checkpoint of step %d: second copy on %s, verified (%d bytes copied)",
                self.node,
                job,
                inp.step,
                where,
                size,
            )
            line = ""
        except (pathcopy.CopyRefused, OSError) as err:
            line = (
                f"xirang: checkpoint of step {inp.step} at {inp.path} keeps one copy: no second copy ({err})"
            )
            log.warning("host %s: %s: %s", self.node, job, line.removeprefix("xirang: "))
        except asyncio.CancelledError:
            self._copying.pop(key, None)  # the agent stops: copied again when it starts
            raise
        except Exception:  # noqa: BLE001 - a bug here must not hold the run's facts for good
            log.exception("host %s: %s: second copy of step %d failed", self.node, job, inp.step)
            line = f"xirang: checkpoint of step {inp.step} keeps one copy: its second copy failed"
        self._copying.pop(key, None)
        self._copied.add(key)
        if self._outbox_wake is not None:
            self._outbox_wake.set()
        if run is not None and line:
            with contextlib.suppress(OSError):
                with open(Path(run.dir) / "output.log", "a") as out:
                    out.write(line + "\n")

    async def _serve_copies(self) -> None:
        """Serve this node's second copies of its jobs' checkpoints to their later runs."""
        try:
            await ckptcopy.serve(self.nc, self.node, self.copies_root, self.paths_root)
        except Exception as err:  # noqa: BLE001 - a role without the subject: the bus's copy only
            log.warning("host %s: cannot serve checkpoint copies (%r)", self.node, err)

    async def _heartbeats(self) -> None:
        subject = f"{bus.HB_PREFIX}.{self.token}"
        last = time.monotonic()
        while True:
            now = time.monotonic()
            if now - last > PAUSE_DETECT_S:
                # We were stopped (SIGSTOP, a frozen VM): our node may have been declared
                # down and our jobs given away. Read the decisions first; report after.
                log.warning(
                    "host %s: paused for %.1f s; catching up on decisions before reporting",
                    self.node,
                    now - last,
                )
                self._caught_up.clear()
            last = now
            if self.disk.look():
                self._disk_changed()
            body = {
                "healthy": not self.disk.low,
                "problem": self.disk.problem if self.disk.low else "",
                # Facts dropped so far, per job still running here (agents/outbox.py).
                "facts_dropped": {job: n for job, n in self.facts_dropped.items() if job in self.runs},
                "node": self.node,
                "gpu_model": self.inventory.model,
                "gpus": len(self.inventory.gpus),
                "jobs": sorted(self.runs),
                "t": int(time.time() * 1000),
                "instance": self.instance,
                "pid": os.getpid(),
                "host": socket.gethostname(),
            }
            try:
                await self.nc.publish(subject, json.dumps(body).encode())
            except Exception:  # noqa: BLE001 - reconnecting; the scheduler's timeout is the judge
                pass
            await asyncio.sleep(HEARTBEAT_S)

    async def _consume(self, sub) -> None:
        while not self.stop_event.is_set():
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=0.5)
            except (asyncio.TimeoutError, TimeoutError):
                self._caught_up.set()  # nothing pending: every decision so far is acted on
                continue
            except Exception as err:  # noqa: BLE001 - connection trouble: retry shortly
                log.warning("host %s: fetch failed: %r", self.node, err)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                await self._handle(msg)
            if len(msgs) < FETCH_BATCH:
                self._caught_up.set()  # a short batch: nothing more was pending

    async def _handle(self, msg) -> None:
        """Act on one decision, once. A message that does not decode, or whose action
        fails, is logged and acknowledged: redelivering it would only fail again, on
        every restart."""
        try:
            record = T.decode_record(msg.data)
        except msgspec.DecodeError as err:
            log.warning("host %s: skipping undecodable message on %s: %s", self.node, msg.subject, err)
            await self._ack(msg)
            return
        problem = self._untrusted(record)
        if problem == NO_KEY:
            await msg.nak(delay=1)
            return
        if problem:
            log.error(
                "host %s: refusing record %d (%s): %s",
                self.node,
                record.n,
                T.type_name(record.event),
                problem,
            )
            await self._ack(msg)
            return
        if record.n > self.acted.last_n:
            try:
                await self._act(record)
            except Exception:  # noqa: BLE001 - one bad decision must not stop the host
                log.exception(
                    "host %s: acting on record %d (%s) failed; skipped",
                    self.node,
                    record.n,
                    T.type_name(record.event),
                )
            self.acted.last_n = record.n
            self._save_acted()
        await self._ack(msg)

    async def _ack(self, msg) -> None:
        try:
            await msg.ack()
        except Exception as err:  # noqa: BLE001 - redelivered later; acted-on records are skipped
            log.warning("host %s: ack failed: %r", self.node, err)

    def _untrusted(self, record: T.Record) -> str:
        """Why this record must not be acted on ('' when the scheduler signed it)."""
        if self.keyring is None:
            path = self.keyring_path
            if path is None or not path.exists():
                if not self._warned_no_key:
                    log.error(
                        "host %s: no scheduler public key at %s: pass --public-key FILE "
                        "(from `xirang key create`); decisions wait until it is there",
                        self.node,
                        path,
                    )
                    self._warned_no_key = True
                return NO_KEY
            self.keyring = KeyRing.load(path)
        return verify_one(self.keyring, record) or ""

    # ------------------------------------------------------------ decisions

    async def _act(self, record: T.Record) -> None:
        ev = record.event
        self.actions += 1
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            await self._start(record.n, ev)
        elif isinstance(ev, T.VictimNotified):
            await self._notify(ev)
        elif isinstance(ev, T.NoticeWithdrawn):
            self._withdraw(ev.job)
        elif isinstance(ev, T.JobCancelled):
            self._stop_run(ev.job, "cancelled")
            self._forget_copies(ev.job)
        elif isinstance(ev, T.JobStopRequested):
            self._stop_run(ev.job, ev.reason)
        elif isinstance(ev, (T.JobFinished, T.JobFailed)):
            self._stop_run(ev.job, "finished_elsewhere")
            self._forget_copies(ev.job)
        elif isinstance(ev, T.NodeLost) and ev.node == self.node:
            asyncio.create_task(self._rejoin())

    async def _start(self, n: int, ev: T.JobStartRequested | T.JobResumeRequested) -> None:
        existing = self.runs.get(ev.job)
        if existing is not None and existing.n == n:
            return  # already started by this very record (before a crash)
        marker = f"{self.node}/{ev.job}/{n}"
        if self.disk.look():
            self._disk_changed()
        if self.disk.low:
            # Not the job's fault: it queues again (the whole gang), and runs elsewhere if
            # another node fits; this node takes runs again once its disk has room. Said
            # after a pause, so that a job this node alone fits is not offered it again
            # and again meanwhile.
            log.warning("host %s: not starting %s: %s", self.node, ev.job, self.disk.problem)
            refusal = T.Finished(job=ev.job, ok=False, requeue=True, attempt=n)
            self._refusals.append((time.monotonic() + REFUSAL_PAUSE_S, refusal, f"{marker}:refused"))
            return
        gpus = [g for slot in ev.placement if slot.node == self.node for g in slot.gpus]
        primary = bool(ev.placement) and ev.placement[0].node == self.node
        resume = isinstance(ev, T.JobResumeRequested) and bool(ev.ckpt_digest)
        adopted, run_dir = self._unrecorded_run(ev.job, n, marker)
        run = Run(
            job=ev.job,
            n=n,
            dir=str(run_dir),
            primary=primary,
            resume=resume,
            started_t=time.time(),
            gpus=gpus,
            gang=len(rendezvous.node_order(ev.placement)) > 1,
            preempt_signal=getattr(ev, "preempt_signal", ""),
            grace_s=getattr(ev, "grace_s", 0.0),
            ckpt_copies=getattr(ev, "ckpt_copies", 1),
        )
        if not adopted:
            # Nothing of an older run, of this job or of one that gave these GPUs up, may
            # still run when this one starts.
            await self._vacate(ev.job, gpus)
        cannot_start = "" if adopted else self._start_problem(run, n)
        resume_env: dict[str, str] = {}
        if not cannot_start and isinstance(ev, T.JobResumeRequested) and _resumes_from_path(ev):
            resume_env = await self._verified_resume(run, ev, marker)
            run.resume = False  # the host checked the checkpoint: it reports `started` itself
        if not cannot_start:
            try:
                with self._run_user(adopted, run_dir) as user:
                    run.job_uid = user.uid if isinstance(self.job_user, UidPool) else 0
                    run_dir.mkdir(parents=True, exist_ok=True)
                    self._hand_over(run, run_dir)
                    if adopted:
                        run.pid = adopted
                    else:
                        run.pid = self._spawn(run, marker, gpus, ev, resume_env)
            except OSError as err:
                cannot_start = f"cannot start its process here: {err}"
        if cannot_start:
            # All parts of a run start or none: the scheduler stops the others and queues it again.
            log.warning("host %s: %s (run %d) cannot start: %s", self.node, ev.job, n, cannot_start)
            await self._report(
                T.Finished(job=ev.job, ok=False, requeue=True, attempt=n), f"{marker}:cannot-start"
            )
            return
        self.runs[ev.job] = run
        self._save_run(run)
        log.info(
            "host %s: %s %s on GPUs %s (pid %d)",
            self.node,
            "resumed" if resume else "started",
            ev.job,
            gpus,
            run.pid,
        )
        if primary and not run.resume:
            # An SDK job restoring a checkpoint reports `started` itself, after checking
            # the checkpoint's digest (a bad one must be reported before it starts).
            copy = int(resume_env.pop(RESTORED_COPY, "0"))
            await self._report(T.Started(job=ev.job, attempt=n, restored_copy=copy), f"{marker}:started")

    async def _vacate(self, job: str, gpus: list[int]) -> None:
        """Wait until no older run of `job`, and no run that is letting go of one of `gpus`
        (notified or being stopped), still runs here: an older run of the job is stopped
        (a gang's part left from a run the scheduler gave up), the others get their grace
        time, then SIGKILL from the monitor."""
        older = self.runs.get(job)
        if older is not None:
            self._stop_run(job, "superseded")
        leaving = [
            r
            for r in self.runs.values()
            if r is older or ((r.notified or r.stopping) and set(r.gpus) & set(gpus))
        ]
        deadline = time.monotonic() + max([self._grace_of(r) for r in leaving] + [0.0]) + DRAIN_SLACK_S
        while leaving and time.monotonic() < deadline:
            for r in leaving:
                if r.notified and not r.term_sent_t and time.time() - r.started_t >= SDK_WAIT_S:
                    self._terminate(r)  # a notified part that has not gone by now is stopped
            await asyncio.sleep(MONITOR_S)
            leaving = [r for r in leaving if self.runs.get(r.job) is r]

    def _grace_of(self, run: Run) -> float:
        return run.grace_s or self.grace_s

    def _start_problem(self, run: Run, n: int) -> str:
        """Why this part of a run cannot start on this host ('' when it can)."""
        if run.gang and run.primary:
            port = rendezvous.master_port(n)
            if rendezvous.port_taken(port):
                return f"its rendezvous port {port} is taken on this host"
        return ""

    async def _verified_resume(self, run: Run, ev: T.JobResumeRequested, marker: str) -> dict[str, str]:
        """The variables that tell a job without the SDK where to resume from: the newest of
        its checkpoints (recorded with a path) of which a copy still matches its digest: the
        path the job wrote, else its second copy (agents/pathcopy.py). A checkpoint with no
        good copy left is reported (the scheduler records the fallback); each step is said in
        the run's output; with none left, the job starts from scratch and is told so."""
        roots = ckptpath.job_roots(self.ckpt_roots, ev.job)
        notes: list[str] = []
        chosen, chosen_path, copy = None, "", 0
        for point in ev.resume_points:
            problem = ckptpath.path_problem(point.path, roots)
            if not problem:
                try:
                    digest, _ = await asyncio.to_thread(ckptpath.digest_path, point.path)
                except OSError as err:
                    problem = f"cannot read it ({err})"
                else:
                    problem = (
                        "" if digest == point.digest else f"its content no longer matches {point.digest}"
                    )
            if not problem:
                chosen, chosen_path, copy = point, point.path, 1
                break
            second, said = "", ""
            if run.ckpt_copies >= 2 and pathcopy.digest_hex(point.digest):
                second, said = await self._second_copy_of(run, ev.job, point)
            notes.append(f"xirang: checkpoint of step {point.step} at {point.path}: {problem}; {said}")
            if second:
                chosen, chosen_path, copy = point, second, 2
                break
            if run.primary:
                await self._report(
                    T.CheckpointFailed(
                        job=ev.job, reason="digest_mismatch", digest=point.digest, attempt=run.n
                    ),
                    f"{marker}:bad-{point.digest[-16:]}",
                )
        notes.append(
            f"xirang: resuming from step {chosen.step} at {chosen_path} (copy {copy})"
            if chosen
            else "xirang: no checkpoint of this job verifies: starting from scratch"
        )
        Path(run.dir).mkdir(parents=True, exist_ok=True)
        with open(Path(run.dir) / "output.log", "a") as out:
            out.write("".join(note + "\n" for note in notes))
        if chosen is None:
            return {"XR_RESUME_STEP": "0", "XR_RESUME_DIGEST": "", "XR_RESUME_PATH": ""}
        return {
            "XR_RESUME_STEP": str(chosen.step),
            "XR_RESUME_DIGEST": chosen.digest,
            "XR_RESUME_PATH": chosen_path,
            RESTORED_COPY: str(copy),
        }

    async def _second_copy_of(self, run: Run, job: str, point) -> tuple[str, str]:
        """(the path of a verified second copy of `point` the job can read, '' : none; what was
        found, in words). Looked for in the job's folder of each of this host's checkpoint
        roots (a second root's copy), then on this host's disk, then asked of the agent of
        the node that reported the checkpoint (the resume point names it); one from a disk
        of an agent's is copied into the job's first folder and verified there again."""
        self._ckpt_env(run)  # the job's first folder, made and its own
        roots = ckptpath.job_roots(self.ckpt_roots, job)
        hexpart = pathcopy.digest_hex(point.digest)
        for root in roots:
            name = await asyncio.to_thread(pathcopy.copy_entry, root / pathcopy.COPIES_SUBDIR, point.digest)
            rel = f"{pathcopy.COPIES_SUBDIR}/{hexpart}/{name}"
            if name and await self._digest_is(root, rel, point.digest):
                return str(root / rel), f"its second copy at {root / rel} matches"
        owner = self._job_owner(run)
        local = pathcopy.host_job_folder(self.dir, job)
        name = await asyncio.to_thread(pathcopy.copy_entry, local, point.digest)
        dest_rel = f"{pathcopy.COPIES_SUBDIR}/{hexpart}/{name}"
        if name and await self._digest_is(local, f"{hexpart}/{name}", point.digest):
            try:
                await asyncio.to_thread(
                    pathcopy.copy_verified,
                    local,
                    f"{hexpart}/{name}",
                    roots[0],
                    dest_rel,
                    point.digest,
                    0,
                    owner,
                )
                return str(roots[0] / dest_rel), f"its second copy on {self.node}'s disk matches"
            except pathcopy.CopyRefused as err:
                return "", f"its second copy on {self.node}'s disk cannot be restored ({err})"
        node = point.node if isinstance(point.node, str) else ""
        if not node or node == self.node:
            return "", "no second copy of it is left"
        try:
            async with self._job_connection(run, job) as nc:
                rel = await pathcopy.fetch(nc, ckptcopy.subject(node, job), point.digest, roots[0], owner)
        except (pathcopy.CopyRefused, OSError) as err:
            return "", f"no good second copy from {node}'s agent ({err})"
        path = roots[0] / rel
        return str(path), f"its second copy, read from {node}'s disk, matches"

    async def _digest_is(self, top: Path, rel: str, digest: str) -> bool:
        try:
            return await asyncio.to_thread(pathcopy.digest_at, top, rel) == digest
        except (pathcopy.CopyRefused, OSError):
            return False

    @contextlib.asynccontextmanager
    async def _job_connection(self, run: Run, job: str):
        """A bus connection that may ask only for `job`'s own copies: with the job's own
        credentials where the bus checks them (a host may not read other jobs' copies)."""
        if self.job_minter is None:
            yield self.nc
            return
        Path(run.dir).mkdir(parents=True, exist_ok=True)
        path = self.job_minter.write(job, Path(run.dir) / JOB_CREDS_FILE, owner=self._job_owner(run))
        nc, _ = await bus.connect(self.url, name=f"host-{self.node}-copies", creds=str(path))
        try:
            yield nc
        finally:
            await nc.close()

    @contextlib.contextmanager
    def _run_user(self, adopted_pid: int, run_dir: Path):
        """The user a new run is started as (None: the agent's own): with a uid pool, a free uid,
        kept from other agents until the block has started the run's process; for a process a
        crashed agent started before recording it, the uid it runs as."""
        if not isinstance(self.job_user, UidPool):
            yield self.job_user
        elif adopted_pid:
            yield numeric_user(process_uid(adopted_pid))
        else:
            with self.job_user.lease({r.job_uid for r in self.runs.values() if r.job_uid}) as user:
                yield user

    def user_of(self, run: Run) -> JobUser | None:
        """The user `run` runs as (None: the agent's own): its own uid if it was given one
        (whatever this agent's --job-user or range now), else the one job user."""
        if run.job_uid:
            return numeric_user(run.job_uid)
        return None if isinstance(self.job_user, UidPool) else self.job_user

    def _hand_over(self, run: Run, path: Path) -> None:
        """Give the run's user what its job must read or write (its run folder and files in it)."""
        user = self.user_of(run)
        if user is not None:
            user.own(path)

    def _hand_over_tree(self, run: Run, folder: Path) -> None:
        """Give the run's user a folder and all in it, when another user holds it: a job's
        checkpoint folder outlives its runs, and each run may have a uid of its own (an older
        run of the job, if one still lives, can then no longer write there)."""
        user = self.user_of(run)
        if user is None or folder.stat().st_uid == user.uid:
            return
        for parent, dirs, files in os.walk(folder):
            for name in dirs + files:
                os.lchown(os.path.join(parent, name), user.uid, user.gid)
        user.own(folder)

    def _job_owner(self, run: Run) -> tuple[int, int] | None:
        user = self.user_of(run)
        return None if user is None else (user.uid, user.gid)

    def _write_notice(self, run: Run, notice: dict) -> None:
        write_durably(Path(run.dir) / NOTICE_FILE, json.dumps(notice).encode())
        self._hand_over(run, Path(run.dir) / NOTICE_FILE)

    def _spawn(self, run: Run, marker: str, gpus: list[int], ev, resume_env: dict[str, str]) -> int:
        command = list(ev.command) or list(self.default_command)
        # A job never inherits the host's secrets: not its NATS credentials, not any key.
        env = {k: v for k, v in os.environ.items() if k not in JOB_WITHHELD_ENV}
        if self.job_minter is not None:
            # In the run's private folder (0600), never on its command line.
            path = self.job_minter.write(ev.job, Path(run.dir) / JOB_CREDS_FILE, owner=self._job_owner(run))
            env[CREDS_ENV] = str(path)
        if self.ckpt_secret:
            env[ckptfile.KEY_ENV] = ckptfile.job_key(self.ckpt_secret, ev.job).hex()
        # `python` in a job's command means the interpreter (and venv) the agent runs in.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        user = self.user_of(run)
        if user is not None:
            env.update(HOME=run.dir, USER=user.name, LOGNAME=user.name)
        outbox = self.outbox.watch_job(Path(run.dir) / "outbox", ev.job)
        self._hand_over(run, outbox)
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus),
                MARKER_ENV: marker,
                "XR_JOB": ev.job,
                "XR_NODE": self.node,
                "XR_NATS_URL": self.url,
                "XR_JOB_DIR": run.dir,
                "XR_OUTBOX": str(outbox),
                "XR_PRIMARY": "1" if run.primary else "0",
                "XR_REPORT_STARTED": "1" if run.resume and run.primary else "0",
                "XR_RESUME_STEP": str(getattr(ev, "ckpt_step", 0) or 0),
                "XR_RESUME_DIGEST": getattr(ev, "ckpt_digest", "") or "",
                "XR_RESUME_POINTS": json.dumps(
                    [msgspec.to_builtins(p) for p in getattr(ev, "resume_points", [])]
                ),
                "XR_PREEMPT_SIGNAL": run.preempt_signal or "SIGTERM",
                "XR_GRACE_S": str(self._grace_of(run)),
                **self._ckpt_env(run),
                **self._copies_env(run, getattr(ev, "ckpt_copies", 1)),
                **rendezvous.gang_env(self.node, run.n, ev),
                **resume_env,
            }
        )
        import subprocess

        out = self._output_pipe(Path(run.dir) / "output.log", self._output_cap(ev))
        as_user = user.popen_kwargs() if user is not None else {}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agents.jobwrap", str(Path(run.dir) / EXIT_FILE), "--", *command],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=os.getcwd(),
                **as_user,
            )
        finally:
            os.close(out)
        self._children[proc.pid] = proc
        return proc.pid

    def _ckpt_env(self, run: Run) -> dict[str, str]:
        """The job's own checkpoint folders (agents/ckptpath.py): the first made for it."""
        roots = ckptpath.job_roots(self.ckpt_roots, run.job)
        try:
            if not roots[0].parent.exists():
                # A root the agent makes: jobs under other users reach their own folder by
                # name, and list nothing (like the runs folder).
                roots[0].parent.mkdir(parents=True, exist_ok=True)
                os.chmod(roots[0].parent, 0o711)
            roots[0].mkdir(exist_ok=True)
            self._hand_over_tree(run, roots[0])
        except OSError as err:  # e.g. a shared filesystem away: the job can still run
            log.warning("host %s: cannot make checkpoint folder %s: %r", self.node, roots[0], err)
        return {"XR_CKPT_DIR": str(roots[0]), "XR_CKPT_ROOTS": os.pathsep.join(str(r) for r in roots)}

    def _copies_env(self, run: Run, copies: int) -> dict[str, str]:
        """How many verified copies the job's SDK checkpoints need, and the folder on this
        host's disk for the second (agents/ckptcopy.py): the job's own, in a folder of the
        agent's that lists nothing to others."""
        if copies < 2:
            return {"XR_CKPT_COPIES": "1"}
        folder = ckptcopy.job_folder(self.copies_root, run.job)
        try:
            if not self.copies_root.exists():
                self.copies_root.mkdir(parents=True, exist_ok=True)
                os.chmod(self.copies_root, 0o711)
            folder.mkdir(exist_ok=True)
            self._hand_over_tree(run, folder)
        except OSError as err:  # the bus's copy alone: the SDK says so
            log.warning("host %s: cannot make checkpoint copy folder %s: %r", self.node, folder, err)
            return {"XR_CKPT_COPIES": str(copies)}
        return {"XR_CKPT_COPIES": str(copies), "XR_CKPT_COPY_DIR": str(folder)}

    def _output_cap(self, ev) -> int:
        """The output a run may keep here: the policy's cap carried by its start
        (`job_output_max_mb`), never more than this host's own (`--job-output-max-mb`), which
        stays the machine's floor whatever the policy says."""
        policy_cap = getattr(ev, "output_max_bytes", msgspec.UNSET)
        if isinstance(policy_cap, int) and policy_cap > 0:
            return min(self.output_max_bytes, policy_cap)
        return self.output_max_bytes

    def _output_pipe(self, path: Path, max_bytes: int) -> int:
        """The write end of a pipe whose reader keeps the run's output in `path`, capped at
        `max_bytes` and rotated (agents/outcap.py), as the agent's user: the job can neither
        stop it nor make it write more."""
        import subprocess

        read_end, write_end = os.pipe()
        try:
            keeper = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agents.outcap",
                    str(path),
                    "--max-bytes",
                    str(max_bytes),
                    "--floor-bytes",
                    str(self.disk_floor_bytes),
                ],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(Path(__file__).resolve().parent.parent),
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._keepers.append(keeper)
        return write_end

    async def _notify(self, ev: T.VictimNotified) -> None:
        run = self.runs.get(ev.job)
        if run is None:
            return  # already gone: its exit was (or will be) reported
        run.notified, run.withdrawn = True, False
        notice = {"saga": ev.saga, "deadline_t": ev.deadline_t, "checkpoint_needed": ev.checkpoint_needed}
        self._write_notice(run, notice)
        run.notice_pending = True
        self._save_run(run)
        self._deliver_notice(run)

    def _deliver_notice(self, run: Run) -> None:
        if (Path(run.dir) / SDK_MARKER).exists():
            run.notice_pending = False
            self._save_run(run)
            _signal_group(run.pid, signal.SIGUSR1)
        elif time.time() - run.started_t >= SDK_WAIT_S:
            run.notice_pending = False
            # The job's own signal (Slurm's --signal), SIGTERM by default; SIGKILL after its grace.
            self._terminate(run, _signal_number(run.preempt_signal))

    def _withdraw(self, job: str) -> None:
        run = self.runs.get(job)
        if run is None:
            return
        run.notified, run.withdrawn, run.notice_pending = False, True, False
        try:
            (Path(run.dir) / NOTICE_FILE).unlink()
        except FileNotFoundError:
            pass
        self._save_run(run)

    def _stop_run(self, job: str, why: str) -> None:
        run = self.runs.get(job)
        if run is None:
            return
        run.stopping = why
        self._save_run(run)
        self._terminate(run)

    def _terminate(self, run: Run, sig: int = signal.SIGTERM) -> None:
        if not run.term_sent_t:
            run.term_sent_t = time.time()
            self._save_run(run)
            _signal_group(run.pid, sig)

    async def _rejoin(self) -> None:
        for run in list(self.runs.values()):
            self._stop_run(run.job, "node_lost")
        deadline = time.monotonic() + self.grace_s + 5
        while self.runs and time.monotonic() < deadline:
            await asyncio.sleep(MONITOR_S)
        await self._report_up()

    async def _report_up(self) -> None:
        """`node_up`, then the node's health as it is now: the scheduler cordons a node that
        says it is unhealthy, and a node that restarted healthy lifts a cordon of its own
        that outlived the agent."""
        await self._report(self._node_up(), f"up-{uuid.uuid4().hex}")
        if self.disk.look():
            self._disk_changed()  # says so (log, alert) and reports the node's health
        else:
            await self._report(self._node_health(), f"health-{uuid.uuid4().hex}")

    def _node_health(self) -> T.NodeHealth:
        return T.NodeHealth(
            node=self.node, healthy=not self.disk.low, reason=self.disk.problem if self.disk.low else ""
        )

    def _node_up(self) -> T.NodeUp:
        return T.NodeUp(
            node=self.node,
            gpu_model=self.inventory.model,
            gpus=len(self.inventory.gpus),
            advertise_addr=self.advertise_addr,
        )

    # ------------------------------------------------------------ processes

    async def _monitor(self) -> None:
        while True:
            self._keepers = [k for k in self._keepers if k.poll() is None]
            await self._report_refusals(time.monotonic())
            for run in list(self.runs.values()):
                try:
                    await self._check(run)
                except Exception as err:  # noqa: BLE001 - one bad run must not stop the others
                    log.warning("host %s: checking %s failed: %r", self.node, run.job, err)
            await asyncio.sleep(MONITOR_S)

    async def _check(self, run: Run) -> None:
        if self._alive(run):
            self._renew_creds(run)
            if run.notice_pending:
                self._deliver_notice(run)
            if run.term_sent_t and not run.killed and time.time() - run.term_sent_t > self._grace_of(run):
                run.killed = True
                self._save_run(run)
                _signal_group(run.pid, signal.SIGKILL)
                # Processes that left the group (torchrun starts its workers in sessions of
                # their own) go too: they carry the run's marker.
                kill_run_processes(f"{self.node}/{run.job}/{run.n}", run.dir)
            return
        await self._exited(run)

    def _renew_creds(self, run: Run) -> None:
        """A live run's credentials are renewed once a third of their lifetime has passed;
        the job's NATS client reads the file again at each (re)connect, so a connection the
        server closes at expiry comes back with the renewed ones."""
        if self.job_minter is None or not run.dir:
            return
        path = Path(run.dir) / JOB_CREDS_FILE
        try:
            age_s = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            age_s = float("inf")  # e.g. adopted from an agent without a minter
        if age_s >= self.job_minter.ttl_s / 3:
            self.job_minter.write(run.job, path, owner=self._job_owner(run))  # the job's, as it lands

    def _alive(self, run: Run) -> bool:
        child = self._children.get(run.pid)
        if child is not None:
            status = child.poll()
            if status is None:
                return True
            self._children.pop(run.pid, None)
            self._wrapper_status[run.pid] = status
            return False
        # Adopted after a restart: the pid must still be our wrapper, not a reused number.
        return pid_alive(run.pid) and is_run_wrapper(
            run.pid, f"{self.node}/{run.job}/{run.n}", run.dir, run.job_uid
        )

    async def _exited(self, run: Run) -> None:
        rc = _read_rc(Path(run.dir) / EXIT_FILE)
        status = self._wrapper_status.pop(run.pid, None)
        if rc is None and status is not None and status >= 0:
            rc = jobwrap.rc_of_status(status)  # the wrapper could not write its exit file
        marker = f"{self.node}/{run.job}/{run.n}"
        # A run ends with its wrapper: whatever it left running in other sessions goes too.
        left = kill_run_processes(marker, run.dir)
        if left:
            log.warning(
                "host %s: %s's run ended leaving %d process(es): killed", self.node, run.job, len(left)
            )
        released_by_sdk = (Path(run.dir) / RELEASED_MARKER).exists()
        if run.stopping:
            pass  # the scheduler already knows why it ended
        elif not run.primary:
            # Another node's part: its end is the primary's to report, unless it failed,
            # which ends the whole run (the scheduler stops the other parts).
            if rc != 0 and not run.notified and not released_by_sdk:
                await self._report(
                    T.Finished(job=run.job, ok=False, exit_code=rc, requeue=_killed(rc), attempt=run.n),
                    f"{marker}:finished",
                )
        elif released_by_sdk and not run.withdrawn:
            pass  # the SDK reported safe_point, checkpoint and released
        elif run.notified:
            await self._report(T.Released(job=run.job, attempt=run.n), f"{marker}:released")
        else:
            # A gang's part killed by a signal (the OOM killer, a lost GPU) costs the gang its
            # run, not its life: it queues again.
            requeue = run.gang and rc != 0 and _killed(rc)
            await self._report(
                T.Finished(job=run.job, ok=rc == 0, exit_code=rc, attempt=run.n, requeue=requeue),
                f"{marker}:finished",
            )
        log.info(
            "host %s: %s exited (status %s)%s",
            self.node,
            run.job,
            rc,
            f", {run.stopping}" if run.stopping else "",
        )
        self._drop_run(run)

    def _unrecorded_run(self, job: str, n: int, marker: str) -> tuple[int, Path]:
        """The process (0: none) and folder of the run that record `n` starts: a crashed agent
        may have started it (or made its folder) without recording it; else a new folder
        with an unguessable name (agents/runfolders.py says why)."""
        folders = run_folders(self.runs_dir, job, n)
        for folder in folders:
            pid = find_marked_process(marker, str(folder))
            if pid:
                return pid, folder
        return 0, folders[-1] if folders else new_run_folder(self.runs_dir, job, n)

    async def _report(self, inp: T.Input, msg_id: str) -> None:
        """Into the durable outbox; the sender delivers it as soon as the bus takes it. On a
        full disk it goes to the bus at once instead (kept in memory until it is taken)."""
        inp = msgspec.structs.replace(inp, id=msg_id)
        try:
            self.outbox.put(inp)
        except OSError as err:
            if not no_space(err):
                raise
            self._disk_failed()
            self._undurable.append(inp)
        self._outbox_wake.set()


# ---------------------------------------------------------------- helpers


RESTORED_COPY = "XR_RESTORED_COPY"  # which copy a resume read (the `started` fact says it)


def _safe(job: str) -> str:
    return bus.node_token(job)


def _resumes_from_path(ev: T.JobResumeRequested) -> bool:
    """Whether the recorded checkpoint is one the job wrote itself (a file or folder), which
    the host checks, rather than one in the SDK's store, which the SDK checks."""
    points = ev.resume_points
    return bool(points) and points[0].digest == ev.ckpt_digest and ckptpath.is_file_path(points[0].path)


def _killed(rc: int | None) -> bool:
    """Whether an exit status means killed by a signal (or with the wrapper: none recorded)."""
    return rc is None or rc < 0


def _signal_number(name: str) -> int:
    """A signal name the core accepted ('' : SIGTERM) as its number."""
    return int(getattr(signal, name, signal.SIGTERM)) if name else int(signal.SIGTERM)


def _read_rc(path: Path) -> int | None:
    try:
        return int(json.loads(path.read_text())["rc"])
    except (OSError, ValueError, KeyError):
        return None  # killed with its wrapper: no exit status


def _take_back(folder: Path) -> None:
    """Give an ended run's folder, and all in it, back to the agent's user."""
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            os.lchown(os.path.join(parent, name), os.geteuid(), os.getegid())
    os.lchown(folder, os.geteuid(), os.getegid())


def process_uid(pid: int) -> int:
    """The real uid process `pid` runs as."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise ProcessLookupError(pid)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)  # the wrapper leads its own session and process group
    except ProcessLookupError:
        pass


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def is_run_wrapper(pid: int, marker: str, job_dir: str, uid: int = 0) -> bool:
    """Whether process `pid` is the wrapper of this run (not a reused pid): it runs
    agents.jobwrap with the run's exit file (in its folder, whose name no one else knows), as
    the run's own uid when it has one, and carries the run's marker in its environment. Its
    environment is read where the agent may (same user, or CAP_SYS_PTRACE); where it may not,
    the command line and uid (world-readable) decide, so no extra capability is needed."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
        if uid and process_uid(pid) != uid:
            return False
    except (OSError, ProcessLookupError):
        return False
    if b"agents.jobwrap" not in args or str(Path(job_dir) / EXIT_FILE).encode() not in args:
        return False
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except PermissionError:
        return True  # another user's, and the agent holds no CAP_SYS_PTRACE: command line and uid decided
    except OSError:
        return False
    return f"{MARKER_ENV}={marker}".encode() in env and f"XR_JOB_DIR={job_dir}".encode() in env


def find_marked_process(marker: str, job_dir: str) -> int:
    """The wrapper process started for this run before a crash, if it still lives. The
    marker (node/job/n) alone is not unique on a machine shared by several clusters (two
    test runs, two folders): the run's own folder, under this agent's state, must match too."""
    for entry in os.scandir("/proc"):
        if (
            entry.name.isdigit()
            and is_run_wrapper(int(entry.name), marker, job_dir)
            and pid_alive(int(entry.name))
        ):
            return int(entry.name)
    return 0


def kill_run_processes(marker: str, job_dir: str) -> list[int]:
    """SIGKILL every process of one run (its marker and folder in its environment), wherever
    it is in the process tree; the pids killed."""
    wanted = (f"{MARKER_ENV}={marker}".encode(), f"XR_JOB_DIR={job_dir}".encode())
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if all(item in env for item in wanted) and pid_alive(int(entry.name)):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


def stop_job_processes(root: str | os.PathLike) -> list[int]:
    """SIGKILL the job processes (wrappers and jobs) that agents with state under `root`
    started: they carry XR_JOB_DIR below it. For tearing down a whole local cluster; an
    agent alone never does this, because its jobs must outlive its restarts."""
    prefix = b"XR_JOB_DIR=" + str(Path(root).resolve()).encode()
    killed = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if any(var.startswith(prefix) for var in env):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


async def run_host(url: str, **kwargs) -> None:
    """Run a host agent until SIGINT or SIGTERM (which drain it)."""
    agent = HostAgent(url, **kwargs)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()
