"""The scheduler's leader lease, kept on a connection and a thread of its own.

The lease (XR_LEASE key `scheduler`, compare-and-set on its revision) only decides who
tries to write: fencing on the log keeps a stale writer out. But a leader that misses its
renewals hands the lead to a standby, which must fold the log before it can decide
anything: at frontier scale a decision, a group of inputs or a snapshot's encoding can
hold the scheduler's loop for seconds, and a renewal queued behind them lapsed (or timed
out, and the leader stepped down though nobody else wanted the lead).

So the renewals run on a timer in a thread with its own event loop and NATS connection
(the scheduler's credentials, as every one of its connections). Python's interpreter lock
passes between threads every few milliseconds, so a renewal goes out on time while the
scheduler's loop computes. It is not a way to hold the lease forever: while the loop has
not moved for `stall_s` the keeper renews no more (a wedged leader lets a standby take
over). A renewal the server refuses (another holder, another revision) marks the lease
`lost`, which the loop reads before its next append; one that goes unanswered is tried
again at the next period (counted in `unanswered_in_row`: a store that cannot write says
so through the appends and these).

The thread also puts snapshots (`put_snapshot`): a put of tens of megabytes in chunks is
answered chunk by chunk there, whatever the loop is doing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Callable

from nats.js.errors import BadRequestError, KeyNotFoundError, KeyValueError

from transport import bus

log = logging.getLogger("xirang.scheduler")

LEASE_KEY = "scheduler"
# Closing waits this long for the bus (an orderly stop during an outage just goes).
CLOSE_TIMEOUT_S = 1.0


def now_ms() -> int:
    """Wall-clock time in milliseconds (the lease's `until_ms` is wall clock: two hosts read it)."""
    return int(time.time() * 1000)


class LeaseKeeper:
    """Takes, renews and hands back the scheduler's lease from a thread of its own; its
    coroutines (`take`, `release`, `put_snapshot`) are awaited from the scheduler's loop
    through `call`."""

    def __init__(
        self, url: str, instance: str, lease_ms: int, loop_moved: Callable[[], float], stall_s: float
    ) -> None:
        self.url = url
        self.instance = instance
        self.lease_ms = lease_ms
        self.loop_moved = loop_moved  # time.monotonic() of the scheduler loop's last step
        self.stall_s = stall_s
        self.lost: str | None = None  # why the lease is not ours any more (set by the thread)
        self.unanswered_in_row = 0  # renewals unanswered since the last answered one
        self.renewed = 0  # renewals the server took
        self._holding = False
        self._rev = 0
        self._said_stalled = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"{instance}-lease", daemon=True)
        self._nc = self._js = self._kv = None
        self._stop: asyncio.Event | None = None
        self._renewing: asyncio.Future | None = None

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()

    async def call(self, coro):
        """Run one of the keeper's coroutines on its thread; awaited from the scheduler's loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def open(self) -> None:
        """Connect (waiting out an outage, as every scheduler connection does)."""
        if not self._thread.is_alive():
            self._thread.start()
        await self.call(self._open())

    async def _open(self) -> None:
        self._stop = asyncio.Event()
        self._nc, self._js = await bus.connect_forever(
            self.url, name=f"{self.instance}-lease", stop=self._stop
        )
        self._kv = await bus.retry_with_backoff(
            lambda: self._js.key_value(bus.LEASE_BUCKET), f"{self.instance}: opening the lease", self._stop
        )
        self._renewing = asyncio.ensure_future(self._renew_forever())

    async def close(self) -> None:
        """Close the connection and end the thread (`release` first to hand the lease back)."""
        if self._thread.is_alive():
            try:
                await asyncio.wait_for(self.call(self._close()), timeout=CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the bus is away: just go
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, CLOSE_TIMEOUT_S)

    async def _close(self) -> None:
        self._holding = False
        if self._stop is not None:
            self._stop.set()
        if self._renewing is not None:
            self._renewing.cancel()
        if self._nc is not None:
            await self._nc.close()

    # ------------------------------------------------------------ the lease

    def _value(self) -> bytes:
        return json.dumps({"holder": self.instance, "until_ms": now_ms() + self.lease_ms}).encode()

    async def take(self) -> bool:
        """Take the lease if it is free, lapsed or ours; renew it from then on."""
        try:
            entry = await self._kv.get(LEASE_KEY)
        except KeyNotFoundError:
            try:
                self._held(await self._kv.create(LEASE_KEY, self._value()))
                return True
            except (KeyValueError, BadRequestError):
                return False
        holder = json.loads(entry.value) if entry.value else {"holder": "", "until_ms": 0}
        if holder["holder"] != self.instance and holder["until_ms"] >= now_ms():
            return False
        try:
            self._held(await self._kv.update(LEASE_KEY, self._value(), last=entry.revision))
            return True
        except (KeyValueError, BadRequestError):
            return False

    def _held(self, rev: int) -> None:
        self._rev, self._holding, self.lost = rev, True, None

    def let_go(self) -> None:
        """Stop renewing (the scheduler stepped down; `take` again to lead)."""
        self._loop.call_soon_threadsafe(self._let_go)

    def _let_go(self) -> None:
        self._holding = False

    async def release(self) -> None:
        """Hand the lease back: a standby takes over at once."""
        await self._release()

    async def _release(self) -> None:
        if not self._rev:
            return
        self._holding = False
        try:
            value = json.dumps({"holder": "", "until_ms": 0}).encode()
            await self._kv.update(LEASE_KEY, value, last=self._rev)
        except Exception:  # noqa: BLE001 - someone else holds it already, or we are offline
            pass
        self._rev = 0

    async def _renew_forever(self) -> None:
        period_s = self.lease_ms / 3000
        while True:
            await asyncio.sleep(period_s)
            if not self._holding:
                continue
            stalled_s = time.monotonic() - self.loop_moved()
            if stalled_s > self.stall_s:
                if not self._said_stalled:
                    self._said_stalled = True
                    log.error(
                        "%s: the scheduler's loop has not moved for %.0f s: no longer renewing the"
                        " lease, so that a standby may take over",
                        self.instance,
                        stalled_s,
                    )
                continue
            self._said_stalled = False
            rev = self._rev
            try:
                new_rev = await self._kv.update(LEASE_KEY, self._value(), last=rev)
            except (KeyValueError, BadRequestError) as err:
                if self._holding and self._rev == rev:
                    self._holding = False
                    self.lost = f"lease lost ({err})"
                continue
            except Exception as err:  # noqa: BLE001 - unanswered: try again next period
                self.unanswered_in_row += 1
                log.warning("%s: renewing the lease went unanswered (%r); trying again", self.instance, err)
                continue
            if self._holding and self._rev == rev:
                self._rev = new_rev
            self.unanswered_in_row = 0
            self.renewed += 1

    # ------------------------------------------------------------ snapshots

    async def put_snapshot(self, payload: bytes) -> None:
        """Put an encoded snapshot (`bus.snapshot_payload`) in the snapshot bucket."""
        await bus.put_snapshot(self._js, payload)
