"""Each team's fair share (core/rules/shares.py), as tables: water-filling by quota, the
within/above share verdicts, and whether a team may reclaim for a job."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Job
from core.model.policy import Policy
from core.rules.shares import (
    HELD_AND_USED,
    HELD_NOW,
    BEYOND_SHARE,
    NOTHING_LENT,
    RECLAIM_OFF,
    above_share,
    level_share_used,
    lent_gpus,
    max_min_shares,
    reclaim_refusal,
    within_share,
)


@pytest.mark.parametrize(
    ("demand", "capacity", "weight", "shares"),
    [
        ({"a": 10, "b": 10}, 10, None, {"a": 5.0, "b": 5.0}),
        ({"a": 2, "b": 10}, 10, None, {"a": 2.0, "b": 8.0}),  # who asks for less gets it all
        ({"a": 10, "b": 10}, 12, {"a": 3.0, "b": 1.0}, {"a": 9.0, "b": 3.0}),  # by quota
        ({"a": 1, "b": 10, "c": 10}, 9, None, {"a": 1.0, "b": 4.0, "c": 4.0}),
        ({}, 8, None, {}),
    ],
)
def test_max_min_shares_table(demand, capacity, weight, shares):
    assert max_min_shares(demand, capacity, weight) == pytest.approx(shares)


@pytest.mark.parametrize(
    ("held", "gpus", "share", "within", "above"),
    [(4, 4, 8.0, True, False), (4, 5, 8.0, False, False), (8, 0, 8.0, True, False), (9, 0, 8.0, False, True)],
)
def test_within_and_above_share(held, gpus, share, within, above):
    assert within_share(held, gpus, share) is within
    assert above_share(held, share) is above


def job(level: int, gpus: int, team: str = "a") -> Job:
    return Job(
        id="j", team=team, user="u", kind="job", level=level, requested_level=level, eff_level=level,
        gpus=gpus, gpu_models=[], est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0, restore_cost_ms=0,
        preemptible=True,
    )  # fmt: skip


ON = msgspec.structs.replace(Policy(), fair_share_guarantee=True, fair_share_from_level=2)


# (policy, job level, gpus, a's share, a holds, b's share, b holds, refusal)
@pytest.mark.parametrize(
    ("p", "level", "gpus", "held_a", "held_b", "refusal"),
    [
        (ON, 3, 2, 2, 14, ""),  # a holds 2 of 8, b lends 6
        (Policy(), 3, 2, 2, 14, RECLAIM_OFF),
        (ON, 1, 2, 2, 14, RECLAIM_OFF),  # the guarantee covers levels from 2 on
        (ON, 3, 7, 2, 14, BEYOND_SHARE),  # 2 + 7 > 8
        (ON, 3, 2, 2, 8, NOTHING_LENT),  # b holds no more than its share
        (ON, 3, 4, 4, 11, NOTHING_LENT),  # b lends 3, the job needs 4
    ],
)
def test_reclaim_refusal_table(p, level, gpus, held_a, held_b, refusal):
    shares = {"a": 8.0, "b": 8.0}
    held = {"a": held_a, "b": held_b}
    assert reclaim_refusal(p, job(level, gpus), shares, held, lent_gpus(shares, held)) == refusal


INSTANT = msgspec.structs.replace(Policy(), fair_share_half_life_s=0.0)
DECAYS = msgspec.structs.replace(Policy(), fair_share_half_life_s=7 * 24 * 3600.0)


@pytest.mark.parametrize(
    ("policy", "held", "used", "quota", "verdict"),
    [
        (INSTANT, 6, 0.0, 3.0, (2.0, HELD_NOW)),
        (INSTANT, 0, 5.0, 1.0, (0.0, HELD_NOW)),  # no half-life: past use does not count
        (DECAYS, 0, 5.0, 1.0, (5.0, HELD_AND_USED)),
        (DECAYS, 6, 3.0, 3.0, (3.0, HELD_AND_USED)),
        (DECAYS, 0, 0.0, 2.0, (0.0, HELD_AND_USED)),
    ],
)
def test_level_share_used_table(policy, held, used, quota, verdict):
    assert level_share_used(policy, held, used, quota) == verdict
