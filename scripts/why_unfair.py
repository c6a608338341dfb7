"""Team by team: why team fairness inside levels 3-5 (the scorecard's Jain) is lower under
xirang than with no preemption on a pool.

Runs xirang (default policy, or --policy FILE, or --set KEY=VALUE) on a panel case, takes no
preemption's run from the sweep's cache (or runs it), and prints, per level and team, what
the metric is made of: GPU-hours held by the team's jobs of that level over the GPU-hours its
max-min share of what the level held entitled it to (`x`, the value Jain is taken over), and
under xirang what happened to those jobs: preemptions suffered and by whom (the preemptor's
team and level), GPU-hours lost, requeues, aging, and compensation.

    .venv/bin/python scripts/why_unfair.py --trace bursts --gpus 32 --seed 0 --levels 4 --cache /tmp/c
"""

from __future__ import annotations

import argparse
import ast
import collections
import os
import pickle

from core import types as T
from core.model.policy_defaults import load_policy_toml
from replay.peers import make_policy
from replay.scorecard import _level_share_of_time, jain
from replay.sim import Cluster, Simulator, SimResult, simulate
from replay.sweep import Case, _cache_path, case_workload

HOUR_MS = 3_600_000


def run_none(case: Case, cache: str | None):
    """No preemption's result for the case, from the cache when there."""
    path = _cache_path(cache, case, "none") if cache else None
    if path and os.path.exists(path):
        with open(path, "rb") as fh:
            return pickle.load(fh)
    result = simulate(_fitting(case), Cluster.uniform(case.gpus), "none", {}, case.seed)
    if path:
        os.makedirs(cache, exist_ok=True)
        with open(path, "wb") as fh:
            pickle.dump(result, fh)
    return result


def _fitting(case: Case):
    """The case's jobs, less those bigger than the pool (as `replay.sweep.run_case` drops them)."""
    workload = case_workload(case)
    workload.jobs[:] = [j for j in workload.jobs if j.gpus <= case.gpus]
    return workload


def run_xirang(case: Case, config: dict):
    """(result, records) of xirang on the case, its log kept in memory."""
    cluster = Cluster.uniform(case.gpus)
    workload = _fitting(case)
    policy = make_policy("xirang", {**config, "keep_records": True}, cluster, case.seed)
    sim = Simulator(workload, cluster, policy, None, None)
    sim.run()
    result = SimResult(
        policy="xirang",
        workload=workload.name,
        seed=case.seed,
        total_gpus=cluster.total_gpus,
        jobs=[sim.jobs[spec.id].out for spec in workload.jobs],
        end_ms=sim.now,
        wall_s=0.0,
        steps=policy.steps,
        events=sim.events,
        extra=policy.summary(),
    )
    return result, policy.records


def story(records, jobs_by_id):
    """Per job: preemptions suffered (preemptor team, preemptor level), requeue boosts, agings,
    compensation grants; per team: quota bonuses granted."""
    per_job = collections.defaultdict(lambda: {"preempted_by": [], "boosts": [], "aged": 0, "comp": []})
    planned = {}
    for rec in records:
        ev = rec.event
        if isinstance(ev, T.PreemptionPlanned):
            planned[ev.saga] = ev
        elif isinstance(ev, T.PreemptionCommitted):
            pre = jobs_by_id.get(ev.preemptor)
            plan = planned.get(ev.saga)
            for v in ev.victims:
                per_job[v]["preempted_by"].append(
                    (pre.team if pre else "?", pre.level if pre else -1, bool(plan and plan.reclaim))
                )
        elif isinstance(ev, T.JobRequeued):
            per_job[ev.job]["boosts"].append(ev.boost)
        elif isinstance(ev, T.PriorityAged):
            per_job[ev.job]["aged"] += 1
        elif isinstance(ev, T.CompensationGranted):
            per_job[ev.job]["comp"].append((ev.kind, ev.amount))
    return per_job


def level_table(level: int, none, xirang, per_job) -> str:
    """The level's index under both policies and, per team, its terms and what xirang did to
    the team's jobs of the level."""
    xn = _level_share_of_time(none.jobs, level)
    xx = _level_share_of_time(xirang.jobs, level)
    lines = [
        f"level {level}: Jain none {jain(list(xn.values()))}  xirang {jain(list(xx.values()))}",
        "team    jobs  GPU-h(n)  x none  wait n h | GPU-h(x)  x xirang  wait x h  preempted(by lvl)  lost GPU-h"
        "  boosts  aged  comp | Jain of the others: none  xirang",
    ]
    for team in sorted(set(xn) | set(xx)):
        nj = [j for j in none.jobs if j.level == level and j.team == team]
        xj = [j for j in xirang.jobs if j.level == level and j.team == team]
        held_n = sum(j.gpus * j.held_ms for j in nj) / HOUR_MS
        held_x = sum(j.gpus * j.held_ms for j in xj) / HOUR_MS
        wait_n = _mean_wait_h(nj)
        wait_x = _mean_wait_h(xj)
        by = collections.Counter()
        boosts = aged = comp = 0
        for j in xj:
            s = per_job.get(j.id)
            if not s:
                continue
            for _team, lvl, _reclaim in s["preempted_by"]:
                by[lvl] += 1
            boosts += sum(s["boosts"])
            aged += s["aged"]
            comp += len(s["comp"])
        lost = sum(j.gpus * (j.lost_progress_ms + j.overhead_ms) for j in xj) / HOUR_MS
        by_text = ",".join(f"L{k}:{v}" for k, v in sorted(by.items())) or "-"
        lines.append(
            f"{team:7s} {len(nj):4d} {held_n:9.1f} {xn.get(team, float('nan')):7.3f} {wait_n:8.2f} |"
            f" {held_x:8.1f} {xx.get(team, float('nan')):9.3f} {wait_x:9.2f}  {by_text:17s} {lost:9.1f}"
            f"  {boosts:6d} {aged:5d} {comp:5d} | {_without(xn, team):.3f} {_without(xx, team):.3f}"
        )
    return "\n".join(lines)


def _without(x: dict, team: str) -> float:
    """Jain over every team but `team` (which team drives the index)."""
    return jain([v for name, v in x.items() if name != team]) or float("nan")


def _mean_wait_h(jobs) -> float:
    waits = [(j.first_start_ms - j.submit_ms) / HOUR_MS for j in jobs if j.first_start_ms >= 0]
    return sum(waits) / len(waits) if waits else float("nan")


def main() -> None:
    """Parse the arguments, run the case, print a table per level."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--window", default="", help="START:COUNT")
    ap.add_argument("--levels", default="3,4,5")
    ap.add_argument("--cache", default=None)
    ap.add_argument("--policy", default=None, help="a policy TOML file for xirang")
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE (a Python literal)")
    ap.add_argument("--save", default=None, help="pickle xirang's result and records here")
    args = ap.parse_args()
    window = tuple(int(x) for x in args.window.split(":")) if args.window else None
    case = Case(args.trace, args.gpus, args.seed, window)
    config: dict = {}
    if args.policy:
        config["policy"] = load_policy_toml(args.policy)
    for item in args.set:
        key, _, value = item.partition("=")
        config[key] = ast.literal_eval(value)
    none = run_none(case, args.cache)
    xirang, records = run_xirang(case, config)
    if args.save:
        with open(args.save, "wb") as fh:
            pickle.dump((xirang, records), fh)
    jobs_by_id = {j.id: j for j in xirang.jobs}
    per_job = story(records, jobs_by_id)
    for level in (int(x) for x in args.levels.split(",")):
        print(level_table(level, none, xirang, per_job))
        print()


if __name__ == "__main__":
    main()
