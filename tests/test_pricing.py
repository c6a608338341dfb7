"""What a victim costs (core/rules/pricing.py), as tables: the level a victim's losses are
weighed at, the recovery boost, an urgent job's priced wait, and a victim's notice-to-safe
point time."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Job
from core.model.policy import Policy
from core.rules.pricing import (
    priced_level,
    queued_fitting,
    recovery_boost,
    victim_safe_point_ms,
    wait_priced_s,
)

P = Policy()


def job(level: int, **fields) -> Job:
    base = Job(
        id="v", team="t", user="u", kind="job", level=level, requested_level=level, eff_level=level,
        gpus=1, gpu_models=[], est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0, restore_cost_ms=0,
        preemptible=True,
    )  # fmt: skip
    return msgspec.structs.replace(base, **fields)


# (victim level, boost, protected until, now, preemptor level, priced at)
@pytest.mark.parametrize(
    ("level", "boost", "until", "t", "preemptor", "priced"),
    [
        (6, 0, 0, 100, 0, 6),
        (6, 2, 200, 100, 0, 4),  # boosted while protected
        (6, 2, 50, 100, 0, 6),  # protection over: its own level
        (6, 5, 200, 100, 3, 4),  # never at the preemptor's level or above
        (6, 9, 200, 100, 0, 1),
    ],
)
def test_priced_level_table(level, boost, until, t, preemptor, priced):
    assert priced_level(job(level, boost=boost, protected_until_t=until), t, preemptor) == priced


@pytest.mark.parametrize(
    ("count", "waited_ms", "boost"),
    [
        (0, 0, 0),
        (1, 0, min(P.requeue_boost_max, P.requeue_boost_per_preemption)),
        (1, P.requeue_boost_wait_ms, min(P.requeue_boost_max, P.requeue_boost_per_preemption + 1)),
        (100, 0, P.requeue_boost_max),
    ],
)
def test_recovery_boost_table(count, waited_ms, boost):
    assert recovery_boost(P, count, waited_ms) == boost


@pytest.mark.parametrize(
    ("level", "wait_s", "priced_s"),
    [
        (3, 100, 100.0),  # below the urgent levels a second is a second
        (1, P.urgent_wait_target_s, P.urgent_wait_target_s),
        (1, P.urgent_wait_target_s + 10, P.urgent_wait_target_s + 10 * P.urgent_overdue_factor),
    ],
)
def test_wait_priced_s_table(level, wait_s, priced_s):
    assert wait_priced_s(P, level, int(wait_s * 1000)) == pytest.approx(priced_s)


@pytest.mark.parametrize(("interval", "learned", "ms"), [(0, 7000, 7000), (10_000, 7000, 5000)])
def test_a_victims_safe_point_is_half_its_interval_when_known(interval, learned, ms):
    assert victim_safe_point_ms(job(6, safe_point_interval_ms=interval), learned) == ms


def test_queued_fitting_counts_the_gangs_that_fit():
    assert queued_fitting({1: 3, 4: 8, 8: 16}, 4) == 11
