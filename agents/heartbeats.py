"""The hosts' heartbeats, heard off the scheduler's loop: a listener process of its own.

Every host beats once a second on `xr.hb.<node>` (plain NATS). At frontier scale that is
12,500 messages a second for 100,000 GPUs; taken on the scheduler's own connection and
loop, they queued the lease, the log's appends and the snapshot's put behind them and
took the CPU the decisions need. So the scheduler starts this module as a child process
(`python -m agents.heartbeats --nats URL`), which connects with the scheduler's own
credentials (the same `$XIRANG_CREDS`, the same role: deploy/nats gives the scheduler
`xr.hb.*`), keeps the newest beat of each subject, and a few times a second writes one
line of JSON to its stdout saying who was heard (`HeartbeatReport`): the scheduler reads
a few lines a second instead of thousands of messages.

What a line holds, and why it is safe to believe:
- `heard`: the nodes heard since the last line. A heartbeat counts for the node its
  subject names (`heartbeat_node`): NATS lets a host publish only on its own node's
  subject, so one host cannot keep another alive.
- `health`: for a node whose newest beat says it is unhealthy or dropped facts, what it
  says (bounded); nothing for a healthy one.
- `odd`: subjects whose beats name another node (not counted).
- `lossy`: beats were dropped before they were read (this process fell behind, or more
  distinct subjects beat than one line holds): the scheduler cannot tell silence from
  loss, so it gives every host a full timeout again rather than call any of them down.
- `loud`: subjects beating far more often than a host does (a flood), loudest first.
- `away` (alone): this process is not connected to the bus now; it hears nobody, so
  nobody's silence means anything until it is back (its next line says `lossy`).

A host flooding its own subject costs this process one dictionary write a message (the
newest beat replaces the one before; only one beat a subject a line is parsed), never
another host's entry; memory is bounded by the bytes kept between two lines. The process
ends when its stdin closes (the scheduler went away, however it ended).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys
import time

from transport import bus

log = logging.getLogger("xirang.heartbeats")

# A line every this often: a host's heard time is late by at most this much.
REPORT_EVERY_S = 0.25
# Bytes of beats kept between two lines (subjects and bodies); past it, beats of subjects
# not heard yet in this line are dropped and the line says `lossy`.
KEPT_BYTES_MAX = 64 << 20
# A beat this large is not a host agent's: it names no node (`odd`).
HEARTBEAT_BYTES_MAX = 64 << 10
# A subject beating more often than this a second is `loud` (a host beats once a second).
LOUD_BEATS_PER_S = 20
LOUD_NAMED_MAX = 10
# How much of what an unhealthy host says is passed on.
PROBLEM_CHARS_MAX = 500
FACTS_DROPPED_JOBS_MAX = 1024
# The client's own buffer of beats not yet read by the callback.
PENDING_BYTES_MAX = 64 << 20


def heartbeat_body(subject: str, data: bytes) -> tuple[str | None, object]:
    """The node a heartbeat on `xr.hb.<token>` speaks for, and its decoded body (None when
    it is not JSON): the node its body names when that name's token is the subject's (the
    subject is what vouches for it), the subject's token for a body naming none, and None
    (not counted) for a body naming another node: one host must not keep another alive."""
    token = subject.split(".", 2)[-1]
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    named = body.get("node") if isinstance(body, dict) else None
    if not isinstance(named, str):
        return token, body
    return (named if bus.node_token(named) == token else None), body


def heartbeat_node(subject: str, data: bytes) -> str | None:
    """The node a heartbeat counts for (`heartbeat_body`), None when it names another."""
    return heartbeat_body(subject, data)[0]


def health_note(body: object) -> dict | None:
    """What the scheduler is told of a beat's health: None for a healthy host that dropped
    no facts (the common case, so most lines carry no note), else `healthy`, `problem`
    and `facts_dropped` (job -> count), each bounded."""
    if not isinstance(body, dict):
        return None
    unhealthy = body.get("healthy") is False
    dropped = body.get("facts_dropped")
    facts = {}
    if isinstance(dropped, dict):
        for job, count in sorted((j, c) for j, c in dropped.items() if isinstance(j, str))[
            :FACTS_DROPPED_JOBS_MAX
        ]:
            if isinstance(count, int) and not isinstance(count, bool):
                facts[job[:400]] = count
    if not unhealthy and not facts:
        return None
    return {
        "healthy": not unhealthy,
        "problem": str(body.get("problem", ""))[:PROBLEM_CHARS_MAX] if unhealthy else "",
        "facts_dropped": facts,
    }


class HeartbeatListener:
    """Keeps the newest beat of each subject until the next line (`report`)."""

    def __init__(self, kept_bytes_max: int = KEPT_BYTES_MAX) -> None:
        self.kept_bytes_max = kept_bytes_max
        self._newest: dict[str, bytes] = {}
        self._counts: dict[str, int] = {}
        self._kept_bytes = 0
        self._beats = 0
        self.dropped = 0  # beats not kept since the last line (cap, or the client fell behind)
        self.reconnected = False
        self._since = time.monotonic()

    def hear(self, subject: str, data: bytes) -> None:
        """One beat: the newest of its subject replaces the one before (O(1), no parsing)."""
        self._beats += 1
        count = self._counts.get(subject)
        if count is None:
            size = len(subject) + min(len(data), HEARTBEAT_BYTES_MAX + 1)
            if self._kept_bytes + size > self.kept_bytes_max:
                self.dropped += 1
                return
            self._kept_bytes += size
            self._counts[subject] = 1
        else:
            self._counts[subject] = count + 1
        self._newest[subject] = data if len(data) <= HEARTBEAT_BYTES_MAX else b""

    def report(self) -> dict:
        """The line for what was heard since the last one; starts the next."""
        now = time.monotonic()
        heard: list[str] = []
        health: dict[str, dict] = {}
        odd: list[str] = []
        for subject, data in self._newest.items():
            if not data:  # larger than any host's beat
                odd.append(subject)
                continue
            node, body = heartbeat_body(subject, data)
            if node is None:
                odd.append(subject)
                continue
            heard.append(node)
            note = health_note(body)
            if note is not None:
                health[node] = note
        line: dict = {"heard": heard}
        if health:
            line["health"] = health
        if odd:
            line["odd"] = odd
        if self.dropped or self.reconnected:
            line["lossy"] = self.dropped
        if self.reconnected:
            line["reconnected"] = True
        if self._beats > len(self._counts):  # someone beat more than once: is it a flood?
            loud_min = max(2, int(LOUD_BEATS_PER_S * max(now - self._since, REPORT_EVERY_S)))
            loud = sorted(
                ((count, subject) for subject, count in self._counts.items() if count > loud_min),
                reverse=True,
            )
            if loud:
                line["loud"] = {subject: count for count, subject in loud[:LOUD_NAMED_MAX]}
        self._newest, self._counts = {}, {}
        self._kept_bytes = self._beats = self.dropped = 0
        self.reconnected = False
        self._since = now
        return line


async def listen(url: str, name: str, out, report_every_s: float = REPORT_EVERY_S) -> None:
    """Subscribe to every host's heartbeat and write a line to `out` (a pipe) every
    `report_every_s`, until stdin closes. A line is written only once the last one has
    been read: while the scheduler is busy, beats gather here (each subject's newest)
    instead of blocking this loop, which would leave them unread on the bus."""
    listener = HeartbeatListener()
    stopped = asyncio.Event()

    async def on_error(err) -> None:
        if "slow consumer" in str(err).lower():
            listener.dropped += 1  # the client dropped beats it could not hand over in time

    async def on_reconnected() -> None:
        listener.reconnected = True  # beats sent while away were never heard

    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    watch_stdin = asyncio.ensure_future(stdin.read())
    watch_stdin.add_done_callback(lambda _: stopped.set())  # the scheduler is gone, or stops
    try:
        nc, _ = await bus.connect_forever(
            url, name=name, stop=stopped, on_error=on_error, reconnected_cb=on_reconnected
        )
    except ConnectionError:
        return  # stopped before the bus was reached

    async def on_beat(msg) -> None:
        listener.hear(msg.subject, msg.data)

    lines, _ = await loop.connect_write_pipe(asyncio.Protocol, out)
    try:
        await nc.subscribe(f"{bus.HB_PREFIX}.*", cb=on_beat, pending_bytes_limit=PENDING_BYTES_MAX)
        while not watch_stdin.done() and not lines.is_closing():
            await asyncio.wait({watch_stdin}, timeout=report_every_s)
            if lines.get_write_buffer_size() == 0:
                line = listener.report() if nc.is_connected else {"away": True}
                lines.write(json.dumps(line, separators=(",", ":")).encode() + b"\n")
    finally:
        watch_stdin.cancel()
        with contextlib.suppress(Exception):  # the bus may be away: just go
            await asyncio.wait_for(nc.close(), timeout=1.0)


def main(argv: list[str] | None = None) -> int:
    """`python -m agents.heartbeats --nats URL`: listen until stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m agents.heartbeats", description=__doc__.splitlines()[0])
    parser.add_argument("--nats", required=True, help="the bus the scheduler is connected to")
    parser.add_argument("--name", default="xirang-heartbeats", help="the connection's name")
    parser.add_argument("--report-ms", type=float, default=REPORT_EVERY_S * 1000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    asyncio.run(listen(args.nats, args.name, sys.stdout, args.report_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
