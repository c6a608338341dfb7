"""The sweep (scorecard over pool sizes, windows, seeds) and the generated bursts trace."""

from replay.generate import parse_bursts_spec
from replay.sweep import Case, case_workload, run_case, sweep_table
from replay.workload import load_trace


def _trace(tmp_path) -> str:
    rows = ["job,submit_s,duration_s,gpus,team,level"]
    for i in range(24):
        rows.append(f"j{i},{i * 60},{1800 + 300 * (i % 5)},{1 + i % 4},t{i % 3},{i % 8}")
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_window_rebases_submit_times_and_keeps_its_jobs(tmp_path):
    jobs = case_workload(Case(_trace(tmp_path), 16, window=(10, 5))).jobs
    assert [j.id for j in jobs] == [f"j{i}" for i in range(10, 15)]
    assert jobs[0].submit_ms == 0 and jobs[1].submit_ms == 60_000


def test_a_case_runs_every_policy_and_the_table_marks_what_misses(tmp_path):
    cache = tmp_path / "cache"
    entry = run_case(Case(_trace(tmp_path), 16), ["none", "k8s", "xirang"], cache_dir=str(cache))
    assert set(entry["row"]["policies"]) == {"none", "k8s", "xirang"}
    assert sorted(p.name.split("_")[-1] for p in cache.iterdir()) == ["k8s.pickle", "none.pickle"]
    checks = entry["row"]["checks"]
    assert "level_mean_wait_vs_none_max" in checks and "level_team_fairness_vs_none" in checks
    entry["row"]["checks"]["mean_wait_vs_none"] = {"value": 2.0, "ok": False}
    table = sweep_table([entry])
    assert "2.000 !" in table and table.count("\n") == 2
    again = run_case(Case(_trace(tmp_path), 16), ["none", "k8s", "xirang"], cache_dir=str(cache))
    assert again["row"]["policies"]["none"] == entry["row"]["policies"]["none"]  # from the cache


def test_the_bursts_trace_is_seeded_scaled_to_the_pool_and_has_urgent_gangs():
    small, again = load_trace("bursts:64", 0), load_trace("bursts:64", 0)
    assert [(j.id, j.submit_ms, j.gpus, j.level) for j in small.jobs] == [
        (j.id, j.submit_ms, j.gpus, j.level) for j in again.jobs
    ]
    big = load_trace("bursts:256", 0)
    assert 2.5 < len(big.jobs) / len(small.jobs) < 5.5
    urgent = [j for j in big.jobs if j.level <= 1]
    assert urgent and any(j.gpus >= 8 for j in urgent)
    assert parse_bursts_spec("bursts:128:1.5") == (128, 1.5)
