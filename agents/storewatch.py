"""`xirang up`'s watch over its embedded nats-server's store: a JetStream store whose
disk filled keeps failing every write after the space is freed, until the server is
restarted (seen with nats-server 2.12: "critical write error", then every publish goes
unanswered). So `xirang up` writes a probe every few seconds; after several unanswered in
a row it restarts the server when the disk has room again (clients reconnect by
themselves), and otherwise says what to free.
"""

from __future__ import annotations

import asyncio
import logging
import time

from transport import bus

from .diskwatch import free_bytes

log = logging.getLogger("xirang.up")

PROBE_EVERY_S = 2.0
PROBE_TIMEOUT_S = 2.0
# Probes unanswered in a row before the store is taken to be stuck.
STUCK_AFTER_PROBES = 3
# A restart that did not help is not repeated sooner than this.
RESTART_EVERY_S_MIN = 20.0
PROBE_KEY = "up-probe"


async def probe_write(url: str) -> bool | None:
    """Whether the server stored a small write (True), took the connection but not the write
    (False: a store that cannot write), or could not be reached at all (None)."""
    import nats

    try:
        nc = await nats.connect(url, connect_timeout=PROBE_TIMEOUT_S, max_reconnect_attempts=0)
    except Exception:  # noqa: BLE001 - not reachable: an outage, not a stuck store
        return None
    try:
        js = nc.jetstream(timeout=PROBE_TIMEOUT_S)
        kv = await js.key_value(bus.LEASE_BUCKET)
        await kv.put(PROBE_KEY, str(time.time()).encode())
        return True
    except Exception:  # noqa: BLE001 - a timeout: the store did not answer
        return False
    finally:
        await nc.close()


class StoreWatch:
    """Call `tick()` from `xirang up`'s loop; it probes every PROBE_EVERY_S and restarts
    `server` (transport.natsd.EmbeddedNats) once its store is stuck and the disk has room
    (`floor_bytes` free)."""

    def __init__(self, server, floor_bytes: int, say=print) -> None:
        self.server = server
        self.floor_bytes = floor_bytes
        self.say = say
        self.unanswered = 0
        self.restarts = 0
        self._next_probe = time.monotonic() + PROBE_EVERY_S
        self._last_restart = -1e9
        self._told_full = False

    def tick(self) -> None:
        """Probe if due; act on a stuck store."""
        now = time.monotonic()
        if now < self._next_probe:
            return
        self._next_probe = now + PROBE_EVERY_S
        answered = asyncio.run(probe_write(self.server.url))
        if answered is not False:
            if answered and self.unanswered >= STUCK_AFTER_PROBES:
                self.say("xirang up: the bus stores writes again")
            self.unanswered, self._told_full = 0, False
            return
        self.unanswered += 1
        if self.unanswered < STUCK_AFTER_PROBES:
            return
        store = self.server.data_dir
        free = free_bytes(store)
        if free < self.floor_bytes:
            if not self._told_full:
                self._told_full = True
                self.say(
                    f"xirang up: the bus cannot store anything: the disk under {store} is full"
                    f" ({free // 2**20} MiB free). Free space there; the server is restarted once"
                    " there is room"
                )
            return
        if now - self._last_restart < RESTART_EVERY_S_MIN:
            return
        self._last_restart = now
        self.restarts += 1
        self.say(
            f"xirang up: the bus's store stopped writing ({self.unanswered} probes unanswered, "
            f"{free // 2**20} MiB free now): restarting the embedded nats-server on {self.server.url}"
        )
        self.server.stop()
        self.server.start()
        self.unanswered = 0
