"""Scenario tests for a checkpoint's copies (given inputs, expect events): every run is told
how many verified copies its SDK checkpoints need (the policy's `checkpoint_copies`, two by
default), a resume's report of the copy it read reaches the log, and the second copy's write
is in the price and the deadline of a save at a notice (`checkpoint_copy_cost_ratio`: the
copies are written side by side, so only a second copy slower than the first adds time)."""

from __future__ import annotations

import msgspec
import pytest

from core import types as T

from scenario import MIN, Run, node, of, start_all, submit

NOTICE_T = 60 * MIN + 2000
WRITE_BEGAN_T = 60 * MIN + 1000
CKPT_COST_MS = 300_000


def test_every_start_and_resume_asks_for_two_verified_copies_by_default():
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("train", 6, 8, est_runtime_s=3600, ckpt_cost_s=30))
    start_all(run, 2000)
    run.at(
        60 * MIN, T.CheckpointSaved(job="train", step=7, digest="sha256:c7", bytes=1, path="xr-ckpt:a1/5-0")
    )
    events = run.at(61 * MIN, T.Requeue(job="train", by="u1"))
    events += run.at(62 * MIN, T.Tick())
    (start,) = run.events(T.JobStartRequested)
    (resume,) = of(events, T.JobResumeRequested)
    assert (start.ckpt_copies, resume.ckpt_copies) == (2, 2)
    assert resume.ckpt_step == 7


def test_a_policy_of_one_copy_asks_for_one():
    run = Run(checkpoint_copies=1)
    run.at(0, node("a1"))
    run.at(1000, submit("train", 6, 8))
    (start,) = run.events(T.JobStartRequested)
    assert start.ckpt_copies == 1


@pytest.mark.parametrize("copies", [0, 3])
def test_a_policy_of_other_copy_counts_is_refused_with_what_to_fix(copies):
    run = Run()
    events = run.at(1000, T.SetPolicy(params={"checkpoint_copies": copies}))
    (rejected,) = of(events, T.InputRejected)
    assert "checkpoint_copies must be 1 or 2" in rejected.detail


def resumed_job() -> Run:
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("train", 6, 8, est_runtime_s=3600))
    start_all(run, 2000)
    run.at(
        60 * MIN, T.CheckpointSaved(job="train", step=7, digest="sha256:c7", bytes=1, path="xr-ckpt:a1/5-0")
    )
    run.at(61 * MIN, T.Requeue(job="train", by="u1"))
    run.at(62 * MIN, T.Tick())
    assert run.job_state("train") == "starting"
    return run


def test_a_resume_from_the_second_copy_is_recorded_as_such():
    run = resumed_job()
    events = run.at(63 * MIN, T.Started(job="train", restored_copy=2))
    assert [(e.job, e.restored_copy) for e in of(events, T.JobRunning)] == [("train", 2)]


def test_a_start_that_names_no_copy_records_none_as_before():
    run = resumed_job()
    events = run.at(63 * MIN, T.Started(job="train"))
    (running,) = of(events, T.JobRunning)
    assert running.restored_copy is msgspec.UNSET
    # neither the fact nor the record carries the field: both read byte for byte as before
    assert b"restored_copy" not in msgspec.json.encode(T.Started(job="train"))
    assert b"restored_copy" not in T.encode(running)


def test_a_copy_number_out_of_range_is_refused_and_the_job_keeps_starting():
    run = resumed_job()
    events = run.at(63 * MIN, T.Started(job="train", restored_copy=3))
    (rejected,) = of(events, T.InputRejected)
    assert "restored_copy" in rejected.detail
    assert run.job_state("train") == "starting"


def writing_victim(**params) -> T.PreemptionPlanned:
    """A level-6 job with 300 s checkpoints begins a write a second before a level-3 job
    needs its node; the deadline covers the rest of the write, all its copies."""
    run = Run(notice_covers_save_in_progress=True, **params)
    run.at(0, node("a1"))
    run.at(1000, submit("batch", 6, 8, team="search", est_runtime_s=8 * 3600, ckpt_cost_s=300))
    start_all(run, 2000)
    run.at(60 * MIN, T.CheckpointSaved(job="batch", step=1, digest="sha256:b1", bytes=1))
    run.at(WRITE_BEGAN_T, T.CheckpointStarted(job="batch"))
    events = run.at(NOTICE_T, submit("tuning", 3, 8, team="nlp", est_runtime_s=3600))
    (plan,) = of(events, T.PreemptionPlanned)
    return plan


def test_a_second_copy_no_slower_than_the_first_adds_nothing_to_the_deadline():
    slack = Run().state.canonical.policy.deadline_slack_ms
    for params in ({}, {"checkpoint_copies": 1}, {"checkpoint_copy_cost_ratio": 1.0}):
        assert writing_victim(**params).deadline_t == WRITE_BEGAN_T + CKPT_COST_MS + slack


def test_a_second_copy_slower_than_the_first_extends_the_deadline_by_the_difference():
    slack = Run().state.canonical.policy.deadline_slack_ms
    plan = writing_victim(checkpoint_copy_cost_ratio=1.5)
    assert plan.deadline_t == WRITE_BEGAN_T + int(CKPT_COST_MS * 1.5) + slack
    assert writing_victim(checkpoint_copy_cost_ratio=1.5, checkpoint_copies=1).deadline_t == (
        WRITE_BEGAN_T + CKPT_COST_MS + slack
    )


def saving_victim_plan(**params) -> T.PreemptionPlanned:
    """A level-6 job with an hour of unsaved progress and 60 s saves, preempted by a level-3
    job: it saves at the notice (cheaper than the hour it would lose)."""
    run = Run(**params)
    run.at(0, node("a1"))
    run.at(1000, submit("batch", 6, 8, team="search", est_runtime_s=8 * 3600, ckpt_cost_s=60))
    start_all(run, 2000)
    events = run.at(62 * MIN, submit("tuning", 3, 8, team="nlp", est_runtime_s=3600))
    (plan,) = of(events, T.PreemptionPlanned)
    (notice,) = of(events, T.VictimNotified)
    assert notice.checkpoint_needed
    return plan


def test_the_victims_price_counts_a_slower_second_copy_and_only_then():
    one = saving_victim_plan(checkpoint_copies=1)
    assert saving_victim_plan().cost == one.cost  # the default: the host's disk keeps up
    slow = saving_victim_plan(checkpoint_copy_cost_ratio=3.0)
    assert slow.cost > one.cost
    assert slow.deadline_t > one.deadline_t


def job_writing_its_own(**params) -> Run:
    """A job that reports a checkpoint it wrote itself (a folder), then is requeued."""
    run = Run(**params)
    run.at(0, node("a1"))
    run.at(1000, submit("train", 6, 8, est_runtime_s=3600))
    start_all(run, 2000)
    run.at(
        60 * MIN,
        T.CheckpointSaved(job="train", step=7, digest="sha256-tree:c7", bytes=1, path="/ck/train/s7"),
    )
    return run


def test_a_resume_point_of_a_checkpoint_the_job_wrote_names_the_host_that_copied_it():
    run = job_writing_its_own()
    events = run.at(61 * MIN, T.Requeue(job="train", by="u1"))
    events += run.at(62 * MIN, T.Tick())
    (resume,) = of(events, T.JobResumeRequested)
    assert [(p.path, p.node) for p in resume.resume_points] == [("/ck/train/s7", "a1")]


def test_under_older_defaults_a_resume_point_names_no_host_and_reads_as_before():
    run = job_writing_its_own(host_copies_job_checkpoints=False)
    events = run.at(61 * MIN, T.Requeue(job="train", by="u1"))
    events += run.at(62 * MIN, T.Tick())
    (resume,) = of(events, T.JobResumeRequested)
    assert resume.resume_points[0].node is msgspec.UNSET
    assert b'"node"' not in msgspec.json.encode(resume.resume_points[0])


def victim_writing_its_own(**params) -> T.PreemptionPlanned:
    """As `writing_victim`, for a job whose checkpoints are files it writes itself."""
    run = Run(notice_covers_save_in_progress=True, **params)
    run.at(0, node("a1"))
    run.at(1000, submit("batch", 6, 8, team="search", est_runtime_s=8 * 3600, ckpt_cost_s=300))
    start_all(run, 2000)
    run.at(60 * MIN, T.CheckpointSaved(job="batch", step=1, digest="sha256:b1", bytes=1, path="/ck/batch/s1"))
    run.at(WRITE_BEGAN_T, T.CheckpointStarted(job="batch"))
    events = run.at(NOTICE_T, submit("tuning", 3, 8, team="nlp", est_runtime_s=3600))
    (plan,) = of(events, T.PreemptionPlanned)
    return plan


def test_the_hosts_copy_of_a_checkpoint_the_job_wrote_follows_the_write_in_the_deadline():
    slack = Run().state.canonical.policy.deadline_slack_ms
    assert victim_writing_its_own().deadline_t == WRITE_BEGAN_T + int(CKPT_COST_MS * 1.5) + slack
    for params in ({"checkpoint_copies": 1}, {"host_copies_job_checkpoints": False}):
        assert victim_writing_its_own(**params).deadline_t == WRITE_BEGAN_T + CKPT_COST_MS + slack
