"""Where the projector, the audit and the dashboard read the log from: XR_EV on JetStream
(through an ordered consumer on `xr.ev.log.>`, never the host copies) or an exported JSONL
file (one `T.encode(record)` a line, as `xirang replay run --events-out` writes).

The stream set-up, the embedded server and the atomic batch publisher are the agents'
(`transport.bus`, `transport.natsd`); this module only adds batched reading for projections
and a publisher of ready-made records for tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import AsyncIterator, Iterator

from nats.errors import ConnectionClosedError
from nats.errors import TimeoutError as NatsTimeout
from nats.js import api

from transport import bus
from core import types as T

log = logging.getLogger("xirang.logsource")

LOG_SUBJECTS = f"{bus.LOG_PREFIX}.>"
IDLE_S = 0.2  # a batch is handed over after this long without a new message


async def read_batches(
    js, start_seq: int = 1, batch_max: int = 20000, follow: bool = False
) -> AsyncIterator[list[tuple[int, bytes]]]:
    """(stream seq, payload) batches of log records from start_seq on, in order.

    Without `follow` it stops once it has caught up with the stream as it was when it
    started; with `follow` it keeps waiting for new records (cancel the task to stop)."""
    end_seq = await bus.stream_last_seq(js, bus.EV_STREAM)
    if not follow and end_seq < start_seq:
        return
    sub = await js.subscribe(
        LOG_SUBJECTS,
        stream=bus.EV_STREAM,
        ordered_consumer=True,
        config=api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start_seq)
        ),
    )
    batch: list[tuple[int, bytes]] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=IDLE_S)
            except (NatsTimeout, asyncio.TimeoutError):
                if batch:
                    yield batch
                    batch = []
                elif not follow and await bus.stream_last_seq(js, bus.EV_STREAM) <= end_seq:
                    return  # nothing (left) for us: only host copies after our last record
                continue
            meta = msg.metadata
            batch.append((meta.sequence.stream, msg.data))
            caught_up = meta.num_pending == 0 and not follow
            if len(batch) >= batch_max or caught_up:
                yield batch
                batch = []
            if caught_up:
                return
    finally:
        # A reader stopped by Ctrl-C may have closed its connection before this generator is
        # closed: the server has then dropped the subscription already.
        with contextlib.suppress(ConnectionClosedError):
            await sub.unsubscribe()


def jsonl_batches(path: str, start_seq: int = 1, batch_max: int = 5000) -> Iterator[list[tuple[int, bytes]]]:
    """(line number, payload) batches of an exported log; blank lines are skipped."""
    batch: list[tuple[int, bytes]] = []
    with open(path, "rb") as fh:
        for line_no, line in enumerate(fh, 1):
            if line_no < start_seq or not line.strip():
                continue
            batch.append((line_no, line.rstrip(b"\r\n")))
            if len(batch) >= batch_max:
                yield batch
                batch = []
    if batch:
        yield batch


async def publish_records(nc, js, records: list[T.Record], writer: str = "test") -> int:
    """Append sealed records to XR_EV the way the scheduler does (log copy plus host copies,
    atomic fenced batches, never splitting a record's copies). Returns the last sequence."""
    last = await bus.stream_last_seq(js, bus.EV_STREAM)
    chunk: list[tuple[str, bytes]] = []
    for record in records:
        messages = bus.record_messages([record])
        if len(chunk) + len(messages) > bus.BATCH_MESSAGES_MAX:
            last = await bus.publish_atomic(nc, chunk, last, writer)
            chunk = []
        chunk.extend(messages)
    if chunk:
        last = await bus.publish_atomic(nc, chunk, last, writer)
    return last


class SignedOnly:
    """Passes on, batch by batch, only the scheduler's records (`trust.foreign.LogSorter`):
    with a keyring, those a signature covers (a record waits until the signature after it
    arrives); without one (an open, unsigned log), those that follow the hash chain. Any
    other message is passed over with a warning, never projected: one foreign message on
    the log stops no projection. `n` and `chain` are where the projection stands."""

    def __init__(self, keyring, n: int = 0, chain: str = T.GENESIS_HASH) -> None:
        from trust.foreign import LogSorter

        self.sorter = LogSorter(keyring, n, chain)
        self._held: dict[int, bytes] = {}  # payloads by position, until covered
        self._warned = 0

    def __call__(self, batch: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
        """The records of this batch now known to be the scheduler's."""
        out = []
        for pos, payload in batch:
            self._held[pos] = payload
            for _, released_pos in self.sorter.feed(pos, payload):
                out.append((released_pos, self._held.pop(released_pos)))
        self._forget_foreign()
        return out

    def finish(self) -> None:
        """The read ended: what no signature covered is foreign."""
        self.sorter.finish()
        self._forget_foreign()

    def _forget_foreign(self) -> None:
        for item in self.sorter.foreign[self._warned :]:
            self._held.pop(item.pos, None)
            log.warning(
                "passing over the message at seq %d (claims record %d): %s%s",
                item.pos,
                item.n,
                item.problem,
                f"; disowned by record {item.disowned_by}" if item.disowned_by else "",
            )
        self._warned = len(self.sorter.foreign)
