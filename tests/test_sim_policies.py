"""Each policy's distinguishing behaviour, on tiny clusters where the outcome is clear."""

from sim_helpers import job, one_node, workload

from replay.sim import Cluster, simulate

LAUNCH_AND_REPORTS_MS = 5_000 + 3 * 200  # kill/notice command, released fact, start command


def outcomes(result):
    return {j.id: j for j in result.jobs}


def test_none_never_preempts_and_serves_the_higher_level_first():
    wl = workload(
        job("batch", 0, 3600, gpus=8, level=7),
        job("low", 50, 600, gpus=8, level=6),
        job("urgent", 100, 600, gpus=8, level=0),
    )
    out = outcomes(simulate(wl, one_node(), "none"))
    assert all(j.preemptions == 0 for j in out.values())
    assert out["urgent"].first_start_ms > out["batch"].finish_ms  # waited for the batch job
    assert out["urgent"].first_start_ms < out["low"].first_start_ms  # then went first


def test_k8s_evicts_only_the_lowest_priority_victim_on_one_node_after_the_grace_period():
    wl = workload(
        job("seven", 0, 7200, gpus=4, level=7),
        job("five", 1, 7200, gpus=4, level=5),
        job("three", 2, 7200, gpus=8, level=3),
        job("urgent", 1000, 600, gpus=4, level=0),
    )
    out = outcomes(simulate(wl, Cluster.uniform(16, 8), "k8s"))
    assert out["seven"].preemptions == 1
    assert out["five"].preemptions == 0 and out["three"].preemptions == 0
    wait = out["urgent"].first_start_ms - out["urgent"].submit_ms
    assert wait == 30_000 + LAUNCH_AND_REPORTS_MS
    # Started at 5.2 s, checkpointed 600 s of progress by 625.2 s, killed at 1030.2 s:
    # the 405 s since that checkpoint are gone, whatever a checkpoint on notice could save.
    assert out["seven"].lost_progress_ms == 405_000


def test_k8s_grace_period_is_configurable():
    wl = workload(job("seven", 0, 7200, gpus=8, level=7), job("urgent", 1000, 600, gpus=8, level=0))
    out = outcomes(simulate(wl, one_node(), "k8s", {"grace_s": 5}))
    assert out["urgent"].first_start_ms - out["urgent"].submit_ms == 5_000 + LAUNCH_AND_REPORTS_MS


def test_slurm_requeues_a_victim_after_grace_time_and_it_loses_progress_since_its_checkpoint():
    wl = workload(job("seven", 0, 7200, gpus=8, level=7), job("urgent", 1000, 600, gpus=8, level=0))
    out = outcomes(simulate(wl, one_node(), "slurm"))
    assert out["seven"].preemptions == 1
    assert out["urgent"].first_start_ms - out["urgent"].submit_ms == 60_000 + LAUNCH_AND_REPORTS_MS
    assert out["seven"].lost_progress_ms == 1060_200 - 625_200
    assert out["seven"].finish_ms > out["urgent"].finish_ms


def test_slurm_age_factor_lets_an_old_job_overtake_a_newer_higher_level_one():
    wl = workload(
        job("blocker", 0, 4000, gpus=8, level=0),
        job("old", 10, 600, gpus=8, level=5),
        job("new", 3000, 600, gpus=8, level=4),
    )
    aged = outcomes(
        simulate(wl, one_node(), "slurm", {"PriorityMaxAge_s": 3600, "PreemptType": "preempt/none"})
    )
    assert aged["old"].first_start_ms < aged["new"].first_start_ms
    plain = outcomes(simulate(wl, one_node(), "none"))
    assert plain["new"].first_start_ms < plain["old"].first_start_ms


def test_slurm_backfills_a_short_job_that_ends_before_the_blocked_job_can_start():
    wl = workload(
        job("running", 0, 3600, gpus=6, level=4, est_runtime_s=3600),
        job("big", 10, 600, gpus=8, level=4),
        job("short", 20, 300, gpus=2, level=6, est_runtime_s=600),
        job("long", 30, 7200, gpus=2, level=6, est_runtime_s=7200),
    )
    out = outcomes(simulate(wl, one_node(), "slurm"))
    assert out["short"].first_start_ms < out["running"].finish_ms  # backfilled
    assert out["long"].first_start_ms > out["big"].first_start_ms  # would delay the big job


def test_xirang_preempts_through_a_checkpoint_so_the_victim_loses_nothing():
    """A level-2 preemptor waits for the save (the urgent levels 0-1 would wait at most
    `release_wait_max_ms`)."""
    wl = workload(
        job("batch", 0, 36_000, gpus=8, level=7, ckpt_interval_s=1800, ckpt_cost_s=20),
        job("hurry", 1000, 600, gpus=8, level=2),
    )
    result = simulate(wl, one_node(), "xirang")
    out = outcomes(result)
    assert out["batch"].preemptions == 1
    assert out["batch"].lost_progress_ms == 0
    assert out["hurry"].first_start_ms - out["hurry"].submit_ms < 120_000
    assert out["batch"].finish_ms > 0 and result.extra["rejected"] == {}


def test_an_urgent_job_waits_no_longer_than_its_grace_for_a_victim_to_save():
    """The same victim, a level-0 preemptor: a save would take the safe point plus 45 s,
    past the level's 30 s, so the victim lets go from its last checkpoint and loses the
    progress since. With no bound it saves and the urgent job waits for that."""

    def run(**policy):
        wl = workload(
            job("batch", 0, 36_000, gpus=8, level=7, ckpt_interval_s=1800, ckpt_cost_s=45),
            job("urgent", 1000, 600, gpus=8, level=0),
        )
        return outcomes(simulate(wl, one_node(), "xirang", policy))

    bounded, unbounded = run(), run(release_wait_max_ms=[0] * 8)
    assert bounded["batch"].preemptions == unbounded["batch"].preemptions == 1
    assert (
        900_000 < bounded["batch"].lost_progress_ms <= 1_100_000 and unbounded["batch"].lost_progress_ms == 0
    )
    bounded_wait = bounded["urgent"].first_start_ms - bounded["urgent"].submit_ms
    unbounded_wait = unbounded["urgent"].first_start_ms - unbounded["urgent"].submit_ms
    assert bounded_wait < 40_000 < 45_000 < unbounded_wait


def test_xirang_takes_the_victim_that_just_checkpointed_and_does_not_wait_for_a_save():
    """Two 4-GPU batch jobs; "fresh" wrote a periodic checkpoint a minute before the urgent
    job arrives, "stale" has ten minutes unsaved. The hosts report every checkpoint, so the
    core preempts "fresh" and lets it go from that checkpoint at its next safe point: the
    urgent job starts in seconds, and "fresh" loses about a minute, with no save written."""
    wl = workload(
        job("fresh", 0, 36_000, gpus=4, level=7, ckpt_interval_s=600, ckpt_cost_s=20, restore_cost_s=30),
        job("stale", 0, 36_000, gpus=4, level=7, ckpt_interval_s=3600, ckpt_cost_s=20, restore_cost_s=30),
        job("urgent", 690, 600, gpus=4, level=0),
    )
    out = outcomes(simulate(wl, one_node(), "xirang"))
    assert out["stale"].preemptions == 0
    assert out["fresh"].preemptions == 1
    assert out["fresh"].lost_progress_ms < 90_000  # since its checkpoint at 600 s of progress
    assert out["fresh"].overhead_ms < 30_000 + 5_000  # its restore; no save at the notice
    assert out["urgent"].first_start_ms - out["urgent"].submit_ms < 30_000
