"""Every tunable of the scheduler in one typed config, with documented defaults.

Loaded from TOML (`core.model.policy_defaults.load_policy_toml`), changed at run time by
`set_policy` inputs (which become `PolicyChanged` events so replay stays exact); the defaults
are versioned per log (core/model/policy_defaults.py). Per-level lists have one entry per
level, 0 (most urgent) to 7. Names end with their unit.

Over 500 lines on purpose: every tunable is one field of one struct, each with its default
and the reason for it beside it; split, the policy would no longer read as one whole.
"""

from __future__ import annotations

import tomllib
from typing import Any

import msgspec

from .types import LEVELS
from .variants import assign_variant, assignment_unit, job_group  # noqa: F401 (policy names)

FCFS = "fcfs"
FAIR_SHARE = "fair_share"
ROUND_ROBIN = "round_robin"
QUEUE_POLICIES = (FCFS, FAIR_SHARE, ROUND_ROBIN)


class Policy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every tunable of the scheduler, with its default: queue order per level, guaranteed
    shares, the preemption decision model, fairness windows, aging, sagas and compensation.
    Set by TOML at start and by `set_policy` inputs."""

    # --- queues
    # Queue order within each level: 0-2 first come first served, 3-5 team fair share by
    # quota, 6-7 round robin over teams.
    queue_policy: list[str] = msgspec.field(
        default_factory=lambda: [
            FCFS,
            FCFS,
            FCFS,
            FAIR_SHARE,
            FAIR_SHARE,
            FAIR_SHARE,
            ROUND_ROBIN,
            ROUND_ROBIN,
        ]
    )
    # Team weights for fair share; a team not listed weighs 1.
    team_quota: dict[str, float] = {}
    # Fair share inside a level weighs each team's GPUs held at the level now plus its use of
    # the level over time, decayed by half every this many seconds (as Slurm's
    # PriorityDecayHalfLife and Kueue's admission fair sharing do), against its quota: a team
    # that ran much lately waits behind one that did not, even while neither holds GPUs.
    # 0: only the GPUs held now count (core/rules/shares.py `level_share_used`). A week by
    # default, as Slurm's default PriorityDecayHalfLife.
    fair_share_half_life_s: float = 604800.0
    # Fraction of the pool each level keeps, counted in whole GPUs (rounded down): while a
    # level with queued jobs holds less, placement serves it first up to that many GPUs,
    # and its jobs are not preempted below it. A level-0 job is never kept waiting by a
    # guarantee smaller than its gang (an emergency outranks a floor it would barely dent).
    guaranteed_share: list[float] = msgspec.field(
        default_factory=lambda: [0.0, 0.0, 0.0, 0.05, 0.05, 0.05, 0.0, 0.0]
    )
    # Level L may preempt jobs of level >= preempts_from_level[L]; 8 means it may not preempt.
    # The urgent levels 0-1 may preempt any less urgent level (as Kubernetes priority
    # classes do) and leave it to the decision model when it is worth it; from level 2 on a
    # gap of two levels keeps neighbours from churning each other.
    preempts_from_level: list[int] = msgspec.field(default_factory=lambda: [1, 2, 4, 6, 7, 8, 8, 8])
    # Weight of one GPU-second of wait (benefit) or loss (cost) at each level.
    level_weight: list[float] = msgspec.field(
        default_factory=lambda: [16.0, 8.0, 4.0, 2.0, 1.5, 1.0, 0.5, 0.25]
    )
    # Weight of one GPU-second of wasted work (progress thrown away, checkpoint writes and
    # restores a preemption causes), at least: the GPUs that redo it are lost to every job
    # in the queue, not only to the victim, so a victim's low level does not make its
    # wasted work cheap. 1.0 is the weight of level 5.
    wasted_work_weight_min: float = 1.0
    # Jobs considered per scheduling pass; bounds the cost of one decision. At most
    # SCAN_JOBS_LIMIT: the records of one input must fit one atomic batch.
    scan_jobs_max: int = 256
    # Queued jobs considered for preemption per tick, strongest base level first.
    preemption_candidates_max: int = 4
    # Nodes a preemption for a one-node job prices exactly before it takes the best set found
    # (recording how much cheaper an unpriced one could be: PreemptionPlanned.regret_max).
    preemption_candidate_nodes_max: int = 100
    # A preemption plan's release curve (`core.forecast.waits.ReleaseCurve`) reads every
    # running job's time to release as at the start of a grid step of this many ms, kept
    # across steps (core/forecast/release_pool.py): each release off by less than a step, a
    # decision costs the nodes events changed, not every running job. 0: exact, at each time.
    release_curve_grid_ms: int = 60_000
    # The longest-waiting jobs (by submit time, whatever their level) that have waited this
    # long get reservations: the nodes where each will fit soonest (by remaining-time
    # estimates) start nothing else until it starts there. Every job eventually becomes one
    # of the oldest, so every job has a finite wait.
    starvation_wait_ms: int = 2 * 3600 * 1000
    starvation_reservations_max: int = 1  # EASY backfill: one reservation, the oldest
    # Besides, the oldest starving jobs of this many teams, those furthest below their quota
    # (GPUs held / quota) first: a small team's job does not wait behind a big team's
    # backlog for its turn to be the oldest of all. Off by default: each reservation holds
    # nodes that urgent jobs can neither start on nor preempt on, so it buys fairness
    # between teams with the urgent levels' tail wait (docs/EXPERIMENTS.md).
    starvation_team_reservations_max: int = 0
    # Opt-in (off by default): the cross-pool team guarantee with reclaim, as Kueue's cohorts
    # do it. By default team fair share works only inside levels 3-5 (who gets a level's next
    # GPUs) and a job never preempts its own level or a more urgent one. With it on:
    # teams keep their fair share: a team's max-min share of the pool, weighted by quota,
    # over the teams holding or asking for GPUs (see core/rules/shares.py). While a team holds
    # no more than its share, other teams' jobs of levels `fair_share_from_level` and on do
    # not preempt it; and a team below its share reclaims: its blocked jobs may preempt
    # other teams' jobs of those levels held while those teams are above their shares, when
    # the wait saved is worth the work wasted, as long as it stays within its share (so GPUs
    # do not move back and forth). This is a cohort's nominal quota with reclaim in Kueue,
    # or a queue's guaranteed capacity in YARN: priority decides within a team and over the
    # GPUs teams hold beyond their shares. The urgent levels below `fair_share_from_level`
    # stay outside it: they preempt by priority whatever the shares, and are never reclaimed.
    fair_share_guarantee: bool = False
    fair_share_from_level: int = 2
    # The first jobs of the serving order that do not fit get the same kind of reservation,
    # so a large gang at an urgent level is not starved by small jobs of less urgent
    # levels taking every GPU that frees (they may still backfill if expected to end first).
    head_reservations_max: int = 1
    # Opt-ins (core/rules/holds.py `backfill_view`, `may_hold_as_head`): backfill forecasts a
    # job's end by its own estimate; no head hold for a job queued above its own level.
    backfill_by_own_estimate: bool = False
    head_reservation_own_level_only: bool = False

    # --- aging: a job waiting longer than its level's threshold rises one level; the
    # threshold shrinks as the queue deepens and as the level's historical wait grows.
    aging_threshold_ms: list[int] = msgspec.field(
        default_factory=lambda: [0, 600_000, 900_000, 1_200_000, 1_800_000, 2_400_000, 3_600_000, 3_600_000]
    )
    aging_depth_factor: float = 0.25  # per doubling of queue depth
    aging_history_factor: float = 0.5  # per threshold of historical mean wait
    aging_threshold_min_ms: int = 60_000
    # Aging lifts a job at most this many levels above its base, so levels stay meaningful
    # under sustained overload; the finite wait bound comes from reservations (below).
    aging_levels_max: int = 2

    # --- preemption decision
    victims_per_preemption_max: int = 8
    # Preemption depth. A cascade: a job displaced by a preemption of depth d that preempts
    # in turn, before it runs again, makes a preemption of depth d + 1 (a job never
    # displaced preempts at depth 1). Levels down: how far below the preemptor's level its
    # victims are. Both are recorded on every PreemptionPlanned and limited here, with
    # per-team and per-user overrides (the stricter of a job's team and user limit holds).
    preemption_depth_max: int = 2
    team_preemption_depth_max: dict[str, int] = {}
    user_preemption_depth_max: dict[str, int] = {}
    preemption_levels_down_max: int = 7
    team_preemption_levels_down_max: dict[str, int] = {}
    user_preemption_levels_down_max: dict[str, int] = {}
    # Every preemption costs each victim this much GPU time beyond lost progress, checkpoint
    # save and restore (process teardown, relaunch, warm-up), priced as wasted work.
    preemption_overhead_s: float = 10.0
    # Jobs at the urgent levels (below this) are all tried for preemption on every pass;
    # the budget `preemption_candidates_max` applies to the less urgent levels.
    urgent_levels: int = 2
    urgent_candidates_max: int = 64
    # An urgent job is not bound by a node hold (reservation) for a job its level may
    # preempt: it may start on, or preempt on, nodes held for such a job (core/rules/holds.py).
    urgent_override_holds: bool = True
    # The urgent levels' wait target, an SLO: an urgent job should start within this much
    # of queueing. Past it, each further second of its wait weighs `urgent_overdue_factor`
    # times its level's weight (core/rules/pricing.py `wait_priced_s`); what that adds to a
    # preemption's benefit pays for the victims' disruption (requeue wait, save, restore,
    # overhead), never for their unsaved work (`overdue_premium`). So a victim with a fresh
    # checkpoint is preempted for an urgent job that would pass its target, at any load.
    # Factor 1: no target.
    urgent_wait_target_s: float = 30.0
    urgent_overdue_factor: float = 8.0
    # How long a preemptor of each level waits for a victim to let go, at most (0: as long
    # as the save takes): a victim that cannot reach its safe point and save a checkpoint in
    # time lets go from its last checkpoint, and the progress since counts as lost in the
    # decision. The urgent levels get Kubernetes' default grace period.
    release_wait_max_ms: list[int] = msgspec.field(default_factory=lambda: [30_000, 30_000, 0, 0, 0, 0, 0, 0])
    # Time for a victim to reach a safe point after the notice, until enough victims
    # (`estimate_samples_min`) have shown how long they take (then their mean).
    safe_point_ms: int = 30_000
    # Extra time on top of the expected safe point + checkpoint before a saga rolls back.
    deadline_slack_ms: int = 120_000
    deadline_min_ms: int = 180_000
    # Whether a notice's deadline also covers a checkpoint the victim is writing when the
    # notice comes (it lets go only once the write ends), plus the slack: off, a write longer
    # than the deadline rolls the saga back while the victim is about to let go
    # (core/rules/notices.py `notice_deadline`).
    notice_covers_save_in_progress: bool = True
    # Whether a victim that lets go after its saga's deadline (the saga was rolled back, the
    # withdrawal came too late) counts as preempted: its preemption count, recovery boost and
    # compensation, and the saga's record (`VictimReleasedLate`). Off, it requeues uncounted
    # (core/rules/notices.py `late_release_counts`).
    late_release_counts_as_preemption: bool = True
    # After a rollback the preemptor waits this long before planning again, and victims that
    # failed to release are left alone as long, so a broken job cannot start a loop.
    preemption_retry_ms: int = 300_000
    # Defaults for what the submitter did not say.
    default_est_runtime_s: float = 3600.0
    default_ckpt_interval_s: float = 1800.0
    default_ckpt_cost_s: float = 30.0
    default_restore_cost_s: float = 30.0
    # Compatible GPU models: model -> {model that may stand in for it: slowdown}, e.g.
    # {"H100": {"A100": 0.6}} (an H100 job runs 1.6 times as long on an A100). Taken only
    # when it pays: see core/rules/substitutes.py. Empty: a job runs only on the models it lists.
    gpu_substitutes: dict[str, dict[str, float]] = {}
    # How often a job reaches a safe point when its submitter does not say (0: unknown; the
    # time victims have taken from notice to safe point is used, see `safe_point_ms`). A
    # victim with a known interval is expected at its next safe point in half of it.
    default_safe_point_interval_s: float = 0.0
    # Finished jobs of one (team, kind) needed before history replaces the submitter's estimate.
    estimate_samples_min: int = 3
    # Net benefit (benefit - cost) must exceed this, in weighted GPU-seconds.
    net_benefit_min: float = 0.0

    # --- fairness, over a sliding window. Only preemptions of another team's (user's) jobs
    # count toward a team's (user's) limits, and those limits never stop a job displacing its
    # own team's (user's) work: they guard teams and users against each other.
    fairness_window_ms: int = 3600 * 1000
    # Counts below are for a 100-GPU pool; a pool of G GPUs allows G/100 times as many
    # (never fewer than the count itself), so a limit means the same share at any size.
    # Team counts are for a team with an even share of the demand (GPUs held and asked
    # for); a team with k times the mean share gets k times the count.
    team_preempted_max: int = 6  # then the team is protected
    team_protect_ms: int = 1800 * 1000
    # Preemptions by a team's jobs of levels below `downgrade_applies_below_level`: past
    # this count the team's new jobs of those levels are downgraded.
    team_preempting_max: int = 6
    # DEPRECATED, no effect: a downgrade lasts until the team's preemption quota recovers
    # (fairness.team_downgrade_ends_t), not a fixed time. Kept so that logs and policy files
    # that set it still fold and load (and older state digests, which cover it, still match).
    team_downgrade_ms: int = 1800 * 1000
    # How many levels a downgraded job enters below the level it asked for. One: a level-1
    # job enters at level 2, which is served after levels 0-1 and may preempt only levels
    # 4-7 (`preempts_from_level`), and its preemptions still count toward the team's
    # allowance. Two (level 3, which may preempt only levels 6-7) leaves a downgraded
    # team's urgent burst nothing it may preempt, so it waits out its quota in full
    # (docs/EXPERIMENTS.md).
    downgrade_levels: int = 1
    downgrade_applies_below_level: int = 3  # jobs submitted at levels < this are downgraded
    # An operator's opt-in (0: off, the model's rule): a downgraded job gets its requested
    # level back once it has waited this long, even while its team's quota has not yet
    # recovered. It bounds what the downgrade costs one urgent job, at the price of the
    # limit: a team past it still gets its urgent jobs through after this wait.
    downgraded_wait_max_ms: int = 0
    user_preempted_max: int = 4
    user_preempting_max: int = 4

    # --- recovery and compensation
    requeue_boost_per_preemption: int = 1
    requeue_boost_max: int = 3
    recovery_boost_within_band: bool = False  # opt-in: core/model/bands.py
    # Protected from preemption for this long after a restart, times the preemption count,
    # at most `restart_protect_max_ms`; and never against the urgent levels unless
    # `restart_protect_from_urgent` (there the boost prices a recently preempted victim at
    # its boosted level instead, which makes a second preemption less likely, not impossible).
    min_run_after_restart_ms: int = 900_000
    restart_protect_max_ms: int = 3_600_000
    restart_protect_from_urgent: bool = False
    # The recovery boost grows with the preemption count and with the wait the job has
    # already borne: one more level per this much time it has queued in all.
    requeue_boost_wait_ms: int = 4 * 3_600_000
    checkpoints_kept: int = 3
    # How long an ended job's (finished, failed, cancelled) checkpoints stay in the bus's
    # store (XR_CKPT) before the scheduler purges them, so short jobs cannot fill it over
    # time. 0: kept for good (as before this parameter).
    ended_job_checkpoints_kept_s: float = 86_400.0
    # Verified copies of an SDK checkpoint (the bus's, then its host's disk), and how long the
    # second takes to write per unit of the first's (core/rules/copies.py, docs/TRAINING.md).
    checkpoint_copies: int = 2
    checkpoint_copy_cost_ratio: float = 0.5
    # A checkpoint a job writes itself is copied by its host after the write: its resume
    # points name that host, and a save at a notice is priced with the copy after the write.
    host_copies_job_checkpoints: bool = True
    compensation_after_preemptions: int = 3
    # Off: a job is compensated from the preemption that brings its count to
    # `compensation_after_preemptions`; on: from the one that takes the count past it, as
    # the model's spec words the trigger (the count exceeds the threshold). See
    # core/rules/compensation.py.
    compensation_when_exceeded: bool = True
    compensation_quota_gpu_hours_per_lost: float = 1.0
    compensation_priority_boost: int = 1
    # The quota bonus of a compensation raises the team's fair-share weight for this long.
    compensation_quota_ms: int = 24 * 3_600_000
    fee_credit_per_gpu_hour: float = 2.5

    # --- A/B: named variants, each a set of overrides of the preemption decision's
    # parameters (`VARIANT_PARAMS`: a new experiment overriding anything else is refused
    # by name), used for the decisions of the jobs assigned to it. One variant is named
    # "control". A job's variant is chosen by a hash of its team (ab_split_by = "team"), its
    # user ("user"), its job group ("job_group": the id without a trailing -N/_N/.N index, so
    # a sweep stays together) or its id ("job"); "" means no experiment.
    ab_variants: dict[str, dict[str, Any]] = {}
    ab_split_by: str = "team"

    # --- hosts
    # Output (stdout and stderr) each job run keeps on its host's disk, rotated beyond it
    # (agents/outcap.py): told to the hosts with every start, each keeps the smaller of this
    # and its own --job-output-max-mb (a machine's floor). 0: each host's own cap alone.
    job_output_max_mb: float = 0.0

    # --- audit
    digest_every_events: int = 500

    # The table of defaults this policy starts from, named by every log (a later release's
    # defaults never change what a log means: core/model/policy_defaults.py).
    defaults_version: int = 3


# One input's records go to the log as one atomic batch of at most 800 messages
# (transport.bus.BATCH_MESSAGES_MAX): a node's loss requeues up to 256 jobs (core.model.bounds
# NODE_GPUS_MAX) and the pass after it may start and back-fill up to 2 x scan_jobs_max
# jobs, so a larger scan would have its every tick refused as too big to record.
SCAN_JOBS_LIMIT = 256
JOB_OUTPUT_MB_MIN, JOB_OUTPUT_MB_MAX = 0.01, float(2**20)  # 0.01 MiB .. 1 TiB


class PolicyError(ValueError):
    """A policy value or file that cannot be used; the message names what to fix."""


def validate(policy: Policy) -> Policy:
    """Check cross-field limits. Raises PolicyError with what to fix."""
    per_level = [
        "queue_policy",
        "guaranteed_share",
        "preempts_from_level",
        "level_weight",
        "aging_threshold_ms",
        "release_wait_max_ms",
    ]
    for name in per_level:
        if len(getattr(policy, name)) != LEVELS:
            raise PolicyError(f"{name} must have {LEVELS} entries, one per level 0..7")
    for name in policy.queue_policy:
        if name not in QUEUE_POLICIES:
            raise PolicyError(f"queue_policy entry {name!r} must be one of {QUEUE_POLICIES}")
    if sum(policy.guaranteed_share) > 1.0 + 1e-9:
        raise PolicyError("guaranteed_share must add up to at most 1.0")
    for level, first in enumerate(policy.preempts_from_level):
        if first <= level:
            raise PolicyError(
                f"preempts_from_level[{level}]={first}: a level may only preempt lower"
                f" levels, so it must be > {level}"
            )
    if not 0 <= policy.fair_share_half_life_s < 1e9:
        raise PolicyError(
            f"fair_share_half_life_s must be >= 0 seconds (0: only GPUs held now count), got"
            f" {policy.fair_share_half_life_s}"
        )
    if policy.checkpoint_copies not in (1, 2) or not 0 <= policy.checkpoint_copy_cost_ratio <= 100:
        raise PolicyError("checkpoint_copies must be 1 or 2, checkpoint_copy_cost_ratio 0..100")
    if not 0 <= policy.fair_share_from_level <= LEVELS:
        raise PolicyError(f"fair_share_from_level must be 0..{LEVELS} ({LEVELS}: no level is covered)")
    if (
        policy.preemption_depth_max < 1
        or any(v < 1 for v in policy.team_preemption_depth_max.values())
        or any(v < 1 for v in policy.user_preemption_depth_max.values())
    ):
        raise PolicyError(
            "preemption depth limits must be at least 1 (a job never displaced preempts at depth 1)"
        )
    if not 0 <= policy.urgent_levels <= LEVELS:
        raise PolicyError(f"urgent_levels must be 0..{LEVELS}")
    if not policy.urgent_wait_target_s >= 0:
        raise PolicyError(f"urgent_wait_target_s must be >= 0 seconds, got {policy.urgent_wait_target_s}")
    if not policy.urgent_overdue_factor >= 1:
        raise PolicyError(
            f"urgent_overdue_factor must be >= 1 (1: a second past the target weighs as any other),"
            f" got {policy.urgent_overdue_factor}"
        )
    for model in sorted(policy.gpu_substitutes):
        for other, slowdown in sorted(policy.gpu_substitutes[model].items()):
            if not slowdown >= 0:
                raise PolicyError(
                    f"gpu_substitutes[{model!r}][{other!r}] must be a slowdown >= 0, got {slowdown}"
                )
    if not 1 <= policy.scan_jobs_max <= SCAN_JOBS_LIMIT:
        raise PolicyError(
            f"scan_jobs_max must be 1..{SCAN_JOBS_LIMIT} (the records of one scheduling pass must fit"
            f" one atomic batch), got {policy.scan_jobs_max}"
        )
    if (
        policy.job_output_max_mb != 0
        and not JOB_OUTPUT_MB_MIN <= policy.job_output_max_mb <= JOB_OUTPUT_MB_MAX
    ):
        raise PolicyError(
            f"job_output_max_mb must be 0 (each host's own cap) or {JOB_OUTPUT_MB_MIN}..{JOB_OUTPUT_MB_MAX}"
            f" MiB, got {policy.job_output_max_mb}"
        )
    if policy.preemption_candidate_nodes_max < 1:
        raise PolicyError("preemption_candidate_nodes_max must be at least 1")
    if policy.release_curve_grid_ms < 0:
        raise PolicyError("release_curve_grid_ms must be 0 (exact) or a grid step in ms > 0")
    if policy.victims_per_preemption_max < 1:
        raise PolicyError("victims_per_preemption_max must be at least 1")
    if policy.digest_every_events < 1:
        raise PolicyError("digest_every_events must be at least 1")
    if policy.ab_split_by not in AB_SPLITS:
        raise PolicyError(f"ab_split_by must be one of {', '.join(AB_SPLITS)}")
    for name in sorted(policy.ab_variants):
        overrides = policy.ab_variants[name]
        if "ab_variants" in overrides or "ab_split_by" in overrides:
            raise PolicyError(f"ab_variants[{name!r}] cannot override the experiment itself")
        base = msgspec.structs.replace(policy, ab_variants={})
        try:
            with_params(base, overrides)
        except PolicyError as err:
            raise PolicyError(f"ab_variants[{name!r}]: {err}") from err
    _check_not_negative(policy)
    if any(w <= 0 for w in policy.level_weight):
        raise PolicyError("level_weight entries must be positive")
    for team in sorted(policy.team_quota):
        if not policy.team_quota[team] > 0:
            raise PolicyError(f"team_quota[{team!r}] must be positive, got {policy.team_quota[team]}")
    return policy


# The one number that may be negative: a net benefit below zero preempts at a small loss.
SIGNED_PARAMS = ("net_benefit_min",)


def _check_not_negative(policy: Policy) -> None:
    """Counts, durations, shares and weights are never negative (a negative limit or time
    would silently read as "never" or "always")."""
    for field in msgspec.structs.fields(Policy):
        name = field.name
        value = getattr(policy, name)
        if name in SIGNED_PARAMS:
            continue
        values = value if isinstance(value, list) else [value]
        for entry in values:
            if isinstance(entry, (int, float)) and not isinstance(entry, bool) and entry < 0:
                raise PolicyError(f"{name} must not be negative, got {value}")


AB_SPLITS = ("team", "user", "job_group", "job")
AB_CONTROL = "control"
# The parameters an A/B variant may override: exactly those the preemption decision reads
# from the variant's policy (`core/rules/decision.py`, `Decision`); every other one is
# read from the base policy, so overriding it per variant would be silently ignored.
# tests/test_core_ab_variants.py shows each of them changing a decision.
VARIANT_PARAMS = (
    "guaranteed_share",
    "level_weight",
    "net_benefit_min",
    "release_wait_max_ms",
    "safe_point_ms",
    "victims_per_preemption_max",
    "wasted_work_weight_min",
)


def check_experiment(policy: Policy) -> None:
    """What a new experiment must satisfy (checked when a `set_policy` or a policy file sets
    one, not when a recorded PolicyChanged is folded, so older logs still fold): every
    override takes effect, and the control is named. Raises PolicyError with what to fix."""
    if not policy.ab_variants:
        return
    for name in sorted(policy.ab_variants):
        ignored = sorted(k for k in policy.ab_variants[name] if k not in VARIANT_PARAMS)
        if ignored:
            raise PolicyError(
                f"ab_variants[{name!r}] overrides {', '.join(ignored)}, which a variant cannot"
                f" change (only the preemption decision's parameters vary by variant:"
                f" {', '.join(VARIANT_PARAMS)}); change it for everyone, or leave it out"
            )
    if AB_CONTROL not in policy.ab_variants:
        raise PolicyError(
            f"ab_variants has no {AB_CONTROL!r} variant: name the one that keeps the base policy"
            f" {AB_CONTROL!r} (an empty [ab_variants.{AB_CONTROL}] table), so reports compare"
            " against it"
        )


def with_params(policy: Policy, params: dict[str, Any]) -> Policy:
    """A new policy with `params` replaced. Raises PolicyError naming the bad field."""
    merged = msgspec.structs.asdict(policy)
    for key in sorted(params):
        if key not in merged:
            raise PolicyError(f"unknown policy parameter {key!r}")
        merged[key] = params[key]
    try:
        return validate(msgspec.convert(merged, Policy))
    except msgspec.ValidationError as err:
        raise PolicyError(f"invalid policy value: {err}") from err


def read_policy_toml(path: str) -> dict[str, Any]:
    """A policy TOML file's keys as `set_policy` params, checked against the defaults (a
    `PolicyError` names the file and the key to fix). The one policy file reader: the
    scheduler, replay and the simulator all load policies through it."""
    with open(path, "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as err:
            raise PolicyError(f"{path}: not valid TOML: {err}") from err
    try:
        check_experiment(with_params(Policy(), data))
    except PolicyError as err:
        raise PolicyError(f"{path}: {err}") from err
    return data
