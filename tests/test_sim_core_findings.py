"""Core behaviours the simulator exposed, each as a minimal reproduction. Found wrong at
first (marked xfail), they now pass: a starving job reserves only the nodes where it will
fit soonest, as EASY backfill does, instead of idling every node of its GPU models."""

from core import new_state, step
from core import types as T

HOUR_MS = 3_600_000


def _started(records) -> set[str]:
    return {r.event.job for r in records if isinstance(r.event, T.JobStartRequested)}


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
    _, records = step(
        state,
        T.Submit(
            t=2000 + 2 * HOUR_MS + 2000, job="small", team="z", user="w", level=5, gpus=1, est_runtime_s=600
        ),
    )
    # Node b has 4 free GPUs the gang cannot use before `long` ends in ~100 h.
    assert "small" in _started(records)
