"""scripts/why_waits.py's table by level and job size: which jobs carry a level's extra wait."""

from __future__ import annotations

import importlib.util
import pathlib

from replay.simhost import JobOutcome
from replay.workload import TraceJob

_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "scripts" / "why_waits.py"
_spec = importlib.util.spec_from_file_location("why_waits", _SCRIPT)
assert _spec is not None and _spec.loader is not None
why_waits = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(why_waits)

HOUR_MS = 3_600_000


def _job(job_id: str, level: int, gpus: int) -> TraceJob:
    return TraceJob(job_id, 0, HOUR_MS, gpus, "t", "u", level, ["V100"], 0, 0, 0, HOUR_MS)


def _out(job: TraceJob, start_ms: int) -> JobOutcome:
    return JobOutcome(
        job.id, job.team, job.user, job.level, job.gpus, job.submit_ms, job.duration_ms, start_ms
    )


def test_the_mid_size_jobs_extra_wait_is_told_apart_from_the_gangs_gain():
    specs = {
        j.id: j for j in (_job("small", 5, 1), _job("mid-a", 5, 4), _job("mid-b", 5, 4), _job("gang", 5, 8))
    }
    none = {"small": 0, "mid-a": 0, "mid-b": 2 * HOUR_MS, "gang": 40 * HOUR_MS}
    xirang = {"small": 0, "mid-a": 10 * HOUR_MS, "mid-b": 12 * HOUR_MS, "gang": 20 * HOUR_MS}
    outcomes = {
        "none": {j: _out(specs[j], t) for j, t in none.items()},
        "xirang": {j: _out(specs[j], t) for j, t in xirang.items()},
    }
    rows = why_waits.waits_by_size(outcomes, specs)
    assert rows == [
        (5, "1-2 GPUs", 1, 0.0, 0.0),
        (5, "3-7 GPUs", 2, 1.0, 11.0),
        (5, "8+ GPUs", 1, 40.0, 20.0),
    ]


def test_a_job_that_never_started_under_either_policy_is_left_out():
    specs = {j.id: j for j in (_job("ran", 3, 2), _job("never", 3, 2))}
    outcomes = {
        "none": {"ran": _out(specs["ran"], HOUR_MS), "never": _out(specs["never"], -1)},
        "xirang": {"ran": _out(specs["ran"], 3 * HOUR_MS), "never": _out(specs["never"], HOUR_MS)},
    }
    assert why_waits.waits_by_size(outcomes, specs) == [(3, "1-2 GPUs", 1, 1.0, 3.0)]
