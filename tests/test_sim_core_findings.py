"""Core behaviours the simulator exposed that look wrong, each as a minimal reproduction
marked xfail(strict=True): when the lead changes core so that it passes, the mark must go.
"""

import pytest

from core import new_state, step
from core import types as T

HOUR_MS = 3_600_000


def _started(records) -> set[str]:
    return {r.event.job for r in records if isinstance(r.event, T.JobStartRequested)}


@pytest.mark.xfail(strict=True, reason=(
    "starvation guard: a job blocked for starvation_wait_ms stops every placement on its GPU "
    "models, including on nodes it cannot use for a long time; on Philly (512 GPUs, seed 0) "
    "this keeps 20-60 GPUs idle for hours behind an 8-32 GPU head job while thousands of "
    "1-GPU jobs wait (xirang mean wait 244 h vs 15 h for no preemption)"))
def test_a_starving_gang_does_not_idle_nodes_it_is_not_waiting_for():
    state = new_state()
    inputs = [
        T.NodeUp(t=0, node="a", gpu_model="V100", gpus=8),
        T.NodeUp(t=0, node="b", gpu_model="V100", gpus=8),
        # Node a drains soon, node b holds a long job: the 8-GPU gang will start on a.
        T.Submit(t=0, job="soon", team="x", user="u", level=3, gpus=7, est_runtime_s=3600),
        T.Submit(t=0, job="long", team="x", user="u", level=3, gpus=4, est_runtime_s=360_000),
        T.Started(t=1000, job="soon"),
        T.Started(t=1000, job="long"),
        # Level 5 may not preempt: it can only wait.
        T.Submit(t=2000, job="gang", team="y", user="v", level=5, gpus=8, est_runtime_s=3600),
        T.Tick(t=2000 + 2 * HOUR_MS + 1000),
    ]
    for inp in inputs:
        step(state, inp)
    _, records = step(state, T.Submit(t=2000 + 2 * HOUR_MS + 2000, job="small", team="z",
                                      user="w", level=5, gpus=1, est_runtime_s=600))
    # Node b has 4 free GPUs the gang cannot use before `long` ends in ~100 h.
    assert "small" in _started(records)
