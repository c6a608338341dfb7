"""The host's durable outbox: facts (exits, checkpoints, releases, node_up) wait here, one
file each, until the bus has taken them, so an outage or a crash of the agent loses none.

Writers (the host agent, and the job SDK of the jobs it runs, through `$XR_OUTBOX`) put a
fact with `put`: the encoded input, written atomically under a name that sorts in the
order facts were made. Each run's SDK writes to its own folder (`watch_job`), and only
that job's own facts are taken from it: a job never publishes on the bus itself, so it
cannot speak for another job or for the host. The host agent's sender publishes them in that order and removes
each one only once XR_IN has acknowledged it; a fact sent twice (a crash between the ack
and the removal) is dropped by XR_IN's deduplication, because every fact carries an id
derived from the run it belongs to.

A run's facts are bounded: at most JOB_FACTS_BURST at once and JOB_FACTS_PER_S after that
(a token bucket), JOB_FACTS_MAX in all, and JOB_FACT_BYTES_MAX each. Beyond them a fact is
dropped (its file removed), counted and reported (`on_dropped`: the agent logs it and
raises an alert), so one job writing facts without end neither floods the log nor delays
its host's and other jobs' facts. A job's SDK sends a handful per checkpoint.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from core import types as T
from core.identity import JOB_FACTS

from transport import bus

from trust.durable import write_durably

from .ckptpath import path_problem

log = logging.getLogger("xirang.outbox")

SUFFIX = ".fact"
JOB_FACTS_BURST = 64
JOB_FACTS_PER_S = 4.0
JOB_FACTS_MAX = 5000
JOB_FACT_BYTES_MAX = 16 * 1024
JOB_MARKER = ".job"  # in a run's outbox folder: the job whose facts it may hold
_counter = itertools.count()


class Outbox:
    """A folder of facts waiting for the bus: `put` writes one atomically, the sender delivers
    them in order and removes each once acknowledged."""

    def __init__(self, folder: str | os.PathLike, sender: str = "") -> None:
        self.folder = Path(folder)
        self.sender = sender  # who the facts are delivered as (core/identity.py)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.job_folders: dict[Path, str] = {}  # runs' own outboxes -> their job
        self.retiring: set[Path] = set()  # runs that ended: dropped once delivered
        # A job's own checkpoint folders (agents/ckptpath.py); None: paths are not checked.
        self.path_roots: Callable[[str], list[Path]] | None = None
        self.budgets: dict[Path, FactBudget] = {}  # each run's allowance of facts
        # Called (job, dropped so far, why) on a run's first dropped fact and every
        # DROPS_REPORTED_EVERY after, for the agent to log and alert.
        self.on_dropped = None
        # Called (fact, job, its file) before a run's fact is delivered: True holds it, and
        # the run's later facts, until the host is done with it (a checkpoint's second copy).
        self.hold: Callable[[T.Input, str, Path], bool] | None = None

    def watch_job(self, folder: str | os.PathLike, job: str) -> Path:
        """Deliver, with this outbox's own facts, those a run's SDK leaves in `folder`,
        checked to be `job`'s own facts."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        write_durably(folder / JOB_MARKER, job.encode())  # read after a restart: whole or absent
        self.job_folders[folder] = job
        return folder

    def watch_marked(self, root: str | os.PathLike) -> None:
        """After a restart: every run outbox under `root` that still has its marker."""
        for marker in sorted(Path(root).glob(f"*/outbox/{JOB_MARKER}")):
            self.job_folders[marker.parent] = marker.read_text()

    def retire(self, folder: str | os.PathLike) -> None:
        """The run ended: stop watching its folder once its facts are delivered."""
        self.retiring.add(Path(folder))

    def _waiting(self) -> list[tuple[Path, str | None]]:
        """Every waiting fact, own (job None) and the runs', in the order they were made."""
        items = [(path, None) for path in self.pending()]
        for folder, job in list(self.job_folders.items()):
            found = sorted(folder.glob(f"*{SUFFIX}"))
            if not found and folder in self.retiring:
                self.job_folders.pop(folder)
                self.retiring.discard(folder)
                self.budgets.pop(folder, None)
                (folder / JOB_MARKER).unlink(missing_ok=True)
            items += [(path, job) for path in found]
        return sorted(items, key=lambda item: item[0].name)

    def put(self, inp: T.Input) -> Path:
        """Keep one fact (it must carry its id) until it is delivered."""
        if not inp.id:
            raise ValueError("a fact in the outbox needs an id, for deduplication on redelivery")
        name = f"{time.time_ns():020d}-{os.getpid():07d}-{next(_counter):06d}{SUFFIX}"
        path = self.folder / name
        write_durably(path, T.encode(inp))
        return path

    def pending(self) -> list[Path]:
        """The waiting fact files, oldest first."""
        return sorted(self.folder.glob(f"*{SUFFIX}"))

    def __len__(self) -> int:
        return len(self._waiting())

    async def deliver(self, js) -> int:
        """Publish the waiting facts in order; stops at the first that the bus does not
        take (it stays, and so do those after it). Returns how many were delivered."""
        delivered = 0
        held: set[Path] = set()  # runs whose facts wait (in order) for the host this time
        for n, (path, job) in enumerate(self._waiting(), 1):
            if n % YIELD_EVERY == 0:  # a flooded folder must not hold the agent's loop
                await asyncio.sleep(0)
            if path.parent in held:
                continue
            if job is not None and self._over_budget_unread(path.parent, job):
                path.unlink(missing_ok=True)  # beyond the run's bounds whatever it holds: not read
                continue
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # delivered by another sender meanwhile
            inp = T.parse_input(data)
            if isinstance(inp, T.Malformed):
                log.warning("outbox: dropping unreadable fact %s: %s", path.name, inp.error)
                path.unlink(missing_ok=True)
                continue
            problem = job_fact_problem(inp, job, self.path_roots) if job is not None else ""
            if not problem and job is not None and self.hold is not None and self.hold(inp, job, path):
                held.add(path.parent)  # spends nothing of the run's budget until it goes
                continue
            if not problem and job is not None and self._over_budget(path.parent, job, len(data)):
                path.unlink(missing_ok=True)  # counted and reported by `_over_budget`
                continue
            if problem:
                log.warning("outbox: dropping %s from job %s's outbox: %s", path.name, job, problem)
                path.unlink(missing_ok=True)
                continue
            await bus.send_input(js, inp, sender=self.sender or None)
            path.unlink(missing_ok=True)
            delivered += 1
        return delivered

    def _over_budget(self, folder: Path, job: str, size: int) -> str:
        """Why a run's fact is beyond its bounds ('' when within them); counts it either way."""
        budget = self.budgets.setdefault(folder, FactBudget())
        return self._counted(budget, job, budget.spend(time.monotonic(), size))

    def _over_budget_unread(self, folder: Path, job: str) -> str:
        """Why a run's next fact is beyond its bounds whatever its size ('' when it may be
        within them: then it is read and `_over_budget` decides); counts it when it is."""
        budget = self.budgets.setdefault(folder, FactBudget())
        return self._counted(budget, job, budget.exhausted(time.monotonic()))

    def _counted(self, budget: "FactBudget", job: str, why: str) -> str:
        if why:
            budget.dropped += 1
            if self.on_dropped is not None and (budget.dropped - 1) % DROPS_REPORTED_EVERY == 0:
                self.on_dropped(job, budget.dropped, why)
        return why


DROPS_REPORTED_EVERY = 1000
YIELD_EVERY = 64  # facts looked at between two turns of the agent's other work


class FactBudget:
    """One run's allowance of facts: a token bucket (JOB_FACTS_BURST, refilled at
    JOB_FACTS_PER_S), a total (JOB_FACTS_MAX) and a size per fact (JOB_FACT_BYTES_MAX)."""

    def __init__(self) -> None:
        self.tokens = float(JOB_FACTS_BURST)
        self.at = time.monotonic()
        self.taken = 0
        self.dropped = 0

    def exhausted(self, now: float) -> str:
        """Why no fact of any size may be taken now ('' when one might be)."""
        self.tokens = min(float(JOB_FACTS_BURST), self.tokens + (now - self.at) * JOB_FACTS_PER_S)
        self.at = now
        if self.taken >= JOB_FACTS_MAX:
            return f"more than {JOB_FACTS_MAX} facts from one run"
        if self.tokens < 1:
            return f"more than {JOB_FACTS_BURST} facts at once, or {JOB_FACTS_PER_S:g} a second after that"
        return ""

    def spend(self, now: float, size: int) -> str:
        """'' and one fact spent, or why this fact is beyond the run's bounds."""
        why = self.exhausted(now)
        if why:
            return why
        if size > JOB_FACT_BYTES_MAX:
            return f"a fact of {size} bytes; at most {JOB_FACT_BYTES_MAX}"
        self.tokens -= 1
        self.taken += 1
        return ""


def job_fact_problem(inp: T.Input, job: str, path_roots: Callable[[str], list[Path]] | None = None) -> str:
    """Why a fact left in `job`'s own outbox must not be delivered ('' when it may): not a job
    fact, another job's, or a checkpoint outside the job's own checkpoint folders."""
    kind = T.type_name(inp)
    if kind not in JOB_FACTS:
        return f"{kind} is not a fact a job reports"
    if T.input_job(inp) != job:
        return f"it names job {T.input_job(inp)!r}; a job speaks only for itself"
    if isinstance(inp, T.CheckpointSaved) and inp.path and path_roots is not None:
        return path_problem(inp.path, path_roots(job))
    return ""
