"""The projector: folds XR_EV records into the DuckDB tables of `schema.py`, exactly once.

Records arrive as (seq, payload) pairs in log order, from JetStream (`logsource.read_batches`)
or from an exported JSONL file. `apply` takes a batch and writes it in ONE DuckDB
transaction together with the position of its last record; a crash before COMMIT loses
the whole batch and the restarted projector reads it again from `last_seq + 1`, a crash
after COMMIT loses nothing. Records at or below the stored position are skipped, so a
redelivered message is never applied twice.

The projector checks that each record follows the previous one (position and hash link)
and stops with `ProjectionError` on a gap: a projection of a broken log would be wrong
without saying so. Full hash and digest verification is the audit's job.

Mutable rows (jobs, sagas, preemptions, team usage, nodes) are kept in memory while they
can still change and replaced by key at commit; append-only rows are buffered as columns
and inserted in bulk, which keeps the projector close to the speed of reading the log.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

import duckdb
import msgspec
import numpy as np

from core import types as T
from core.model.cordon import OPERATOR_PREFIX

from . import schema
from .notices import derive as derive_notices

log = logging.getLogger("xirang.projector")

TERMINAL = ("finished", "failed", "cancelled")
APPEND_TABLES = (
    "events",
    "job_events",
    "queue_wait",
    "ledger",
    "team_limits",
    "declines",
    "policy_changes",
    "feedback",
    "notices",
)
NOTICE_EVENTS = (
    T.VictimNotified,
    T.NoticeWithdrawn,
    T.JobRequeued,
    T.CheckpointFallback,
    T.CompensationGranted,
    T.JobSubmitted,
    T.JobLevelRestored,
)


class ProjectionError(RuntimeError):
    """The log cannot be projected as it is (a gap or a broken link): names the record."""


# Waiting jobs whose reasons the `pending` table holds, most urgent first: explaining one
# weighs a preemption, so a flood of queued jobs does not slow every batch down.
PENDING_ROWS_MAX = 500
# Explaining is the costly part: while catching up on a long log (full batches) the reasons
# are rewritten at most this often; a short batch (the projector has caught up) and
# `refresh_pending` rewrite them at once.
PENDING_EVERY_S = 2.0
CAUGHT_UP_BATCH = 1000


class Projector:
    """Folds log records into DuckDB tables, exactly once: each batch is applied with its stream
    position in one transaction."""

    def __init__(
        self, db: str | duckdb.DuckDBPyConnection, stream: str = "XR_EV", pending_reasons: bool = False
    ) -> None:
        self.con = duckdb.connect(db) if isinstance(db, str) else db
        self.stream = stream
        self.skipped = 0  # undecodable messages passed over
        # With `pending_reasons`, the scheduler's state is folded alongside (core.replay) so
        # that each commit can write why each queued job waits (`pending`, core/explain.py).
        self.pending_reasons = pending_reasons
        self.state = None
        self._pending_at = 0.0  # monotonic time of the last rewrite of `pending`
        self._pending_stale = False  # records applied since `pending` was last rewritten
        self._batch_len = 0
        schema.create(self.con)
        self._cols = {t: schema.columns(self.con, t) for t in APPEND_TABLES + tuple(schema.KEYS)}
        self._dtypes = {t: schema.numpy_dtypes(self.con, t) for t in self._cols}
        self._load()

    # ------------------------------------------------------------ state

    def _load(self) -> None:
        """Read the committed position and the rows that may still change."""
        pos = self.con.execute(
            "SELECT last_seq, last_n, last_hash FROM projector_position WHERE stream = ?", [self.stream]
        ).fetchone()
        self.last_seq, self.last_n, self.last_hash = pos or (0, 0, T.GENESIS_HASH)
        self.jobs = self._rows("jobs", "state NOT IN ('finished', 'failed', 'cancelled')")
        self.sagas = self._rows("sagas", "outcome = 'open'")
        self.preemptions = self._rows("preemptions", "resumed_t IS NULL AND outcome <> 'victim_ended'")
        self.team_usage = self._rows("team_usage", "true")
        self.nodes = self._rows("nodes", "true")
        self.placements = self._rows("placements", "end_t IS NULL")  # the runs holding nodes
        self.runs_by_job: dict[str, int] = {}  # runs counted so far, of jobs seen since loading
        self._reset_buffers()

    def _rows(self, table: str, where: str) -> dict[Any, dict]:
        cols = self._cols[table]
        keys = schema.KEYS[table]
        rows = self.con.execute(f"SELECT * FROM {table} WHERE {where}").fetchall()
        out = {}
        for row in rows:
            d = dict(zip(cols, row))
            out[_key(d, keys)] = d
        return out

    def _reset_buffers(self) -> None:
        self.buf: dict[str, list[tuple]] = {t: [] for t in APPEND_TABLES}
        self.dirty: dict[str, dict[Any, dict]] = {t: {} for t in schema.KEYS}

    # ------------------------------------------------------------ applying

    def apply(self, items: Iterable[tuple[int, bytes]]) -> int:
        """Project a batch of (seq, payload) in one transaction; returns records applied."""
        applied = 0
        applied_or_skipped = False
        self._batch_len = 0
        try:
            for seq, data in items:
                self._batch_len += 1
                if seq <= self.last_seq:
                    continue  # already projected: a redelivery or an overlap on restart
                try:
                    record = T.decode_record(data)
                except msgspec.DecodeError as err:
                    # Not a record the scheduler wrote (it could not have: the chain holds
                    # only what it sealed): skip it, so one stray message stops nothing.
                    log.warning("projector: skipping undecodable message at seq %d: %s", seq, err)
                    self.last_seq = seq
                    self.skipped += 1
                    applied_or_skipped = True
                    continue
                self._check_link(seq, record)
                self._project(seq, record, data)
                if self.pending_reasons:
                    self._fold(record)
                self.last_seq, self.last_n, self.last_hash = seq, record.n, record.hash
                applied += 1
            if applied or applied_or_skipped:
                self._commit()
        except BaseException:
            self._load()  # drop half-applied memory: the database holds the truth
            self.state = None  # folded again from the stored records when next needed
            raise
        self._evict()
        return applied

    def _check_link(self, seq: int, record: T.Record) -> None:
        if record.n != self.last_n + 1 or record.prev != self.last_hash:
            raise ProjectionError(
                f"seq {seq}: record {record.n} does not follow record {self.last_n}"
                f" (gap, reorder or modification); run `xirang audit` to locate it"
            )

    def _commit(self) -> None:
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            for table in APPEND_TABLES:
                rows = self.buf[table]
                if rows:
                    self._insert(table, dict(zip(self._cols[table], map(list, zip(*rows)))))
            for table, rows in self.dirty.items():
                if rows:
                    self._replace(table, rows)
            if self.pending_reasons:
                if (
                    self._batch_len < CAUGHT_UP_BATCH
                    or time.monotonic() - self._pending_at >= PENDING_EVERY_S
                ):
                    self._write_pending()
                else:
                    self._pending_stale = True  # rewritten by `refresh_pending` once caught up
            con.execute("DELETE FROM projector_position WHERE stream = ?", [self.stream])
            con.execute(
                "INSERT INTO projector_position VALUES (?, ?, ?, ?, ?)",
                [self.stream, self.last_seq, self.last_n, self.last_hash, self._last_t],
            )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self._reset_buffers()

    def _fold(self, record: T.Record) -> None:
        from core.replay import apply_record

        if self.state is None:
            self.state = self._state_from_events()
        apply_record(self.state, record)

    def _state_from_events(self):
        """The state as of the committed position, folded from the stored records (once,
        when a projection that did not fold goes on with pending reasons)."""
        from core import new_state
        from core.replay import apply_record

        state = new_state()
        for (body,) in self.con.execute("SELECT body FROM events ORDER BY seq").fetchall():
            apply_record(state, T.decode_record(body))
        return state

    def refresh_pending(self, only_if_stale: bool = False) -> None:
        """Rewrite the `pending` table now (after catching up on a log); with `only_if_stale`,
        only if a full batch was committed without rewriting it."""
        if only_if_stale and not self._pending_stale:
            return
        if self.pending_reasons and self.state is not None:
            self.con.execute("BEGIN TRANSACTION")
            try:
                self._write_pending()
                self.con.execute("COMMIT")
            except BaseException:
                self.con.execute("ROLLBACK")
                raise

    def _write_pending(self) -> None:
        from core.explain import explain_queue

        self._pending_at = time.monotonic()
        self._pending_stale = False
        state = self.state
        self.con.execute("DELETE FROM pending")
        if state is None:
            return
        jobs = state.canonical.jobs
        waiting = sorted(
            (job for job in jobs.values() if job.state in ("queued", "held", "reserved")),
            key=lambda job: (job.eff_level, job.submit_t, job.id),
        )[:PENDING_ROWS_MAX]
        reasons = explain_queue(state, [job.id for job in waiting])
        rows = [
            (
                job.id,
                job.team,
                job.user,
                job.level,
                job.eff_level,
                job.gpus,
                job.state,
                state.canonical.t - job.queued_since_t,
                reasons[job.id].code,
                reasons[job.id].reason,
                reasons[job.id].limit,
                reasons[job.id].start_in_ms,
                state.canonical.t,
            )
            for job in waiting
        ]
        if rows:
            self.con.executemany("INSERT INTO pending VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    def _insert(self, table: str, columns: dict[str, list]) -> None:
        cols = self._cols[table]
        if not columns[cols[0]]:
            return
        # Typed arrays scan several times faster than object arrays, and object arrays
        # than list parameters; a column holding a NULL stays an object array.
        frame = {}
        for col, dtype in zip(cols, self._dtypes[table]):
            values = columns[col]
            frame[col] = np.array(values, dtype=dtype if None not in values else object)
        self.con.register("_xr_batch", frame)
        try:
            self.con.execute(f"INSERT INTO {table} SELECT * FROM _xr_batch")
        finally:
            self.con.unregister("_xr_batch")

    def _replace(self, table: str, rows: dict[Any, dict]) -> None:
        keys = schema.KEYS[table]
        key_sql = " || '\x1f' || ".join(f'"{k}"::VARCHAR' for k in keys)
        ids = ["\x1f".join(str(v) for v in k) if isinstance(k, tuple) else str(k) for k in rows]
        self.con.execute(f"DELETE FROM {table} WHERE {key_sql} IN (SELECT unnest($1::VARCHAR[]))", [ids])
        cols = self._cols[table]
        self._insert(table, {c: [row[c] for row in rows.values()] for c in cols})

    def _evict(self) -> None:
        """Forget rows that can no longer change; they live on in the database."""
        for key in [k for k, row in self.placements.items() if row["end_t"] is not None]:
            del self.placements[key]
        for job_id in [j for j, row in self.jobs.items() if row["state"] in TERMINAL]:
            del self.jobs[job_id]
        for saga in [s for s, row in self.sagas.items() if row["outcome"] != "open"]:
            del self.sagas[saga]
        for key in [
            k
            for k, row in self.preemptions.items()
            if row["resumed_t"] is not None or row["outcome"] == "victim_ended"
        ]:
            del self.preemptions[key]

    # ------------------------------------------------------------ projection

    _last_t = 0

    def _append(self, table: str, *values) -> None:
        self.buf[table].append(values)

    def _project(self, seq: int, record: T.Record, data: bytes) -> None:
        ev = record.event
        self._last_t = ev.t
        name = ev.__struct_config__.tag
        job = getattr(ev, "job", "") or getattr(ev, "preemptor", "")
        if not job and isinstance(ev, T.InputAccepted):
            job = getattr(ev.input, "job", "")
        body = data.decode() if isinstance(data, (bytes, bytearray)) else data
        self._append("events", seq, record.n, ev.t, name, job, record.input_seq, record.hash, body)
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, seq, record.n, ev)
        if isinstance(ev, NOTICE_EVENTS):
            for notice in derive_notices(seq, ev, self._job_user):
                self._append("notices", seq, notice.t, notice.user, notice.job, notice.kind, notice.message)

    def _job_user(self, job_id: str) -> tuple[str, str, int] | None:
        row = self.jobs.get(job_id) or self._fetch("jobs", job_id)
        return None if row is None else (row["user"], row["team"], row["level"])

    def job_event(self, seq: int, n: int, ev: T.Event, job: str, detail: str, saga: str = "") -> None:
        """Append one row to a job's event history."""
        self._append("job_events", seq, n, ev.t, job, ev.__struct_config__.tag, saga, detail)

    def job(self, job_id: str) -> dict:
        """The job's row, loaded or created, marked to be written at the batch's end."""
        row = self.jobs.get(job_id)
        if row is None:
            row = self._fetch("jobs", job_id) or _new_job(job_id)
            self.jobs[job_id] = row
        self.dirty["jobs"][job_id] = row
        return row

    def _fetch(self, table: str, key: str) -> dict | None:
        cols = self._cols[table]
        col = schema.KEYS[table][0]
        row = self.con.execute(f'SELECT * FROM {table} WHERE "{col}" = ?', [key]).fetchone()
        return dict(zip(cols, row)) if row else None

    def usage(self, team: str, level: int) -> dict:
        """The (team, level) usage row, created when new."""
        key = (team, level)
        row = self.team_usage.get(key)
        if row is None:
            row = self.team_usage[key] = {
                "team": team,
                "level": level,
                "gpu_ms": 0,
                "submitted": 0,
                "started": 0,
                "finished": 0,
                "failed": 0,
                "preempted": 0,
                "preempting": 0,
                "lost_progress_ms": 0,
            }
        self.dirty["team_usage"][key] = row
        return row

    def saga(self, saga_id: str) -> dict | None:
        """The saga's row (marked to be written), or None when unknown."""
        row = self.sagas.get(saga_id) or self._fetch("sagas", saga_id)
        if row is not None:
            self.sagas[saga_id] = row
            self.dirty["sagas"][saga_id] = row
        return row

    def preemption(self, saga: str, victim: str) -> dict | None:
        """The row of one victim of a saga (marked to be written), or None."""
        key = (saga, victim)
        row = self.preemptions.get(key)
        if row is not None:
            self.dirty["preemptions"][key] = row
        return row

    def open_preemption_of(self, victim: str) -> dict | None:
        """The victim's latest preemption still waiting for the victim to run again."""
        best = None
        for (_saga, job), row in self.preemptions.items():
            if job == victim and (best is None or row["planned_t"] >= best["planned_t"]):
                best = row
        if best is not None:
            self.dirty["preemptions"][(best["saga"], victim)] = best
        return best

    def node(self, name: str) -> dict:
        """The node's row, created when new, marked to be written."""
        row = self.nodes.get(name)
        if row is None:
            row = self.nodes[name] = {
                "node": name,
                "gpu_model": "",
                "gpus": 0,
                "up": True,
                "joined_t": None,
                "lost_t": None,
                "lost_reason": None,
                "cordoned_by": "",
                "cordon_reason": "",
            }
        self.dirty["nodes"][name] = row
        return row

    def place(self, ev) -> None:
        """A start or resume was asked: one open placement row per node of the job's run."""
        job = self.jobs.get(ev.job) or {}
        run = self.runs_by_job.get(ev.job)
        if run is None:
            run = self.con.execute("SELECT coalesce(max(run), 0) FROM placements WHERE job = ?", [ev.job])
            run = run.fetchone()[0]
        self.end_placements(ev.job, ev.t, "superseded")  # none in a consistent log
        run = self.runs_by_job[ev.job] = run + 1
        gpus: dict[str, int] = {}
        for slot in ev.placement:
            gpus[slot.node] = gpus.get(slot.node, 0) + len(slot.gpus)
        for node, count in gpus.items():
            row = {
                "job": ev.job,
                "run": run,
                "node": node,
                "gpus": count,
                "team": job.get("team", ""),
                "user": job.get("user", ""),
                "level": job.get("level", 0),
                "requested_t": ev.t,
                "start_t": None,
                "end_t": None,
                "ended": None,
            }
            self.placements[(ev.job, run, node)] = self.dirty["placements"][(ev.job, run, node)] = row

    def open_placements(self, job: str) -> list[dict]:
        """The job's placement rows still holding their nodes (marked to be written)."""
        rows = []
        for key, row in self.placements.items():
            if key[0] == job and row["end_t"] is None:
                self.dirty["placements"][key] = row
                rows.append(row)
        return rows

    def end_placements(self, job: str, t: int, why: str) -> None:
        """The job's run let its nodes go at `t`, for `why`."""
        for row in self.open_placements(job):
            row["end_t"], row["ended"] = t, why

    def stop_running(self, row: dict, t: int) -> None:
        """Charge the GPU time of the run that ends at t to the job and its team."""
        since = row["running_since_t"]
        if since is not None:
            gpu_ms = row["gpus"] * max(0, t - since)
            row["gpu_ms"] += gpu_ms
            self.usage(row["team"], row["level"])["gpu_ms"] += gpu_ms
            row["running_since_t"] = None


def _key(row: dict, keys: tuple[str, ...]):
    return row[keys[0]] if len(keys) == 1 else tuple(row[k] for k in keys)


def _new_job(job_id: str) -> dict:
    return {
        "job": job_id,
        "team": "",
        "user": "",
        "kind": "",
        "variant": "",
        "level": 0,
        "requested_level": 0,
        "eff_level": 0,
        "gpus": 0,
        "state": "queued",
        "submit_t": None,
        "first_start_t": None,
        "end_t": None,
        "waited_ms": 0,
        "run_ms": None,
        "gpu_ms": 0,
        "preempt_count": 0,
        "lost_progress_ms": 0,
        "aged": 0,
        "last_ckpt_step": None,
        "fee_credit": 0.0,
        "est_runtime_ms": None,
        "running_since_t": None,
        "queued_since_t": None,
    }


# ---------------------------------------------------------------- handlers, one per event type


def _submitted(p: Projector, seq: int, n: int, ev: T.JobSubmitted) -> None:
    # A job id is never reused, so there is no earlier row to look up.
    row = p.jobs[ev.job] = p.dirty["jobs"][ev.job] = _new_job(ev.job)
    row.update(
        team=ev.team,
        user=ev.user,
        kind=ev.kind,
        variant=ev.variant,
        level=ev.level,
        requested_level=ev.requested_level,
        eff_level=ev.level,
        gpus=ev.gpus,
        state="queued",
        submit_t=ev.t,
        queued_since_t=ev.t,
        est_runtime_ms=int(ev.est_runtime_s * 1000),
    )
    p.usage(ev.team, ev.level)["submitted"] += 1
    downgrade = f" (downgraded from {ev.requested_level})" if ev.level != ev.requested_level else ""
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"submitted by {ev.user} of {ev.team} at level {ev.level}"
        f"{downgrade} for {ev.gpus} GPUs{' variant ' + ev.variant if ev.variant else ''}",
    )


def _level_restored(p: Projector, seq: int, n: int, ev: T.JobLevelRestored) -> None:
    row = p.job(ev.job)
    row["level"] = ev.level
    row["eff_level"] = min(row.get("eff_level", ev.level), ev.level)
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"back at level {ev.level}: its team's preemption quota has recovered"
        f" (waited {ev.waited_ms / 1000:.0f} s downgraded)",
    )


def placement_end(ev) -> str:
    """Why a run let its nodes go, in the words of `placements.ended`."""
    if isinstance(ev, T.JobFinished):
        return "finished"
    if isinstance(ev, T.JobCancelled):
        return "cancelled"
    return ev.reason  # a failure's (exit_code_N, ...) or a requeue's (preempted, node_lost, ...)


def _start_requested(p: Projector, seq: int, n: int, ev) -> None:
    p.place(ev)
    row = p.job(ev.job)
    row["state"] = "starting"
    where = ", ".join(f"{s.node}:{','.join(map(str, s.gpus))}" for s in ev.placement)
    if isinstance(ev, T.JobResumeRequested):
        detail = f"resume requested on {where} from checkpoint step {ev.ckpt_step} ({ev.reason})"
    else:
        detail = f"start requested on {where}"
    p.job_event(seq, n, ev, ev.job, detail)


def _running(p: Projector, seq: int, n: int, ev: T.JobRunning) -> None:
    for placed in p.open_placements(ev.job):
        placed["start_t"] = placed["start_t"] or ev.t
    row = p.job(ev.job)
    row["state"] = "running"
    row["waited_ms"] += ev.waited_ms
    row["running_since_t"] = ev.t
    if row["first_start_t"] is None:
        row["first_start_t"] = ev.t
    usage = p.usage(row["team"], row["level"])
    usage["started"] += 1
    after = row["preempt_count"] > 0
    p._append(
        "queue_wait",
        seq,
        ev.t,
        ev.job,
        row["team"],
        row["user"],
        row["level"],
        row["eff_level"],
        row["variant"],
        ev.waited_ms,
        after,
    )
    pre = p.open_preemption_of(ev.job)
    if pre is not None and pre["requeued_t"] is not None:
        pre["resumed_t"] = ev.t
        pre["recovery_ms"] = ev.t - pre["planned_t"]
    p.job_event(seq, n, ev, ev.job, f"running after waiting {ev.waited_ms / 1000:.0f} s")


def _ended(p: Projector, seq: int, n: int, ev) -> None:
    p.end_placements(ev.job, ev.t, placement_end(ev))
    p.runs_by_job.pop(ev.job, None)
    row = p.job(ev.job)
    p.stop_running(row, ev.t)
    row["end_t"] = ev.t
    usage = p.usage(row["team"], row["level"])
    if isinstance(ev, T.JobFinished):
        row["state"], row["run_ms"] = "finished", ev.run_ms
        usage["finished"] += 1
        detail = f"finished after {ev.run_ms / 1000:.0f} s of progress"
    elif isinstance(ev, T.JobFailed):
        row["state"], row["run_ms"] = "failed", ev.run_ms
        usage["failed"] += 1
        detail = f"failed ({ev.reason}) after {ev.run_ms / 1000:.0f} s of progress"
    else:
        row["state"] = "cancelled"
        detail = "cancelled"
    for (saga, victim), pre in list(p.preemptions.items()):
        if victim == ev.job and pre["resumed_t"] is None:
            pre["outcome"] = "victim_ended" if pre["outcome"] != "rolled_back" else pre["outcome"]
            p.dirty["preemptions"][(saga, victim)] = pre
    p.job_event(seq, n, ev, ev.job, detail)


def _requeued(p: Projector, seq: int, n: int, ev: T.JobRequeued) -> None:
    p.end_placements(ev.job, ev.t, placement_end(ev))
    row = p.job(ev.job)
    p.stop_running(row, ev.t)
    row.update(
        state="queued",
        preempt_count=ev.preempt_count,
        queued_since_t=ev.t,
        eff_level=max(0, row["level"] - ev.boost),
    )
    row["lost_progress_ms"] += ev.lost_progress_ms
    p.usage(row["team"], row["level"])["lost_progress_ms"] += ev.lost_progress_ms
    pre = p.open_preemption_of(ev.job)
    if pre is not None and ev.reason in ("preempted", "node_lost"):
        pre["requeued_t"] = ev.t
        pre["requeue_lost_ms"] = ev.lost_progress_ms
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"requeued ({ev.reason}) with boost {ev.boost}, lost"
        f" {ev.lost_progress_ms / 1000:.0f} s of progress, preempted {ev.preempt_count} times",
    )


def _aged(p: Projector, seq: int, n: int, ev: T.PriorityAged) -> None:
    row = p.job(ev.job)
    row["eff_level"] = ev.to_level
    row["aged"] += 1
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"aged from level {ev.from_level} to {ev.to_level} after waiting {ev.waited_ms / 1000:.0f} s",
    )


def _planned(p: Projector, seq: int, n: int, ev: T.PreemptionPlanned) -> None:
    pre = p.job(ev.preemptor)
    pre["state"] = "reserved"
    p.usage(pre["team"], pre["level"])["preempting"] += 1
    p.sagas[ev.saga] = p.dirty["sagas"][ev.saga] = {
        "saga": ev.saga,
        "planned_t": ev.t,
        "preemptor": ev.preemptor,
        "preemptor_team": pre["team"],
        "preemptor_user": pre["user"],
        "preemptor_level": pre["level"],
        "victims": len(ev.victims),
        "benefit": ev.benefit,
        "cost": ev.cost,
        "reason": ev.reason,
        "deadline_t": ev.deadline_t,
        "outcome": "open",
        "end_t": None,
        "wait_ms": None,
        "rollback_reason": None,
        "reclaim": ev.reclaim,
    }
    p.job_event(
        seq,
        n,
        ev,
        ev.preemptor,
        f"preempting {', '.join(ev.victims)}: benefit"
        f" {ev.benefit:.0f} against cost {ev.cost:.0f} ({ev.reason})",
        ev.saga,
    )
    for victim_id in ev.victims:
        victim = p.job(victim_id)
        victim["state"] = "preempting"
        p.usage(victim["team"], victim["level"])["preempted"] += 1
        key = (ev.saga, victim_id)
        p.preemptions[key] = p.dirty["preemptions"][key] = {
            "saga": ev.saga,
            "victim": victim_id,
            "victim_team": victim["team"],
            "victim_user": victim["user"],
            "victim_level": victim["level"],
            "victim_gpus": victim["gpus"],
            "preemptor": ev.preemptor,
            "preemptor_team": pre["team"],
            "preemptor_level": pre["level"],
            "planned_t": ev.t,
            "benefit": ev.benefit,
            "cost": ev.cost,
            "reason": ev.reason,
            "released_t": None,
            "release_lost_ms": None,
            "requeued_t": None,
            "requeue_lost_ms": None,
            "resumed_t": None,
            "recovery_ms": None,
            "outcome": "open",
            "reclaim": ev.reclaim,
        }
        p.job_event(
            seq,
            n,
            ev,
            victim_id,
            f"chosen as victim by {ev.preemptor}"
            f" (level {pre['level']}, team {pre['team']}): benefit {ev.benefit:.0f}"
            f" against cost {ev.cost:.0f} ({ev.reason})",
            ev.saga,
        )


def _released(p: Projector, seq: int, n: int, ev: T.VictimReleased) -> None:
    row = p.job(ev.job)
    row["state"] = "released"
    p.stop_running(row, ev.t)
    pre = p.preemption(ev.saga, ev.job)
    if pre is not None:
        pre["released_t"] = ev.t
        pre["release_lost_ms"] = ev.lost_progress_ms
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"released its GPUs, {ev.lost_progress_ms / 1000:.0f} s since its last checkpoint",
        ev.saga,
    )


def _saga_ended(p: Projector, seq: int, n: int, ev) -> None:
    saga = p.saga(ev.saga)
    committed = isinstance(ev, T.PreemptionCommitted)
    outcome = "committed" if committed else "rolled_back"
    if saga is not None:
        saga.update(
            outcome=outcome,
            end_t=ev.t,
            wait_ms=ev.t - saga["planned_t"],
            rollback_reason=None if committed else ev.reason,
        )
    for victim in ev.victims:
        pre = p.preemption(ev.saga, victim)
        if pre is not None:
            pre["outcome"] = outcome
            if not committed:
                pre["resumed_t"] = ev.t  # a rolled-back victim keeps (or gets back) its GPUs
                pre["recovery_ms"] = ev.t - pre["planned_t"]
        p.job_event(
            seq,
            n,
            ev,
            victim,
            f"preemption {outcome.replace('_', ' ')}{'' if committed else ' (' + ev.reason + ')'}",
            ev.saga,
        )
    if ev.preemptor:
        p.job_event(
            seq,
            n,
            ev,
            ev.preemptor,
            f"preemption {outcome.replace('_', ' ')}{'' if committed else ' (' + ev.reason + ')'}",
            ev.saga,
        )
        if not committed and ev.preemptor in p.jobs and p.jobs[ev.preemptor]["state"] == "reserved":
            p.job(ev.preemptor)["state"] = "queued"


def _released_late(p: Projector, seq: int, n: int, ev: T.VictimReleasedLate) -> None:
    # Rolled back at its deadline, yet the victim let go: it was preempted after all, so the
    # saga and the victim's row say so, and it recovers when it runs again.
    saga = p.saga(ev.saga)
    if saga is not None:
        saga["outcome"] = "released_late"
    pre = p.preemption(ev.saga, ev.job)
    if pre is None:  # its rollback was already written and set aside: read it back
        found = p.con.execute(
            "SELECT * FROM preemptions WHERE saga = ? AND victim = ?", [ev.saga, ev.job]
        ).fetchone()
        if found is not None:
            pre = dict(zip(p._cols["preemptions"], found))
            p.preemptions[(ev.saga, ev.job)] = pre
            p.dirty["preemptions"][(ev.saga, ev.job)] = pre
    if pre is not None:
        pre.update(
            outcome="released_late", released_t=ev.t, release_lost_ms=ev.lost_progress_ms,
            resumed_t=None, recovery_ms=None,
        )  # fmt: skip
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"released its GPUs after its deadline, {ev.lost_progress_ms / 1000:.0f} s since its last"
        " checkpoint: preempted after all",
        ev.saga,
    )


def _withdrawn(p: Projector, seq: int, n: int, ev: T.NoticeWithdrawn) -> None:
    p.job(ev.job)["state"] = "running"
    p.job_event(seq, n, ev, ev.job, "preemption notice withdrawn, keeps running", ev.saga)


def _notified(p: Projector, seq: int, n: int, ev: T.VictimNotified) -> None:
    need = "save a checkpoint and " if ev.checkpoint_needed else ""
    p.job_event(
        seq, n, ev, ev.job, f"told to reach a safe point, {need}release by t={ev.deadline_t}", ev.saga
    )


def _ckpt(p: Projector, seq: int, n: int, ev: T.CheckpointRecorded) -> None:
    row = p.job(ev.job)
    row["last_ckpt_step"] = ev.step
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"checkpoint step {ev.step} saved ({ev.digest[:19]}), {ev.progress_ms / 1000:.0f} s of progress",
    )


def _fallback(p: Projector, seq: int, n: int, ev: T.CheckpointFallback) -> None:
    row = p.job(ev.job)
    row["lost_progress_ms"] += ev.lost_progress_ms
    p.usage(row["team"], row["level"])["lost_progress_ms"] += ev.lost_progress_ms
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"checkpoint {ev.bad_digest[:19]} failed verification:"
        f" falling back to step {ev.to_step}, losing {ev.lost_progress_ms / 1000:.0f} s",
    )


def _compensation(p: Projector, seq: int, n: int, ev: T.CompensationGranted) -> None:
    p._append("ledger", seq, ev.t, ev.job, ev.team, ev.kind, ev.amount, ev.preempt_count)
    if ev.kind == "fee_credit":
        p.job(ev.job)["fee_credit"] += ev.amount
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"team {ev.team} compensated: {ev.kind} {ev.amount:g} after {ev.preempt_count} preemptions",
    )


def _declined(p: Projector, seq: int, n: int, ev: T.PreemptionDeclined) -> None:
    p._append("declines", seq, ev.t, ev.job, ev.reason, ev.benefit, ev.cost)
    p.job_event(
        seq, n, ev, ev.job, f"did not preempt: {ev.reason} (benefit {ev.benefit:.0f}, cost {ev.cost:.0f})"
    )


def _team_limit(p: Projector, seq: int, n: int, ev) -> None:
    if isinstance(ev, T.TeamProtected):
        p._append("team_limits", seq, ev.t, ev.team, "protected", ev.until_t, ev.preempted_in_window)
    else:
        p._append("team_limits", seq, ev.t, ev.team, "downgraded", ev.until_t, ev.preempting_in_window)


def _node_joined(p: Projector, seq: int, n: int, ev: T.NodeJoined) -> None:
    row = p.node(ev.node)
    row.update(gpu_model=ev.gpu_model, gpus=ev.gpus, up=True, joined_t=ev.t, lost_t=None, lost_reason=None)
    if not (row.get("cordoned_by") or "").startswith(OPERATOR_PREFIX):  # as core/log/evolve.py
        row.update(cordoned_by="", cordon_reason="")


def _node_cordoned(p: Projector, seq: int, n: int, ev: T.NodeCordoned) -> None:
    p.node(ev.node).update(cordoned_by=ev.by, cordon_reason=ev.reason)


def _node_uncordoned(p: Projector, seq: int, n: int, ev: T.NodeUncordoned) -> None:
    p.node(ev.node).update(cordoned_by="", cordon_reason="")


def _node_lost(p: Projector, seq: int, n: int, ev: T.NodeLost) -> None:
    p.node(ev.node).update(up=False, lost_t=ev.t, lost_reason=ev.reason)


def _policy(p: Projector, seq: int, n: int, ev: T.PolicyChanged) -> None:
    p._append("policy_changes", seq, ev.t, ev.by, ev.reason, T.encode(ev.params).decode())


def _feedback(p: Projector, seq: int, n: int, ev: T.FeedbackRecorded) -> None:
    p._append("feedback", seq, ev.t, ev.job, ev.user, ev.score, ev.comment)
    p.job_event(
        seq,
        n,
        ev,
        ev.job,
        f"feedback from {ev.user}: {ev.score}/5" + (f" ({ev.comment})" if ev.comment else ""),
    )


def _rejected(p: Projector, seq: int, n: int, ev: T.InputRejected) -> None:
    if ev.job:
        p.job_event(seq, n, ev, ev.job, f"{ev.input_type} input rejected: {ev.reason} {ev.detail}".strip())


def _ckpt_failed(p: Projector, seq: int, n: int, ev: T.CheckpointFailedRecorded) -> None:
    p.job_event(seq, n, ev, ev.job, f"checkpoint failed: {ev.reason}")


def _held(p: Projector, seq: int, n: int, ev: T.JobHeld) -> None:
    p.job(ev.job)["state"] = "held"
    p.job_event(seq, n, ev, ev.job, f"held by {ev.by}")


def _hold_released(p: Projector, seq: int, n: int, ev: T.JobHoldReleased) -> None:
    p.job(ev.job)["state"] = "queued"
    p.job_event(seq, n, ev, ev.job, f"released from hold by {ev.by}")


def _level_set(p: Projector, seq: int, n: int, ev: T.JobLevelSet) -> None:
    row = p.job(ev.job)
    # The level set is the one the job asks for now (as in the core): no downgrade to report.
    row.update(level=ev.level, requested_level=ev.level, eff_level=ev.level)
    p.job_event(seq, n, ev, ev.job, f"level set from {ev.from_level} to {ev.level} by {ev.by}")


def _stop_requested(p: Projector, seq: int, n: int, ev: T.JobStopRequested) -> None:
    p.job_event(seq, n, ev, ev.job, f"stop requested on {', '.join(ev.nodes) or 'no node'} ({ev.reason})")


_HANDLERS = {
    T.JobHeld: _held,
    T.JobHoldReleased: _hold_released,
    T.JobLevelSet: _level_set,
    T.JobStopRequested: _stop_requested,
    T.JobSubmitted: _submitted,
    T.JobStartRequested: _start_requested,
    T.JobResumeRequested: _start_requested,
    T.JobRunning: _running,
    T.JobFinished: _ended,
    T.JobFailed: _ended,
    T.JobCancelled: _ended,
    T.JobRequeued: _requeued,
    T.PriorityAged: _aged,
    T.PreemptionPlanned: _planned,
    T.VictimReleased: _released,
    T.PreemptionCommitted: _saga_ended,
    T.PreemptionRolledBack: _saga_ended,
    T.NoticeWithdrawn: _withdrawn,
    T.VictimReleasedLate: _released_late,
    T.VictimNotified: _notified,
    T.CheckpointRecorded: _ckpt,
    T.CheckpointFallback: _fallback,
    T.CompensationGranted: _compensation,
    T.PreemptionDeclined: _declined,
    T.TeamProtected: _team_limit,
    T.TeamDowngraded: _team_limit,
    T.JobLevelRestored: _level_restored,
    T.NodeJoined: _node_joined,
    T.NodeLost: _node_lost,
    T.NodeCordoned: _node_cordoned,
    T.NodeUncordoned: _node_uncordoned,
    T.PolicyChanged: _policy,
    T.InputRejected: _rejected,
    T.FeedbackRecorded: _feedback,
    T.CheckpointFailedRecorded: _ckpt_failed,
}
