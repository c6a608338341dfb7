"""Two passes of work a step skips when their outcome is already sure, and the run decides
exactly as without them:

- a preemption plan for a job below the urgent levels whose last decline was
  `benefit_below_cost` stops pricing victims and returns that decline as soon as the set
  that would be chosen is sure to cost more than its weighted natural wait can beat
  (`core.rules.benefit.priced_out_at`, `core.passes.bounded.choose_on_one_node_bounded(...,
  priced_out_at=)`): nothing is recorded for a decline the job had already;
- a placement pass passes over a level whose every queued job is larger than the free GPUs
  once no head reservation is left to make (`_PlacementPass.passes_over`), counting them
  against the backfill budget as reading them one by one would.

On a busy simulated pool (the pool full most of the time, levels 2-4 blocked behind
unsaved work, hosts reporting every checkpoint) both fire often, and the per-job outcomes,
steps and end time are those of the run without them; and at every plan of that run, a
sure decline is the decline the full plan comes to.
"""

from __future__ import annotations

import random

import core.passes.placement as PP
import core.passes.plan as PL
from core.passes.plan import Decline
from core.passes.victims import PRICED_OUT
from replay.sim import Cluster, simulate
from sim_helpers import job, workload


def _busy_workload(count: int):
    """A pool kept full by one-GPU level-7 work of mixed lengths that saves rarely (hours of
    unsaved work: dear victims), releases every few minutes (short natural waits), and
    level 2-4 jobs queued behind it; a few urgent jobs and gangs besides."""
    rng = random.Random(5)
    jobs = []
    for i in range(count):
        background = i % 3 != 2
        urgent = not background and rng.random() < 0.15
        if background:
            level, gpus, duration_s, interval_s = 7, 1, rng.randint(1800, 36000), 4 * 3600
        elif urgent:
            level, gpus, duration_s, interval_s = rng.choice((0, 1)), rng.choice((1, 2)), 1800, 600
        else:
            level, gpus, duration_s, interval_s = rng.choice((2, 3, 4)), rng.choice((1, 1, 2, 8)), 3600, 900
        jobs.append(
            job(
                f"j{i:03d}",
                submit_s=i * 60,
                duration_s=duration_s,
                gpus=gpus,
                level=level,
                team=f"t{rng.randrange(12)}" if background else rng.choice(("ops", "train", "eval")),
                user=f"u{i % 17}",
                ckpt_interval_s=interval_s,
                ckpt_cost_s=20,
                est_runtime_s=duration_s,
            )
        )
    return workload(*jobs)


def _run(monkeypatch, shortcuts: bool):
    counts = {"sure_declines": 0, "levels_passed_over": 0}
    priced_out_at = PL.priced_out_at
    choose = PL.choose_on_one_node_bounded
    passes_over = PP._PlacementPass.passes_over

    def threshold(*args):
        return priced_out_at(*args) if shortcuts else None

    def choosing(*args, **kwargs):
        answer = choose(*args, **kwargs)
        counts["sure_declines"] += answer == PRICED_OUT
        return answer

    def passing(self, level):
        if not shortcuts:
            return False
        answer = passes_over(self, level)
        counts["levels_passed_over"] += answer
        return answer

    monkeypatch.setattr(PL, "priced_out_at", threshold)
    monkeypatch.setattr(PL, "choose_on_one_node_bounded", choosing)
    monkeypatch.setattr(PP._PlacementPass, "passes_over", passing)
    config = {"tick_s": 60.0, "report_periodic_checkpoints": True}
    result = simulate(_busy_workload(300), Cluster.uniform(64, 8), "xirang", config, seed=0)
    monkeypatch.undo()
    return result, counts


def test_sure_declines_and_passed_over_levels_decide_as_the_full_work(monkeypatch):
    full, full_counts = _run(monkeypatch, shortcuts=False)
    quick, quick_counts = _run(monkeypatch, shortcuts=True)
    assert full_counts == {"sure_declines": 0, "levels_passed_over": 0}
    assert quick_counts["sure_declines"] > 20, quick_counts
    assert quick_counts["levels_passed_over"] > 20, quick_counts
    assert quick.jobs == full.jobs
    assert (quick.steps, quick.end_ms, quick.extra) == (full.steps, full.end_ms, full.extra)


def test_every_sure_decline_is_the_decline_of_the_full_plan(monkeypatch):
    """At every plan the busy run makes, the plan with the job's last decline known comes to
    the same decision as the full plan (a sure decline: the same reason, unpriced)."""
    import core.passes.preemption as PPS

    planned = PPS.plan_preemption
    counts = {"sure": 0, "plans": 0}

    def compared(state, job, reclaim=False, known_decline=""):
        full = planned(state, job, reclaim)
        quick = planned(state, job, reclaim, known_decline)
        counts["plans"] += 1
        if isinstance(quick, Decline) and isinstance(full, Decline):
            assert quick.reason == full.reason, (job.id, quick, full)
            counts["sure"] += (quick.benefit, quick.cost) != (full.benefit, full.cost)
        else:
            assert quick == full, (job.id, quick, full)
        return quick

    monkeypatch.setattr(PPS, "plan_preemption", compared)
    config = {"tick_s": 60.0, "report_periodic_checkpoints": True}
    simulate(_busy_workload(300), Cluster.uniform(64, 8), "xirang", config, seed=0)
    assert counts["sure"] > 20, counts
