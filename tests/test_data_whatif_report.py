"""What-if through the simulator, the periodic HTML review, and the replay benchmark."""

from __future__ import annotations

import json
import re

import pytest

from core import types as T
from core.model.policy import Policy, with_params
from projections.projector import Projector
from data_helpers import workload_records, write_jsonl, xirang, xirang_process
from replay.scorecard import policy_card
from replay.sim import Cluster, simulate
from replay.workload import TraceJob, Workload

HOUR = 3_600_000
ALT = {"net_benefit_min": 1e12}


def _expected_workload(records, from_t: int, to_t: int) -> tuple[Workload, Cluster]:
    """The window's recorded inputs, read straight from the log for comparison."""
    run_ms = {r.event.job: r.event.run_ms for r in records if isinstance(r.event, T.JobFinished)}
    jobs = []
    for r in records:
        inp = getattr(r.event, "input", None)
        if isinstance(inp, T.Submit) and from_t <= r.event.t <= to_t:
            jobs.append(
                TraceJob(
                    id=inp.job,
                    submit_ms=inp.t - from_t,
                    duration_ms=run_ms.get(inp.job, int(inp.est_runtime_s * 1000)),
                    gpus=inp.gpus,
                    team=inp.team,
                    user=inp.user,
                    level=inp.level,
                    gpu_models=inp.gpu_models,
                    ckpt_interval_ms=int(inp.ckpt_interval_s * 1000),
                    ckpt_cost_ms=int(inp.ckpt_cost_s * 1000),
                    restore_cost_ms=int(inp.restore_cost_s * 1000),
                    est_runtime_ms=int(inp.est_runtime_s * 1000),
                )
            )
    nodes = sorted(
        {
            (r.event.node, r.event.gpu_model, r.event.gpus)
            for r in records
            if isinstance(r.event, T.NodeJoined) and r.event.t <= to_t
        }
    )
    return Workload("expected", jobs, 0), Cluster(tuple(nodes))


def _comparable(card: dict) -> dict:
    return {k: v for k, v in card.items() if k not in ("sim_wall_s", "policy")}


def test_whatif_on_a_recorded_window_gives_the_simulators_scorecard(tmp_path):
    records = workload_records()
    path = write_jsonl(str(tmp_path / "log.jsonl"), records)
    alt = tmp_path / "alt.toml"
    alt.write_text("net_benefit_min = 1e12\n")
    from_t, to_t = 1 * HOUR, 5 * HOUR
    result = xirang(
        "whatif", "--policy", str(alt), "--log", path, "--from", str(from_t), "--to", str(to_t), "--json"
    )
    assert result.returncode == 0, result.stderr
    cards = json.loads(result.stdout)["cards"]
    workload, cluster = _expected_workload(records, from_t, to_t)
    assert len(workload.jobs) > 20
    expected_alt = policy_card(simulate(workload, cluster, "xirang", {"policy": with_params(Policy(), ALT)}))
    expected_now = policy_card(simulate(workload, cluster, "xirang", {"policy": Policy()}))
    assert _comparable(cards["simulated_alternative"]) == _comparable(expected_alt)
    assert _comparable(cards["simulated_recorded_policy"]) == _comparable(expected_now)
    assert cards["simulated_alternative"]["preemptions"] == 0  # the alternative never preempts
    # and the recorded column is what the log says happened to those jobs
    ids = {j.id for j in workload.jobs}
    preempted = sum(
        1
        for r in records
        if isinstance(r.event, T.JobRequeued) and r.event.reason == "preempted" and r.event.job in ids
    )
    recorded = cards["recorded"]
    assert recorded["jobs"] == len(ids) and recorded["preemptions"] == preempted > 0
    # GPU time held is read from the log as spans, so the fair-share index has a value too
    assert recorded["util"] > 0 and 0 < recorded["jain_teams_share"] <= 1
    table = xirang("whatif", "--policy", str(alt), "--log", path, "--from", str(from_t), "--to", str(to_t))
    assert "simulated_alternative" in table.stdout and "wait L0-1 p99 s" in table.stdout


@pytest.mark.parametrize(
    "policy_text, args, words",
    [
        (None, [], "cannot read"),
        ("net_benefit_min = [", [], "not valid TOML"),
        ("no_such_knob = 1", [], "unknown policy parameter"),
        (
            "net_benefit_min = 1.0",
            ["--from", "999999999999", "--to", "999999999999999"],
            "no job was submitted",
        ),
        ("net_benefit_min = 1.0", ["--from", "10", "--to", "5"], "--to must be after --from"),
    ],
)
def test_whatif_explains_bad_input(policy_text, args, words, tmp_path):
    path = write_jsonl(str(tmp_path / "log.jsonl"), workload_records()[:500])
    alt = tmp_path / "alt.toml"
    if policy_text is not None:
        alt.write_text(policy_text + "\n")
    result = xirang("whatif", "--policy", str(alt), "--log", path, *args)
    assert result.returncode == 2 and words in result.stderr, result.stderr


def test_report_writes_an_html_review_with_charts_and_the_logs_numbers(tmp_path):
    records = workload_records()
    db = str(tmp_path / "p.duckdb")
    proj = Projector(db)
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records, 1)])
    proj.con.close()
    from_t, to_t = 2 * HOUR, 8 * HOUR
    out = tmp_path / "review.html"
    result = xirang(
        "report", "--from", str(from_t), "--to", str(to_t), "--db", db, "--out", str(out), "--json"
    )
    assert result.returncode == 0, result.stderr
    numbers = json.loads(result.stdout)
    committed = {r.event.saga for r in records if isinstance(r.event, T.PreemptionCommitted)}
    planned = [
        r.event for r in records if isinstance(r.event, T.PreemptionPlanned) and from_t <= r.event.t <= to_t
    ]
    net = sum(p.benefit - p.cost for p in planned if p.saga in committed)
    assert numbers["net_benefit"] == pytest.approx(net) and numbers["preemptions"] == len(planned) > 0
    assert 1 / len(numbers["team_gpu_h"]) <= numbers["jain_teams_gpu_h"] <= 1
    page = out.read_text()
    assert len(re.findall(r'<img alt="[a-z_]+" src="data:image/png;base64,', page)) == 4
    assert f"<b id='net-benefit'>{net:.0f}</b>" in page
    bad = xirang("report", "--from", "10", "--to", "5", "--db", db)
    assert bad.returncode == 2 and "--to must be after --from" in bad.stderr


def test_bench_replay_measures_rebuild_against_raw_reads_in_one_run():
    result = xirang_process("bench", "replay", "--json", "--quick", timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["records"] > 3000 and out["stream_messages"] > out["records"]
    assert out["raw_reads_per_s_best"] > 0 and out["rebuild_records_per_s_best"] > 0
    assert out["rebuild_over_raw"] == pytest.approx(
        out["rebuild_records_per_s_best"] / out["raw_reads_per_s_best"], abs=1e-3
    )
