"""The shipped units of the online tuning loop work as written: the systemd timer and service
and the Kubernetes CronJob parse, run the same command on an hourly schedule, one turn at a
time, with an operator's credentials; and that exact command, run against a real local
cluster (a nats-server and a scheduler process) whose log holds a tuner change that made
things worse, sends the revert, which the scheduler applies."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from agents.local_cluster import REPO, Cluster, matching
from core import types as T
from data_helpers import publish
from replay.synthetic_log import Spec, generate
from trust.signing import create_key
from xirang.cli import build_parser

pytestmark = pytest.mark.timeout(240)

SYSTEMD = REPO / "deploy" / "systemd"
CRONJOB = REPO / "deploy" / "k8s" / "xirang-tune.yaml"
HOUR_MS = 3_600_000


def unit(name: str) -> configparser.ConfigParser:
    parsed = configparser.ConfigParser(strict=True, interpolation=None)
    parsed.optionxform = str  # systemd's keys are case-sensitive
    assert parsed.read(SYSTEMD / name), name
    return parsed


def service_command() -> list[str]:
    """The service's ExecStart: `xirang` and its arguments."""
    argv = shlex.split(unit("xirang-tune.service")["Service"]["ExecStart"])
    assert argv[0] == "/opt/xirang/.venv/bin/xirang", argv  # where the operator guide installs it
    return ["xirang", *argv[1:]]


def cronjob() -> dict:
    (doc,) = [d for d in yaml.safe_load_all(CRONJOB.read_text()) if d]
    return doc


def test_the_timer_starts_one_turn_an_hour_and_survives_downtime():
    timer = unit("xirang-tune.timer")
    assert timer["Timer"]["OnCalendar"] == "hourly" and timer["Timer"]["Persistent"] == "true"
    assert timer["Install"]["WantedBy"] == "timers.target"
    assert "Unit" not in timer["Timer"]  # it starts the service of its own name
    service = unit("xirang-tune.service")["Service"]
    assert service["Type"] == "oneshot" and service["User"] == "xirang"
    assert "op-tuner.creds" in (SYSTEMD / "xirang-tune.service").read_text()
    if shutil.which("systemd-analyze"):
        out = subprocess.run(
            ["systemd-analyze", "calendar", "--iterations=3", "hourly"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        minutes = re.findall(r"\d{4}-\d{2}-\d{2} \d{2}:(\d{2}):00", out)
        assert minutes[:3] == ["00", "00", "00"], out


def test_the_cronjob_runs_the_services_command_one_turn_at_a_time():
    doc = cronjob()
    assert doc["apiVersion"] == "batch/v1" and doc["kind"] == "CronJob"
    spec = doc["spec"]
    minute, *rest = spec["schedule"].split()
    assert 0 <= int(minute) < 60 and rest == ["*", "*", "*", "*"]  # hourly
    assert spec["concurrencyPolicy"] == "Forbid"  # never two turns at once
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert ["xirang", *container["args"]] == service_command()  # the image's entrypoint is xirang
    env = {e["name"]: e for e in container["env"]}
    assert {"XIRANG_NATS", "XIRANG_CREDS", "XIRANG_TLS_CA"} <= set(env)
    secret = pod["volumes"][0]["secret"]["secretName"]
    assert secret in CRONJOB.read_text().split("kubectl create secret generic ", 1)[1]
    assert "add-user op tuner" in CRONJOB.read_text()
    assert build_parser().parse_args(container["args"]).apply


def test_the_units_command_reverts_a_change_that_hurt_on_a_live_cluster(tmp_path):
    # A tuner change planted to hurt: from 3 h on, no preemption at all (the bar is out of
    # reach), with the jobs of the following hours in the log.
    planted = T.SetPolicy(
        t=3 * HOUR_MS, params={"net_benefit_min": 1e12}, by="tuner", reason="tuner (decision_model)"
    )
    records = generate(Spec(jobs=150, seed=7, extra_inputs=[planted])).records
    with Cluster(tmp_path, policy="") as cluster:
        publish(cluster.url, records)
        create_key(tmp_path / "keys")  # the scheduler's key in its --data-dir
        adopt = subprocess.run(
            [
                sys.executable,
                "-m",
                "xirang.cli",
                "key",
                "adopt",
                "--dir",
                str(tmp_path / "keys"),
                "--nats",
                cluster.url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        assert adopt.returncode == 0, adopt.stdout + adopt.stderr
        cluster.scheduler()
        cluster.wait_for(T.SchedulerStarted)

        # The exact command the units run, with what /etc/xirang/tune.env would give it.
        env = {**os.environ, "XIRANG_NATS": cluster.url}
        words = service_command()
        turn = subprocess.run(
            [sys.executable, "-m", "xirang.cli", *words[1:]],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env=env,
        )
        assert turn.returncode == 0, turn.stdout + turn.stderr
        assert "reverted" in turn.stdout, turn.stdout

        (changed,) = [
            r.event
            for r in cluster.wait_for(T.PolicyChanged, by="tuner", count=2)
            if isinstance(r.event, T.PolicyChanged) and r.event.t > planted.t
        ]
        assert changed.params == {"net_benefit_min": 0.0}
        assert changed.reason.startswith("tuner (revert)") and "{" in changed.reason  # with its evidence

        # The next turn: the revert is in force and nothing was submitted in the last window
        # (the log's jobs are hours old): a quiet turn, which ends well and changes nothing,
        # so an idle cluster does not leave the timer's service or the CronJob failed.
        again = subprocess.run(
            [sys.executable, "-m", "xirang.cli", *words[1:], "--json"],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env=env,
        )
        assert again.returncode == 0, again.stdout + again.stderr
        quiet = json.loads(again.stdout)
        assert quiet["proposals"] == [] and "no job was submitted" in quiet["quiet"]
        changes = [r for r in matching(cluster.records(), T.PolicyChanged) if r.n > 1]  # after the log's own
        assert len(changes) == 2  # the planted change, its revert
