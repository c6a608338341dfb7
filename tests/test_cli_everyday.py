"""What a new user trips on, command by command, and the one line each now gets instead: a
file that is not a log, a signed log read without its key, a job that never existed, an
output folder that cannot be written, a cluster started from another folder."""

from __future__ import annotations

import time

import pytest

from agents.logs import job_output_paths
from core import types as T
from data_helpers import workload_records, write_jsonl, xirang
from scenario import Run, node, submit
from test_security_signed_log import _signed
from trust.signing import Signer, create_key

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def not_a_log(tmp_path):
    path = tmp_path / "hostname"
    path.write_text("gpu-box-7\n")
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["whatif", "--policy", "POLICY"],
        ["review", "--out", "OUT"],
        ["project", "--db", "DB"],
        ["dashboard", "--port", "0"],
        ["audit"],
    ],
)
def test_a_file_that_is_not_a_log_is_refused_saying_so(argv, not_a_log, tmp_path):
    (tmp_path / "alt.toml").write_text("net_benefit_min = 1.0\n")
    words = {
        "POLICY": str(tmp_path / "alt.toml"),
        "OUT": str(tmp_path / "r.html"),
        "DB": str(tmp_path / "p.db"),
    }
    done = xirang(*[words.get(w, w) for w in argv], "--log", not_a_log)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a xirang log: line 1" in done.stderr and "xirang replay run" in done.stderr
    assert "a bug in xirang" not in done.stderr and "Traceback" not in done.stderr


def test_an_empty_file_is_refused_as_having_no_records(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    done = xirang("project", "--log", str(empty), "--db", str(tmp_path / "p.db"))
    assert done.returncode == 2 and "is empty" in done.stderr


def test_a_signed_log_audited_without_its_key_says_the_key_is_missing_not_that_it_fails(tmp_path):
    private, public, _ = create_key(tmp_path / "keys")
    log = write_jsonl(
        str(tmp_path / "signed.jsonl"), _signed(workload_records(jobs=20), Signer.load(private))
    )
    done = xirang("audit", "--log", log)
    assert "LOG DOES NOT VERIFY" not in done.stdout, done.stdout
    assert done.stdout.startswith("SIGNATURES NOT CHECKED") and "--public-key" in done.stdout
    assert "hash chain intact" in done.stdout
    verified = xirang("audit", "--log", log, "--public-key", str(public))
    assert verified.returncode == 0 and verified.stdout.startswith("log verified")


def test_logs_of_a_job_the_log_only_names_in_a_rejection_says_there_is_no_such_job(tmp_path):
    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("real", 5, 8))
    run.at(2000, T.Cancel(job="nosuch"))  # rejected: unknown_job, but it names the job
    assert job_output_paths(run.records, "nosuch", tmp_path) is None
    assert job_output_paths(run.records, "real", tmp_path) == []


def test_sim_with_an_unwritable_out_folder_fails_before_simulating(tmp_path):
    began = time.monotonic()
    done = xirang("sim", "--trace", "philly", "--limit", "20000", "--out", "/proc/nope")
    assert done.returncode == 2 and "--out /proc/nope: cannot write there" in done.stderr
    assert time.monotonic() - began < 15  # the policies were not run first


def test_jobs_from_another_folder_than_up_says_to_pass_data_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XIRANG_NATS", raising=False)
    done = xirang("jobs")
    assert done.returncode == 2 and "--data-dir" in done.stderr


def test_numbers_and_millisecond_counts_read_as_a_person_says_them():
    from core.model.words import readable_ms_text, readable_number

    assert [readable_number(v) for v in (8880.3, 10330.0, 12.345, 0.12345, 7)] == [
        "8,880",
        "10,330",
        "12.3",
        "0.123",
        "7",
    ]
    assert (
        readable_ms_text("saves 3511776 ms of level-2 wait, 250 ms more")
        == "saves 58m of level-2 wait, 250 ms more"
    )


def test_whatif_and_its_labels_say_what_they_count_without_exponents(tmp_path):
    log = write_jsonl(str(tmp_path / "log.jsonl"), workload_records(jobs=120))
    (tmp_path / "alt.toml").write_text("net_benefit_min = 1e9\n")
    done = xirang("whatif", "--log", log, "--policy", str(tmp_path / "alt.toml"))
    assert done.returncode == 0, done.stderr
    assert "preempted (victims)" in done.stdout and "Jain (teams, service)" in done.stdout
    assert "e+" not in done.stdout and "e-0" not in done.stdout


def test_a_dry_run_that_preempts_gives_its_price_in_gpu_hours_and_the_victims_total_loss():
    from projections.dryrun import dry_run

    run = Run()
    run.at(0, node("a1"))
    run.at(1000, submit("batch", 6, 8, team="x", user="u", est_runtime_s=36000, ckpt_interval_s=3600))
    run.at(2000, T.Started(job="batch"))
    run.at(1_800_000, T.Tick())
    answer = dry_run(
        run.state, submit("urgent", 0, 8, team="y", user="v", est_runtime_s=600), now_ms=1_800_000
    )
    if answer["outcome"] != "preempts":
        pytest.skip(f"the model chose not to preempt here: {answer['summary']}")
    assert "level-weighted GPU-hours" in answer["summary"] and "in all" in answer["summary"]
    assert answer["lost_s"] == sum(v["lost_s"] for v in answer["victims"])
    assert "e+" not in answer["summary"]


def test_a_report_of_a_quiet_window_charts_nothing_it_has_too_few_points_for(tmp_path):
    import duckdb

    from projections import report
    from projections.projector import Projector

    records = workload_records(jobs=3)
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode_record(r)) for i, r in enumerate(records, 1)])
    data = report.gather(proj.con, records[0].event.t, records[-1].event.t)
    shown = report.charts(data)
    assert "net_benefit" not in shown  # no committed preemption in three jobs
    page = report.render(data)
    assert page.count("<img") == len(shown) and "Not charted, fewer than 2 points" in page


def test_the_reviews_charts_leave_out_what_has_a_single_point():
    from projections import review

    parts = {
        "urgent_wait_saved_gpu_h": 1.0,
        "lost_gpu_h": 0.5,
        "fairness_penalty_gpu_h": 0.0,
        "objective_gpu_h": 0.5,
    }
    d = {
        "net_benefit": {"recorded": parts, "simulated_policy_in_force": parts},
        "levels": [{"level": 1, "wait_s_mean": 60.0, "no_preemption_wait_s_mean": 120.0}],
        "fairness": {"teams": [{"team": "a", "preempted": 1, "preempting": 0}]},
        "satisfaction": {"by_team_level": []},
    }
    assert sorted(review.charts(d)) == ["net_benefit"]


def test_table_columns_are_as_wide_as_their_widest_cell():
    from xirang.tables import start_estimate, table

    rows = [["a-job-with-a-very-long-name", "node-a:0,1,2,3,4,5,6,7 node-b:0,1", 8], ["b", "-", 16]]
    lines = table(["JOB", "WHERE", "GPUS"], rows, right=("GPUS",)).splitlines()
    where = lines[0].index("WHERE")
    assert all(line[where - 2 : where] == "  " for line in lines)  # no cell runs into the next column
    assert lines[1][where:].startswith("node-a:0,1,2,3,4,5,6,7 node-b:0,1")
    assert len({len(line) for line in lines}) == 1  # the numbers right-aligned to one edge
    assert start_estimate(7080, 0).startswith("in 1h58m (")
