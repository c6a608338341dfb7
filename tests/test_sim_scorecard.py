"""Scorecard arithmetic on hand-made outcomes."""

import pytest

from replay.scorecard import jain, policy_card, render_table, scorecard
from replay.sim import JobOutcome, SimResult


def _result(policy, jobs, end_ms=10_000_000):
    return SimResult(
        policy=policy,
        workload="hand",
        seed=0,
        total_gpus=8,
        jobs=jobs,
        end_ms=end_ms,
        wall_s=0.1,
        steps=1,
        events=1,
    )


def _job(job_id, level, team, gpus, submit, start, finish, duration, **kw):
    return JobOutcome(
        id=job_id,
        team=team,
        user="u",
        level=level,
        gpus=gpus,
        submit_ms=submit,
        duration_ms=duration,
        first_start_ms=start,
        finish_ms=finish,
        **kw,
    )


def test_jain_is_one_when_even_and_one_over_n_when_one_takes_all():
    assert jain([0.5, 0.5, 0.5]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain([]) is None


def test_card_counts_waits_lost_gpu_hours_and_team_service():
    jobs = [
        _job(
            "a",
            0,
            "x",
            2,
            0,
            10_000,
            3_610_000,
            3_600_000,
            preemptions=1,
            lost_progress_ms=1_800_000,
            overhead_ms=60_000,
            held_spans=[(10_000, 3_610_000)],
        ),
        _job("b", 0, "y", 4, 0, 0, 3_600_000, 3_600_000, held_spans=[(0, 3_600_000)]),
        _job("c", 5, "y", 1, 1000, -1, -1, 60_000),
    ]
    card = policy_card(_result("p", jobs))
    assert card["levels"]["0"]["wait_s"]["max"] == 10.0
    assert card["levels"]["5"]["unstarted"] == 1 and card["levels"]["5"]["wait_s"]["max"] is None
    assert card["unstarted"] == 1 and card["unfinished"] == 1
    assert card["lost_gpu_h"] == pytest.approx(2 * (1_800_000 + 60_000) / 3_600_000, abs=1e-3)
    assert card["preemptions"] == 1 and card["jobs_preempted"] == 1
    assert card["util"] == pytest.approx(6 * 3_600_000 / (8 * 10_000_000), abs=1e-4)
    assert card["teams"]["y"]["service_fraction"] == 1.0
    assert card["teams"]["x"]["service_fraction"] == pytest.approx(3_600_000 / 3_610_000, abs=1e-4)


def test_acceptance_compares_xirang_with_k8s_and_none():
    def run(policy, wait_ms, lost_ms):
        return _result(
            policy,
            [
                _job(
                    f"{policy}{i}",
                    i % 2,
                    f"t{i % 3}",
                    1,
                    0,
                    wait_ms,
                    wait_ms + 1000,
                    1000,
                    lost_progress_ms=lost_ms,
                )
                for i in range(30)
            ],
        )

    card = scorecard([run("none", 100_000, 0), run("k8s", 5_000, 9000), run("xirang", 6_000, 1000)])
    checks = card["acceptance"]["checks"]
    assert checks["p99_wait_l01_vs_k8s"]["value"] == 1.2 and checks["p99_wait_l01_vs_k8s"]["ok"]
    assert checks["p99_wait_l01_none_over_xirang"]["ok"]
    assert checks["lost_gpu_h_vs_k8s"]["ok"] and checks["every_job_started"]["ok"]
    assert "PASS  lost_gpu_h_vs_k8s" in render_table(card)
    # Team fairness is checked inside the fair-share levels against no preemption; the
    # cross-pool forms are reported, unchecked.
    assert "jain_teams_share" not in checks and "jain_teams" not in checks
    assert card["acceptance"]["reported"]["jain_teams"]["value"] == card["policies"]["xirang"]["jain_teams"]
    assert "info  jain_teams" in render_table(card)


def test_acceptance_checks_each_less_urgent_level_against_no_preemption():
    """Level 4 waits 10 s under none and 20 s under xirang: 2x, past the 1.25x bound; the
    mean over all jobs is measured against none's too."""

    def run(policy, level4_wait_ms):
        jobs = [_job(f"{policy}-u{i}", 0, "t", 1, 0, 1000, 2000, 1000) for i in range(10)]
        jobs += [
            _job(f"{policy}-b{i}", 4, "t", 1, 0, level4_wait_ms, level4_wait_ms + 1000, 1000)
            for i in range(10)
        ]
        return _result(policy, jobs)

    card = scorecard([run("none", 10_000), run("k8s", 10_000), run("xirang", 20_000)])
    checks = card["acceptance"]["checks"]
    assert checks["level_mean_wait_vs_none_max"]["value"] == 2.0
    assert checks["level_mean_wait_vs_none_max"]["level"] == 4
    assert not checks["level_mean_wait_vs_none_max"]["ok"]
    assert not checks["mean_wait_vs_none"]["ok"]
    assert card["policies"]["xirang"]["levels_vs_none"]["4"]["mean"] == 2.0


def test_team_fairness_inside_a_level_compares_held_with_the_levels_max_min_split():
    """Level 4 holds 8 GPUs: x holds all 8 while y asks for 4 and waits (Jain 0.5); at
    level 5 each holds what it asks: 1.0. Other levels' GPUs do not enter level 4's."""
    jobs = [
        _job("x", 4, "x", 8, 0, 0, 100_000, 100_000, held_spans=[(0, 100_000)]),
        _job("y", 4, "y", 4, 0, -1, -1, 100_000),
        _job("a", 5, "x", 2, 0, 0, 100_000, 100_000, held_spans=[(0, 100_000)]),
        _job("b", 5, "y", 2, 0, 0, 100_000, 100_000, held_spans=[(0, 100_000)]),
        _job("c", 3, "y", 8, 0, 0, 100_000, 100_000, held_spans=[(0, 100_000)]),
    ]
    card = policy_card(_result("p", jobs, end_ms=100_000))
    assert card["level_team_jain"]["4"] == pytest.approx(0.5, abs=1e-3)
    assert card["level_team_jain"]["5"] == 1.0
    assert card["level_team_jain"]["3"] == 1.0


def test_urgent_latency_is_split_by_whether_the_job_was_downgraded():
    jobs = [_job("d", 0, "x", 1, 0, 50_000, 60_000, 10_000), _job("n", 1, "x", 1, 0, 2_000, 12_000, 10_000)]
    result = _result("xirang", jobs)
    result.extra["downgraded"] = ["d"]
    card = policy_card(result)
    assert card["wait_s_levels_0_1_downgraded"]["max"] == 50.0
    assert card["wait_s_levels_0_1_not_downgraded"]["max"] == 2.0


def test_fair_share_fairness_compares_what_teams_held_with_their_max_min_share():
    """8 GPUs; team y wants 2 for the whole run. When x wants and holds 6 next to y's 2,
    both got their max-min share; when x wants and holds all 8 while y waits, max-min
    entitled x to 6 and y to 2: x got 8/6 of its share and y none."""

    def card(x_gpus: int, y_started: bool):
        jobs = [
            _job("x", 3, "x", x_gpus, 0, 0, 100_000, 100_000, held_spans=[(0, 100_000)]),
            _job(
                "y",
                3,
                "y",
                2,
                0,
                0 if y_started else -1,
                100_000 if y_started else -1,
                100_000,
                held_spans=[(0, 100_000)] if y_started else [],
            ),
        ]
        return policy_card(_result("p", jobs, end_ms=100_000))

    even = card(6, True)
    assert even["teams"]["x"]["share_of_fair"] == 1.0 and even["teams"]["y"]["share_of_fair"] == 1.0
    assert even["jain_teams_share"] == 1.0
    hogged = card(8, False)
    assert hogged["teams"]["y"]["share_of_fair"] == 0.0
    assert hogged["teams"]["x"]["share_of_fair"] == pytest.approx(8 / 6, abs=1e-3)
    assert hogged["jain_teams_share"] == pytest.approx(0.5, abs=1e-3)


def test_all_waits_of_urgent_jobs_count_the_wait_again_after_a_preemption():
    """Two level-1 jobs start 2 s after submit. `p` is preempted at 10 s and waits 50 s
    before it runs again: its first-start delay is 2 s, its waits 52 s. A job still
    waiting after a release at the run's end counts until the end."""
    jobs = [
        _job("p", 1, "x", 1, 0, 2_000, 80_000, 28_000, held_spans=[(2_000, 10_000), (60_000, 80_000)]),
        _job("q", 1, "x", 1, 0, 2_000, 12_000, 10_000, held_spans=[(2_000, 12_000)]),
        _job("r", 0, "x", 1, 0, 1_000, -1, 50_000, held_spans=[(1_000, 5_000)]),
    ]
    card = policy_card(_result("k8s", jobs, end_ms=100_000))
    assert card["wait_s_levels_0_1"]["max"] == 2.0
    # p 52 s, q 2 s, r 96 s (100 s to the run's end, 4 s held)
    assert card["wait_s_levels_0_1_all"]["max"] == 96.0
    assert card["wait_s_levels_0_1_all"]["p50"] == 52.0
    assert card["wait_s_levels_0_1_all"]["n"] == 3


def test_acceptance_reports_all_waits_against_k8s_beside_the_checks():
    def run(policy, rewait_ms):
        jobs = [
            _job(
                f"{policy}{i}",
                1,
                "t",
                1,
                0,
                1_000,
                31_000 + rewait_ms,
                30_000,
                held_spans=[(1_000, 11_000), (11_000 + rewait_ms, 31_000 + rewait_ms)],
            )
            for i in range(20)
        ]
        return _result(policy, jobs)

    card = scorecard([run("none", 0), run("k8s", 9_000), run("xirang", 0)])
    reported = card["acceptance"]["reported"]["p99_all_waits_l01_vs_k8s"]
    assert reported["value"] == 0.1  # 1 s against 10 s
    assert "p99_all_waits_l01_vs_k8s" not in card["acceptance"]["checks"]
