"""Job by job: why jobs of the given levels wait longer under xirang than with no preemption.

Simulates the trace under `none` and under xirang (default policy, or --policy FILE), keeps
xirang's log, then steps a fresh core through the inputs it accepted and, after each step,
asks the core's own explanation (`core.explain.explain`) why each job that waited over a
minute longer than under `none` still waits, weighted by the time to the next input. For
the waits blocked by a reservation it names the holders (level, queue level, gang, whether
back from a preemption); for those blocked by more urgent work, what that work is. Prints
the breakdown as text. First, per level and job size (one or two GPUs, three to seven, a
whole node or more), the mean wait under each policy and the hours xirang's jobs waited
beyond none's: which jobs carry a level's extra wait (`--sizes-only` stops there, without
re-stepping the core).

    .venv/bin/python scripts/why_waits.py --trace bursts:64 --gpus 64 --levels 6,7
    .venv/bin/python scripts/why_waits.py --trace alibaba --gpus 40 --seed 1 --sizes-only
"""

from __future__ import annotations

import argparse
import collections

from core import new_state, step
from core import types as T
from core.explain import explain
from core.model.policy_defaults import load_policy_toml
from core.passes.placement import reserved_nodes
from replay.peers import make_policy
from replay.sim import Cluster, Simulator
from replay.workload import load_trace

MORE_S = 60.0  # waits within a minute of none's are not counted as longer


def run(trace: str, gpus: int, seed: int, limit: int | None, policy_file: str | None):
    """(outcomes per policy, xirang's records, the workload's jobs by id)."""
    workload = load_trace(trace, seed=seed, limit=limit)
    cluster = Cluster.uniform(gpus)
    outcomes, records = {}, []
    for name in ("none", "xirang"):
        config: dict = {}
        if name == "xirang":
            config = {"report_periodic_checkpoints": True, "tick_s": 60.0, "keep_records": True}
            if policy_file:
                config["policy"] = load_policy_toml(policy_file)
        policy = make_policy(name, config, cluster, seed)
        sim = Simulator(workload, cluster, policy, None, None)
        sim.run()
        outcomes[name] = {spec.id: sim.jobs[spec.id].out for spec in workload.jobs}
        if name == "xirang":
            records = policy.records
    return outcomes, records, {spec.id: spec for spec in workload.jobs}


def longer_waits(outcomes, specs, levels: list[int]) -> dict[str, tuple[float, float]]:
    """Job -> (wait under none, wait under xirang), seconds, for the jobs of `levels` that
    waited over a minute longer under xirang."""
    out = {}
    for job_id in sorted(outcomes["xirang"]):
        x, n = outcomes["xirang"][job_id], outcomes["none"][job_id]
        if specs[job_id].level not in levels or x.first_start_ms < 0 or n.first_start_ms < 0:
            continue
        wait_x = (x.first_start_ms - x.submit_ms) / 1000
        wait_n = (n.first_start_ms - n.submit_ms) / 1000
        if wait_x > wait_n + MORE_S:
            out[job_id] = (wait_n, wait_x)
    return out


SIZES = ((1, 2, "1-2 GPUs"), (3, 7, "3-7 GPUs"), (8, 1 << 30, "8+ GPUs"))


def waits_by_size(outcomes, specs) -> list[tuple[int, str, int, float, float]]:
    """(level, size, jobs, mean wait under none, mean wait under xirang), hours, per level and
    job size, over the jobs that started under both."""
    sums: dict = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for job_id, spec in sorted(specs.items()):
        none, xirang = outcomes["none"][job_id], outcomes["xirang"][job_id]
        if none.first_start_ms < 0 or xirang.first_start_ms < 0:
            continue
        size = next(k for k, (low, high, _) in enumerate(SIZES) if low <= spec.gpus <= high)
        row = sums[(spec.level, size)]
        row[0] += 1
        row[1] += (none.first_start_ms - spec.submit_ms) / 3.6e6
        row[2] += (xirang.first_start_ms - spec.submit_ms) / 3.6e6
    return [(level, SIZES[size][2], n, a / n, b / n) for (level, size), (n, a, b) in sorted(sums.items())]


def why(records, targets: dict) -> dict:
    """Time-weighted reasons (seconds) over the targets' waits, re-stepping the core."""
    inputs = [r.event.input for r in records if isinstance(r.event, T.InputAccepted)]
    state = new_state()
    found = {
        "reason": collections.Counter(),
        "reason_with_room": collections.Counter(),
        "holder": collections.Counter(),
        "ahead": collections.Counter(),
        "back_gpu_s": 0.0,
        "idle_gpu_s": 0.0,
        "wait_s": 0.0,
    }
    for i, inp in enumerate(inputs):
        state, _ = step(state, inp)
        dt = ((inputs[i + 1].t if i + 1 < len(inputs) else inp.t) - inp.t) / 1000
        if dt <= 0:
            continue
        c = state.canonical
        nodes = [c.nodes[name] for name in sorted(c.nodes) if c.nodes[name].up]
        room = max((node.holder.count("") for node in nodes), default=0)
        idle = sum(node.holder.count("") for node in nodes)
        back = sum(
            c.jobs[h].gpus for h in {h for node in nodes for h in node.holder if h} if c.jobs[h].preempt_count
        )
        ahead = None
        for job_id in sorted(targets):
            job = c.jobs.get(job_id)
            if job is None or job.state != "queued" or job.first_start_t:
                continue
            pending = explain(state, job_id)
            found["reason"][pending.code] += dt
            found["wait_s"] += dt
            found["back_gpu_s"] += back * dt
            found["idle_gpu_s"] += idle * dt
            if room >= min(job.gpus, 8):
                found["reason_with_room"][pending.code] += dt
            if pending.code == "reservation":
                holders = sorted(
                    {h for _, h in reserved_nodes(state).values() if h != job_id and h in c.jobs}
                )
                for h in holders:
                    holder = c.jobs[h]
                    key = (holder.level, holder.eff_level, holder.gpus >= 8, holder.preempt_count > 0)
                    found["holder"][key] += dt / len(holders)
            elif pending.code == "priority":
                ahead = ahead or _ahead_by_kind(c)
                kinds = ahead[job.eff_level]
                total = sum(kinds) or 1
                for k, name in enumerate(("requeued victims", "aged", "at their own level")):
                    found["ahead"][name] += dt * kinds[k] / total
    return found


def _ahead_by_kind(c) -> list[list[int]]:
    """Per queue level: the GPUs queued at more urgent levels, by kind (requeued victims, aged
    jobs, jobs at their own level)."""
    per = [[0, 0, 0] for _ in range(8)]
    for job_id in sorted(c.jobs):
        q = c.jobs[job_id]
        if q.state == "queued":
            kind = 0 if q.preempt_count > 0 else (1 if q.eff_level < q.level else 2)
            per[q.eff_level][kind] += q.gpus
    ahead = [[0, 0, 0]]
    for level in range(8):
        ahead.append([ahead[-1][k] + per[level][k] for k in range(3)])
    return ahead


def main() -> None:
    """Print the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default="bursts:64")
    parser.add_argument("--gpus", type=int, default=64)
    parser.add_argument("--levels", default="6,7")
    parser.add_argument("--limit", type=int, default=0, help="only the first N jobs (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default=None, help="xirang policy TOML")
    parser.add_argument("--sizes-only", action="store_true", help="only the table by level and job size")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    outcomes, records, specs = run(args.trace, args.gpus, args.seed, args.limit or None, args.policy)
    print("mean wait by level and job size, none / xirang (hours), and xirang's extra hours in all:")
    for level, words, n, none_h, xirang_h in waits_by_size(outcomes, specs):
        extra_h = n * (xirang_h - none_h)
        print(f"  L{level} {words:>8}: {n:5d} jobs, {none_h:7.1f} / {xirang_h:7.1f} h, {extra_h:+9.0f} h")
    if args.sizes_only:
        return
    targets = longer_waits(outcomes, specs, levels)
    at_levels = sum(1 for s in specs.values() if s.level in levels)
    extra_h = sum(x - n for n, x in targets.values()) / 3600
    print(
        f"{len(targets)} of {at_levels} jobs of levels {levels} waited over a minute longer than under none"
    )
    print(f"({extra_h:.0f} h longer in all); their waits under xirang, by the core's reason:")
    found = why(records, targets)
    total = found["wait_s"] or 1
    for code, s in found["reason"].most_common():
        print(f"  {code}: {s / 3600:.0f} h ({s / total:.0%})")
    room = sum(found["reason_with_room"].values())
    print(f"while a node had room for the gang ({room / total:.0%} of those waits), by reason:")
    for code, s in found["reason_with_room"].most_common():
        print(f"  {code}: {s / 3600:.0f} h ({s / (room or 1):.0%})")
    held = sum(found["holder"].values()) or 1
    print("the reservations in their way, by holder (level, queue level, gang, back from a preemption):")
    for (level, eff, whole, back), s in found["holder"].most_common(10):
        gang = "whole-node gang" if whole else "small"
        came = "requeued victim" if back else "never preempted"
        print(f"  L{level} queued at L{eff}, {gang}, {came}: {s / 3600:.0f} h ({s / held:.0%})")
    ahead = sum(found["ahead"].values()) or 1
    print(
        "the more urgent queued GPUs ahead of them:",
        {k: f"{v / ahead:.0%}" for k, v in found["ahead"].items()},
    )
    print(
        f"over those waits, on average: {found['back_gpu_s'] / total:.1f} GPUs held by jobs back from a"
        f" preemption, {found['idle_gpu_s'] / total:.1f} idle, of {args.gpus}"
    )


if __name__ == "__main__":
    main()
