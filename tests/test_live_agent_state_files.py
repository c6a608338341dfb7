"""An agent whose state folder holds a file it cannot read (a disk fault, an edit by hand)
refuses to start with one line naming the file and what to do, not as "a bug in xirang"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agents.local_cluster import REPO
from transport.bus import node_token

pytestmark = pytest.mark.timeout(60)


def start_agent(data_dir) -> subprocess.CompletedProcess:
    # The state folder is read before the bus is reached: no server is needed to see it refused.
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", "agent", "--node", "h1", "--simulate", "1xH100"]
        + ["--data-dir", str(data_dir), "--nats", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=40,
        cwd=REPO,
        env={**os.environ, "XIRANG_CREDS": ""},
    )


@pytest.mark.parametrize("name", ["acted.json", "runs/train-1.json"])
def test_an_unreadable_state_file_is_named_with_what_to_do(tmp_path, name):
    state = tmp_path / "hosts" / node_token("h1")
    path = state / name
    path.parent.mkdir(parents=True)
    path.write_text('{"last_n": 12')  # cut short, as a write a power cut caught
    done = start_agent(tmp_path)
    assert done.returncode == 2, done.stderr
    assert str(path) in done.stderr and "move it aside" in done.stderr, done.stderr
    assert "a bug" not in done.stderr and "Traceback" not in done.stderr
