"""What each user is told: notices derived from the log, per user.

A preemption, a checkpoint fallback, a compensation or a downgrade concerns one job, so it
concerns that job's user. The log already holds every fact; this module turns the events
into short notices a person can act on, addressed to the job's user:

- `preemption_notice` (VictimNotified): your job is being preempted, by which job of which
  level, why, and the deadline to reach a safe point (and save);
- `preemption_called_off` (NoticeWithdrawn): it keeps running;
- `preempted` (JobRequeued for a preemption or a lost node): requeued, progress lost, boost;
- `checkpoint_fallback` (CheckpointFallback): the newest checkpoint failed verification;
  resumed from an older step, with the progress lost;
- `compensation` (CompensationGranted): what the team was granted for the job, and why;
- `downgraded` (JobSubmitted below its requested level): the team is downgraded for
  preempting too often; `level_restored` (JobLevelRestored): back at the level asked for.

The same derivation serves the projection's `notices` table (dashboards, SQL), `xirang
notices [--follow]` (read from the log, filtered to one user), the unread marks of
`xirang jobs` (notices newer than what the user has read, `ReadMarks`), and `xirang notices
--publish`, which publishes each user's notices on their own subject (`subject(user)`,
`xr.notice.<user>`) for clients that listen rather than read the log.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from typing import Callable, Iterable

from core import types as T

from core.explain import human_duration
from trust.durable import write_durably

from .audit import fmt_t

NOTICE_PREFIX = "xr.notice"
_SUBJECT_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")

# `xirang jobs` looks for unread notices in at most this many of the log's newest records
LOOKBACK_RECORDS_MAX = 20_000

# job id -> (user, team, level), for jobs the caller knows of
JobLookup = Callable[[str], "tuple[str, str, int] | None"]


@dataclass(frozen=True)
class Notice:
    """One message for a user about their job (a preemption notice, a requeue, compensation...)."""

    seq: int  # position of the event in the log (stream sequence or line)
    t: int
    user: str
    job: str
    kind: str
    message: str

    def as_dict(self) -> dict:
        """The notice as JSON-ready data."""
        return asdict(self)

    def line(self) -> str:
        """The notice as one line of text."""
        return f"{fmt_t(self.t)}  {self.job:<18} {self.kind:<22} {self.message}"


def derive(seq: int, ev: T.Event, lookup: JobLookup) -> list[Notice]:
    """The notices one event gives rise to (none for most events)."""
    job = getattr(ev, "job", "")
    if not job:
        return []
    made = _message(ev, lookup)
    if made is None:
        return []
    kind, message, user = made
    if not user:
        known = lookup(job)
        if known is None:
            return []
        user = known[0]
    return [Notice(seq, ev.t, user, job, kind, message)]


def _message(ev: T.Event, lookup: JobLookup) -> tuple[str, str, str] | None:
    if isinstance(ev, T.VictimNotified):
        by = (
            f" by {ev.preemptor}" + (f" (level {ev.preemptor_level})" if ev.preemptor_level >= 0 else "")
            if ev.preemptor
            else ""
        )
        save = "save a checkpoint and " if ev.checkpoint_needed else ""
        why = f": {ev.reason}" if ev.reason else ""
        return (
            "preemption_notice",
            f"being preempted{by}{why}; reach a safe point, {save}release by {fmt_t(ev.deadline_t)}",
            "",
        )
    if isinstance(ev, T.NoticeWithdrawn):
        return "preemption_called_off", "the preemption was called off: it keeps running", ""
    if isinstance(ev, T.JobRequeued) and ev.reason in ("preempted", "node_lost"):
        cause = "preempted" if ev.reason == "preempted" else "its node was lost"
        return (
            "preempted",
            f"{cause}; requeued with a priority boost of {ev.boost} level(s), lost"
            f" {human_duration(ev.lost_progress_ms)} of progress (preempted {ev.preempt_count} times)",
            "",
        )
    if isinstance(ev, T.CheckpointFallback):
        return (
            "checkpoint_fallback",
            f"checkpoint {ev.bad_digest[:19]} failed verification; resumed"
            f" from step {ev.to_step}, losing {human_duration(ev.lost_progress_ms)} of progress",
            "",
        )
    if isinstance(ev, T.CompensationGranted):
        return (
            "compensation",
            f"team {ev.team} granted {ev.kind} {ev.amount:g} after {ev.preempt_count} preemptions",
            ev.user,
        )
    if isinstance(ev, T.JobSubmitted) and ev.level > ev.requested_level:
        return (
            "downgraded",
            f"entered at level {ev.level}, not {ev.requested_level}: team {ev.team}"
            " is downgraded for preempting too often; it goes back when the team's quota"
            " recovers",
            ev.user,
        )
    if isinstance(ev, T.JobLevelRestored):
        return "level_restored", f"back at level {ev.level} (the team's preemption quota recovered)", ""
    return None


def subject(user: str) -> str:
    """The NATS subject a user's notices are published on (`xr.notice.<user>`, the name
    made a single subject token), so that subject permissions can give each user theirs."""
    return f"{NOTICE_PREFIX}.{_SUBJECT_UNSAFE.sub('_', user) or '_'}"


class Notifier:
    """Derives notices from records in order, knowing each job's user from its JobSubmitted
    (or from `known`, e.g. the open jobs of a folded state, when reading only a tail)."""

    def __init__(self, known: JobLookup | None = None) -> None:
        self.jobs: dict[str, tuple[str, str, int]] = {}
        self.known = known

    def lookup(self, job: str) -> tuple[str, str, int] | None:
        """(user, team, level) of a job, from what this notifier has seen or the `known` lookup."""
        found = self.jobs.get(job)
        if found is None and self.known is not None:
            found = self.known(job)
        return found

    def feed(self, seq: int, record: T.Record) -> list[Notice]:
        """The notices one record gives rise to (remembering who submitted which job)."""
        ev = record.event
        if isinstance(ev, T.JobSubmitted):
            self.jobs[ev.job] = (ev.user, ev.team, ev.level)
        return derive(seq, ev, self.lookup)

    def all(self, items: Iterable[tuple[int, T.Record]], user: str | None = None) -> list[Notice]:
        """Every notice of these records, or only `user`'s."""
        out = []
        for seq, record in items:
            out.extend(n for n in self.feed(seq, record) if user is None or n.user == user)
        return out


def state_lookup(state) -> JobLookup:
    """Job users from a folded state's open jobs."""

    def lookup(job_id: str):
        job = state.canonical.jobs.get(job_id)
        return None if job is None else (job.user, job.team, job.level)

    return lookup


class ReadMarks:
    """Per user, the log position up to which they have read their notices (a small JSON
    file beside the other local state, `.xirang/notices-read.json`)."""

    def __init__(self, path: str = os.path.join(".xirang", "notices-read.json")) -> None:
        self.path = path

    def _load(self) -> dict[str, int]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            return {}
        return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def get(self, user: str) -> int:
        """The log position up to which `user` has read their notices (0: none)."""
        return self._load().get(user, 0)

    def set(self, user: str, seq: int) -> None:
        """Record that `user` has read up to `seq` (never moves back)."""
        marks = self._load()
        if seq <= marks.get(user, 0):
            return
        marks[user] = seq
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        write_durably(self.path, json.dumps(marks, sort_keys=True).encode())


def unread_jobs(
    items: Iterable[tuple[int, T.Record]], lookup: JobLookup, after_seq: int, user: str | None = None
) -> dict[str, int]:
    """Job -> count of its notices after `after_seq` (of `user`'s jobs, or everyone's)."""
    counts: dict[str, int] = {}
    for notice in Notifier(lookup).all(((s, r) for s, r in items if s > after_seq), user):
        counts[notice.job] = counts.get(notice.job, 0) + 1
    return counts
