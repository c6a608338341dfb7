"""A notice's deadline and late releases (core/rules/notices.py), as tables."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Job
from core.model.policy import Policy
from core.rules.notices import (
    DEADLINE_GRACE,
    DEADLINE_MIN,
    DEADLINE_RELEASE,
    DEADLINE_SAVE_IN_PROGRESS,
    LATE_COUNTED,
    LATE_NOT_COUNTED,
    NOT_LATE,
    late_release_counts,
    notice_deadline,
    save_left_ms,
)

T0 = 1_000_000


def victim(ckpt_started_t: int = 0, ckpt_cost_ms: int = 300_000, grace_ms: int = 0, **kw) -> Job:
    return Job(
        id="v", team="t", user="u", kind="job", level=6, requested_level=6, eff_level=6, gpus=8,
        gpu_models=["A100"], est_runtime_ms=1, ckpt_interval_ms=1, ckpt_cost_ms=ckpt_cost_ms,
        restore_cost_ms=0, preemptible=True, ckpt_started_t=ckpt_started_t, grace_ms=grace_ms, **kw,
    )  # fmt: skip


OFF = msgspec.structs.replace(
    Policy(), notice_covers_save_in_progress=False, late_release_counts_as_preemption=False
)
COVERS = msgspec.structs.replace(OFF, notice_covers_save_in_progress=True)


@pytest.mark.parametrize(
    ("policy", "victims", "ready_ms", "wait_ms", "reason"),
    [
        (OFF, [victim()], 10_000, 180_000, DEADLINE_MIN),  # slack 120 s, minimum 180 s
        (OFF, [victim()], 100_000, 220_000, DEADLINE_RELEASE),
        (OFF, [victim(grace_ms=200_000)], 10_000, 320_000, DEADLINE_GRACE),
        # A 300 s write that began 1 s before the notice: not covered by default...
        (OFF, [victim(ckpt_started_t=T0 - 1000)], 30_000, 180_000, DEADLINE_MIN),
        # ... covered with the switch: the 299 s left plus the slack.
        (COVERS, [victim(ckpt_started_t=T0 - 1000)], 30_000, 419_000, DEADLINE_SAVE_IN_PROGRESS),
        (COVERS, [victim(), victim(ckpt_started_t=T0 - 250_000)], 30_000, 180_000, DEADLINE_MIN),
        (COVERS, [victim(ckpt_started_t=T0 - 400_000)], 0, 180_000, DEADLINE_MIN),  # overran: 0 left
        (COVERS, [victim(ckpt_started_t=T0)], 300_000, 420_000, DEADLINE_RELEASE),  # a tie: the plainer
    ],
)
def test_notice_deadline_table(policy, victims, ready_ms, wait_ms, reason):
    assert notice_deadline(policy, T0, victims, ready_ms) == (T0 + wait_ms, reason)


@pytest.mark.parametrize(
    ("bound_ms", "wait_ms", "reason"),
    [
        (0, 419_000, DEADLINE_SAVE_IN_PROGRESS),  # the level waits for saves
        (30_000, 180_000, DEADLINE_MIN),  # an urgent level's bound: it lets go from its last checkpoint
        (600_000, 419_000, DEADLINE_SAVE_IN_PROGRESS),  # within the bound: waited for
    ],
)
def test_a_write_in_progress_is_covered_only_where_the_preemptors_level_waits_for_it(
    bound_ms, wait_ms, reason
):
    victims = [victim(ckpt_started_t=T0 - 1000)]
    assert notice_deadline(COVERS, T0, victims, 30_000, bound_ms) == (T0 + wait_ms, reason)


@pytest.mark.parametrize(
    ("started", "left"), [(0, 0), (T0, 300_000), (T0 - 100_000, 200_000), (T0 - 301_000, 0)]
)
def test_save_left_table(started, left):
    assert save_left_ms(victim(ckpt_started_t=started), T0, Policy()) == left


COUNTS = msgspec.structs.replace(OFF, late_release_counts_as_preemption=True)


@pytest.mark.parametrize(
    ("policy", "state", "overdue", "verdict"),
    [
        (COUNTS, "running", "saga-1", (True, LATE_COUNTED)),
        (OFF, "running", "saga-1", (False, LATE_NOT_COUNTED)),
        (COUNTS, "running", "", (False, NOT_LATE)),  # rolled back for another reason
        (COUNTS, "preempting", "saga-1", (False, NOT_LATE)),  # in a saga: an ordinary release
    ],
)
def test_late_release_counts_table(policy, state, overdue, verdict):
    assert late_release_counts(policy, victim(state=state, overdue_saga=overdue)) == verdict
