"""The quarterly review, end to end on a simulated quarter: the simulator keeps the core's
log of 2026Q3 (run under an over-cautious `net_benefit_min` an operator set), survey answers
follow, and `xirang review` writes the HTML: net benefit against a no-preemption what-if,
per-level speedup and cost, fairness, satisfaction, and a recommendation with evidence,
checked in headless Chromium."""

from __future__ import annotations

import json
import struct

import pytest

from core import types as T
from core.model.policy import Policy, with_params
from tests.data_helpers import xirang
from projections.windows import quarter_bounds
from tests.quarter import simulated_quarter_log
from tests.test_data_dashboard import CHROMIUM_FLAGS, chromium

import subprocess

CAUTIOUS = 300_000.0
REVIEW_ARGS = ["--urgent-tick-s", "60", "--tune-param", "net_benefit_min"]


@pytest.fixture(scope="module")
def quarter(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quarter")
    log = str(folder / "q3.jsonl")
    records = simulated_quarter_log(log, with_params(Policy(), {"net_benefit_min": CAUTIOUS}))
    out = str(folder / "review.html")
    result = xirang("review", "--log", log, "--out", out, "--json", *REVIEW_ARGS)
    assert result.returncode == 0, result.stderr
    return records, log, out, json.loads(result.stdout)


def test_the_review_defaults_to_the_last_full_quarter_and_weighs_preemption_against_none(quarter):
    records, log, out, review = quarter
    start, end = quarter_bounds("2026Q3")
    assert (review["window"]["from_t"], review["window"]["to_t"]) == (start, end)
    assert "2026Q3" in review["window"]["chosen"]
    submitted = [
        r.event for r in records if isinstance(r.event, T.JobSubmitted) and start <= r.event.t <= end
    ]
    assert review["jobs"] == len(submitted)
    net = review["net_benefit"]
    assert net["no_preemption"]["objective_gpu_h"] == 0  # the yardstick itself
    assert net["recorded"]["urgent_wait_saved_gpu_h"] > 0 and net["recorded"]["lost_gpu_h"] > 0
    assert net["recorded"]["objective_gpu_h"] == pytest.approx(
        net["recorded"]["urgent_wait_saved_gpu_h"]
        - net["recorded"]["lost_gpu_h"]
        - net["recorded"]["fairness_penalty_gpu_h"],
        abs=1e-3,
    )
    urgent = [row for row in review["levels"] if row["level"] <= 1]
    assert urgent and all(row["speedup"] > 1 for row in urgent)
    lower = [row for row in review["levels"] if row["level"] >= 3]
    assert sum(row["preemptions"] for row in lower) > 0 and all("extra_wait_s_mean" in row for row in lower)


def test_the_review_shows_fairness_satisfaction_and_a_recommendation_with_evidence(quarter):
    records, log, out, review = quarter
    teams = {t["team"]: t for t in review["fairness"]["teams"]}
    planned = [r.event for r in records if isinstance(r.event, T.PreemptionPlanned)]
    assert sum(t["preempting"] for t in teams.values()) == len(planned) and teams["ops"]["preempting"] > 0
    # The teams' work lost adds up to the total the net benefit weighs.
    total = review["net_benefit"]["recorded"]["lost_gpu_h"]
    assert total > 0 and sum(t["lost_gpu_h"] for t in teams.values()) == pytest.approx(total, abs=0.01)
    answers = [r.event for r in records if isinstance(r.event, T.FeedbackRecorded)]
    assert review["satisfaction"]["answers"] == len(answers) > 0
    assert {row["team"] for row in review["satisfaction"]["by_team_level"]} >= {"vision", "lm", "search"}
    (rec,) = review["recommendations"]
    assert rec["params"]["net_benefit_min"] < CAUTIOUS == rec["before"]["net_benefit_min"]
    assert rec["evidence"]["after"]["objective_gpu_h"] > rec["evidence"]["before"]["objective_gpu_h"]
    page = open(out, encoding="utf-8").read()
    for marker in (
        "id='net-benefit'",
        "id='levels'",
        "id='fairness-teams'",
        "id='satisfaction'",
        "net_benefit_min: 300000.0 → ",
        "no preemption (what-if)",
    ):
        assert marker in page, marker


def _png_size(path) -> tuple[int, int]:
    with open(path, "rb") as fh:
        head = fh.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_the_review_renders_in_headless_chromium(quarter, tmp_path):
    _, _, out, review = quarter
    shot = tmp_path / "review.png"
    profile = tmp_path / "chromium"
    run = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={shot}", f"file://{out}"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert shot.exists(), run.stderr[-2000:]
    assert _png_size(shot) == (1280, 900)
    dom = subprocess.run(
        [chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}-dom", "--dump-dom", f"file://{out}"],
        capture_output=True,
        text=True,
        timeout=90,
    ).stdout
    assert dom.count("<img") == 4 and "data:image/png;base64," in dom  # the four charts, embedded
    assert f"{review['net_benefit']['recorded']['objective_gpu_h']:+.2f}" in dom
    assert "Recommended changes" in dom and "decision_model" in dom


def test_a_period_without_jobs_is_refused_with_what_to_do(quarter, tmp_path):
    _, log, _, _ = quarter
    result = xirang(
        "review", "--log", log, "--quarter", "2026Q4", "--out", str(tmp_path / "r.html"), *REVIEW_ARGS
    )
    assert result.returncode == 2 and "no job was submitted" in result.stderr
    bad = xirang("review", "--log", log, "--quarter", "Q4-2026")
    assert bad.returncode == 2 and "YEARQn" in bad.stderr


def test_the_review_is_scheduled_at_the_start_of_each_quarter():
    import configparser
    import shlex
    import shutil

    from tests.data_helpers import REPO
    from xirang.cli import build_parser

    timer = configparser.ConfigParser(strict=False)
    timer.read(f"{REPO}/deploy/systemd/xirang-review.timer")
    calendar = timer["Timer"]["OnCalendar"]
    service = configparser.ConfigParser(strict=False, interpolation=None)
    service.read(f"{REPO}/deploy/systemd/xirang-review.service")
    command = shlex.split(service["Service"]["ExecStart"])[-1].replace("%%", "%")
    argv = shlex.split(command.replace('"review-$(date -u +%Y-%m-%d).html"', "review.html"))
    assert argv[:3] == ["exec", "/opt/xirang/.venv/bin/xirang", "review"]
    assert build_parser().parse_args(argv[2:]).func.__name__ == "cmd_review"
    if shutil.which("systemd-analyze"):
        out = subprocess.run(
            ["systemd-analyze", "calendar", "--iterations=4", calendar],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        import re

        months = sorted({m.group(1) for m in re.finditer(r"\d{4}-(\d{2})-01 06:00:00", out)})
        assert months == ["01", "04", "07", "10"], out
