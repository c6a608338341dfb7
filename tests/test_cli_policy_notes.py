"""Every command that reads a policy file says, once, on stderr, that a deprecated parameter in
it (core.model.policy_deprecated.DEPRECATED_PARAMS) has no effect, and still does its work."""

from __future__ import annotations

from pathlib import Path

import pytest

from xirang.cli import main

REPO = Path(__file__).resolve().parents[1]
NOTE = "policy parameter 'team_downgrade_ms' is deprecated, no effect"


@pytest.fixture
def files(tmp_path):
    (tmp_path / "old.toml").write_text("team_downgrade_ms = 60000\n")
    (tmp_path / "trace.csv").write_text("job,submit_s,duration_s,gpus\na,0,60,1\nb,10,60,2\n")
    (tmp_path / "inputs.jsonl").write_text("")
    return tmp_path


COMMANDS = {
    "replay run": ["replay", "run", "{d}/inputs.jsonl", "--policy", "{d}/old.toml"],
    "whatif": ["whatif", "--log", str(REPO / "tests/data/demo-events.jsonl"), "--policy", "{d}/old.toml"],
    "sweep": [
        "sweep",
        "--trace",
        "{d}/trace.csv",
        "--gpus",
        "8",
        "--windows",
        "0:2",
        "--seeds",
        "0",
        "--policies",
        "xirang",
        "--policy",
        "{d}/old.toml",
        "--out",
        "{d}/sweep.md",
    ],  # fmt: skip
    "sim": [
        "sim",
        "--trace",
        "{d}/trace.csv",
        "--gpus",
        "8",
        "--node-gpus",
        "8",
        "--policies",
        "xirang",
        "--procs",
        "1",
        "--policy",
        "{d}/old.toml",
        "--out",
        "{d}/sim",
    ],  # fmt: skip
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_deprecated_policy_parameter_gets_one_note_from_every_command_that_reads_the_file(
    command, files, capsys
):
    code = main([arg.format(d=files) for arg in COMMANDS[command]])
    err = capsys.readouterr().err
    assert code == 0, err
    notes = [line for line in err.splitlines() if NOTE in line]
    assert len(notes) == 1 and notes[0].startswith(f"note: {files / 'old.toml'}: "), err
