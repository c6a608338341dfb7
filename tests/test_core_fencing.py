"""Runs are fenced in the core: every start names its run (its record n); a fact of an
earlier run is refused as `stale_run`; a fact without a run (attempt 0) is taken as before."""

from core import new_state, rebuild, state_digest, step
from core import types as T


def run_of(records, job: str) -> int:
    return [
        r.n
        for r in records
        if isinstance(r.event, (T.JobStartRequested, T.JobResumeRequested)) and r.event.job == job
    ][-1]


def test_a_fact_of_a_run_given_away_is_refused_and_the_new_run_counts():
    state, log = new_state(), []
    for inp in (
        T.NodeUp(t=1, node="a", gpu_model="H100", gpus=8),
        T.Submit(t=2, job="j", team="t", user="u", level=3, gpus=8),
    ):
        log += step(state, inp)[1]
    first = run_of(log, "j")
    log += step(state, T.Started(t=3, job="j", attempt=first))[1]
    log += step(state, T.NodeDown(t=4, node="a"))[1]
    log += step(state, T.NodeUp(t=5, node="b", gpu_model="H100", gpus=8))[1]
    second = run_of(log, "j")
    assert second > first
    stale = step(state, T.Finished(t=6, job="j", ok=False, attempt=first))[1]
    assert [r.event.reason for r in stale] == ["stale_run"]
    log += stale
    log += step(state, T.Started(t=7, job="j", attempt=second))[1]
    done = step(state, T.Finished(t=8, job="j", ok=True, attempt=second))[1]
    assert any(isinstance(r.event, T.JobFinished) for r in done)
    log += done
    assert state_digest(rebuild(log).canonical) == state_digest(state.canonical)


def test_a_fact_without_a_run_is_taken_as_before():
    state = new_state()
    step(state, T.NodeUp(t=1, node="a", gpu_model="H100", gpus=8))
    step(state, T.Submit(t=2, job="j", team="t", user="u", level=3, gpus=8))
    _, records = step(state, T.Started(t=3, job="j"))
    assert any(isinstance(r.event, T.JobRunning) for r in records)


def test_a_victim_that_releases_after_its_saga_rolled_back_queues_again_from_its_checkpoint():
    state = new_state()
    step(state, T.NodeUp(t=1, node="a", gpu_model="H100", gpus=8))
    step(state, T.Submit(t=2, job="v", team="t", user="u", level=6, gpus=8, est_runtime_s=600))
    step(state, T.Started(t=3, job="v"))
    step(state, T.CheckpointSaved(t=4, job="v", step=5, digest="sha256:aa", bytes=10))
    assert state.canonical.jobs["v"].state == "running"  # as after a rollback withdrew its notice
    _, records = step(state, T.Released(t=5, job="v"))
    requeued = [r.event for r in records if isinstance(r.event, T.JobRequeued)]
    assert requeued and requeued[0].reason == "released_after_rollback"
    resumed = [r.event for r in records if isinstance(r.event, T.JobResumeRequested)]
    assert resumed and resumed[0].ckpt_step == 5  # the GPUs were free: it resumes at once
