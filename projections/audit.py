"""Audit: rebuild the scheduler's state from the log, verify it, and tell a job's story.

`Audit.feed(pos, payload)` folds one record with `core.apply_record`, which checks the
record's position and hash link, recomputes its hash, and checks every `StateDigest`
against the rebuilt state; the first record that fails is reported with its position in
the chain (`n`) and in its source (stream sequence or line number). A modified record
fails its hash; a dropped or reordered one breaks the position sequence; a forger who
recomputes hashes is caught by the next StateDigest.

Logs written by older releases audit the same way: a record's hash is checked over its event
as stored, whatever fields the event's type has gained since, and each `StateDigest` as its
schema says (core/log/digest.py; the summary counts the digests of each schema and names the
older releases whose digests matched). Folding applies the recorded events and never
re-makes a decision, so a log written under other decision rules or policy defaults still
folds and verifies; only a change in how events fold (core/log/evolve.py) would show, as a
digest mismatch that says so.

What one log alone cannot show is a loss of records at its very end: compare the chain
head printed by the audit with one kept elsewhere (the scheduler logs its own).

The story of a job (`--job J`) is told from the log, not the projection, so it works on
an exported file as well: when it queued and aged, who preempted it and why (benefit
against cost), how it was released, which checkpoint it resumed from, what its team was
compensated, and how it ended.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


from core import ChainError, apply_record, new_state
from core import types as T
from core.log.digest import LEGACY_RELEASES
from core.explain import human_duration
from core.model.state import state_digest
from trust.foreign import LogSorter
from trust.signing import SignatureError

EPOCH_MS_MIN = 10**12  # below this, t counts from the start of a scenario, not 1970
FOREIGN_LISTED_MAX = 100  # foreign messages the summary lists one by one (all are counted)


def fmt_t(t: int) -> str:
    """A log time in words: a UTC date and time, or T+h:m:s for logs that start at 0."""
    if t >= EPOCH_MS_MIN:
        return dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    s = t // 1000
    return f"T+{s // 3600}h{s // 60 % 60:02d}m{s % 60:02d}s"


# What a resume's `JobRunning.restored_copy` says, in a job's story.
RESTORED_FROM = {
    1: "; its checkpoint read from copy 1 (the bus's store)",
    2: (
        "; its checkpoint read from copy 2 (the disk of the host that wrote it):"
        " the bus's copy was missing or corrupt"
    ),
}


@dataclass
class Problem:
    """Where an audited log goes wrong: the record, its position, and what is wrong."""

    n: int  # position in the hash chain where the log goes wrong
    pos: int  # stream sequence or line number
    problem: str

    def words(self, pos_name: str) -> str:
        """The problem in one line."""
        return f"record {self.n} ({pos_name} {self.pos}): {self.problem}"


@dataclass
class JobInfo:
    """Who a job belongs to and its level, for the audit's job view."""

    team: str
    user: str
    level: int


@dataclass
class Audit:
    """An audit fed record by record: checks the hash chain, state digests and signatures while
    folding the log, optionally up to a record or time, and follows one job."""

    job: str = ""
    to_n: int | None = None
    to_t: int | None = None
    state: object = field(default_factory=new_state)
    records: int = 0
    digests: int = 0
    last_pos: int = 0
    problem: Problem | None = None
    stopped_early: bool = False
    story: list[str] = field(default_factory=list)
    jobs: dict[str, JobInfo] = field(default_factory=dict)
    _last_ckpt: dict[str, T.CheckpointRecorded] = field(default_factory=dict)
    # With a keyring (trust.signing.KeyRing), every record must be covered by the
    # scheduler's signature; without one, a log that carries signatures is refused at the
    # end (the auditor must say which key to trust), and an unsigned one is said to be
    # unchecked. Either way `sorter` (trust/foreign.py) sets aside the messages that are
    # not the scheduler's records; the log verifies when each was disowned.
    keyring: object = None
    sorter: LogSorter = field(init=False)
    signed_records: int = 0
    digest_schemas: dict[int, int] = field(default_factory=dict)  # schema -> digests verified
    legacy_releases: list[str] = field(default_factory=list)  # whose schema-1 digests matched

    def __post_init__(self) -> None:
        self.sorter = LogSorter(self.keyring)

    @property
    def done(self) -> bool:
        """Whether the audit has stopped (a problem, or the window's end)."""
        return self.problem is not None or self.stopped_early

    def feed(self, pos: int, payload: bytes) -> bool:
        """Read one message; False once the audit has stopped (a problem or the window end).
        A message that is not the scheduler's record is set aside (`sorter.foreign`), and
        the audit goes on past it."""
        if self.done:
            return False
        try:
            released = self.sorter.feed(pos, payload)
        except SignatureError as err:
            self.problem = Problem(err.n, err.pos or pos, err.problem)
            return False
        except ChainError as err:
            self.problem = Problem(err.n, pos, err.problem)
            return False
        return self._fold_all(released)

    def _fold_all(self, released: list[tuple[T.Record, int]]) -> bool:
        for record, pos in released:
            if (self.to_n is not None and record.n > self.to_n) or (
                self.to_t is not None and record.event.t > self.to_t
            ):
                self.stopped_early = True
                return False
            if not self._fold(record, pos):
                return False
        return True

    def _fold(self, record: T.Record, pos: int) -> bool:
        try:
            apply_record(self.state, record)
        except ChainError as err:
            self.problem = Problem(err.n, pos, self._explain(record, err))
            return False
        except (KeyError, IndexError, ValueError) as err:  # hash fine, but the fold is impossible
            self.problem = Problem(record.n, pos, f"cannot be applied to the state: {err!r}")
            return False
        self.records += 1
        self.signed_records += bool(record.sig)
        self.last_pos = pos
        if isinstance(record.event, T.StateDigest):
            self._count_digest(record.event)
        self._remember(record.event)
        if self.job and _concerns(record.event, self.job):
            line = self._tell(record.event)
            if line:
                self.story.append(f"{fmt_t(record.event.t)}  {line}")
        return True

    def _count_digest(self, ev: T.StateDigest) -> None:
        self.digests += 1
        self.digest_schemas[ev.schema] = self.digest_schemas.get(ev.schema, 0) + 1
        if ev.schema == 1:
            name = LEGACY_RELEASES[self.state.scratch.legacy_digest_release].name
            if name not in self.legacy_releases:
                self.legacy_releases.append(name)

    def digest_words(self) -> str:
        """How many state digests of which schema matched, in words."""
        if not self.digests:
            return "no state digest written yet (the scheduler writes one every digest_every_events)"
        schemas = ", ".join(f"{n} of schema {schema}" for schema, n in sorted(self.digest_schemas.items()))
        older = (
            f"; schema 1 as computed by {' then '.join(self.legacy_releases)}" if self.legacy_releases else ""
        )
        return f"all {self.digests} state digests match the rebuilt state ({schemas}{older})"

    def _explain(self, record: T.Record, err: ChainError) -> str:
        """Say which record is missing or displaced, not only where the chain broke."""
        expected = self.state.canonical.events_n + 1
        if record.n > expected:
            missing = (
                f"record {expected}" if record.n == expected + 1 else f"records {expected}..{record.n - 1}"
            )
            return f"{missing} missing just before it (dropped, or moved later)"
        if record.n < expected:
            return f"record {record.n} appears again after record {expected - 1} (moved or duplicated)"
        return err.problem

    def finish(self) -> None:
        """After the last message: every message must be the scheduler's record, or one it
        disowned."""
        if self.problem is not None or self.stopped_early:
            return
        try:
            self._fold_all(self.sorter.finish())
        except SignatureError as err:
            self.problem = Problem(err.n, err.pos, err.problem)
            return
        if self.problem is not None or self.stopped_early:
            return
        undisowned = self.sorter.undisowned()
        if undisowned:
            first = undisowned[0]
            more = f" (and {len(undisowned) - 1} more)" if len(undisowned) > 1 else ""
            self.problem = Problem(
                first.n,
                first.pos,
                f"{first.problem}{more}; not disowned by the scheduler (it records a RecordDisowned"
                " for each foreign message once it reads the log)",
            )
        elif self.keyring is None and self.signed_records:
            self.problem = Problem(
                self.state.canonical.events_n,
                self.last_pos,
                "the log is signed, but no public key was given to verify it: "
                "pass --public-key FILE (or set XIRANG_PUBLIC_KEY)",
            )

    def signatures(self) -> str:
        """What the signature check found, in words."""
        if self.keyring is None:
            return "not checked (no public key)" if not self.signed_records else "no public key given"
        keys = ", ".join(sorted(self.sorter.keys_seen)) or "-"
        return f"{self.sorter.signatures} verified (keys {keys})"

    def foreign_summary(self, pos_name: str) -> dict:
        """The messages set aside as not the scheduler's: each with its position, why, and the
        record that disowned it (0: not disowned)."""
        listed = [
            {
                pos_name.replace(" ", "_"): f.pos,
                "reason": f.reason,
                "problem": f.problem,
                "sha256": f.digest,
                "disowned_by_record": f.disowned_by,
            }
            for f in self.sorter.foreign[:FOREIGN_LISTED_MAX]
        ]
        return {
            "foreign_messages": len(self.sorter.foreign),
            "disowned": sum(1 for f in self.sorter.foreign if f.disowned_by),
            "foreign": listed,
            "disowns_naming_no_message_here": len(self.sorter.disowns_unmatched),
        }

    def summary(self, pos_name: str) -> dict:
        """The audit's result as JSON-ready data."""
        c = self.state.canonical
        out = {
            "ok": self.problem is None,
            "records_verified": self.records,
            "state_digests_verified": self.digests,
            "last_record": c.events_n,
            f"last_{pos_name.replace(' ', '_')}": self.last_pos,
            "last_t": c.t,
            "chain_head": c.chain,
            "state_digest": state_digest(c),
            "jobs_open": len(c.jobs),
            "jobs_done": c.done_count,
            "sagas_open": len(c.sagas),
            "signatures": self.signatures(),
            "state_digest_schemas": {str(k): v for k, v in sorted(self.digest_schemas.items())},
            "legacy_digest_releases": self.legacy_releases,
            **self.foreign_summary(pos_name),
        }
        if self.problem:
            out["problem"] = self.problem.words(pos_name)
            out["problem_record"] = self.problem.n
            out[f"problem_{pos_name.replace(' ', '_')}"] = self.problem.pos
        return out

    # ------------------------------------------------------------ the story

    def _remember(self, ev: T.Event) -> None:
        if isinstance(ev, T.JobSubmitted):
            self.jobs[ev.job] = JobInfo(ev.team, ev.user, ev.level)
        elif isinstance(ev, T.CheckpointRecorded):
            self._last_ckpt[ev.job] = ev

    def _who(self, job: str) -> str:
        info = self.jobs.get(job)
        return f"{job} (level {info.level}, team {info.team}, user {info.user})" if info else job

    def _tell(self, ev: T.Event) -> str:
        job = self.job
        if isinstance(ev, T.JobSubmitted):
            down = (
                f", downgraded from level {ev.requested_level} because its team preempted too often"
                if ev.level != ev.requested_level
                else ""
            )
            variant = f", A/B variant {ev.variant}" if ev.variant else ""
            return (
                f"queued at level {ev.level}{down}: {ev.gpus} GPUs of {ev.gpu_models or 'any model'}"
                f" for {ev.user} of team {ev.team}{variant}"
            )
        if isinstance(ev, T.PriorityAged):
            return f"aged from level {ev.from_level} to {ev.to_level} after waiting {human_duration(ev.waited_ms)}"
        if isinstance(ev, T.JobStartRequested):
            return f"placed on {_where(ev.placement)}"
        if isinstance(ev, T.JobResumeRequested):
            why = "after its preemption was rolled back" if ev.reason == "rolled_back" else "after a requeue"
            ckpt = (
                f"from checkpoint step {ev.ckpt_step} ({ev.ckpt_digest[:23]})"
                if ev.ckpt_digest
                else "from scratch (no checkpoint)"
            )
            return f"resumed {why} on {_where(ev.placement)}, restoring {ckpt}"
        if isinstance(ev, T.JobRunning):
            copy = RESTORED_FROM.get(ev.restored_copy, "") if isinstance(ev.restored_copy, int) else ""
            return f"running, after waiting {human_duration(ev.waited_ms)} in the queue{copy}"
        if isinstance(ev, T.PreemptionPlanned):
            if ev.preemptor == job:
                victims = ", ".join(self._who(v) for v in ev.victims)
                regret = (
                    f"; a set on a node it did not price (past preemption_candidate_nodes_max)"
                    f" could have cost up to {ev.regret_max:.0f} less"
                    if ev.regret_max
                    else ""
                )
                return (
                    f"preempts {victims} ({ev.saga}): benefit {ev.benefit:.0f} against cost"
                    f" {ev.cost:.0f}, net {ev.benefit - ev.cost:.0f}; {ev.reason}{regret}"
                )
            return (
                f"preempted by {self._who(ev.preemptor)} ({ev.saga}) because the benefit"
                f" {ev.benefit:.0f} outweighed the cost {ev.cost:.0f} (net"
                f" {ev.benefit - ev.cost:.0f}); {ev.reason}"
            )
        if isinstance(ev, T.VictimNotified):
            need = "save a checkpoint and " if ev.checkpoint_needed else ""
            fresh = (
                ""
                if ev.checkpoint_needed
                else (
                    " from its last checkpoint (losing the progress since costs less than a save"
                    " would make the preemptor wait)"
                )
            )
            return f"told to reach a safe point, {need}release by {fmt_t(ev.deadline_t)}{fresh}"
        if isinstance(ev, T.SafePointReached):
            return "reached a safe point"
        if isinstance(ev, T.VictimReleased):
            ckpt = self._last_ckpt.get(job)
            at = f" at checkpoint step {ckpt.step}" if ckpt else " without any checkpoint"
            return f"released its GPUs{at}, losing {human_duration(ev.lost_progress_ms)} of progress since it"
        if isinstance(ev, T.PreemptionCommitted):
            return f"preemption {ev.saga} committed" + (
                ": starts on the freed GPUs" if ev.preemptor == job else ""
            )
        if isinstance(ev, T.PreemptionRolledBack):
            return f"preemption {ev.saga} rolled back ({ev.reason}): " + (
                "back in the queue" if ev.preemptor == job else "keeps or gets back its GPUs"
            )
        if isinstance(ev, T.NoticeWithdrawn):
            return "preemption notice withdrawn: keeps running"
        if isinstance(ev, T.NoticeOverdue):
            return f"still holding its GPUs at the deadline of {ev.saga} ({fmt_t(ev.deadline_t)})"
        if isinstance(ev, T.VictimReleasedLate):
            return (
                f"released its GPUs after the deadline of {ev.saga}, losing"
                f" {human_duration(ev.lost_progress_ms)} of progress: preempted after all"
            )
        if isinstance(ev, T.JobRequeued):
            return (
                f"requeued ({ev.reason}) with a priority boost of {ev.boost}, preempted"
                f" {ev.preempt_count} time(s) so far, {human_duration(ev.lost_progress_ms)} of progress lost"
            )
        if isinstance(ev, T.CheckpointFallback):
            return (
                f"checkpoint {ev.bad_digest[:23]} failed verification: fell back to step"
                f" {ev.to_step}, losing {human_duration(ev.lost_progress_ms)} more"
            )
        if isinstance(ev, T.CompensationGranted):
            unit = {
                "quota_gpu_hours": " GPU-hours of quota",
                "fee_credit": " in fee credit",
                "priority_boost": " level(s) of priority boost",
            }.get(ev.kind, "")
            return f"team {ev.team} compensated {ev.amount:g}{unit} after {ev.preempt_count} preemptions"
        if isinstance(ev, T.PreemptionDeclined):
            return (
                f"could not start and did not preempt: {ev.reason} (benefit {ev.benefit:.0f},"
                f" cost {ev.cost:.0f})"
            )
        if isinstance(ev, T.CheckpointFailedRecorded):
            return f"checkpoint failed: {ev.reason}"
        if isinstance(ev, T.JobFinished):
            return f"finished after {human_duration(ev.run_ms)} of training"
        if isinstance(ev, T.JobFailed):
            return f"failed ({ev.reason}) after {human_duration(ev.run_ms)} of training"
        if isinstance(ev, T.JobCancelled):
            return "cancelled"
        if isinstance(ev, T.InputRejected):
            return f"a {ev.input_type or 'an'} input about it was rejected: {ev.reason} {ev.detail}".strip()
        return ""


def _concerns(ev: T.Event, job: str) -> bool:
    if getattr(ev, "job", None) == job:
        return True
    if isinstance(ev, (T.PreemptionPlanned, T.PreemptionCommitted, T.PreemptionRolledBack)):
        return ev.preemptor == job or job in ev.victims
    return False


def _where(placement: list[T.Slot]) -> str:
    return ", ".join(f"{s.node} GPUs {','.join(map(str, s.gpus))}" for s in placement)
