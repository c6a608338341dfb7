"""The host's durable outbox: facts (exits, checkpoints, releases, node_up) wait here, one
file each, until the bus has taken them, so an outage or a crash of the agent loses none.

Writers (the host agent, and the job SDK of the jobs it runs, through `$XR_OUTBOX`) put a
fact with `put`: the encoded input, written atomically under a name that sorts in the
order facts were made. The host agent's sender publishes them in that order and removes
each one only once XR_IN has acknowledged it; a fact sent twice (a crash between the ack
and the removal) is dropped by XR_IN's deduplication, because every fact carries an id
derived from the run it belongs to.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

from core import types as T

from transport import bus

log = logging.getLogger("xirang.outbox")

SUFFIX = ".fact"
_counter = itertools.count()


class Outbox:
    def __init__(self, folder: str | os.PathLike, sender: str = "") -> None:
        self.folder = Path(folder)
        self.sender = sender  # who the facts are delivered as (core/identity.py)
        self.folder.mkdir(parents=True, exist_ok=True)

    def put(self, inp: T.Input) -> Path:
        """Keep one fact (it must carry its id) until it is delivered."""
        if not inp.id:
            raise ValueError("a fact in the outbox needs an id, for deduplication on redelivery")
        name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(_counter):06d}{SUFFIX}"
        path = self.folder / name
        tmp = self.folder / (name + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(T.encode(inp))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return path

    def pending(self) -> list[Path]:
        return sorted(self.folder.glob(f"*{SUFFIX}"))

    def __len__(self) -> int:
        return len(self.pending())

    async def deliver(self, js) -> int:
        """Publish the waiting facts in order; stops at the first that the bus does not
        take (it stays, and so do those after it). Returns how many were delivered."""
        delivered = 0
        for path in self.pending():
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # delivered by another sender meanwhile
            inp = T.parse_input(data)
            if isinstance(inp, T.Malformed):
                log.warning("outbox: dropping unreadable fact %s: %s", path.name, inp.error)
                path.unlink(missing_ok=True)
                continue
            await bus.send_input(js, inp, sender=self.sender or None)
            path.unlink(missing_ok=True)
            delivered += 1
        return delivered
