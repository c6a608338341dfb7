"""Scenario tests: a victim writing a checkpoint when its notice comes, and a victim that lets
go after its saga's deadline (given inputs, expect events). Both rules are policy switches
(`notice_covers_save_in_progress`, `late_release_counts_as_preemption`): each test runs the
same inputs with the switch off (today's outcome) and on."""

from core import types as T

from scenario import MIN, Run, node, of, start_all, submit

NOTICE_T = 60 * MIN + 2000
SAVE_ENDS_T = 60 * MIN + 1000 + 300_000  # the write began a second before the notice


def writing_victim(**params) -> tuple[Run, T.PreemptionPlanned]:
    """A level-6 batch job (300 s checkpoints) begins a write a second before a level-3 job
    that needs its node arrives: the plan lets it go from its last checkpoint, but it lets
    go only once the write ends."""
    run = Run(**params)
    run.at(0, node("a1", "A100"))
    run.at(
        1000,
        submit(
            "batch",
            6,
            8,
            team="search",
            user="li",
            est_runtime_s=8 * 3600,
            ckpt_cost_s=300,
            restore_cost_s=10,
        ),
    )
    start_all(run, 2000)
    run.at(60 * MIN, T.CheckpointSaved(job="batch", step=1, digest="sha256:b1", bytes=1))
    run.at(60 * MIN + 1000, T.CheckpointStarted(job="batch"))
    events = run.at(NOTICE_T, submit("tuning", 3, 8, team="nlp", user="ana", est_runtime_s=3600))
    return run, of(events, T.PreemptionPlanned)[0]


def finish_write_and_let_go(run: Run) -> list[T.Event]:
    """The victim's write ends and it lets go (after ticks up to then)."""
    events = []
    for t in range(NOTICE_T + 60_000, SAVE_ENDS_T, 60_000):
        events += run.at(t, T.Tick(t=t))
    events += run.at(SAVE_ENDS_T, T.CheckpointSaved(job="batch", step=2, digest="sha256:b2", bytes=1))
    events += run.at(SAVE_ENDS_T + 500, T.SafePoint(job="batch"), T.Released(job="batch"))
    return events


def test_the_deadline_covers_a_checkpoint_being_written_and_the_saga_commits():
    run, plan = writing_victim(notice_covers_save_in_progress=True, late_release_counts_as_preemption=False)
    assert plan.deadline_t >= SAVE_ENDS_T + run.state.canonical.policy.deadline_slack_ms
    events = finish_write_and_let_go(run)
    assert not of(events, T.PreemptionRolledBack)
    assert [e.saga for e in of(events, T.PreemptionCommitted)] == [plan.saga]
    requeued = of(events, T.JobRequeued)
    assert [(e.job, e.reason, e.preempt_count, e.boost) for e in requeued] == [("batch", "preempted", 1, 1)]
    assert run.job_state("tuning") == "starting"


def test_without_it_the_saga_rolls_back_during_the_write_and_the_release_goes_uncounted():
    run, plan = writing_victim(notice_covers_save_in_progress=False, late_release_counts_as_preemption=False)
    assert plan.deadline_t - NOTICE_T == run.state.canonical.policy.deadline_min_ms
    events = finish_write_and_let_go(run)
    assert [e.reason for e in of(events, T.PreemptionRolledBack)] == ["deadline_passed"]
    requeued = of(events, T.JobRequeued)
    assert [(e.job, e.reason, e.preempt_count, e.boost) for e in requeued] == [
        ("batch", "released_after_rollback", 0, 0)
    ]
    assert not of(events, T.VictimReleasedLate)


def test_a_victim_that_lets_go_after_its_deadline_counts_as_preempted_and_its_saga_says_so():
    run, plan = writing_victim(notice_covers_save_in_progress=False, late_release_counts_as_preemption=True)
    events = finish_write_and_let_go(run)
    overdue = of(events, T.NoticeOverdue)
    assert [(e.saga, e.job, e.deadline_t) for e in overdue] == [(plan.saga, "batch", plan.deadline_t)]
    assert [e.reason for e in of(events, T.PreemptionRolledBack)] == ["deadline_passed"]
    late = of(events, T.VictimReleasedLate)
    assert [(e.saga, e.job) for e in late] == [(plan.saga, "batch")]
    assert late[0].lost_progress_ms <= 500  # it let go half a second after its fresh checkpoint
    requeued = of(events, T.JobRequeued)
    assert [(e.job, e.reason, e.preempt_count, e.boost) for e in requeued] == [("batch", "preempted", 1, 1)]
    assert run.job("batch").preempt_count == 1 and run.job("batch").overdue_saga == ""


def test_a_late_release_that_reaches_the_threshold_is_compensated():
    run, plan = writing_victim(
        notice_covers_save_in_progress=False,
        late_release_counts_as_preemption=True,
        compensation_when_exceeded=False,
    )
    run.job("batch").preempt_count = 2  # as if preempted twice before
    events = finish_write_and_let_go(run)
    granted = of(events, T.CompensationGranted)
    assert sorted(e.kind for e in granted) == ["fee_credit", "priority_boost", "quota_gpu_hours"]
    assert {e.preempt_count for e in granted} == {3}


def test_the_projection_counts_a_late_release_as_a_successful_preemption(tmp_path):
    from projections.projector import Projector

    outcomes = {}
    for counted in (False, True):
        run, plan = writing_victim(
            notice_covers_save_in_progress=False, late_release_counts_as_preemption=counted
        )
        finish_write_and_let_go(run)
        proj = Projector(str(tmp_path / f"p{counted}.duckdb"))
        proj.apply([(i, T.encode(r)) for i, r in enumerate(run.records, 1)])
        con = proj.con
        outcomes[counted] = (
            con.execute("SELECT outcome FROM sagas WHERE saga = ?", [plan.saga]).fetchone()[0],
            con.execute("SELECT outcome, released_t IS NOT NULL FROM preemptions").fetchall(),
            con.execute("SELECT success_rate FROM preemption_stats").fetchone()[0],
            con.execute("SELECT preempt_count FROM jobs WHERE job = 'batch'").fetchone()[0],
        )
    assert outcomes[False] == ("rolled_back", [("rolled_back", False)], 0.0, 0)
    assert outcomes[True] == ("released_late", [("released_late", True)], 1.0, 1)


def test_the_audits_story_of_the_job_tells_a_late_release():
    from projections.audit import Audit

    run, plan = writing_victim(notice_covers_save_in_progress=False, late_release_counts_as_preemption=True)
    finish_write_and_let_go(run)
    audit = Audit(job="batch")
    for pos, record in enumerate(run.records, 1):
        audit.feed(pos, T.encode(record))
    audit.finish()
    assert audit.problem is None
    assert any(f"still holding its GPUs at the deadline of {plan.saga}" in line for line in audit.story), (
        audit.story
    )
    assert any("after the deadline" in line and "preempted after all" in line for line in audit.story)


def test_by_default_the_deadline_covers_the_write_and_a_late_release_counts():
    """This release's defaults (version 2): both switches on."""
    run, plan = writing_victim()
    assert plan.deadline_t >= SAVE_ENDS_T + run.state.canonical.policy.deadline_slack_ms
    events = finish_write_and_let_go(run)
    assert not of(events, T.PreemptionRolledBack)
    assert [(e.job, e.reason, e.preempt_count) for e in of(events, T.JobRequeued)] == [
        ("batch", "preempted", 1)
    ]
    # A write longer than the deadline where the notice does not cover it: counted all the same.
    run, plan = writing_victim(notice_covers_save_in_progress=False)
    events = finish_write_and_let_go(run)
    assert [(e.saga, e.job) for e in of(events, T.VictimReleasedLate)] == [(plan.saga, "batch")]
    assert [(e.job, e.reason, e.preempt_count) for e in of(events, T.JobRequeued)] == [
        ("batch", "preempted", 1)
    ]
