"""The tuner: learns the policy's parameters by replaying the recent log.

The event log makes a what-if exact: every accepted `submit` of a window, the cluster and
the policy in force are in it, and the simulator runs the same `core.step` the scheduler
runs (`replay/whatif.py`). So the tuner never guesses whether a change would help: it
replays the same window under the current policy and under each candidate, and scores
each run with one stated objective, in GPU-hours:

    objective = urgent_weight x (urgent wait saved)  -  lost_weight x (work lost)
                -  fairness_weight x (Jain drop) x (the window's GPU-hours of work)

- urgent wait saved: for each job of levels 0-`URGENT_LEVEL_MAX`, its queue wait in a
  replay of the window with no preemption at all, minus its wait in this run, times its
  GPUs (a job never started waits until the run's end);
- work lost: progress thrown away plus checkpoint saves, frozen time and restores that
  preemptions caused, times GPUs (`replay.scorecard`'s lost GPU-hours);
- Jain drop: how much Jain's index over the teams' GPU-time held against their max-min fair
  share (`jain_teams_share`) falls below the no-preemption run's (0 when it does not).

A candidate is kept only when it beats the current policy by `margin`, a share
(`MARGIN_SHARE`, 1%) of the urgent jobs' GPU-hours of wait in the no-preemption replay (all
that preemption could save), so noise and ties change nothing.

Four parameter groups, each searched on its own, greedily in turn, on top of the changes
kept so far (`GROUPS`): the levels' guaranteed shares, the decision model's weights and bar,
the fairness thresholds, and the safe point and deadline times. A continuous parameter is
searched by a pattern search: a multiplicative step up and down, keep the better if it
beats the current value by the margin, else halve the step's exponent, until the step is
under `STEP_MIN` or the evaluation budget is spent.

Each kept change is a `Proposal`: its parameters, and its evidence (the objective and its
parts before and after, per level and per team). As a `set_policy` input (`by="tuner"`)
it goes through `core.step` like any input and becomes a `PolicyChanged` event whose reason
carries the summary and the evidence as JSON after `EVIDENCE_MARK`, so an audit sees why
and a replay reproduces it.

Watching (`watch`): after a change, the next window (jobs submitted since the change) is
replayed under the policy before the change and under the one in force; when the change
made the objective worse by the margin, the tuner proposes the old values back (a revert,
with its own evidence).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import msgspec
import numpy as np

from core import types as T
from core.model.bounds import TEXT_CHARS_MAX
from core.model.policy import Policy, PolicyError, with_params
from core.model.policy_defaults import log_policy
from replay.scorecard import policy_card
from replay.peers.xirang import TICK_MS as XIRANG_TICK_MS
from replay.sim import Cluster, SimResult, simulate
from replay.workload import Workload

from replay import whatif

URGENT_LEVEL_MAX = 2
# A candidate must beat the current policy by this share of the urgent wait there is to save
# (the urgent jobs' GPU-hours of wait with no preemption), plus a floor.
MARGIN_SHARE = 0.01
MARGIN_MIN_GPU_H = 0.01
STEP_MIN = 1.01  # a multiplicative step below this ends a pattern search (1%: fine enough)
FLAT_WIDENINGS_MAX = 4
BRACKET_STEPS = 12  # from 0: try start x 2^k, k < this
NO_PREEMPTION = {"net_benefit_min": 1e18}  # every preemption, reclaims too, is declined
EVIDENCE_MARK = "\nevidence: "
HOUR_MS = 3_600_000
WINDOW_MS = 6 * HOUR_MS


@dataclass(frozen=True)
class Objective:
    """The stated objective's weights (GPU-hours against GPU-hours)."""

    urgent_weight: float = 1.0
    lost_weight: float = 1.0
    fairness_weight: float = 1.0

    def describe(self) -> str:
        """The objective in words."""
        return (
            f"{self.urgent_weight:g} x urgent (levels 0-{URGENT_LEVEL_MAX}) GPU-hours of wait saved"
            f" against no preemption - {self.lost_weight:g} x GPU-hours of work lost -"
            f" {self.fairness_weight:g} x drop in Jain's index over teams' fair shares x GPU-hours"
            " of work"
        )


@dataclass
class Score:
    """A run scored by the objective: GPU-hours of urgent wait saved, work lost, the fairness
    penalty, and per level and team."""

    objective_gpu_h: float
    urgent_saved_gpu_h: float
    lost_gpu_h: float
    fairness_penalty_gpu_h: float
    jain_teams_share: float | None
    per_level: dict
    per_team: dict

    def as_dict(self) -> dict:
        """The score as JSON-ready data."""
        return {
            "objective_gpu_h": round(self.objective_gpu_h, 4),
            "urgent_wait_saved_gpu_h": round(self.urgent_saved_gpu_h, 4),
            "lost_gpu_h": round(self.lost_gpu_h, 4),
            "fairness_penalty_gpu_h": round(self.fairness_penalty_gpu_h, 4),
            "jain_teams_share": self.jain_teams_share,
            "per_level": self.per_level,
            "per_team": self.per_team,
        }


class NothingToReplay(ValueError):
    """The window holds no job, or no node to run one on: a quiet window, not a failure of
    the loop (a turn of `xirang tune --apply` on it changes nothing and ends well)."""


class Replay:
    """One window's workload and cluster, replayed under any policy (memoised)."""

    def __init__(
        self,
        workload: Workload,
        cluster: Cluster,
        policy: Policy,
        objective: Objective | None = None,
        seed: int = 0,
        sim_options: dict | None = None,
    ) -> None:
        if not workload.jobs:
            raise NothingToReplay("no job was submitted in this window: nothing to replay")
        self.workload = workload
        self.cluster = cluster
        self.policy = policy  # in force at the window's start
        self.objective = objective or Objective()
        self.seed = seed
        self.sim_options = dict(sim_options or {})  # the simulator adapter's tick_s, urgent_tick_s
        self.runs = 0
        self._memo: dict[bytes, tuple[SimResult, dict]] = {}
        self.work_gpu_h = sum(j.gpus * j.duration_ms for j in workload.jobs) / HOUR_MS
        # With no preemption an urgent job has nothing to retry, so its 5-second re-evaluation
        # ticks change nothing: the baseline ticks at the adapter's usual period.
        self.baseline = self._run(
            with_params(policy, NO_PREEMPTION), {"urgent_tick_s": XIRANG_TICK_MS / 1000}
        )
        base = self.baseline[0]
        self.urgent_wait_gpu_h = (
            sum(j.gpus * _wait_ms(j, base.end_ms) for j in base.jobs if j.level <= URGENT_LEVEL_MAX) / HOUR_MS
        )
        self.margin_gpu_h = MARGIN_SHARE * self.urgent_wait_gpu_h + MARGIN_MIN_GPU_H

    @classmethod
    def from_log(
        cls,
        records,
        from_t: int,
        to_t: int,
        objective: Objective | None = None,
        policy: Policy | None = None,
        sim_options: dict | None = None,
    ) -> "Replay":
        """A replay of the log's window [from_t, to_t] (its jobs, nodes and policy)."""
        win = whatif.scan(records, from_t, to_t)
        if not win.nodes:
            raise NothingToReplay("no node joined before the window's end: nothing to run jobs on")
        return cls(
            whatif.workload(win),
            whatif.cluster(win),
            policy or win.policy,
            objective,
            sim_options=sim_options,
        )

    def _run(self, policy: Policy, options: dict | None = None) -> tuple[SimResult, dict]:
        key = msgspec.json.encode(policy, order="sorted")
        if key not in self._memo:
            self.runs += 1
            config = {"policy": policy, **self.sim_options, **(options or {})}
            result = simulate(self.workload, self.cluster, "xirang", config, seed=self.seed)
            self._memo[key] = (result, policy_card(result))
        return self._memo[key]

    def score(self, policy: Policy) -> Score:
        """Simulate the window under `policy` (memoised) and score it."""
        result, card = self._run(policy)
        return self.score_result(result, card)

    def score_result(self, result: SimResult, card: dict | None = None) -> Score:
        """Any run of this window's jobs (e.g. what the log recorded) against no preemption."""
        base_result, base_card = self.baseline
        return _score(
            self.objective, result, card or policy_card(result), base_result, base_card, self.work_gpu_h
        )


def _wait_ms(job, end_ms: int) -> int:
    return (job.first_start_ms if job.first_start_ms >= 0 else end_ms) - job.submit_ms


def _score(
    obj: Objective, result: SimResult, card: dict, base: SimResult, base_card: dict, work_gpu_h: float
) -> Score:
    base_jobs = {j.id: j for j in base.jobs}
    saved = 0.0
    per_level: dict[str, dict] = {}
    per_team: dict[str, dict] = {}
    for job in result.jobs:
        wait = _wait_ms(job, result.end_ms)
        base_wait = _wait_ms(base_jobs[job.id], base.end_ms)
        lost = job.gpus * (job.lost_progress_ms + job.overhead_ms) / HOUR_MS
        if job.level <= URGENT_LEVEL_MAX:
            saved += job.gpus * (base_wait - wait) / HOUR_MS
        for table, key in ((per_level, str(job.level)), (per_team, job.team)):
            row = table.setdefault(key, {"jobs": 0, "wait_s": [], "lost_gpu_h": 0.0, "preemptions": 0})
            row["jobs"] += 1
            row["wait_s"].append(wait / 1000)
            row["lost_gpu_h"] += lost
            row["preemptions"] += job.preemptions
    jain, base_jain = card.get("jain_teams_share"), base_card.get("jain_teams_share")
    drop = max(0.0, (base_jain or 0.0) - (jain or 0.0)) if jain is not None and base_jain is not None else 0.0
    penalty = obj.fairness_weight * drop * work_gpu_h
    lost_gpu_h = float(card["lost_gpu_h"])
    value = obj.urgent_weight * saved - obj.lost_weight * lost_gpu_h - penalty
    return Score(value, saved, lost_gpu_h, penalty, jain, _summarise(per_level), _summarise(per_team))


def _summarise(table: dict) -> dict:
    out = {}
    for key in sorted(table, key=lambda k: (len(k), k)):
        row = table[key]
        waits = np.asarray(row.pop("wait_s"), dtype=float)
        out[key] = {
            "jobs": row["jobs"],
            "wait_s_mean": round(float(waits.mean()), 1),
            "wait_s_p99": round(float(np.percentile(waits, 99)), 1),
            "lost_gpu_h": round(row["lost_gpu_h"], 4),
            "preemptions": row["preemptions"],
        }
    return out


# ------------------------------------------------------------------ parameters


@dataclass(frozen=True)
class Param:
    """One tunable number: a scalar field, or one entry of a per-level list."""

    name: str
    index: int | None = None
    integer: bool = False
    start: float = 1.0  # the first step away from 0
    low: float = 0.0
    high: float = math.inf

    @property
    def label(self) -> str:
        """The parameter's name, with its index for a per-level list."""
        return self.name if self.index is None else f"{self.name}[{self.index}]"

    def get(self, policy: Policy) -> float:
        """The parameter's value in `policy`."""
        value = getattr(policy, self.name)
        return value[self.index] if self.index is not None else value

    def params(self, policy: Policy, value: float) -> dict:
        """The set_policy params that give the parameter `value` (rounded as its type needs)."""
        value = int(round(value)) if self.integer else round(float(value), 6)
        if self.index is None:
            return {self.name: value}
        values = list(getattr(policy, self.name))
        values[self.index] = value
        return {self.name: values}

    def moves(self, value: float, factor: float) -> list[float]:
        """The values one step up and down from `value` (distinct, within bounds)."""
        if value == 0:
            raw = [self.start]
        elif self.integer:
            raw = [max(value + 1, round(value * factor)), min(value - 1, round(value / factor))]
        else:
            raw = [value * factor, value / factor]
        out: list[float] = []
        for v in raw:
            v = min(self.high, max(self.low, v))
            if v != value and v not in out:
                out.append(v)
        return out


GROUPS: dict[str, list[Param]] = {
    "guaranteed_shares": [Param("guaranteed_share", lv, start=0.05, high=0.5) for lv in (3, 4, 5)],
    "decision_model": [
        Param("net_benefit_min", start=1000.0, low=-math.inf),
        Param("wasted_work_weight_min", start=0.5),
        Param("level_weight", 0, start=1.0, low=0.01),
        Param("level_weight", 1, start=1.0, low=0.01),
    ],
    "fairness": [
        Param(name, integer=True, start=1, low=1)
        for name in ("team_preempted_max", "team_preempting_max", "user_preempted_max", "user_preempting_max")
    ],
    "safe_points": [
        Param("safe_point_ms", integer=True, start=10_000, low=1_000),
        Param("deadline_slack_ms", integer=True, start=30_000, low=1_000),
    ],
}


def param_by_label(label: str) -> Param:
    """The tunable parameter with this label; KeyError lists the tunable ones."""
    for params in GROUPS.values():
        for param in params:
            if param.label == label:
                return param
    raise KeyError(
        f"no tunable parameter {label!r}; tunable: "
        + ", ".join(p.label for ps in GROUPS.values() for p in ps)
    )


# ------------------------------------------------------------------ search


@dataclass
class Proposal:
    """A change the tuner proposes for one group, with the values before, the evidence and the
    reason."""

    group: str
    params: dict
    before: dict  # the parameters' values before
    evidence: dict
    reason: str

    def as_input(self, t: int = 0) -> T.SetPolicy:
        """The proposal as a set_policy input by the tuner, its evidence in the reason (cut to
        fit)."""
        budget = TEXT_CHARS_MAX - len(self.reason) - len(EVIDENCE_MARK)
        text = self.reason + EVIDENCE_MARK + compact_evidence(self.evidence, budget)
        return T.SetPolicy(t=t, params=self.params, by="tuner", reason=text)

    def as_dict(self) -> dict:
        """The proposal as JSON-ready data."""
        return {
            "group": self.group,
            "params": self.params,
            "before": self.before,
            "reason": self.reason,
            "evidence": self.evidence,
        }


def _try(replay: Replay, policy: Policy, params: dict) -> Policy | None:
    try:
        return with_params(policy, params)
    except PolicyError:
        return None  # outside the policy's own limits: not a candidate


def search(replay: Replay, policy: Policy, param: Param, evals_max: int = 12, factor: float = 2.0) -> Policy:
    """Pattern search on one parameter from the policy's value; returns the best policy.
    A step that changes nothing at all (a flat stretch: no decision differs) is widened
    (`FLAT_WIDENINGS_MAX` times at most) before the step is refined."""
    best_score = replay.score(policy).objective_gpu_h
    value = param.get(policy)
    evals = widenings = 0
    if value == 0:  # no scale to step from: bracket by doublings of the parameter's `start`
        base = policy
        for k in range(BRACKET_STEPS):
            trial = _try(replay, base, param.params(base, param.start * 2**k))
            if trial is None:
                break
            score = replay.score(trial).objective_gpu_h
            if score > best_score + replay.margin_gpu_h:
                policy, value, best_score = trial, param.start * 2**k, score
    while factor >= STEP_MIN and evals < evals_max:
        improved, flat = False, True
        for candidate in param.moves(value, factor):
            trial = _try(replay, policy, param.params(policy, candidate))
            if trial is None:
                continue
            evals += 1
            score = replay.score(trial).objective_gpu_h
            flat = flat and abs(score - best_score) < 1e-9
            if score > best_score + replay.margin_gpu_h:
                policy, value, best_score, improved = trial, candidate, score, True
                break
        if improved:
            continue
        if flat and widenings < FLAT_WIDENINGS_MAX:
            widenings += 1
            factor = factor * factor
        else:
            factor = math.sqrt(factor)
    return policy


def judge(replay: Replay, policy: Policy, params: dict, group: str = "given") -> Proposal | None:
    """A given change, kept only if it beats `policy` by the margin on the replay."""
    trial = with_params(policy, params)  # PolicyError names a bad parameter
    before, after = replay.score(policy), replay.score(trial)
    if after.objective_gpu_h <= before.objective_gpu_h + replay.margin_gpu_h:
        return None
    changed, old = _changed(policy, trial, [Param(name) for name in params])
    return _proposal(replay, group, changed, old, before, after)


def propose(
    replay: Replay, groups: list[str] | None = None, evals_per_param: int = 4, only: list[str] | None = None
) -> list[Proposal]:
    """Per group, in turn, the change that improves the objective by the margin (if any),
    each judged on top of the changes kept before it. `only` limits the search to these
    parameters (labels such as `net_benefit_min` or `level_weight[0]`)."""
    policy = replay.policy
    out: list[Proposal] = []
    for group in list(GROUPS) if groups is None else groups:
        before_score = replay.score(policy)
        tuned = policy
        for param in GROUPS[group]:
            if only is None or param.label in only or param.name in only:
                tuned = search(replay, tuned, param, evals_max=evals_per_param)
        after_score = replay.score(tuned)
        if after_score.objective_gpu_h <= before_score.objective_gpu_h + replay.margin_gpu_h:
            continue
        params, before = _changed(policy, tuned, GROUPS[group])
        out.append(_proposal(replay, group, params, before, before_score, after_score))
        policy = tuned
    return out


def _changed(old: Policy, new: Policy, params: list[Param]) -> tuple[dict, dict]:
    names = sorted({p.name for p in params if getattr(old, p.name) != getattr(new, p.name)})
    return {n: getattr(new, n) for n in names}, {n: getattr(old, n) for n in names}


def _proposal(
    replay: Replay, group: str, params: dict, before: dict, old: Score, new: Score, revert: bool = False
) -> Proposal:
    gain = new.objective_gpu_h - old.objective_gpu_h
    changes = ", ".join(f"{k} {before[k]} -> {params[k]}" for k in sorted(params))
    verb = "revert" if revert else group
    reason = (
        f"tuner ({verb}): {changes}: objective {old.objective_gpu_h:+.3f} -> {new.objective_gpu_h:+.3f}"
        f" GPU-h ({gain:+.3f}, margin {replay.margin_gpu_h:.3f}) on a replay of"
        f" {len(replay.workload.jobs)} jobs"
    )
    evidence = {
        "objective": replay.objective.describe(),
        "margin_gpu_h": round(replay.margin_gpu_h, 4),
        "jobs": len(replay.workload.jobs),
        "before": old.as_dict(),
        "after": new.as_dict(),
    }
    return Proposal(group, params, before, evidence, reason)


# ------------------------------------------------------------------ watching a change


@dataclass
class Change:
    """A policy change the tuner made: when, what, the policy before and after, and why."""

    t: int
    params: dict
    before: Policy
    after: Policy
    reason: str


def last_tuner_change(records) -> Change | None:
    """The newest PolicyChanged the tuner made, with the policy before and after it (as the
    core folds them: core/model/policy_defaults.py)."""
    params: dict = {}
    policy = log_policy(params)
    last = None
    for record in records:
        ev = record.event
        if isinstance(ev, T.PolicyChanged):
            try:
                new = log_policy({**params, **ev.params})
            except PolicyError:
                continue
            if ev.by == "tuner":
                last = Change(ev.t, dict(ev.params), policy, new, ev.reason)
            policy, params = new, {**params, **ev.params}
    return last


def watch(
    records, change: Change, to_t: int, objective: Objective | None = None, sim_options: dict | None = None
) -> Proposal | None:
    """Replay the jobs submitted from the change to `to_t` under the policy before it and
    under the policy after it; a revert when the change made things worse by the margin."""
    replay = Replay.from_log(records, change.t, to_t, objective, policy=change.after, sim_options=sim_options)
    before, after = replay.score(change.before), replay.score(change.after)
    if after.objective_gpu_h >= before.objective_gpu_h - replay.margin_gpu_h:
        return None
    old_values = {k: getattr(change.before, k) for k in sorted(change.params)}
    new_values = {k: getattr(change.after, k) for k in sorted(change.params)}
    return _proposal(replay, "revert", old_values, new_values, after, before, revert=True)


def compact_evidence(evidence: dict, chars_max: int) -> str:
    """The evidence as compact JSON that fits an input's reason (`core.model.bounds`): the
    objective's parts before and after, and per level and per team `[before, after]` of the
    mean wait (s) and the lost GPU-hours; when it does not fit, the teams that changed least
    are left out (and counted)."""
    parts = (
        "objective_gpu_h",
        "urgent_wait_saved_gpu_h",
        "lost_gpu_h",
        "fairness_penalty_gpu_h",
        "jain_teams_share",
    )
    before, after = evidence["before"], evidence["after"]
    out: dict = {
        "margin_gpu_h": evidence["margin_gpu_h"],
        "jobs": evidence["jobs"],
        **{p: [before[p], after[p]] for p in parts},
    }
    for key in ("per_level", "per_team"):
        out[key] = {
            name: {
                "wait_s_mean": [before[key][name]["wait_s_mean"], after[key][name]["wait_s_mean"]],
                "lost_gpu_h": [before[key][name]["lost_gpu_h"], after[key][name]["lost_gpu_h"]],
            }
            for name in after[key]
            if name in before[key]
        }
    teams = sorted(
        out["per_team"],
        key=lambda n: -abs(out["per_team"][n]["wait_s_mean"][1] - out["per_team"][n]["wait_s_mean"][0]),
    )
    text = json.dumps(out, sort_keys=True, separators=(",", ":"))
    while len(text) > chars_max and teams:
        out["per_team"].pop(teams.pop())
        out["teams_left_out"] = out.get("teams_left_out", 0) + 1
        text = json.dumps(out, sort_keys=True, separators=(",", ":"))
    return text


def evidence_of(reason: str) -> dict | None:
    """The evidence JSON a tuner's PolicyChanged reason carries, if any."""
    if EVIDENCE_MARK not in reason:
        return None
    try:
        return json.loads(reason.split(EVIDENCE_MARK, 1)[1])
    except ValueError:
        return None


@dataclass
class Cycle:
    """What one run of the tuner decided, for the CLI to print or publish."""

    window: dict
    proposals: list[Proposal] = field(default_factory=list)
    watched: dict | None = None
    runs: int = 0


def cycle(
    records,
    from_t: int,
    to_t: int,
    objective: Objective | None = None,
    groups: list[str] | None = None,
    evals_per_param: int = 4,
    watch_ms: int = WINDOW_MS,
    only: list[str] | None = None,
    sim_options: dict | None = None,
) -> Cycle:
    """One turn of the loop: if the tuner's last change is younger than a full watched
    window, judge it once it has one (revert or keep); otherwise propose from the window."""
    change = last_tuner_change(records)
    out = Cycle(window={"from_t": from_t, "to_t": to_t})
    if change is not None and "(revert)" not in change.reason and to_t - change.t < watch_ms:
        out.watched = {
            "change_t": change.t,
            "params": change.params,
            "verdict": "watching",
            "until_t": change.t + watch_ms,
        }
        return out
    if change is not None and "(revert)" not in change.reason and not _judged(records, change):
        revert = watch(records, change, min(to_t, change.t + watch_ms), objective, sim_options)
        out.watched = {
            "change_t": change.t,
            "params": change.params,
            "verdict": "reverted" if revert else "kept",
        }
        if revert is not None:
            out.proposals = [revert]
            return out
    replay = Replay.from_log(records, from_t, to_t, objective, sim_options=sim_options)
    out.proposals = propose(replay, groups, evals_per_param, only)
    out.runs = replay.runs
    return out


def _judged(records, change: Change) -> bool:
    """A change is judged once any set_policy follows it."""
    return any(isinstance(r.event, T.PolicyChanged) and r.event.t > change.t for r in records)
