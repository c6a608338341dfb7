"""A scheduler of this release goes on with the JetStream log of an older release: the golden
log written by a release of 2026-11-29, before records were signed, is put on a real nats-server's
XR_EV, adopted under the scheduler's key (`xirang key adopt`), and a real scheduler process
folds it, decides new inputs and signs them; the whole log then audits, old and new."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agents.local_cluster import REPO, Cluster
from core import types as T
from core.model.digests import DIGEST_SCHEMA
from data_helpers import publish
from trust.signing import create_key

pytestmark = pytest.mark.timeout(120)

OLD_LOG = Path(__file__).parent / "data" / "golden-logs" / "written-by-276a06d.jsonl"


def xirang(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_a_scheduler_with_a_key_goes_on_with_an_adopted_log_of_a_release_before_signing(tmp_path):
    lines = OLD_LOG.read_bytes().splitlines()
    with Cluster(tmp_path) as cluster:
        publish(cluster.url, [T.decode_record(line) for line in lines])  # as the old scheduler wrote them
        _, keyring, _ = create_key(tmp_path / "keys")  # where the scheduler's --data-dir keeps it
        refused = json.loads(
            xirang("audit", "--nats", cluster.url, "--public-key", str(keyring), "--json").stdout
        )
        assert not refused["ok"] and "not signed by the scheduler" in refused["problem"]

        adopt = xirang("key", "adopt", "--dir", str(tmp_path / "keys"), "--nats", cluster.url, "--json")
        assert adopt.returncode == 0, adopt.stderr
        assert json.loads(adopt.stdout)["adopted_records"] == len(lines)

        cluster.scheduler()
        submit = xirang(
            "submit",
            "after-upgrade",
            "--nats",
            cluster.url,
            "--team",
            "lm",
            "--level",
            "5",
            "--gpus",
            "2",
            "--gpu-model",
            "A100",
        )
        assert submit.returncode == 0, submit.stdout + submit.stderr
        records = cluster.wait_for(T.JobSubmitted, job="after-upgrade")
        assert records[len(lines) - 1].hash == T.decode_record(lines[-1]).hash  # the old log, untouched
        # a digest of this release's, after the old release's (written on the scheduler's tick)
        cluster.wait_for(T.StateDigest, timeout_s=60, schema=DIGEST_SCHEMA)
        audit = json.loads(
            xirang("audit", "--nats", cluster.url, "--public-key", str(keyring), "--json").stdout
        )
    assert audit["ok"], audit.get("problem")
    assert audit["records_verified"] >= len(lines) + 2
    assert audit["state_digest_schemas"]["1"] == sum(b'"StateDigest"' in line for line in lines)
    written_now = str(DIGEST_SCHEMA)  # this release's digests, after the old release's
    assert audit["signatures"].split()[0] != "0" and audit["state_digest_schemas"].get(written_now, 0) >= 1
