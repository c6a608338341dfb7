"""A person's requests about a job: hold, release, requeue, set_level. The owner may act on
their own jobs, an operator on anyone's; a refused request says why and changes nothing;
the exit status of a failed job is kept."""

from core import types as T
from core.explain import explain
from core.replay import rebuild
from core.model.state import jobs_hash_total

from scenario import Run, node, of, start_all, submit


def busy_pool() -> Run:
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("runner", 5, 8, user="ana", est_runtime_s=600))
    start_all(run, 2000)
    run.at(3000, submit("waiter", 6, 4, user="bo"), submit("other", 6, 4, team="t2", user="cy"))
    return run


def test_a_held_job_is_not_scheduled_until_released():
    run = busy_pool()
    events = run.at(4000, T.Hold(job="waiter", by="bo"))
    assert of(events, T.JobHeld) and run.job_state("waiter") == "held"
    assert explain(run.state, "waiter").code == "held"
    run.at(5000, T.Finished(job="runner", ok=True))
    assert run.job_state("waiter") == "held" and run.job_state("other") == "starting"
    events = run.at(6000, T.ReleaseHold(job="waiter", by="bo"))
    assert of(events, T.JobHoldReleased) and run.job_state("waiter") == "starting"
    rebuild(run.records)  # the log folds back with every digest


def test_only_the_owner_or_an_operator_may_act_on_a_job():
    run = busy_pool()
    before = jobs_hash_total(run.state)  # the jobs, not the log position
    refused = of(run.at(4000, T.Hold(job="waiter", by="cy")), T.InputRejected)
    assert refused[0].reason == "not_your_job" and "operator" in refused[0].detail
    assert jobs_hash_total(run.state) == before
    assert of(run.at(4000, T.Hold(job="waiter")), T.InputRejected)[0].reason == "by_must_be_set"
    assert of(run.at(4000, T.Hold(job="waiter", by="root", operator=True)), T.JobHeld)


def test_requeue_stops_the_job_on_its_hosts_and_queues_it_again():
    run = busy_pool()
    events = run.at(4000, T.Requeue(job="runner", by="ana"))
    stop = of(events, T.JobStopRequested)[0]
    assert stop.nodes == ["a1"] and stop.reason == "requeue_requested"
    requeued = of(events, T.JobRequeued)[0]
    assert requeued.reason == "requeue_requested" and requeued.preempt_count == 0
    assert run.job_state("runner") in ("queued", "starting")  # again, from its last checkpoint
    run.at(4400, submit("late", 7, 8, user="bo"))  # the pool is full: it queues
    assert of(run.at(4500, T.Requeue(job="late", by="bo")), T.InputRejected)[0].reason == "job_is_queued"


def test_an_owner_may_lower_a_level_but_only_an_operator_may_raise_it():
    run = busy_pool()
    refused = of(run.at(3500, T.SetLevel(job="waiter", level=5, by="bo")), T.InputRejected)[0]
    assert refused.reason == "raising_priority_needs_operator" and "only an operator" in refused.detail
    lowered = of(run.at(4000, T.SetLevel(job="waiter", level=7, by="bo")), T.JobLevelSet)[0]
    assert (lowered.from_level, lowered.level) == (6, 7) and run.job("waiter").level == 7
    assert of(run.at(4300, T.SetLevel(job="waiter", level=2, by="ops", operator=True)), T.JobLevelSet)
    assert run.job("waiter").level == 2 and run.job("waiter").eff_level == 2
    assert (
        of(run.at(4400, T.SetLevel(job="runner", level=9, by="ana")), T.InputRejected)[0].reason
        == "level_must_be_0_to_7"
    )
    rebuild(run.records)


def test_an_owner_who_lowered_their_job_may_set_it_back_but_no_higher():
    run = busy_pool()
    of(run.at(4000, T.SetLevel(job="waiter", level=7, by="bo")), T.JobLevelSet)
    too_high = of(run.at(4100, T.SetLevel(job="waiter", level=5, by="bo")), T.InputRejected)[0]
    assert too_high.reason == "raising_priority_needs_operator" and "back to level 6" in too_high.detail
    restored = of(run.at(4200, T.SetLevel(job="waiter", level=6, by="bo")), T.JobLevelSet)[0]
    assert (restored.from_level, restored.level) == (7, 6) and run.job("waiter").level == 6
    # What was taken back is spent: the submitted level is as far as the owner goes.
    again = of(run.at(4300, T.SetLevel(job="waiter", level=5, by="bo")), T.InputRejected)[0]
    assert again.reason == "raising_priority_needs_operator"
    # An operator's level is the new start; lowerings from it add up and may be taken back.
    run.at(4600, T.SetLevel(job="waiter", level=3, by="ops", operator=True))
    run.at(4700, T.SetLevel(job="waiter", level=5, by="bo"))
    run.at(4750, T.SetLevel(job="waiter", level=6, by="bo"))
    assert of(run.at(4800, T.SetLevel(job="waiter", level=4, by="bo")), T.JobLevelSet)
    assert rebuild(run.records).canonical.jobs["waiter"].raisable_by_owner == 1
    assert of(run.at(4900, T.SetLevel(job="waiter", level=2, by="bo")), T.InputRejected)
    assert of(run.at(5000, T.SetLevel(job="waiter", level=3, by="bo")), T.JobLevelSet)
    assert run.job("waiter").level == 3 and run.job("waiter").raisable_by_owner == 0
    rebuild(run.records)


def test_a_failed_job_keeps_its_exit_code():
    run = busy_pool()
    failed = of(run.at(4000, T.Finished(job="runner", ok=False, exit_code=3)), T.JobFailed)[0]
    assert failed.reason == "exit_code_3"


def test_a_cancel_that_names_who_asks_is_its_owners_or_an_operators():
    run = busy_pool()
    refused = of(run.at(4000, T.Cancel(job="waiter", by="cy")), T.InputRejected)[0]
    assert refused.reason == "not_your_job" and run.job_state("waiter") == "queued"
    assert of(run.at(4100, T.Cancel(job="waiter", by="bo")), T.JobCancelled)
    assert of(run.at(4200, T.Cancel(job="other", by="root", operator=True)), T.JobCancelled)
    assert of(run.at(4300, T.Cancel(job="runner")), T.JobCancelled)  # names nobody: as before
    rebuild(run.records)
