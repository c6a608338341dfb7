"""The simulated job: progress, periodic checkpoints, notices, kills and restores, timed
to the millisecond (launch 5 s, reports 0.2 s, safe point 10 s: replay.sim.HostLatency)."""

from sim_helpers import job, run_scripted, workload


NODE = [("n0", 1)]


def test_notified_job_saves_and_resumes_from_its_checkpoint_with_its_progress():
    wl = workload(job("j", 0, 3000, ckpt_interval_s=1000, ckpt_cost_s=20, restore_cost_s=30))
    sim, policy = run_scripted(
        wl, [(0, "start", "j", NODE, 0), (1_500_000, "notify", "j", True), (2_000_000, "start", "j", NODE, 2)]
    )
    out = sim.jobs["j"].out
    # 1000 s done at the periodic checkpoint, +475 s to the notice, +10 s to the safe point.
    assert sim.jobs["j"].ckpt_progress == {1: 1_000_000, 2: 1_485_000, 3: 2_000_000}
    assert policy.fact_times("checkpoint_saved", "j") == [1_025_400, 1_530_400, 2_570_400]
    assert policy.fact_times("released", "j") == [1_530_400]
    assert out.preemptions == 1 and out.lost_progress_ms == 0
    assert out.overhead_ms == 20_000 + 30_000  # the notice's save (frozen) + the restore
    assert out.first_start_ms == 5_200
    assert out.finish_ms == 3_570_200  # resumed at 2035.2 s with 1485 s done, one more checkpoint


def test_killed_job_loses_progress_since_its_last_periodic_checkpoint():
    wl = workload(job("j", 0, 3000, ckpt_interval_s=1000, ckpt_cost_s=20, restore_cost_s=30))
    sim, policy = run_scripted(
        wl,
        [(0, "start", "j", NODE, 0), (1_500_000, "kill", "j", 30_000), (2_000_000, "start", "j", NODE, None)],
    )
    out = sim.jobs["j"].out
    assert policy.fact_times("released", "j") == [1_530_400]
    assert out.lost_progress_ms == 505_000  # computed to 1505 s through the grace, saved 1000 s
    assert out.preemptions == 1
    assert out.finish_ms == 4_055_200  # restarted from 1000 s of progress at 2035.2 s
    assert out.overhead_ms == 30_000


def test_job_that_never_checkpoints_loses_everything_on_a_notice():
    wl = workload(job("j", 0, 3000, ckpt_interval_s=0))
    sim, _ = run_scripted(
        wl, [(0, "start", "j", NODE, 0), (1_000_000, "notify", "j", True), (1_100_000, "start", "j", NODE, 0)]
    )
    out = sim.jobs["j"].out
    assert out.lost_progress_ms == 1_010_200 - 5_200  # safe point minus start
    assert out.finish_ms == 1_100_200 + 5_000 + 3_000_000


def test_withdrawn_notice_lets_the_job_run_on_without_loss():
    wl = workload(job("j", 0, 3000, ckpt_interval_s=1000, ckpt_cost_s=20))
    sim, policy = run_scripted(
        wl, [(0, "start", "j", NODE, 0), (1_500_000, "notify", "j", True), (1_505_000, "withdraw", "j")]
    )
    out = sim.jobs["j"].out
    assert out.preemptions == 0 and out.lost_progress_ms == 0
    assert out.finish_ms == 5_200 + 3_000_000 + 2 * 20_000
    assert policy.fact_times("safe_point", "j") == []


def test_notice_during_a_periodic_checkpoint_uses_that_checkpoint():
    wl = workload(job("j", 0, 3000, ckpt_interval_s=1000, ckpt_cost_s=20))
    sim, policy = run_scripted(wl, [(0, "start", "j", NODE, 0), (1_010_000, "notify", "j", True)])
    out = sim.jobs["j"].out
    assert policy.fact_times("released", "j") == [1_025_400]
    assert out.lost_progress_ms == 0 and sim.jobs["j"].ckpt_step == 1


def test_job_finishing_inside_its_grace_period_is_not_preempted():
    wl = workload(job("j", 0, 100, ckpt_interval_s=0))
    sim, policy = run_scripted(wl, [(0, "start", "j", NODE, 0), (90_000, "kill", "j", 30_000)])
    out = sim.jobs["j"].out
    assert out.finish_ms == 105_200 and out.preemptions == 0
    assert policy.fact_times("released", "j") == []


def test_gpu_time_held_covers_launch_run_and_checkpoints():
    wl = workload(job("j", 0, 1500, gpus=2, ckpt_interval_s=1000, ckpt_cost_s=20))
    sim, _ = run_scripted(wl, [(0, "start", "j", [("n0", 2)], 0)])
    out = sim.jobs["j"].out
    assert out.held_ms == 5_000 + 1_500_000 + 20_000
    assert out.periodic_ckpt_ms == 20_000
    # one allocation, from the start command reaching the host (200 ms) to the job's end
    assert out.held_spans == [(200, out.finish_ms)] and out.finish_ms == 200 + out.held_ms
