"""What the everyday commands ask of a running cluster: send one input and wait for the
scheduler's verdict in the log, fold the state, read the log's records. Synchronous
wrappers over the bus, so a command only parses, calls and prints.

Reading never creates streams: a client pointed at a server without xirang's streams is
told so instead of setting them up there."""

from __future__ import annotations

import asyncio
from typing import Any

from core import types as T

from transport import bus

from .interrupts import run_until_stopped

OUTCOME_TIMEOUT_S = 15.0


def run(url: str, work) -> Any:
    """Connect to `url`, run `await work(nc, js)`, close; connection failures propagate.
    Ctrl-C or SIGTERM ends it at once (agents/interrupts.py)."""

    async def go():
        nc, js = await bus.connect(url, reconnects=2)
        try:
            return await work(nc, js)
        finally:
            await nc.close()

    return run_until_stopped(go())


def _keyring():
    """The scheduler's public keyring from $XIRANG_PUBLIC_KEY: when set, what a command
    shows is folded only from records (and a snapshot) the scheduler signed."""
    from trust.signing import find_keyring

    return find_keyring(None, None)


def load_state(url: str):
    """The state folded from the newest snapshot and the log's tail."""
    keyring = _keyring()

    async def work(nc, js):
        state, _ = await bus.load_state(js, keyring=keyring)
        return state

    return run(url, work)


def records(url: str, start_seq: int = 1) -> list[tuple[int, T.Record]]:
    """Every record of the log from `start_seq` on, with its stream sequence."""

    async def work(nc, js):
        end = await bus.stream_last_seq(js, bus.EV_STREAM)
        return [item async for item in bus.read_records(js, start_seq, end)]

    return run(url, work)


def state_and_records(url: str) -> tuple[Any, list[T.Record]]:
    """The state folded from the whole log (no snapshot), and the scheduler's records (with
    a keyring, those its signature covers; foreign messages passed over: trust/foreign.py)."""
    from core import new_state
    from core.replay import apply_record
    from trust.foreign import LogSorter

    state = new_state()
    sorter = LogSorter(_keyring())
    recs = [genuine for seq, record in records(url) for genuine, _ in sorter.feed_record(seq, record)]
    recs += [genuine for genuine, _ in sorter.finish()]
    for record in recs:
        apply_record(state, record)
    return state, recs


def send_and_wait(url: str, inp: T.Input, timeout_s: float = OUTCOME_TIMEOUT_S) -> dict:
    """Send one input and wait for the scheduler's verdict on it in the log: a dict with
    `outcome` accepted, rejected (with `reason` and `detail`), duplicate or pending."""
    return run_until_stopped(_send_and_wait(url, inp, timeout_s))


def client_sender(inp: T.Input) -> str:
    """Who a command sends as: $XIRANG_IDENTITY if set (an operator: `op:<user>`), else a
    submission's own team and user; '' (no sender) otherwise, which only an open server
    accepts (deploy/nats lets nobody but the scheduler publish without one)."""
    sender = bus.default_sender()
    if sender:
        return sender
    if isinstance(inp, T.Submit):
        return f"client:{inp.team}:{inp.user}"
    return ""


async def _send_and_wait(url: str, inp: T.Input, timeout_s: float) -> dict:
    from nats.js import api

    nc, js = await bus.connect(url, reconnects=2)
    try:
        await bus.ensure_streams(js)
        start = await bus.stream_last_seq(js, bus.EV_STREAM)
        msg_id, seq, duplicate = await bus.send_input(js, inp, sender=client_sender(inp))
        base = {"type": T.type_name(inp), "job": T.input_job(inp), "id": msg_id, "seq": seq}
        if duplicate:
            return {
                **base,
                "outcome": "duplicate",
                "detail": f"input id {msg_id} was sent before (seq {seq})",
            }
        found: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_msg(msg) -> None:
            record = T.decode_record(msg.data)
            if record.input_seq == seq and not found.done():
                found.set_result(record)

        sub = await js.subscribe(
            f"{bus.LOG_PREFIX}.>",
            stream=bus.EV_STREAM,
            ordered_consumer=True,
            cb=on_msg,
            config=api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start + 1
            ),
        )
        try:
            record = await asyncio.wait_for(found, timeout_s)
        except asyncio.TimeoutError:
            return {
                **base,
                "outcome": "pending",
                "detail": f"queued on XR_IN (seq {seq}) but no scheduler answered within {timeout_s:.0f} s"
                " (is `xirang scheduler` running?)",
            }
        finally:
            await sub.unsubscribe()
        ev = record.event
        if isinstance(ev, T.InputRejected):
            return {**base, "outcome": "rejected", "reason": ev.reason, "detail": ev.detail}
        return {**base, "outcome": "accepted", "record": record.n}
    finally:
        await nc.close()
