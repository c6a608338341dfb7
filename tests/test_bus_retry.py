"""The agents' one retry loop while the bus is away (transport.bus.retry_with_backoff): it
keeps trying with growing, jittered waits until the action succeeds (agents that lost the bus
together do not come back in lockstep), a stop ends the wait at once (an agent asked to stop
during an outage does not sit out its backoff), and an answer that retrying cannot change -
refused credentials, a refused permission, a stream these credentials may not create - ends
it at once with what to fix."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest

from transport import bus
from transport.natsd import free_port, nats_server_binary
from trust.connect import CredentialsRefused

pytestmark = pytest.mark.timeout(60)


def test_it_tries_again_until_the_action_succeeds():
    tries: list[float] = []

    async def twice_refused() -> int:
        tries.append(time.monotonic())
        if len(tries) <= 2:
            raise ConnectionRefusedError("no bus yet")
        return 7

    assert asyncio.run(bus.retry_with_backoff(twice_refused, "reading", first_delay_s=0.05)) == 7
    assert len(tries) == 3
    # Each wait is half its exponential step plus up to the other half at random.
    assert tries[1] - tries[0] >= 0.025 and tries[2] - tries[1] >= 0.05


def test_agents_that_lost_the_bus_together_come_back_spread_out():
    async def one_agent() -> list[float]:
        tries: list[float] = []

        async def refused_twice() -> None:
            tries.append(time.monotonic())
            if len(tries) <= 2:
                raise ConnectionRefusedError("no bus yet")

        await bus.retry_with_backoff(refused_twice, "reading", first_delay_s=0.4)
        return [b - a for a, b in zip(tries, tries[1:])]

    async def many() -> list[list[float]]:
        return await asyncio.gather(*(one_agent() for _ in range(24)))

    waits = asyncio.run(many())
    first = sorted(w[0] for w in waits)
    second = sorted(w[1] for w in waits)
    assert first[0] >= 0.2 - 0.01 and second[0] >= 0.4 - 0.01  # the deterministic half
    assert first[-1] - first[0] > 0.05 and second[-1] - second[0] > 0.1  # spread, not lockstep
    assert len({round(w, 3) for w in first}) > 12


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
    assert tries == 2  # the first try, and one more once the stop cut the 2-4 s wait short
    assert took_s < 2.5


def test_refused_credentials_end_the_retries_with_what_to_fix():
    tries: list[int] = []

    async def refused() -> None:
        tries.append(1)
        raise CredentialsRefused("the NATS server refused the credentials x.creds: get a creds file")

    with pytest.raises(bus.PermanentBusError, match="host h1: reading: .*get a creds file"):
        asyncio.run(bus.retry_with_backoff(refused, "host h1: reading", first_delay_s=0.05))
    assert tries == [1]


@pytest.fixture
def guarded_nats(tmp_path):
    """A real nats-server with JetStream and two password users: `admin` may do anything,
    `worker` may publish to xr.> and read stream info but not create streams."""
    port = free_port()
    conf = tmp_path / "nats.conf"
    conf.write_text(
        f"""listen: 127.0.0.1:{port}
jetstream {{ store_dir: "{tmp_path / "js"}" }}
accounts {{ A {{ jetstream: enabled, users: [
  {{user: worker, password: wpass, permissions: {{
     publish: {{ allow: ["xr.>", "$JS.API.INFO", "$JS.API.STREAM.INFO.>"] }},
     subscribe: {{ allow: ["_INBOX.>"] }} }} }},
  {{user: admin, password: apass}} ] }} }}
"""
    )
    log = open(tmp_path / "nats.log", "ab")
    proc = subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + 10
    while "Server is ready" not in (tmp_path / "nats.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield port
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(10)


def test_a_stream_these_credentials_may_not_create_ends_the_retries_with_what_to_fix(guarded_nats):
    url = f"nats://worker:wpass@127.0.0.1:{guarded_nats}"

    async def go() -> None:
        nc, js = await bus.connect(url, name="worker")
        try:
            await bus.retry_with_backoff(lambda: bus.ensure_streams(js), "host h1: creating streams")
        finally:
            await nc.close()

    began = time.monotonic()
    with pytest.raises(bus.PermanentBusError) as refused:
        asyncio.run(go())
    assert "stream XR_IN does not exist and these credentials may not create it" in str(refused.value)
    assert "start the scheduler first" in str(refused.value)
    assert time.monotonic() - began < 30  # one unanswered create, not a wait forever


def test_connecting_forever_with_a_wrong_password_ends_saying_the_credentials_were_refused(guarded_nats):
    url = f"nats://worker:wrong@127.0.0.1:{guarded_nats}"
    began = time.monotonic()
    with pytest.raises(bus.PermanentBusError, match="refused the credentials"):
        asyncio.run(asyncio.wait_for(bus.connect_forever(url, name="host-h1"), 30))
    assert time.monotonic() - began < 20
