"""The scheduler agent: the only writer of the log XR_EV.

It holds a lease (XR_LEASE key `scheduler`, compare-and-set on its revision, renewed well
inside its term); a second instance waits for the lease as a standby and takes over when
the leader stops renewing. While it waits it folds the log as it grows (a hot standby), so
a takeover costs only the last few records. The lease only decides who tries: safety
comes from fencing, every append is an atomic batch with Nats-Expected-Last-Sequence, so
a stale writer's batch is refused whole.

As leader it folds the newest snapshot plus the log tail into state, records that it
starts from a folded state (`scheduler_start`: the placement passes' memory between steps
starts afresh, and so does a re-decision of the log at that record), then reads XR_IN in
order from the input after the last applied one (the state remembers it, so an input that
was applied before a crash is never applied twice). Each input gets `t` (wall clock, never
earlier than the state's time) and `seq` (its XR_IN sequence), goes through `core.step`,
and its records join the current group commit: up to `group_max` inputs, never splitting
one input's records, appended as one atomic batch. About once a tick it steps `Tick` and
turns hosts silent past the timeout into `node_down` inputs; now and then it snapshots the
state. After a refused or unanswered batch it rebuilds state from the log and carries on
from there.

What is not on its loop, so that a frontier-scale pool cannot stall it: the hosts'
heartbeats are heard by a listener process of its own (agents/heartbeats.py), which sends
a few lines a second saying who was heard; the lease is renewed, and snapshots are put,
from a thread with its own connection (agents/lease.py). A snapshot that cannot be put is
tried again later: it only shortens the next fold, and never costs the lead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import sys
import time
import uuid

import msgspec
from nats.js import api

from core import parse_input, step
from core.model.policy_defaults import log_policy, older_defaults_note
from core.machine import reject_input
from core.identity import origin_of_subject
from core import types as T

from trust.signing import SignatureError

from transport import bus, checkpoints
from agents.heartbeats import heartbeat_node  # noqa: F401 - the rule is named here too
from agents.lease import LEASE_KEY, LeaseKeeper  # noqa: F401

log = logging.getLogger("xirang.scheduler")
ODD_HEARTBEATS_NAMED_MAX = 64  # subjects whose heartbeats name another node, logged once each
# Heartbeats remembered for nodes the state does not know yet (a host beats before its
# node_up is folded); beyond this, those of further unknown nodes are dropped (an open bus).
UNKNOWN_NODES_HEARD_MAX = 1024

# A leader whose loop has not moved for this long (nor for ten lease terms) lets its lease
# lapse: a standby should take over from a wedged leader.
LOOP_STALL_S = 30.0
# A snapshot that could not be put is tried again after this, doubling up to the max.
SNAPSHOT_RETRY_S = 5.0
SNAPSHOT_RETRY_MAX_S = 300.0
# The heartbeat listener's longest line (it names every host heard in a quarter second).
HEARD_LINE_BYTES_MAX = 64 << 20
# Subjects beating like a flood, named (and alerted) once each.
LOUD_HEARTBEATS_NAMED_MAX = 64
# Unhealthy hosts the scheduler remembers (and names in its log) at once.
UNHEALTHY_NAMED_MAX = 1024
# A job's dropped facts are said again after this many more.
FACTS_DROPPED_SAID_EVERY = 1000
# An input that waited in XR_IN longer than this is dated when the bus received it.
WAITED_MS = 1000
# How much of a foreign message's problem a `RecordDisowned` keeps (a name field's bound),
# and how many of their sequences one alert lists.
DISOWN_PROBLEM_CHARS_MAX = 200
DISOWN_ALERT_SEQS_MAX = 100
# An orderly stop hands the lease back within this; past it (a bus away or slow) it just goes.
LEAVE_TIMEOUT_S = 3.0
# A stop waits this long for the step under way before cancelling it.
STOP_GRACE_S = 1.0
# Appends unanswered in a row (while reads are answered) before the store is said stuck.
STORE_STUCK_AFTER_WRITES = 3
# How long a streaming burst of inputs may wait to share one group commit.
LINGER_MS = 5.0
# Ended jobs' checkpoints are looked for at least this often (ended_job_checkpoints_kept_s).
CHECKPOINT_SWEEP_S = 60.0
ENDED_EVENTS = (T.JobFinished, T.JobFailed, T.JobCancelled)


def stamped_input(
    data: bytes, seq: int, now: int, state_t: int, subject: str = "", senders_required: bool = False
) -> T.Input:
    """An input as the scheduler steps it: decoded (never raising: bytes out of bounds or
    undecodable become `Malformed`), stamped with its XR_IN sequence, the time it is
    taken (never earlier than the state's) and its sender, read from the subject the
    server authenticated (never from the body), with `operator` as that subject vouches.
    On an authenticated bus (`senders_required`) a subject that names no sender stamps the
    input `unknown:<subject>`, which the core refuses (core/identity.py)."""
    inp = bus.vouched(parse_input(data), subject)
    origin = origin_of_subject(subject, bus.IN_PREFIX, senders_required)
    return msgspec.structs.replace(inp, t=max(now, state_t), seq=seq, origin=origin)


def bus_authenticates(nc) -> bool:
    """Whether the server we are connected to authenticates its users (its INFO says
    `auth_required`): then every input's sender must be one the subject establishes."""
    info = getattr(nc, "_server_info", None) or {}
    return bool(info.get("auth_required"))


def received_ms(msg) -> int | None:
    """When the bus stored an XR_IN message (its server's clock), in ms; None if not said."""
    stamp = getattr(msg.metadata, "timestamp", None)
    if stamp is None:
        return None
    return int(stamp.timestamp() * 1000)


def input_time(now: int, received: int | None) -> int:
    """The time an input is stamped with: when it is taken, or, for one that waited in XR_IN
    longer than WAITED_MS (the scheduler was down, or a burst queued), when the bus received
    it. So a fact sent while the scheduler was away (a job's end, a victim's release) is
    dated when it happened, and the downtime counts as neither run time nor lost progress.
    A server clock ahead of ours changes nothing (the input did not wait); the state's
    time still never goes back (`stamped_input`)."""
    if received is None or now - received <= WAITED_MS:
        return now
    return received


class EffectsTooLarge(RuntimeError):
    """One input led to more records than one atomic batch may hold."""


class LostLeadership(Exception):
    """Our lease was taken or a batch was fenced: stop, re-read the log, try again."""


def now_ms() -> int:
    """Wall-clock time in milliseconds (the only clock the scheduler reads; the core gets time
    in its inputs)."""
    return int(time.time() * 1000)


class Scheduler:
    """The scheduler process: holds the leader lease, folds the log into the state, steps the
    core on each input from XR_IN, and appends the records atomically; a standby follows the
    log and takes over when the lease lapses."""

    def __init__(
        self,
        url: str,
        instance: str | None = None,
        tick_ms: int = 1000,
        group_max: int = 256,
        node_timeout_ms: int = 10_000,
        lease_ms: int = 3000,
        snapshot_every_events: int = 5000,
        snapshot_every_ms: int = 30_000,
        policy: dict | None = None,
        linger_ms: float | None = None,
        signer=None,
        keyring=None,
        unknown_nodes_heard_max: int = UNKNOWN_NODES_HEARD_MAX,
    ) -> None:
        self.url = url
        # The log is signed with `signer` (trust.signing.Signer); records and snapshots
        # read back are trusted only under `keyring` (its own key and any rotated ones).
        self.signer = signer
        self.keyring = keyring if keyring is not None else (signer.keyring() if signer else None)
        self.instance = instance or f"sched-{uuid.uuid4().hex[:8]}"
        self.sender = f"sched:{self.instance}"  # who its own inputs come from (core/identity.py)
        self.tick_ms = tick_ms
        self.group_max = group_max
        self.node_timeout_ms = node_timeout_ms
        self.lease_ms = lease_ms
        self.snapshot_every_events = snapshot_every_events
        self.snapshot_every_ms = snapshot_every_ms
        self.policy = policy or {}
        self.linger_ms = LINGER_MS if linger_ms is None else linger_ms
        self.stop_event = asyncio.Event()
        self.leading = asyncio.Event()
        self.state = None
        self.ev_seq = 0
        self.appended_batches = 0
        self.internal_errors = 0
        self.nc = self.js = None
        self.lease: LeaseKeeper | None = None
        self._loop_moved = time.monotonic()  # the loop's last step (the lease keeper reads it)
        self._lease_unanswered_seen = 0
        self._snapshot_put: asyncio.Future | None = None
        self._snapshot_covers = (0, 0.0)  # (records, when) of the snapshot being put
        self._snapshot_bytes = 0
        self._snapshot_encode_s = 0.0
        self._last_snapshot = (0, 0.0)  # ... and of the last one put
        self._snapshot_retry_at = 0.0
        self._snapshot_retry_s = SNAPSHOT_RETRY_S
        self.snapshots_failed = 0
        self._listener = None  # the heartbeat listener process
        self._listening = False  # ... has said it listens (no host is silent before that)
        self._said_lossy = False
        self._loud_heartbeats: set[str] = set()
        # Last heartbeat of each node the state knows, in the order heard (the longest
        # silent first: `_watch_hosts` reads only the silent ones) ...
        self._heard: dict[str, float] = {}
        # ... unless a node joined, a state was folded or a node was heard out of turn since:
        # then the next watch gives every up node an entry and orders them again.
        self._heard_unordered = True
        # ... and of nodes it does not know (yet), at most `unknown_nodes_heard_max` of them.
        self._heard_unknown: dict[str, float] = {}
        self.unknown_nodes_heard_max = unknown_nodes_heard_max
        self._warned_unknown_full = False
        self._odd_heartbeats: set[str] = set()  # subjects whose heartbeats named another node
        self._reconnected = False
        self._down_sent: dict[str, float] = {}
        # A standby's follow passed over a foreign message not disowned yet: a takeover
        # folds from the snapshot, so that it sees the message and disowns it.
        self._foreign_in_tail = False
        self.disowned = 0  # foreign messages this instance disowned
        self._writes_unanswered = 0  # appends unanswered in a row while connected
        self._unhealthy: dict[str, str] = {}  # hosts whose heartbeats say unhealthy: why
        self._facts_dropped_said: dict[str, int] = {}  # node/job -> facts dropped, as last said
        # Ended jobs whose checkpoints may still be in XR_CKPT: when each ended (ms), as this
        # instance saw it (a job that ended before it led counts from when it first looked).
        self._ended_t: dict[str, int] = {}
        self._next_checkpoint_sweep = 0.0
        self.checkpoints_purged = 0  # ended jobs whose checkpoints this instance purged

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Take part in leader election and schedule while leader, until stopped; a lost
        connection is waited out."""
        # A lost connection is waited out, never a reason to exit: the client reconnects
        # forever, and a reconnect makes the leader re-read the log (its consumer and any
        # batch in flight may be gone) and gives every host a full timeout again.
        self.nc, self.js = await bus.connect_forever(
            self.url,
            name=self.instance,
            stop=self.stop_event,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        await self._retry("creating streams", self._open_buckets)
        self.lease = LeaseKeeper(
            self.url,
            self.instance,
            self.lease_ms,
            lambda: self._loop_moved,
            max(LOOP_STALL_S, 10 * self.lease_ms / 1000),
        )
        hearing = asyncio.ensure_future(self._hear_hosts())
        try:
            work = asyncio.ensure_future(self._elect_and_lead())
            stopped = asyncio.ensure_future(self.stop_event.wait())
            await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                # The step under way may wait on the bus (an outage: a request's full
                # timeout): it gets a moment, then is cancelled. An append cut short is
                # safe: it was fenced, and the next leader re-reads the log.
                done, _ = await asyncio.wait({work}, timeout=STOP_GRACE_S)
                if not done:
                    work.cancel()
            stopped.cancel()
            await asyncio.gather(work, stopped, return_exceptions=True)
            if not work.cancelled() and work.exception() is not None:
                raise work.exception()
        finally:
            hearing.cancel()
            with contextlib.suppress(BaseException):
                await hearing
            try:
                if not self.nc.is_connected:
                    raise ConnectionError("the bus is away: nothing to hand back")
                await asyncio.wait_for(self._leave(), timeout=LEAVE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - stopping while the bus is away: just go
                with contextlib.suppress(Exception):  # closing a connection that is lost
                    await self.nc.close()
            await self.lease.close()

    async def _elect_and_lead(self) -> None:
        """Take part in leader election and lead while leader, until stopped."""
        await self.lease.open()
        while not self.stop_event.is_set():
            if not await self._acquire_lease():
                break
            try:
                await self._lead()
            except LostLeadership as why:
                log.warning("%s: %s; re-reading the log", self.instance, why)
            except SignatureError as err:
                # Never adopt a record we did not sign: stop leading until it is gone.
                log.error(
                    "%s: the log holds a record the scheduler did not sign: %s; refusing "
                    "to act on it (run `xirang audit`)",
                    self.instance,
                    err,
                )
                await self._sleep(5.0)
            except Exception:  # noqa: BLE001 - NATS trouble: step down, re-read, try again
                log.exception("%s: leading failed; re-reading the log", self.instance)
                await self._sleep(1.0)
            finally:
                self.leading.clear()
                self.lease.let_go()
                self._snapshot_put = None  # a put under way ends on its own (never half-cancelled)
                self.state = None  # may hold steps the log never took: re-read it

    async def _leave(self) -> None:
        """Hand the lease back (a standby takes over at once) and drain the connection."""
        await self.lease.call(self.lease.release())
        await self.nc.drain()

    def stop(self) -> None:
        """Ask the scheduler to stop."""
        self.stop_event.set()

    async def _open_buckets(self) -> None:
        await bus.ensure_streams(self.js)

    async def _retry(self, what: str, action):
        """Run `action` until it succeeds (or we are stopped), with capped backoff."""
        return await bus.retry_with_backoff(action, f"{self.instance}: {what}", self.stop_event)

    async def _on_disconnected(self) -> None:
        log.warning("%s: disconnected from NATS; waiting for it", self.instance)

    async def _on_reconnected(self) -> None:
        log.warning("%s: reconnected to NATS", self.instance)
        self._reconnected = True
        self._forget_heard()  # hosts could not be heard either: each gets a full timeout

    def _forget_heard(self) -> None:
        """Every host gets a full timeout from now (heartbeats may have been missed)."""
        self._heard.clear()
        self._heard_unknown.clear()
        self._heard_unordered = True

    # ------------------------------------------------------------ lease

    async def _acquire_lease(self) -> bool:
        """Wait until we hold the lease (standby) or we are stopped."""
        announced = False
        while not self.stop_event.is_set():
            try:
                taken = await self.lease.call(self.lease.take())
            except Exception as err:  # noqa: BLE001 - the bus is away: keep waiting
                log.warning("%s: cannot reach the lease (%r); retrying", self.instance, err)
                if "timeout" in repr(err).lower() and self.nc.is_connected:
                    await self._write_unanswered()
                taken = False
            if taken:
                log.info("%s: leader", self.instance)
                return True
            if not announced:
                log.info("%s: standby, waiting for the lease", self.instance)
                announced = True
            await self._follow()
            await self._sleep(self.lease_ms / 4000)
        return False

    async def _lease_kept(self) -> None:
        """Raise LostLeadership once the lease keeper found the lease taken; say a store
        that cannot write when its renewals go unanswered (a lease write is a write too)."""
        if self.lease.lost:
            raise LostLeadership(self.lease.lost)
        unanswered = self.lease.unanswered_in_row
        if unanswered != self._lease_unanswered_seen:
            if unanswered > self._lease_unanswered_seen and self.nc.is_connected:
                await self._write_unanswered()
            elif unanswered == 0:
                self._writes_unanswered = 0
            self._lease_unanswered_seen = unanswered

    # ------------------------------------------------------------ leading

    async def _lead(self) -> None:
        started = self._loop_moved = time.monotonic()
        stats: dict = {}
        if self.state is not None and self._foreign_in_tail:
            self.state = None
        if self.state is not None:  # a hot standby: only the records appended since it last looked
            stats.update(snapshot_seq=self.ev_seq, tail_records=await self._follow())
        foreign: list = []
        if self.state is None or self._foreign_in_tail:
            self._foreign_in_tail = False
            self.state, self.ev_seq = await bus.load_state(
                self.js, stats=stats, keyring=self.keyring, foreign=foreign
            )
        log.info(
            "%s: state at record %d (snapshot at XR_EV seq %d + %d tail records), XR_EV seq %d,"
            " XR_IN seq %d, %d open sagas",
            self.instance,
            self.state.canonical.events_n,
            stats["snapshot_seq"],
            stats["tail_records"],
            self.ev_seq,
            self.state.canonical.last_input_seq,
            len(self.state.canonical.sagas),
        )
        for name in self.state.canonical.nodes:  # every host gets a full timeout after a takeover
            self._heard.setdefault(name, started)
        self._heard_unordered = True
        _freeze_heap()
        queue: asyncio.Queue = asyncio.Queue()
        sub = await self.js.subscribe(
            f"{bus.IN_PREFIX}.>",
            stream=bus.IN_STREAM,
            ordered_consumer=True,
            cb=self._enqueue(queue),
            pending_msgs_limit=-1,
            pending_bytes_limit=-1,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self.state.canonical.last_input_seq + 1,
            ),
        )
        self.leading.set()
        try:
            # The state was folded from the log: say so first, so that re-deciding the log
            # forgets the passes' memory here too (core.model.types.SchedulerStart).
            # Dated at the state's time, not now: the inputs that waited while no scheduler
            # led are dated when they arrived, which may be before now (`input_time`).
            start = T.SchedulerStart(t=self.state.canonical.t or now_ms(), instance=self.instance)
            await self._flush(await self._apply(start, []))
            await self._disown([f for f in foreign if not f.disowned_by])
            await self._ensure_policy()
            await self._loop(queue)
        finally:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass

    async def _follow(self) -> int:
        """Keep a standby's state current with the log, so a takeover folds only the last
        few records. Returns how many it folded."""
        try:
            if self.state is None:
                self.state, self.ev_seq = await bus.load_state(self.js, keyring=self.keyring)
                return 0
            end = await bus.stream_last_seq(self.js, bus.EV_STREAM)
            foreign: list = []
            folded = await bus.fold_records(self.js, self.state, self.ev_seq + 1, end, self.keyring, foreign)
            self.ev_seq = end
            self._foreign_in_tail |= any(not f.disowned_by for f in foreign)
            return folded
        except Exception:  # noqa: BLE001 - a standby that cannot follow re-reads on takeover
            log.exception("%s: following the log failed", self.instance)
            self.state = None
            return 0

    @staticmethod
    def _enqueue(queue: asyncio.Queue):
        async def on_msg(msg) -> None:
            queue.put_nowait(msg)

        return on_msg

    async def _ensure_policy(self) -> None:
        c = self.state.canonical
        note = older_defaults_note(c.policy_params, self.policy)
        if note:  # an upgrade never changes the defaults a running log decides under
            log.warning("%s: %s", self.instance, note)
        if not self.policy:
            return
        if log_policy({**c.policy_params, **self.policy}) == c.policy:
            return
        tag = uuid.uuid5(uuid.NAMESPACE_URL, json.dumps(self.policy, sort_keys=True)).hex
        await bus.send_input(
            self.js,
            T.SetPolicy(
                params=self.policy, by=self.instance, reason="scheduler --policy", id=f"policy-{tag}"
            ),
            sender=self.sender,
        )

    async def _loop(self, queue: asyncio.Queue) -> None:
        next_tick = time.monotonic()
        next_check = time.monotonic() + self.lease_ms / 3000
        self._last_snapshot = (self.state.canonical.events_n, time.monotonic())
        self._snapshot_retry_at = 0.0
        while not self.stop_event.is_set():
            self._loop_moved = time.monotonic()
            if self._reconnected:
                self._reconnected = False
                raise LostLeadership("reconnected after an outage")
            await self._lease_kept()
            msgs = await self._take(queue, max(0.0, next_tick - time.monotonic()))
            pending: list[tuple[str, bytes]] = []
            for msg in msgs:
                pending = await self._apply_input(msg, pending)
            now = time.monotonic()
            if now >= next_tick:
                next_tick = now + self.tick_ms / 1000
                pending = await self._apply(T.Tick(t=max(now_ms(), self.state.canonical.t)), pending)
                await self._watch_hosts()
            await self._flush(pending)
            if time.monotonic() >= self._next_checkpoint_sweep:
                await self._purge_ended_checkpoints()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + self.lease_ms / 3000
                await self._check_log_end()
            self._snapshot_when_due()

    def _snapshot_when_due(self) -> None:
        """Snapshot the state every `snapshot_every_events` records (or `snapshot_every_ms`):
        encoded here, between two groups (the state and the log agree), put by the lease
        keeper's thread while the loop goes on; one put at a time. A put that fails is
        said and tried again later: a snapshot only shortens the next fold."""
        put = self._snapshot_put
        if put is not None:
            if not put.done():
                return
            self._snapshot_put = None
            err = put.exception() if not put.cancelled() else asyncio.CancelledError()
            if err is None:
                self._last_snapshot = self._snapshot_covers
                self._snapshot_retry_s = SNAPSHOT_RETRY_S
                log.info(
                    "%s: snapshot of record %d put (%.1f MB, encoded on the loop in %.2f s, put in %.1f s)",
                    self.instance,
                    self._snapshot_covers[0],
                    self._snapshot_bytes / 1e6,
                    self._snapshot_encode_s,
                    time.monotonic() - self._snapshot_covers[1],
                )
            else:
                self.snapshots_failed += 1
                self._snapshot_retry_at = time.monotonic() + self._snapshot_retry_s
                log.warning(
                    "%s: putting the snapshot of record %d failed (%r); still leading, trying"
                    " again in %.0f s (until then a takeover folds a longer tail)",
                    self.instance,
                    self._snapshot_covers[0],
                    err,
                    self._snapshot_retry_s,
                )
                self._snapshot_retry_s = min(2 * self._snapshot_retry_s, SNAPSHOT_RETRY_MAX_S)
        n = self.state.canonical.events_n
        last_n, last_at = self._last_snapshot
        now = time.monotonic()
        if n == last_n or now < self._snapshot_retry_at:
            return
        if n - last_n < self.snapshot_every_events and now - last_at < self.snapshot_every_ms / 1000:
            return
        encoding = time.monotonic()
        payload = bus.snapshot_payload(self.state, self.ev_seq, self.signer)
        self._snapshot_encode_s = time.monotonic() - encoding
        self._snapshot_put = asyncio.ensure_future(self.lease.call(self.lease.put_snapshot(payload)))
        # A put left behind by a leader that stepped down is not looked at again: its
        # outcome is read here, so that it is never reported as an error nobody retrieved.
        self._snapshot_put.add_done_callback(lambda put: put.cancelled() or put.exception())
        self._snapshot_covers = (n, time.monotonic())
        self._snapshot_bytes = len(payload)
        del payload
        _freeze_heap()

    async def _purge_ended_checkpoints(self) -> None:
        """Purge from XR_CKPT the checkpoints of every job that ended at least the policy's
        `ended_job_checkpoints_kept_s` ago (none while it is 0): without it, each short job
        that checkpoints leaves its objects in the bus's store for good. Looked at every
        half of that time, at most every CHECKPOINT_SWEEP_S."""
        kept_s = self.state.canonical.policy.ended_job_checkpoints_kept_s
        self._next_checkpoint_sweep = time.monotonic() + min(CHECKPOINT_SWEEP_S, max(kept_s / 2, 0.5))
        if kept_s <= 0:
            return
        done = self.state.canonical.done
        now = now_ms()
        kept_ms = kept_s * 1000
        purged: list[str] = []
        try:
            stored = dict.fromkeys(await checkpoints.stored_jobs(self.js))
            for job in stored:
                if job in done and now - self._ended_t.setdefault(job, now) >= kept_ms:
                    await checkpoints.purge_job(self.js, job)
                    purged.append(job)
        except Exception as err:  # noqa: BLE001 - the next sweep tries again
            log.warning("%s: purging ended jobs' checkpoints failed: %r", self.instance, err)
            return
        for job in [j for j, t in self._ended_t.items() if j not in stored and now - t >= kept_ms]:
            del self._ended_t[job]  # past its time with nothing stored: nothing left to purge
        for job in purged:
            self._ended_t.pop(job, None)
        if purged:
            self.checkpoints_purged += len(purged)
            log.info(
                "%s: purged the checkpoints of %d job(s) ended over %g s ago (ended_job_checkpoints_kept_s): %s",
                self.instance,
                len(purged),
                kept_s,
                ", ".join(purged[:20]) + (" ..." if len(purged) > 20 else ""),
            )

    async def _write_unanswered(self) -> None:
        """An append went unanswered while connected. Several in a row while the server
        still answers reads mean a JetStream store that cannot write: a full disk, or a
        write error nats-server does not recover from until it is restarted. Say what to do
        (once an episode) and raise an alert."""
        self._writes_unanswered += 1
        if self._writes_unanswered != STORE_STUCK_AFTER_WRITES:
            return
        try:
            await bus.stream_last_seq(self.js, bus.EV_STREAM)
        except Exception:  # noqa: BLE001 - reads fail too: an outage, not a stuck store
            self._writes_unanswered = 0
            return
        words = (
            f"{STORE_STUCK_AFTER_WRITES} appends in a row went unanswered while the server still"
            " answers reads: its JetStream store cannot write (a full disk, or a write error"
            " nats-server keeps failing on until restarted). Free space under the server's"
            " store_dir and restart nats-server (`xirang up` restarts its own); the scheduler"
            " goes on once appends are answered"
        )
        log.error("%s: %s", self.instance, words)
        alert = {"kind": "bus_store_failing", "instance": self.instance, "problem": words}
        try:
            await self.nc.publish(f"{bus.ALERT_PREFIX}.bus_store_failing", json.dumps(alert).encode())
        except Exception:  # noqa: BLE001 - the log line says it
            pass

    async def _check_log_end(self) -> None:
        """Only this leader appends to the log: a log that grew past our last append holds
        a message someone else wrote. Re-read it (the fold passes over the message and
        `_lead` disowns it) rather than wait for our next append to be fenced."""
        try:
            end = await bus.stream_last_seq(self.js, bus.EV_STREAM)
        except Exception as err:  # noqa: BLE001 - unanswered: the next look (or an append) tells
            log.warning("%s: cannot read the log's end (%r); looking again later", self.instance, err)
            return
        if end > self.ev_seq:
            raise LostLeadership(
                f"the log grew to XR_EV seq {end} past our last append at {self.ev_seq}: "
                "someone else appended"
            )

    async def _disown(self, foreign: list) -> None:
        """Record, signed, that each foreign message is not ours (`RecordDisowned`), and
        raise an alert: the log cannot drop them (XR_EV denies delete), so it keeps the
        account, and every reader passes over them (trust/foreign.py)."""
        if not foreign:
            return
        pending: list = []
        for item in sorted(foreign, key=lambda f: f.pos):
            inp = T.DisownRecord(
                t=self.state.canonical.t or now_ms(),  # as `SchedulerStart`: inputs that waited come next
                log_seq=item.pos,
                digest=item.digest,
                reason=item.reason,
                problem=item.problem.encode("ascii", "replace").decode()[:DISOWN_PROBLEM_CHARS_MAX],
                origin=self.sender,
            )
            pending = await self._apply(inp, pending)
        await self._flush(pending)
        self.disowned += len(foreign)
        first = min(f.pos for f in foreign)
        log.error(
            "%s: disowned %d foreign message(s) on the log (first at XR_EV seq %d: %s); someone "
            "who may publish on xr.ev.> appended them: check who holds the scheduler's NATS "
            "credentials (`xirang audit` lists them)",
            self.instance,
            len(foreign),
            first,
            foreign[0].problem,
        )
        alert = {
            "kind": "record_disowned",
            "instance": self.instance,
            "count": len(foreign),
            "log_seqs": [f.pos for f in foreign][:DISOWN_ALERT_SEQS_MAX],
            "reasons": sorted({f.reason for f in foreign}),
            "t": self.state.canonical.t,
        }
        try:
            await self.nc.publish(f"{bus.ALERT_PREFIX}.record_disowned", json.dumps(alert).encode())
        except Exception:  # noqa: BLE001 - the log records it anyway
            pass

    async def _take(self, queue: asyncio.Queue, timeout_s: float) -> list:
        try:
            first = await asyncio.wait_for(queue.get(), timeout=min(timeout_s, 0.25) or 0.001)
        except asyncio.TimeoutError:
            return []
        msgs = [first]
        self._drain(queue, msgs)
        if 1 < len(msgs) < self.group_max and self.linger_ms:
            # Inputs are streaming in: a moment's wait makes the batch, and its one disk
            # sync, cover more of them. A lone input is not delayed.
            await asyncio.sleep(self.linger_ms / 1000)
            self._drain(queue, msgs)
        return msgs

    def _drain(self, queue: asyncio.Queue, msgs: list) -> None:
        while len(msgs) < self.group_max:
            try:
                msgs.append(queue.get_nowait())
            except asyncio.QueueEmpty:
                return

    async def _apply_input(self, msg, pending: list) -> list:
        seq = msg.metadata.sequence.stream
        if seq <= self.state.canonical.last_input_seq:
            return pending  # applied before a restart: skip, never apply twice
        taken_t = input_time(now_ms(), received_ms(msg))
        return await self._apply(
            stamped_input(
                msg.data, seq, taken_t, self.state.canonical.t, msg.subject, bus_authenticates(self.nc)
            ),
            pending,
        )

    async def _apply(self, inp: T.Input, pending: list) -> list:
        self._loop_moved = time.monotonic()
        try:
            _, records = step(self.state, inp)
            for record in records:
                if isinstance(record.event, ENDED_EVENTS):
                    self._ended_t[record.event.job] = record.event.t
                elif type(record.event) is T.NodeJoined:
                    self._heard_unordered = True  # (the watch gives it an entry)
            messages = bus.record_messages(records, self.signer) if records else []
            if len(messages) > bus.BATCH_MESSAGES_MAX:
                # One input's records never split, and the server refuses a bigger batch:
                # appending it would fail the same way after every re-read.
                raise EffectsTooLarge(
                    f"{len(messages)} log messages for one input; one atomic batch"
                    f" holds at most {bus.BATCH_MESSAGES_MAX}"
                )
        except Exception as err:  # noqa: BLE001 - one input must never halt the scheduler
            records, pending = await self._reject_internal(inp, err, pending)
            messages = bus.record_messages(records, self.signer)
        if not records:
            return pending
        if pending and len(pending) + len(messages) > bus.BATCH_MESSAGES_MAX:
            await self._flush(pending)
            pending = []
        pending.extend(messages)
        return pending

    async def _reject_internal(
        self, inp: T.Input, err: Exception, pending: list
    ) -> tuple[list[T.Record], list]:
        """`step` raised: the state may be half changed. Append what came before, fold the
        state back from the log (the state before this input), record the input as
        rejected with `internal_error`, and raise an alert. The scheduler goes on."""
        words = f"{type(err).__name__}: {err}"
        log.error(
            "%s: internal error on input %s (XR_IN seq %d): %s; rejected, state re-read",
            self.instance,
            T.type_name(inp),
            inp.seq,
            words,
            exc_info=err,
        )
        await self._flush(pending)
        self.state, self.ev_seq = await bus.load_state(self.js, keyring=self.keyring)
        self._heard_unordered = True
        try:
            records = reject_input(self.state, inp, T.INTERNAL_ERROR, words)
        except Exception:  # noqa: BLE001 - the input cannot even be named: record it bare
            records = reject_input(
                self.state, T.Malformed(raw="", error="", t=inp.t, seq=inp.seq), T.INTERNAL_ERROR, words
            )
        self.internal_errors += 1
        alert = {
            "kind": T.INTERNAL_ERROR,
            "instance": self.instance,
            "input_type": T.type_name(inp),
            "input_seq": inp.seq,
            "error": words[:2000],
            "t": inp.t,
        }
        try:
            await self.nc.publish(f"{bus.ALERT_PREFIX}.{T.INTERNAL_ERROR}", json.dumps(alert).encode())
        except Exception:  # noqa: BLE001 - the log records it anyway
            pass
        return records, []

    async def _flush(self, pending: list) -> None:
        if not pending:
            return
        try:
            self.ev_seq = await bus.publish_atomic(self.nc, pending, self.ev_seq, self.instance)
            self.appended_batches += 1
            self._writes_unanswered = 0
        except bus.FencingError as err:
            raise LostLeadership(f"fenced: {err}") from err
        except bus.BatchError as err:
            if "no answer" in str(err) and self.nc.is_connected:
                await self._write_unanswered()
            raise LostLeadership(str(err)) from err

    # ------------------------------------------------------------ host liveness

    async def _hear_hosts(self) -> None:
        """Run the heartbeat listener process (agents/heartbeats.py) and take its lines,
        starting another if it ends. It connects as this scheduler does (the same
        environment: credentials, TLS); it ends when its stdin closes, so it never outlives
        this process."""
        pause_s = 1.0
        while not self.stop_event.is_set():
            proc = None
            started = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "agents.heartbeats",
                    "--nats",
                    self.url,
                    "--name",
                    f"{self.instance}-heartbeats",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    limit=HEARD_LINE_BYTES_MAX,
                )
                self._listener = proc
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        break
                    self._take_heard(json.loads(line))
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - a listener that cannot run: start another
                log.warning("%s: the heartbeat listener failed (%r)", self.instance, err)
            finally:
                self._listening = False
                if proc is not None:
                    await _end_child(proc)
            if not self.stop_event.is_set():
                # One that ends at once again and again (it cannot run here) is started
                # less and less often, up to once a minute.
                pause_s = 1.0 if time.monotonic() - started > 60 else min(2 * pause_s, 60.0)
                log.warning(
                    "%s: the heartbeat listener ended (exit status %s); starting another in %.0f s"
                    " (until then no host is called silent)",
                    self.instance,
                    proc.returncode if proc is not None else None,
                    pause_s,
                )
                self._forget_heard()
                await self._sleep(pause_s)

    def _take_heard(self, line: dict) -> None:
        """One line of the heartbeat listener: who was heard since its last line."""
        if line.get("away"):
            self._listening = False  # it is not on the bus: silence says nothing
            return
        if not self._listening:  # its first line, or back on the bus: it listens from now on
            self._listening = True
            self._forget_heard()
        now = time.monotonic()
        if "lossy" in line:
            # Beats were lost before they were read: silence says nothing now.
            self._forget_heard()
            if not self._said_lossy:
                self._said_lossy = True
                log.warning(
                    "%s: heartbeats were lost before they were read (the listener fell behind,"
                    " or reconnected): every host gets a full timeout again",
                    self.instance,
                )
        else:
            self._said_lossy = False
        for subject in line.get("odd", ()):
            # Said once per subject (it beats every second), for a bounded number of subjects.
            if subject not in self._odd_heartbeats and len(self._odd_heartbeats) < ODD_HEARTBEATS_NAMED_MAX:
                self._odd_heartbeats.add(subject)
                log.warning("%s: ignoring heartbeats on %s: they name another node", self.instance, subject)
        for subject, count in line.get("loud", {}).items():
            if (
                subject not in self._loud_heartbeats
                and len(self._loud_heartbeats) < LOUD_HEARTBEATS_NAMED_MAX
            ):
                self._loud_heartbeats.add(subject)
                log.warning(
                    "%s: %s beat %d times in a quarter second (a host beats once a second):"
                    " a flood; its beats count once a line",
                    self.instance,
                    subject,
                    count,
                )
                self._alert("heartbeat_flood", {"subject": subject[:200], "beats": count})
        health = line.get("health") or {}
        nodes = self.state.canonical.nodes if self.state is not None else None
        heard = self._heard
        for node in line.get("heard", ()):
            self._note_health(node, health.get(node))
            if nodes is None:
                continue  # nothing folded yet: a takeover gives every host a full timeout
            if node in nodes:
                heard.pop(node, None)  # to the end: the dict stays in the order heard
                heard[node] = now
            elif node in self._heard_unknown or len(self._heard_unknown) < self.unknown_nodes_heard_max:
                self._heard_unknown[node] = now
            elif not self._warned_unknown_full:
                self._warned_unknown_full = True
                log.warning(
                    "%s: heartbeats from more than %d nodes the state does not know: dropping those"
                    " of further ones (who publishes on %s.>? an open bus)",
                    self.instance,
                    self.unknown_nodes_heard_max,
                    bus.HB_PREFIX,
                )

    def _note_health(self, node: str, note: dict | None) -> None:
        """Say when a host reports itself unhealthy (its disk full: it refuses new runs) and
        when it is well again, and when a job's facts are dropped there (agents/outbox.py),
        with an alert each: a host may not raise alerts on a secured bus, its heartbeats
        (on its own subject) may. `note` is what the listener read of its newest beat
        (`agents.heartbeats.health_note`: None for a healthy host that dropped nothing).
        At most UNHEALTHY_NAMED_MAX nodes are remembered."""
        if note is None and node not in self._unhealthy:
            return
        if note is not None and note.get("facts_dropped"):
            self._note_facts_dropped(node, note["facts_dropped"])
        unhealthy = note is not None and note.get("healthy") is False
        if not unhealthy and node not in self._unhealthy:
            return
        if not unhealthy:
            del self._unhealthy[node]
            log.warning("%s: host %s is healthy again", self.instance, node)
            return
        if node in self._unhealthy or len(self._unhealthy) >= UNHEALTHY_NAMED_MAX:
            return
        problem = str(note.get("problem", ""))[:500]
        self._unhealthy[node] = problem
        log.warning("%s: host %s reports itself unhealthy: %s", self.instance, node, problem or "(no reason)")
        self._alert("node_unhealthy", {"node": node, "problem": problem})

    def _note_facts_dropped(self, node: str, dropped: dict) -> None:
        if not isinstance(dropped, dict):
            return
        for job, count in sorted(dropped.items())[:UNHEALTHY_NAMED_MAX]:
            if not isinstance(count, int) or not isinstance(job, str):
                continue
            key = f"{node}/{job}"[:400]
            said = self._facts_dropped_said.get(key, 0)
            if count <= said or (said and count - said < FACTS_DROPPED_SAID_EVERY):
                continue
            if key not in self._facts_dropped_said and len(self._facts_dropped_said) >= UNHEALTHY_NAMED_MAX:
                return
            self._facts_dropped_said[key] = count
            log.warning("%s: host %s dropped %d fact(s) of job %s so far", self.instance, node, count, job)
            self._alert("job_facts_dropped", {"node": node, "job": job[:200], "dropped": count})

    def _alert(self, kind: str, fields: dict) -> None:
        """Publish `xr.alert.<kind>` (plain NATS, not stored), without waiting."""
        alert = {"kind": kind, "instance": self.instance, **fields}

        async def publish() -> None:
            with contextlib.suppress(Exception):  # the log line says it too
                await self.nc.publish(f"{bus.ALERT_PREFIX}.{kind}", json.dumps(alert).encode())

        asyncio.ensure_future(publish())

    def _settle_unknown_heard(self, now: float, timeout_s: float) -> None:
        """Nodes the state now knows take their last heartbeat with them; unknown nodes
        silent past the timeout are forgotten (making room for others)."""
        for name, heard in sorted(self._heard_unknown.items()):
            if name in self.state.canonical.nodes:
                self._heard[name] = max(heard, self._heard.get(name, heard))
                self._heard_unordered = True
                del self._heard_unknown[name]
            elif now - heard > timeout_s:
                del self._heard_unknown[name]
        if len(self._heard_unknown) < self.unknown_nodes_heard_max:
            self._warned_unknown_full = False  # that flood is over: say the next one again

    async def _watch_hosts(self) -> None:
        if not self._listening:
            return  # nobody is listening to the hosts: their silence says nothing
        now = time.monotonic()
        timeout_s = self.node_timeout_ms / 1000
        self._settle_unknown_heard(now, timeout_s)
        nodes = self.state.canonical.nodes
        if self._heard_unordered:
            # A node joined, a state was folded, or a node was heard out of turn: every up
            # node never heard gets a full timeout from now, and the entries are put back in
            # the order heard (a pass over the pool, only then).
            for name, node in nodes.items():
                if node.up:
                    self._heard.setdefault(name, now)
            self._heard = dict(sorted(self._heard.items(), key=lambda item: item[1]))
            self._heard_unordered = False
        # The longest silent first: the watch reads the silent hosts (and those down, which
        # beat no more), not the pool; only the silent ones are sorted (their node_down
        # inputs go out in name order).
        silent = []
        for name, heard in self._heard.items():
            if now - heard <= timeout_s:
                break
            node = nodes.get(name)
            if node is not None and node.up:
                silent.append(name)
        for name in sorted(silent):
            silent_s = now - self._heard[name]  # a heartbeat may have come while others were sent
            if silent_s > timeout_s and now - self._down_sent.get(name, 0) > timeout_s:
                self._down_sent[name] = now
                log.warning("%s: host %s silent for %.1f s: node_down", self.instance, name, silent_s)
                await bus.send_input(
                    self.js,
                    sender=self.sender,
                    inp=T.NodeDown(
                        node=name,
                        reason="heartbeat_lost",
                        id=f"node_down-{name}-{self.state.canonical.events_n}",
                    ),
                )

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop_event.wait(), timeout=seconds)
        except asyncio.TimeoutError:
            pass


async def _end_child(proc) -> None:
    """End a child process this scheduler started: close its stdin (it ends by itself),
    then SIGTERM and SIGKILL it by its pid if it has not."""
    if proc.returncode is None:
        with contextlib.suppress(Exception):
            proc.stdin.close()
        for stop in (None, proc.terminate, proc.kill):
            if stop is not None:
                with contextlib.suppress(ProcessLookupError):
                    stop()
            try:
                await asyncio.wait_for(proc.wait(), timeout=1.0)
                return
            except asyncio.TimeoutError:
                continue


def _freeze_heap() -> None:
    """Move what lives now (the folded state above all: it holds no reference cycles, so
    nothing frozen with it would have been collected) out of the cyclic collector's way:
    its full collections then scan what changed since, not the whole state, which at
    frontier scale is most of the heap. Garbage is collected first, so none is frozen."""
    gc.collect()
    gc.freeze()


async def run_scheduler(url: str, **kwargs) -> None:
    """Run until SIGINT/SIGTERM."""
    import signal

    sched = Scheduler(url, **kwargs)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, sched.stop)
    await sched.run()
