"""`xirang replay run` on hand-written scenario files, as a user would run it."""

import json
import os
import subprocess
import sys

from core import decode_record, rebuild

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE_SCENARIO = os.path.join(ROOT, "examples", "scenarios", "example-preemption.jsonl")

HAND_WRITTEN = """\
{"type":"node_up","t":0,"node":"a","gpu_model":"A100","gpus":8}
{"type":"submit","t":1000,"job":"batch-1","team":"x","user":"u","level":6,"gpus":8,"est_runtime_s":7200}
{"type":"started","t":2000,"job":"batch-1"}
{"type":"checkpoint_saved","t":600000,"job":"batch-1","step":10,"digest":"sha256:ab","bytes":5}
{"type":"submit","t":900000,"job":"fix","team":"y","user":"v","level":0,"gpus":8,"est_runtime_s":600}
this line is not JSON
{"type":"safe_point","t":910000,"job":"batch-1"}
{"type":"checkpoint_saved","t":920000,"job":"batch-1","step":11,"digest":"sha256:cd","bytes":5}
{"type":"released","t":921000,"job":"batch-1"}
{"type":"started","t":925000,"job":"fix"}
{"type":"finished","t":1525000,"job":"fix","ok":true}
{"type":"started","t":1530000,"job":"batch-1"}
{"type":"finished","t":7000000,"job":"batch-1","ok":true}
"""


def xirang(*args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args],
        input=stdin,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_replay_run_prints_a_summary_and_writes_a_verifiable_log(tmp_path):
    scenario = tmp_path / "scenario.jsonl"
    scenario.write_text(HAND_WRITTEN)
    events = tmp_path / "events.jsonl"
    out = xirang("replay", "run", str(scenario), "--events-out", str(events))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    by_type = summary["events_by_type"]
    assert by_type["PreemptionCommitted"] == 1
    assert by_type["JobFinished"] == 2
    assert summary["rejected"] == [
        {"line": 6, "reason": "malformed_input", "detail": summary["rejected"][0]["detail"]}
    ]
    records = [decode_record(line) for line in events.read_bytes().splitlines()]
    assert len(records) == summary["events"]
    state = rebuild(records)
    assert state.canonical.chain == summary["chain_head"]


def test_replay_run_reads_the_example_scenario(tmp_path):
    out = xirang("replay", "run", EXAMPLE_SCENARIO)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["events_by_type"]["PreemptionCommitted"] == 1
    assert [r["reason"] for r in summary["rejected"]] == ["level_must_be_0_to_7"]


def test_replay_run_with_a_missing_file_or_bad_policy_says_what_to_fix(tmp_path):
    missing = xirang("replay", "run", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    policy = tmp_path / "p.toml"
    policy.write_text("level_weight = [1, 2]\n")
    scenario = tmp_path / "s.jsonl"
    scenario.write_text(HAND_WRITTEN)
    bad = xirang("replay", "run", str(scenario), "--policy", str(policy))
    assert bad.returncode == 2 and "level_weight must have 8 entries" in bad.stderr


def test_a_policy_file_enters_the_log_so_the_log_audits(tmp_path):
    policy = tmp_path / "p.toml"
    policy.write_text("victims_per_preemption_max = 1\n")
    scenario = tmp_path / "s.jsonl"
    scenario.write_text(HAND_WRITTEN)
    events = tmp_path / "e.jsonl"
    out = xirang("replay", "run", str(scenario), "--policy", str(policy), "--events-out", str(events))
    assert out.returncode == 0, out.stderr
    records = [decode_record(line) for line in events.read_bytes().splitlines()]
    state = rebuild(records)
    assert state.canonical.policy.victims_per_preemption_max == 1
