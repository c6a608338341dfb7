"""The DuckDB schema of the projection of XR_EV, documented table by table.

Every table is derived from the log alone, so the whole database can be dropped and
rebuilt from sequence 1. `projector_position` holds the stream sequence of the last record
applied; the projector writes it in the same transaction as the rows, which is what makes
the projection exactly once across crashes.

Times (`*_t`) are the log's milliseconds (the scheduler's clock, stamped on inputs);
durations end in `_ms`; `seq` is the XR_EV stream sequence (or the line number of an
exported JSONL log), `n` the record's position in the hash chain.

Tables
- `events`: every record of the log: seq, n, t, type, job (if the event names one),
  input_seq, hash, body (the record as canonical JSON, for `json_extract`).
- `job_events`: one row per (record, job it concerns), including the preemptor and each
  victim of a preemption: seq, n, t, job, type, saga, detail (a short description).
- `jobs`: one row per job, its latest state: team, user, kind, variant, level (base),
  requested_level, eff_level (queue level after aging and boosts), gpus, state
  (queued, starting, running, reserved, preempting, released, finished, failed,
  cancelled), submit_t, first_start_t, end_t, waited_ms (total time queued before each
  start), run_ms (reported at the end), gpu_ms (GPU time held while running),
  preempt_count, lost_progress_ms (from requeues and checkpoint fallbacks), aged (level
  rises), last_ckpt_step, compensation fee_credit, est_runtime_ms.
- `sagas`: one row per preemption saga: planned_t, preemptor (+ team, user, level),
  victims, benefit, cost, reason, deadline_t, outcome (open, committed, rolled_back,
  released_late: rolled back at its deadline, yet a victim let go after it),
  end_t, wait_ms (planned to committed or rolled back), rollback_reason, reclaim (taken
  back for a team below its fair share rather than by priority).
- `preemptions`: one row per (saga, victim), with the saga's benefit, cost and reason:
  victim team, user, level and gpus; preemptor team and level; planned_t, released_t,
  release_lost_ms (progress since the last checkpoint at release), requeued_t,
  requeue_lost_ms, resumed_t and recovery_ms (notice to running again), outcome, reclaim.
- `queue_wait`: one row per start (JobRunning): job, team, user, level, eff_level,
  variant, waited_ms, after_preemption (the job had been preempted before).
- `team_usage`: per (team, level): gpu_ms run, jobs submitted/started/finished/failed,
  preempted (as victim), preempting (as preemptor), lost_progress_ms.
- `ledger`: the compensation ledger: seq, t, job, team, kind (quota_gpu_hours,
  priority_boost, fee_credit), amount, preempt_count.
- `nodes`: node, gpu_model, gpus, up, joined_t, lost_t, lost_reason.
- `placements`: one row per (job, run, node) - what ran where and when (Slurm's `sacct -N`):
  job, run (1 for its first start, 2 for the next, ...), node, gpus (on that node), team,
  "user", level, requested_t (the start or resume was asked), start_t (running; NULL if it
  never ran), end_t (NULL while it holds the node), ended (why it let the node go:
  finished, cancelled, a failure's reason, or the requeue's: preempted, node_lost, ...).
- `team_limits`: TeamProtected and TeamDowngraded events: seq, t, team, kind, until_t, count.
- `declines`: PreemptionDeclined: seq, t, job, reason, benefit, cost.
- `policy_changes`: PolicyChanged: seq, t, by, reason, params (JSON; a tuner's reason
  carries its evidence as JSON after "evidence: ").
- `feedback`: FeedbackRecorded (`xirang feedback`): seq, t, job, user (who answered),
  score 1..5, comment. View `satisfaction`: per team and level of the job, answers and
  mean score.
- `notices`: what each user is told (projections/notices.py): seq, t, user, job, kind
  (preemption_notice, preemption_called_off, preempted, checkpoint_fallback, compensation,
  downgraded, level_restored), message.
- `pending`: why each waiting job waits, as of the last committed record (written by a
  projector folding the state, as `xirang project` and `xirang dashboard` do): job, team,
  user, level, eff_level, gpus, state (queued, held, reserved), wait_ms, code, reason,
  limit (the policy parameter that blocks it), start_in_ms (expected start; NULL when it
  never can as the pool stands), t. The most urgent `PENDING_ROWS_MAX` (500) jobs.
- `projector_position`: one row: stream, last_seq, last_n, last_hash, updated_t.

Views
- `queue_now`: queued jobs per eff_level, team and user: depth, oldest wait.
- `running_now`: GPUs held per level, team and user.
- `preemption_stats`: per victim level, team and user: preemptions (reclaims among them),
  committed, rolled back, success rate, mean recovery, lost GPU-hours.
- `team_ledger`: compensation totals per team and kind.
- `team_usage_decayed_7d`: per team, GPU-hours run (from `placements`) and the same with each
  hour weighed down by half every 7 days before the log's last time (Slurm's decayed usage
  in sshare, PriorityDecayHalfLife=7-0), and each team's part of the decayed total. The
  table macro `team_usage_decayed(half_life_s, now_t)` gives it for any half-life and time.
"""

from __future__ import annotations

TABLES = """
CREATE TABLE IF NOT EXISTS events (
    seq BIGINT, n BIGINT, t BIGINT, type VARCHAR, job VARCHAR, input_seq BIGINT,
    hash VARCHAR, body VARCHAR);
CREATE TABLE IF NOT EXISTS job_events (
    seq BIGINT, n BIGINT, t BIGINT, job VARCHAR, type VARCHAR, saga VARCHAR, detail VARCHAR);
CREATE TABLE IF NOT EXISTS jobs (
    job VARCHAR, team VARCHAR, "user" VARCHAR, kind VARCHAR, variant VARCHAR, level INTEGER,
    requested_level INTEGER, eff_level INTEGER, gpus INTEGER, state VARCHAR, submit_t BIGINT,
    first_start_t BIGINT, end_t BIGINT, waited_ms BIGINT, run_ms BIGINT, gpu_ms BIGINT,
    preempt_count INTEGER, lost_progress_ms BIGINT, aged INTEGER, last_ckpt_step BIGINT,
    fee_credit DOUBLE, est_runtime_ms BIGINT, running_since_t BIGINT, queued_since_t BIGINT);
CREATE TABLE IF NOT EXISTS sagas (
    saga VARCHAR, planned_t BIGINT, preemptor VARCHAR, preemptor_team VARCHAR,
    preemptor_user VARCHAR, preemptor_level INTEGER, victims INTEGER, benefit DOUBLE,
    cost DOUBLE, reason VARCHAR, deadline_t BIGINT, outcome VARCHAR, end_t BIGINT,
    wait_ms BIGINT, rollback_reason VARCHAR, reclaim BOOLEAN);
CREATE TABLE IF NOT EXISTS preemptions (
    saga VARCHAR, victim VARCHAR, victim_team VARCHAR, victim_user VARCHAR,
    victim_level INTEGER, victim_gpus INTEGER, preemptor VARCHAR, preemptor_team VARCHAR,
    preemptor_level INTEGER, planned_t BIGINT, benefit DOUBLE, cost DOUBLE, reason VARCHAR,
    released_t BIGINT, release_lost_ms BIGINT, requeued_t BIGINT, requeue_lost_ms BIGINT,
    resumed_t BIGINT, recovery_ms BIGINT, outcome VARCHAR, reclaim BOOLEAN);
CREATE TABLE IF NOT EXISTS queue_wait (
    seq BIGINT, t BIGINT, job VARCHAR, team VARCHAR, "user" VARCHAR, level INTEGER,
    eff_level INTEGER, variant VARCHAR, waited_ms BIGINT, after_preemption BOOLEAN);
CREATE TABLE IF NOT EXISTS team_usage (
    team VARCHAR, level INTEGER, gpu_ms BIGINT, submitted INTEGER, started INTEGER,
    finished INTEGER, failed INTEGER, preempted INTEGER, preempting INTEGER,
    lost_progress_ms BIGINT);
CREATE TABLE IF NOT EXISTS ledger (
    seq BIGINT, t BIGINT, job VARCHAR, team VARCHAR, kind VARCHAR, amount DOUBLE,
    preempt_count INTEGER);
CREATE TABLE IF NOT EXISTS nodes (
    node VARCHAR, gpu_model VARCHAR, gpus INTEGER, up BOOLEAN, joined_t BIGINT,
    lost_t BIGINT, lost_reason VARCHAR);
CREATE TABLE IF NOT EXISTS placements (
    job VARCHAR, run INTEGER, node VARCHAR, gpus INTEGER, team VARCHAR, "user" VARCHAR,
    level INTEGER, requested_t BIGINT, start_t BIGINT, end_t BIGINT, ended VARCHAR);
CREATE TABLE IF NOT EXISTS team_limits (
    seq BIGINT, t BIGINT, team VARCHAR, kind VARCHAR, until_t BIGINT, count INTEGER);
CREATE TABLE IF NOT EXISTS declines (
    seq BIGINT, t BIGINT, job VARCHAR, reason VARCHAR, benefit DOUBLE, cost DOUBLE);
CREATE TABLE IF NOT EXISTS policy_changes (
    seq BIGINT, t BIGINT, "by" VARCHAR, reason VARCHAR, params VARCHAR);
CREATE TABLE IF NOT EXISTS feedback (
    seq BIGINT, t BIGINT, job VARCHAR, "user" VARCHAR, score INTEGER, comment VARCHAR);
CREATE TABLE IF NOT EXISTS notices (
    seq BIGINT, t BIGINT, "user" VARCHAR, job VARCHAR, kind VARCHAR, message VARCHAR);
CREATE TABLE IF NOT EXISTS pending (
    job VARCHAR, team VARCHAR, "user" VARCHAR, level INTEGER, eff_level INTEGER, gpus INTEGER,
    state VARCHAR, wait_ms BIGINT, code VARCHAR, reason VARCHAR, "limit" VARCHAR,
    start_in_ms BIGINT, t BIGINT);
CREATE TABLE IF NOT EXISTS projector_position (
    stream VARCHAR, last_seq BIGINT, last_n BIGINT, last_hash VARCHAR, updated_t BIGINT);
"""

VIEWS = """
CREATE OR REPLACE VIEW queue_now AS
    SELECT eff_level AS level, team, "user", count(*) AS depth,
           max((SELECT max(t) FROM events) - queued_since_t) AS oldest_wait_ms
    FROM jobs WHERE state = 'queued' GROUP BY ALL;
CREATE OR REPLACE VIEW running_now AS
    SELECT level, team, "user", sum(gpus) AS gpus, count(*) AS jobs
    FROM jobs WHERE state IN ('starting', 'running', 'reserved', 'preempting') GROUP BY ALL;
CREATE OR REPLACE VIEW preemption_stats AS
    SELECT victim_level AS level, victim_team AS team, victim_user AS "user",
           count(*) AS preemptions,
           count(*) FILTER (reclaim) AS reclaims,
           count(*) FILTER (outcome = 'committed') AS committed,
           count(*) FILTER (outcome = 'rolled_back') AS rolled_back,
           count(*) FILTER (outcome IN ('committed', 'released_late'))
               / greatest(1, count(*) FILTER (outcome <> 'open'))
               AS success_rate,
           avg(recovery_ms) AS recovery_ms_mean,
           sum(coalesce(requeue_lost_ms, 0) * victim_gpus) / 3600000.0 AS lost_gpu_hours
    FROM preemptions GROUP BY ALL;
CREATE OR REPLACE VIEW team_ledger AS
    SELECT team, kind, sum(amount) AS amount, count(*) AS grants FROM ledger GROUP BY ALL;
CREATE OR REPLACE VIEW satisfaction AS
    SELECT j.team, j.requested_level AS level, count(*) AS answers, avg(f.score) AS score_mean,
           count(*) FILTER (f.score <= 2) AS unhappy
    FROM (SELECT job, arg_max(score, seq) AS score FROM feedback GROUP BY job) f
    JOIN jobs j USING (job) GROUP BY ALL ORDER BY ALL;
"""

# Usage decays as Slurm's does: an hour run `age` ago weighs 2^(-age / half_life); a run from
# s to e of g GPUs weighs g * H / ln 2 * (2^(-(now - e) / H) - 2^(-(now - s) / H)) in all.
USAGE_MACROS = """
CREATE OR REPLACE MACRO team_usage_decayed(half_life_s, now_t) AS TABLE
WITH runs AS (
    SELECT team, gpus, least(start_t, now_t) AS s, least(coalesce(end_t, now_t), now_t) AS e,
           half_life_s * 1000.0 AS h
    FROM placements WHERE start_t IS NOT NULL AND start_t <= now_t
), per_team AS (
    SELECT team, sum(gpus * (e - s)) / 3600000.0 AS gpu_hours,
           sum(gpus * h / ln(2) * (pow(2, -(now_t - e) / h) - pow(2, -(now_t - s) / h))) / 3600000.0
               AS decayed_gpu_hours
    FROM runs GROUP BY team
)
SELECT team, gpu_hours, decayed_gpu_hours,
       decayed_gpu_hours / nullif(sum(decayed_gpu_hours) OVER (), 0) AS decayed_part
FROM per_team ORDER BY team;
CREATE OR REPLACE VIEW team_usage_decayed_7d AS
SELECT * FROM team_usage_decayed(7 * 86400, (SELECT coalesce(max(t), 0) FROM events));
"""

# Mutable tables: rows are replaced by key when they change in a batch.
KEYS = {
    "jobs": ("job",),
    "sagas": ("saga",),
    "preemptions": ("saga", "victim"),
    "team_usage": ("team", "level"),
    "nodes": ("node",),
    "placements": ("job", "run", "node"),
}


def columns(con, table: str) -> list[str]:
    """A table's column names, in order."""
    rows = con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [r[0] for r in rows]


_NUMPY = {"BIGINT": "int64", "INTEGER": "int64", "DOUBLE": "float64", "BOOLEAN": "bool"}


def numpy_dtypes(con, table: str) -> list:
    """The numpy dtype that carries each column into DuckDB fastest (object for text)."""
    rows = con.execute(
        "SELECT data_type FROM information_schema.columns WHERE table_name = ? ORDER BY ordinal_position",
        [table],
    ).fetchall()
    return [_NUMPY.get(r[0], object) for r in rows]


# Columns added since a table was first written: a database projected by an older xirang
# gains them (NULL in its old rows) and goes on from where it was.
ADDED_COLUMNS = (
    ("sagas", "reclaim", "BOOLEAN"),
    ("preemptions", "reclaim", "BOOLEAN"),
    ("nodes", "cordoned_by", "VARCHAR"),  # '' or NULL: not cordoned (core/model/cordon.py)
    ("nodes", "cordon_reason", "VARCHAR"),
)


def create(con) -> None:
    """Create the tables (adding columns that newer versions added) and the views."""
    con.execute(TABLES)
    for table, column, sql_type in ADDED_COLUMNS:
        con.execute(f'ALTER TABLE {table} ADD COLUMN IF NOT EXISTS "{column}" {sql_type}')
    con.execute(VIEWS)
    con.execute(USAGE_MACROS)
