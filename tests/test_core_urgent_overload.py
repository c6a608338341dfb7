"""Urgent work stays urgent when the pool is overloaded (issue 19): one scenario per cause
seen job by job on overloaded pools, named after it. Holds (reservations) for jobs an
urgent job may preempt do not bind it; a gang spanning nodes may take victims in proportion
to the nodes it frees; the natural wait of an urgent job that has already outwaited its
forecast is not forecast shorter than the forecasts it has outwaited."""

from core import types as T
from core.holds import victim_cap
from core.policy import Policy

from scenario import HOUR, MIN, Run, node, of, start_all, submit, tick


def _starving_gang_holds_both_nodes(free_on_n2: int, **params) -> Run:
    """n1 and n2 (8 GPUs each) run long level-6 jobs that checkpoint often; a level-6 gang of
    16 GPUs has waited past `starvation_wait_ms` and holds both nodes; n2 has
    `free_on_n2` GPUs free."""
    run = Run(starvation_wait_ms=HOUR, **params)
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        submit("low-1", 6, 8, team="low", user="l1", est_runtime_s=50 * 3600),
        submit("low-2", 6, 8 - free_on_n2, team="low", user="l2", est_runtime_s=50 * 3600),
    )
    start_all(run, 2000)
    run.at(3000, submit("starving", 6, 16, team="big", user="s", est_runtime_s=3600))
    run.at(
        10 * MIN,
        *(T.CheckpointSaved(job=j, step=1, digest=f"sha256:{j}", bytes=1) for j in ["low-1", "low-2"]),
    )
    run.at(2 * HOUR, tick(2 * HOUR))
    holders = {name: job for name, (_, job) in run.state.index.reserved_nodes.items()}
    assert holders == {"n1": "starving", "n2": "starving"}
    return run


def test_a_hold_for_a_starving_less_urgent_gang_does_not_keep_an_urgent_job_off_free_gpus():
    """n2's four free GPUs are held for a starving level-6 gang: a level-1 job, whose level
    may preempt level 6, starts on them at once (the gang would be preempted by it were it
    running); a level-6 job of the same size does not."""
    run = _starving_gang_holds_both_nodes(free_on_n2=4)
    t = 2 * HOUR + 1000
    events = run.at(t, submit("same-level", 6, 4, team="x", user="x", est_runtime_s=100 * 3600))
    assert not of(events, T.JobStartRequested)
    events = run.at(t + 1000, submit("urgent", 1, 4, team="u", user="u", est_runtime_s=100 * 3600))
    assert [(e.job, e.placement[0].node) for e in of(events, T.JobStartRequested)] == [("urgent", "n2")]
    assert not of(events, T.PreemptionPlanned)


def test_a_hold_for_a_starving_less_urgent_gang_does_not_keep_an_urgent_job_from_preempting():
    """Both nodes are full (n2's last GPUs backfilled) and held for the starving level-6
    gang: a level-1 whole-node job preempts a level-6 job there instead of waiting behind
    the promise to a job it outranks."""

    def urgent_arrives(**params) -> list:
        run = _starving_gang_holds_both_nodes(free_on_n2=4, **params)
        run.at(2 * HOUR + 500, submit("backfill", 7, 4, team="b", user="b", est_runtime_s=1800))
        start_all(run, 2 * HOUR + 600)
        assert run.job_state("backfill") == "running"
        events = run.at(2 * HOUR + 1000, submit("urgent", 1, 8, team="u", user="u", est_runtime_s=100 * 3600))
        return of(events, T.PreemptionPlanned)

    plans = urgent_arrives()
    assert [(p.preemptor, p.victims) for p in plans] == [("urgent", ["backfill", "low-2"])]
    assert urgent_arrives(urgent_override_holds=False) == []  # held back by the reservation


def test_the_holds_bind_an_urgent_job_when_the_policy_says_so():
    """`urgent_override_holds = false` keeps every hold binding (the release before)."""
    run = _starving_gang_holds_both_nodes(free_on_n2=4, urgent_override_holds=False)
    events = run.at(2 * HOUR + 1000, submit("urgent", 1, 4, team="u", user="u", est_runtime_s=100 * 3600))
    assert not of(events, T.JobStartRequested)


def test_a_gang_spanning_nodes_may_take_one_victim_per_gpu_among_one_gpu_jobs():
    """Two nodes hold sixteen one-GPU level-6 jobs: a level-0 gang of 16 GPUs needs all
    sixteen as victims, which `victims_per_preemption_max` (8) allows per node it frees."""
    run = Run()
    run.at(0, node("n1"), node("n2"))
    run.at(
        1000,
        *(
            submit(f"one-{i:02d}", 6, 1, team=f"t{i % 4}", user=f"u{i}", est_runtime_s=50 * 3600)
            for i in range(16)
        ),
    )
    start_all(run, 2000)
    run.at(
        10 * MIN,
        *(T.CheckpointSaved(job=f"one-{i:02d}", step=1, digest=f"sha256:{i}", bytes=1) for i in range(16)),
    )
    events = run.at(10 * MIN + 1000, submit("gang", 0, 16, team="sre", user="g", est_runtime_s=3600))
    plans = of(events, T.PreemptionPlanned)
    assert [(p.preemptor, len(p.victims)) for p in plans] == [("gang", 16)]
    assert victim_cap(run.state, Policy(), run.job("gang"), ["A100"]) == 16
    assert victim_cap(run.state, Policy(), run.job("one-00"), ["A100"]) == 8
