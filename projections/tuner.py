"""The online tuner: reads recent outcomes from the projection and proposes policy changes.

A proposal is a `set_policy` input (`by="tuner"`, with its reason in words and numbers).
It is never applied behind the scheduler's back: published to XR_IN (`xr.in.set_policy`)
it goes through `core.step` like any input and becomes a `PolicyChanged` event in the log,
so an audit sees it and a replay reproduces it; offline it is written to a file of inputs
that can be appended to a scenario.

Rules (each looks at the last `window_ms` of log time and changes one thing, by a bounded
step, so the tuner cannot run away):
- many preemptions roll back because victims miss the deadline: more deadline slack;
- many preemptions roll back: a higher bar (net_benefit_min) for starting one;
- victims are preempted again soon after they resume: longer protection after a restart;
- urgent levels (0-2) wait long while preemptions are declined as not worth it: those
  levels weigh more in the benefit.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from core import types as T
from core.policy import Policy, PolicyError, with_params

WINDOW_MS = 6 * 3600 * 1000
SAGAS_MIN = 5  # fewer ended preemptions than this say nothing
ROLLBACK_SHARE_MAX = 0.2
REPEAT_VICTIM_SHARE_MAX = 0.25
URGENT_WAIT_MS_MAX = 10 * 60_000
STEP = 1.5  # multiplicative step of one proposal
NET_BENEFIT_STEP = 100.0  # weighted GPU-seconds added when net_benefit_min is 0


@dataclass
class Proposal:
    params: dict
    reason: str

    def as_input(self, t: int = 0) -> T.SetPolicy:
        return T.SetPolicy(t=t, params=self.params, by="tuner", reason=self.reason)


def current_policy(con) -> Policy:
    """The policy in force at the end of the projection: defaults plus every PolicyChanged."""
    policy = Policy()
    for (params,) in con.execute("SELECT params FROM policy_changes ORDER BY seq").fetchall():
        try:
            policy = with_params(policy, msgspec.json.decode(params))
        except PolicyError:
            continue  # the core accepted it under its rules; keep the rest comparable
    return policy


def propose(con, now: int, window_ms: int = WINDOW_MS) -> list[Proposal]:
    policy = current_policy(con)
    since = now - window_ms
    out: list[Proposal] = []
    for rule in (_deadline_rollbacks, _rollbacks, _repeat_victims, _urgent_waits):
        proposal = rule(con, policy, since)
        if proposal is not None:
            try:
                with_params(policy, proposal.params)
            except PolicyError:
                continue  # at a limit of the policy's own checks: nothing to propose
            out.append(proposal)
    return out


def _saga_outcomes(con, since: int) -> tuple[int, int, int]:
    return con.execute("""
        SELECT count(*) FILTER (outcome IN ('committed', 'rolled_back')),
               count(*) FILTER (outcome = 'rolled_back'),
               count(*) FILTER (outcome = 'rolled_back' AND rollback_reason LIKE '%deadline%')
        FROM sagas WHERE planned_t > ?""", [since]).fetchone()


def _deadline_rollbacks(con, policy: Policy, since: int) -> Proposal | None:
    ended, rolled, deadline = _saga_outcomes(con, since)
    if ended < SAGAS_MIN or deadline / ended <= ROLLBACK_SHARE_MAX:
        return None
    slack = int(policy.deadline_slack_ms * STEP)
    return Proposal({"deadline_slack_ms": slack},
                    f"{deadline} of {ended} recent preemptions rolled back at their deadline:"
                    f" deadline slack {policy.deadline_slack_ms} -> {slack} ms")


def _rollbacks(con, policy: Policy, since: int) -> Proposal | None:
    ended, rolled, deadline = _saga_outcomes(con, since)
    if ended < SAGAS_MIN or (rolled - deadline) / ended <= ROLLBACK_SHARE_MAX:
        return None
    bar = policy.net_benefit_min * STEP if policy.net_benefit_min > 0 else NET_BENEFIT_STEP
    return Proposal({"net_benefit_min": round(bar, 3)},
                    f"{rolled - deadline} of {ended} recent preemptions rolled back for other reasons:"
                    f" net_benefit_min {policy.net_benefit_min} -> {bar:g}")


def _repeat_victims(con, policy: Policy, since: int) -> Proposal | None:
    victims, repeats = con.execute("""
        SELECT count(DISTINCT victim), count(DISTINCT victim) FILTER (n > 1) FROM (
            SELECT victim, count(*) AS n FROM preemptions WHERE planned_t > ? GROUP BY victim)""",
                                   [since]).fetchone()
    if victims < SAGAS_MIN or repeats / victims <= REPEAT_VICTIM_SHARE_MAX:
        return None
    protect = int(policy.min_run_after_restart_ms * STEP)
    return Proposal({"min_run_after_restart_ms": protect},
                    f"{repeats} of {victims} recent victims were preempted more than once:"
                    f" protection after restart {policy.min_run_after_restart_ms} -> {protect} ms")


def _urgent_waits(con, policy: Policy, since: int) -> Proposal | None:
    wait_ms, declined = con.execute("""
        SELECT (SELECT avg(waited_ms) FROM queue_wait WHERE t > ? AND level <= 2),
               (SELECT count(*) FROM declines d JOIN jobs j USING (job)
                WHERE d.t > ? AND j.level <= 2 AND d.reason = 'benefit_below_cost')""",
                                    [since, since]).fetchone()
    if wait_ms is None or wait_ms <= URGENT_WAIT_MS_MAX or declined == 0:
        return None
    weights = list(policy.level_weight)
    for level in range(3):
        weights[level] = round(weights[level] * STEP, 3)
    return Proposal({"level_weight": weights},
                    f"levels 0-2 waited {wait_ms / 60000:.1f} min on average while {declined}"
                    f" preemptions were declined as not worth it: urgent level weights x{STEP}")
