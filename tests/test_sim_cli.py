"""`xirang sim` and `xirang bench sim` from the command line, on small inputs."""

import json
import os
import random
import subprocess
import sys

import duckdb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XIRANG = [sys.executable, "-m", "xirang.cli"]


def _run(*args, timeout=240):
    return subprocess.run(XIRANG + list(args), capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def _trace(tmp_path, jobs=40) -> str:
    rng = random.Random(11)
    lines = ["job,submit_s,duration_s,gpus,team,level"]
    for i in range(jobs):
        lines.append(
            f"j{i},{i * 30},{rng.randint(300, 4000)},{rng.choice([1, 1, 2, 4, 8])},"
            f"t{i % 3},{rng.randrange(8)}"
        )
    path = tmp_path / "small.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_sim_compares_all_policies_and_writes_every_output(tmp_path):
    out = tmp_path / "out"
    proc = _run("sim", "--trace", _trace(tmp_path), "--gpus", "16", "--out", str(out), "--quiet")
    assert proc.returncode == 0, proc.stderr
    for name in ("none", "k8s", "slurm", "xirang"):
        assert name in proc.stdout
    assert "queueing delay p99 by level" in proc.stdout and "acceptance (xirang)" in proc.stdout
    card = json.loads((out / "scorecard.json").read_text())
    assert sorted(card["policies"]) == ["k8s", "none", "slurm", "xirang"]
    assert card["policies"]["none"]["preemptions"] == 0
    assert all(c["unfinished"] == 0 for c in card["policies"].values())
    con = duckdb.connect(str(out / "scorecard.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM jobs").fetchone()[0] == 4 * 40
    assert con.execute("SELECT count(*) FROM levels WHERE policy = 'xirang'").fetchone()[0] == 8
    assert con.execute("SELECT count(DISTINCT policy) FROM policies").fetchone()[0] == 4
    con.close()
    for png in ("wait_p99_by_level.png", "wait_cdf_levels_0_1.png", "overview.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_shows_progress_on_stderr(tmp_path):
    proc = _run(
        "sim",
        "--trace",
        _trace(tmp_path, 10),
        "--gpus",
        "16",
        "--policies",
        "none,k8s",
        "--procs",
        "1",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "none [" in proc.stderr and "100%" in proc.stderr


def test_sim_rejects_bad_arguments_with_what_to_fix(tmp_path):
    trace = _trace(tmp_path, 5)
    cases = [
        (["--policies", "none,fifo"], "unknown fifo"),
        (["--gpus", "12"], "do not split into nodes of 8"),
        (["--limit", "0"], "--limit must be positive"),
        (["--policy", str(tmp_path / "missing.toml")], "--policy"),
    ]
    for extra, words in cases:
        proc = _run("sim", "--trace", trace, "--out", str(tmp_path / "o"), *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        assert words in proc.stderr, (extra, proc.stderr)
    proc = _run("sim", "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 2 and "cannot read" in proc.stderr
    proc = _run(
        "sim",
        "--trace",
        _trace(tmp_path, 40),
        "--gpus",
        "4",
        "--node-gpus",
        "4",
        "--out",
        str(tmp_path / "o"),
    )
    assert proc.returncode == 2 and "raise --gpus" in proc.stderr


def test_sim_help_documents_the_seeded_defaults():
    proc = _run("sim", "--help")
    assert proc.returncode == 0
    for column in ("level", "ckpt_interval_s", "ckpt_cost_s", "restore_cost_s", "gpu_model", "user"):
        assert column in proc.stdout


def test_bench_sim_reports_events_per_second_for_each_policy():
    proc = _run("bench", "sim", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert sorted(result["policies"]) == ["k8s", "none", "slurm", "xirang"]
    for entry in result["policies"].values():
        assert entry["events"] > 0 and entry["events_per_s"] > 0


def test_bench_philly_times_the_four_policies_side_by_side_against_the_goal():
    proc = _run("bench", "philly", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["jobs"] == 60 and result["goal_wall_s"] == 300
    assert result["within_goal"] == (result["wall_s"] <= 300)
    assert sorted(result["policies"]) == ["k8s", "none", "slurm", "xirang"]
    for entry in result["policies"].values():
        assert entry["steps"] > 0 and entry["cpu_s"] is not None
    assert len(result["load_average_before"]) == 3
