"""What Slurm users ask, answered on a real cluster (nats-server, scheduler and a host agent
as OS processes): what ran on a node between two times (`history --node`, sacct -N), how much
each team used over time, decayed (`shares`, sshare), the factors behind a waiting job's place
(`prio`, sprio); held jobs stay in `queue` with their reason; `history` counts every wait and
every run, the current ones too."""

from __future__ import annotations

import json
import sys
import time

import pytest

from agents.local_cluster import Cluster
from core import types as T
from xirang.cli import main

pytestmark = pytest.mark.timeout(180)

SLEEP = f'{sys.executable} -c "import time; time.sleep(120)"'


def xirang(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys, *args: str) -> dict:
    code, out, err = xirang(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def submit(capsys, url: str, job: str, team: str, user: str, level: int, gpus: int) -> None:
    code, out, err = xirang(
        capsys,
        "submit",
        job,
        "--nats",
        url,
        "--team",
        team,
        "--user",
        user,
        "--level",
        str(level),
        "--gpus",
        str(gpus),
        "--est-runtime-s",
        "600",
        "--command",
        SLEEP,
    )
    assert code == 0 and out.startswith("accepted"), out + err


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    """One cluster, one story: `first` runs on all of h1 and is cancelled; `second` runs,
    is requeued and runs again; `third` (team nlp) and `fourth` (team lm) queue behind it,
    `held` is held."""
    import _pytest.capture

    with Cluster(tmp_path_factory.mktemp("slurm")) as c:
        c.scheduler()
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        capsys = _pytest.capture.CaptureFixture(_pytest.capture.SysCapture, None, _ispytest=True)
        capsys._start()
        try:
            url = c.url
            submit(capsys, url, "first", "vision", "ana", 5, 8)
            c.wait_for(T.JobRunning, job="first")
            time.sleep(1.0)
            assert xirang(capsys, "cancel", "first", "--nats", url, "--user", "ana")[0] == 0
            c.wait_for(T.JobCancelled, job="first")
            between_ms = int(time.time() * 1000)
            time.sleep(0.5)
            submit(capsys, url, "second", "search", "bo", 5, 8)
            c.wait_for(T.JobRunning, job="second")
            assert xirang(capsys, "requeue", "second", "--nats", url, "--user", "bo")[0] == 0
            c.wait_for(T.JobRunning, job="second", count=2)
            submit(capsys, url, "third", "nlp", "cy", 6, 4)
            submit(capsys, url, "fourth", "lm", "di", 6, 4)
            submit(capsys, url, "held", "lm", "di", 6, 2)
            assert xirang(capsys, "hold", "held", "--nats", url, "--user", "di")[0] == 0
            c.wait_for(T.JobHeld, job="held")
        finally:
            capsys.close()
        yield c, between_ms


def test_history_node_says_what_ran_on_a_node_and_why_each_run_ended(story, capsys):
    cluster, between_ms = story
    rows = as_json(capsys, "history", "--node", "h1", "--nats", cluster.url)["placements"]
    runs = [(r["job"], r["run"], r["gpus"], r["ended"]) for r in rows]
    assert runs == [
        ("first", 1, 8, "cancelled"),
        ("second", 1, 8, "requeue_requested"),
        ("second", 2, 8, None),
    ]
    assert all(r["node"] == "h1" and r["start_t"] for r in rows)
    assert rows[0]["end_t"] < between_ms < rows[1]["start_t"]
    later = as_json(capsys, "history", "--node", "h1", "--since", str(between_ms), "--nats", cluster.url)
    assert [r["job"] for r in later["placements"]] == ["second", "second"]
    earlier = as_json(capsys, "history", "--node", "h1", "--until", str(between_ms), "--nats", cluster.url)
    assert [r["job"] for r in earlier["placements"]] == ["first"]
    assert as_json(capsys, "history", "--node", "nowhere", "--nats", cluster.url)["placements"] == []
    code, out, _ = xirang(capsys, "history", "--node", "h1", "--nats", cluster.url)
    assert code == 0 and "(holds it)" in out and "3 run(s) on h1" in out


def test_history_counts_every_wait_and_every_run_the_current_ones_too(story, capsys):
    cluster, _ = story
    jobs = {r["job"]: r for r in as_json(capsys, "history", "--nats", cluster.url)["jobs"]}
    assert jobs["first"]["run_s"] >= 1.0  # cancelled while running: its run counts
    second = jobs["second"]
    assert second["state"] == "running" and second["run_s"] > 0  # was 0 while running
    assert jobs["third"]["state"] == "queued" and jobs["third"]["wait_s"] > 0  # still waiting
    assert jobs["held"]["state"] == "held"


def test_shares_show_each_teams_usage_over_time_decayed(story, capsys):
    cluster, _ = story
    week = {r["team"]: r for r in as_json(capsys, "shares", "--nats", cluster.url)["teams"]}
    assert week["vision"]["gpu_hours"] > 0 and week["search"]["gpu_hours"] > 0
    assert week["nlp"]["gpu_hours"] == 0  # queued only
    for team in ("vision", "search"):
        assert 0 < week[team]["decayed_gpu_hours"] <= week[team]["gpu_hours"]
    assert sum(r["decayed_part"] or 0 for r in week.values()) == pytest.approx(1.0, abs=1e-3)
    # A half-life of a second: the run that ended earlier (first's) has faded far more.
    fast = {
        r["team"]: r for r in as_json(capsys, "shares", "--half-life-s", "1", "--nats", cluster.url)["teams"]
    }
    assert fast["vision"]["decayed_gpu_hours"] < week["vision"]["decayed_gpu_hours"] / 2
    assert fast["search"]["decayed_part"] > week["search"]["decayed_part"]
    code, out, _ = xirang(capsys, "shares", "--nats", cluster.url)
    assert code == 0 and "DECAYED" in out and "halved every 7d" in out


def test_prio_gives_each_factor_of_a_waiting_jobs_place(story, capsys):
    cluster, _ = story
    third = as_json(capsys, "prio", "third", "--nats", cluster.url)
    fourth = as_json(capsys, "prio", "fourth", "--nats", cluster.url)
    assert (third["level"], third["queue_level"]) == (6, 6)
    assert third["queue_policy"] in ("fcfs", "fair_share", "round_robin")
    assert {third["position"], fourth["position"]} == {1, 2}
    second_in_line = fourth if fourth["position"] == 2 else third
    assert second_in_line["jobs_ahead"] == 1 and second_in_line["gpus_ahead"] == 4
    assert third["team_quota"] > 0 and third["team_gpus_at_level"] == 0
    assert third["reason_code"] and third["reason"] and third["start_in_s"] is not None
    assert third["levels_from_boost"] == 0 and third["levels_from_aging"] == 0
    code, out, _ = xirang(capsys, "prio", "third", "--nats", cluster.url)
    assert code == 0 and "fair share" in out and "expected start" in out and "in " in out
    code, _, err = xirang(capsys, "prio", "first", "--nats", cluster.url)
    assert code == 2 and "first is cancelled" in err


def test_jobs_of_one_team_does_not_count_every_teams_done_jobs(story, capsys):
    cluster, _ = story
    code, out, _ = xirang(capsys, "jobs", "--team", "nlp", "--nats", cluster.url)
    assert code == 0 and "third" in out and "second" not in out
    assert (
        out.strip().splitlines()[-1]
        == "1 open matching; `xirang history` with the same filters lists the done ones"
    )


def test_a_held_job_stays_in_the_queue_with_its_reason(story, capsys):
    cluster, _ = story
    levels = as_json(capsys, "queue", "--nats", cluster.url)["levels"]
    held = levels[6]["held"]
    assert [h["job"] for h in held] == ["held"] and held[0]["reason_code"] == "held"
    code, out, _ = xirang(capsys, "queue", "--nats", cluster.url)
    line = next(line for line in out.splitlines() if " held " in f" {line} ")
    assert "held" in line.split() and "held:" in line
