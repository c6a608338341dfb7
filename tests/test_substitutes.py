"""Compatible GPU models (core/rules/substitutes.py), as tables: which models may stand in
for a job's own, and the extra run time a substitute is priced at."""

from __future__ import annotations

import msgspec
import pytest

from core.model.entities import Job
from core.model.policy import Policy
from core.rules.substitutes import substitute_penalty, substitutes

P = msgspec.structs.replace(
    Policy(), gpu_substitutes={"H100": {"A100": 0.5, "L4": 2.0}, "A100": {"L4": 1.0, "H100": 0.0}}
)


def job(models: list[str], level: int = 3, gpus: int = 4) -> Job:
    return Job(
        id="j", team="t", user="u", kind="job", level=level, requested_level=level, eff_level=level,
        gpus=gpus, gpu_models=models, est_runtime_ms=1, ckpt_interval_ms=0, ckpt_cost_ms=0,
        restore_cost_ms=0, preemptible=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("models", "stand_ins"),
    [
        (["H100"], {"A100": 0.5, "L4": 2.0}),
        (["A100"], {"H100": 0.0, "L4": 1.0}),
        (["A100", "H100"], {"L4": 1.0}),  # its own models are not substitutes; the least slowdown
        ([], {}),  # any model: nothing to substitute
        (["L4"], {}),
    ],
)
def test_substitutes_table(models, stand_ins):
    assert substitutes(P, job(models)) == stand_ins


def test_no_substitutes_without_the_policy():
    assert substitutes(Policy(), job(["H100"])) == {}


def test_the_penalty_is_the_extra_run_time_at_the_jobs_level_weight():
    assert substitute_penalty(P, job(["H100"]), 3_600_000, 0.5) == pytest.approx(P.level_weight[3] * 4 * 1800)
