"""The agents' one retry loop while the bus is away (transport.bus.retry_with_backoff): it
keeps trying with growing waits until the action succeeds, and a stop ends the wait at
once (an agent asked to stop during an outage does not sit out its backoff)."""

from __future__ import annotations

import asyncio
import time

import pytest

from transport import bus

pytestmark = pytest.mark.timeout(30)


def test_it_tries_again_until_the_action_succeeds():
    tries: list[float] = []

    async def twice_refused() -> int:
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise ConnectionRefusedError("no bus yet")
        return 7

    assert asyncio.run(bus.retry_with_backoff(twice_refused, "reading", first_delay_s=0.05)) == 7
    assert len(tries) == 3
    assert tries[2] - tries[1] >= tries[1] - tries[0] >= 0.05  # the wait grows


def test_a_stop_ends_the_wait_at_once_and_the_last_error_is_raised():
    async def go() -> tuple[float, int]:
        stop = asyncio.Event()
        tries: list[int] = []

        async def refused() -> None:
            tries.append(1)
            raise ConnectionRefusedError("no bus")

        asyncio.get_running_loop().call_later(0.5, stop.set)
        began = time.monotonic()
        with pytest.raises(ConnectionRefusedError):
            await bus.retry_with_backoff(refused, "reading", stop, first_delay_s=4.0)
        return time.monotonic() - began, len(tries)

    took_s, tries = asyncio.run(go())
    assert tries == 2  # the first try, and one more once the stop cut the 4 s wait short
    assert took_s < 2.5
