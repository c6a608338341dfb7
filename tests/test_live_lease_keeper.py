"""The scheduler's lease keeper (agents/lease.py) against a real nats-server: its renewals go
out on time while the scheduler's loop is busy computing, and stop once that loop has not
moved for its stall limit, so that a standby can take over from a wedged leader."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from agents.lease import LEASE_KEY, LeaseKeeper
from transport import bus
from transport.natsd import EmbeddedNats

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 1000


async def _lease(js) -> dict:
    kv = await js.key_value(bus.LEASE_BUCKET)
    return json.loads((await kv.get(LEASE_KEY)).value)


def test_renewals_go_out_while_the_loop_computes_and_stop_once_it_has_not_moved_for_the_stall_limit(tmp_path):
    async def scenario(url: str) -> None:
        nc, js = await bus.connect(url)
        await bus.ensure_streams(js)
        moved = [time.monotonic()]
        keeper = LeaseKeeper(url, "s1", LEASE_MS, lambda: moved[0], stall_s=4.0)
        await keeper.open()
        try:
            assert await keeper.call(keeper.take())
            before = await _lease(js)
            # A step that holds the loop for three lease terms (a decision at frontier scale
            # on a loaded machine): the keeper's thread renews all the same.
            time.sleep(3 * LEASE_MS / 1000)
            moved[0] = time.monotonic()
            during = await _lease(js)
            assert during["holder"] == "s1" and during["until_ms"] > before["until_ms"] + 1500
            assert during["until_ms"] > time.time() * 1000  # never lapsed
            assert keeper.renewed >= 6 and keeper.lost is None
            # The loop stops moving (wedged, though its event loop turns): past the stall
            # limit the keeper renews no more, and the lease lapses for a standby to take.
            await asyncio.sleep(4.0 + 2 * LEASE_MS / 1000)
            stalled = await _lease(js)
            assert stalled["until_ms"] < time.time() * 1000
            other = LeaseKeeper(url, "s2", LEASE_MS, time.monotonic, stall_s=30.0)
            await other.open()
            try:
                assert await other.call(other.take())
            finally:
                await other.close()
            # Its next renewal is refused: the lease is marked lost for the loop to read.
            moved[0] = time.monotonic()
            deadline = time.monotonic() + 5
            while keeper.lost is None:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
                moved[0] = time.monotonic()
            assert "lease lost" in keeper.lost
        finally:
            await keeper.close()
            await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(scenario(server.url))
