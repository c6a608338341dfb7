"""The tuning loop's commands on a real log: `tests/data/demo-events.jsonl` is the log of
one `xirang demo` run (real nats-server, scheduler, two hosts, numpy training jobs, one
level-0 job preempting three; kept as written, signatures and all), and
`tests/data/demo-events.pub` the public keyring of the scheduler that signed it."""

from __future__ import annotations

import json
import os

import duckdb

from core import rebuild, step
from core import types as T
from projections.notices import Notifier
from projections.projector import Projector
from tests.data_helpers import xirang

DEMO_LOG = os.path.join(os.path.dirname(__file__), "data", "demo-events.jsonl")
DEMO_KEYRING = os.path.join(os.path.dirname(__file__), "data", "demo-events.pub")


def _records() -> list[T.Record]:
    with open(DEMO_LOG, "rb") as fh:
        return [T.decode_record(line) for line in fh.read().splitlines()]


def test_the_demo_log_verifies_under_its_schedulers_keyring_and_under_no_other_key():
    signed = sum(b'"sig":' in line for line in open(DEMO_LOG, "rb"))
    result = xirang("audit", "--log", DEMO_LOG, "--public-key", DEMO_KEYRING, "--json")
    summary = json.loads(result.stdout)
    assert result.returncode == 0 and summary["ok"] and summary["jobs_done"] == 7
    assert signed >= 70 and summary["signatures"] == f"{signed} verified (keys 558df41c4460e227)"
    other = os.path.join(os.path.dirname(__file__), "data", "golden-logs", "signed-with-digest-schema-2.pub")
    result = xirang("audit", "--log", DEMO_LOG, "--public-key", other, "--json")
    assert result.returncode == 1 and not json.loads(result.stdout)["ok"]


def test_whatif_and_tune_replay_the_demo_logs_own_span_and_say_so(tmp_path):
    records = _records()
    alt = tmp_path / "alt.toml"
    alt.write_text("net_benefit_min = 1e12\n")
    whatif = json.loads(xirang("whatif", "--policy", str(alt), "--log", DEMO_LOG, "--json").stdout)
    assert (
        whatif["window"]["from_t"] == records[0].event.t
        and whatif["window"]["chosen"] == "the log's whole span"
    )
    assert whatif["window"]["jobs"] == 7 and whatif["cards"]["recorded"]["util"] > 0.1
    assert whatif["cards"]["simulated_alternative"]["preemptions"] == 0
    tune = xirang(
        "tune",
        "--log",
        DEMO_LOG,
        "--group",
        "decision_model",
        "--param",
        "net_benefit_min",
        "--evals",
        "1",
        "--json",
    )
    assert tune.returncode == 0, tune.stderr
    out = json.loads(tune.stdout)
    assert out["window"]["from_t"] == records[0].event.t and "last 6 h" in out["window"]["chosen"]
    assert out["replays"] > 1 and all(
        p["evidence"]["after"]["objective_gpu_h"] > p["evidence"]["before"]["objective_gpu_h"]
        for p in out["proposals"]
    )


def test_the_demo_logs_victims_are_told_and_its_review_weighs_the_preemption(tmp_path):
    records = _records()
    victims = {r.event.job for r in records if isinstance(r.event, T.VictimNotified)}
    told = Notifier().all(enumerate(records, 1))
    assert {n.job for n in told if n.kind == "preemption_notice"} == victims and len(victims) == 3
    assert {n.job for n in told if n.kind == "preempted"} == victims
    review = xirang(
        "review", "--log", DEMO_LOG, "--out", str(tmp_path / "r.html"), "--tune-evals", "0", "--json"
    )
    assert review.returncode == 0, review.stderr
    data = json.loads(review.stdout)
    assert "covers no full quarter" in data["window"]["chosen"]
    assert data["net_benefit"]["recorded"]["urgent_wait_saved_gpu_h"] > 0
    assert {t["team"] for t in data["fairness"]["teams"] if t["preempted"]}  # someone's jobs were taken


def test_feedback_folds_onto_the_demo_log_and_reaches_the_projection():
    records = _records()
    state = rebuild(records)
    job = next(
        r.event
        for r in records
        if isinstance(r.event, T.JobSubmitted)
        and r.event.job in {v.event.job for v in records if isinstance(v.event, T.VictimNotified)}
    )
    _, new = step(
        state,
        T.Feedback(
            t=records[-1].event.t + 1, job=job.job, user=job.user, score=2, comment="preempted at step 500"
        ),
    )
    assert [type(r.event) for r in new if not isinstance(r.event, T.InputAccepted)] == [T.FeedbackRecorded]
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode(r)) for i, r in enumerate(records + new, 1)])
    assert proj.con.execute("SELECT team, answers, score_mean FROM satisfaction").fetchall() == [
        (job.team, 1, 2.0)
    ]
