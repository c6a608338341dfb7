"""The README followed as written, from a directory outside the repository, on a fresh copy
of it: `xirang up` in one terminal, then every command of the README's local-cluster block
in another, each answering without an error or a traceback. The commands are read from the
README itself, so the test follows the README as it is."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.host import stop_job_processes
from agents.local_cluster import REPO

pytestmark = pytest.mark.timeout(180)


def readme_block(after: str) -> list[str]:
    """The commands of the first fenced block after `after`, continuation lines joined and
    comments dropped."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(after) :].split("```", 2)[1]
    joined = re.sub(r"\\\n\s*", "", block)
    commands = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a fresh clone has them (tracked, and new files not ignored)."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    return dest


def test_the_readme_local_cluster_works_from_another_directory(tmp_path):
    clone = fresh_copy(tmp_path / "clone")
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    env.pop("XIRANG_NATS", None)
    xirang = [sys.executable, "-m", "xirang.cli"]
    up_line = shlex.split(re.search(r"`(xirang up [^`]+)`", (REPO / "README.md").read_text()).group(1))
    up = subprocess.Popen(
        xirang + up_line[1:] + ["--json"],
        cwd=elsewhere,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        started = json.loads(up.stdout.readline())
        assert Path(started["data_dir"]).parent == elsewhere
        _wait_for_nodes(xirang, elsewhere, env, 2)
        for words in readme_block("Other terminals find it through"):
            assert words[0] == "xirang"
            done = subprocess.run(
                xirang + words[1:], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
            )
            said = done.stdout + done.stderr
            assert done.returncode == 0, (words, said)
            assert "Traceback" not in said and "rejected" not in said, (words, said)
            if words[1] == "submit" and "--dry-run" not in words:
                _wait_for_start(xirang, elsewhere, env, words[2])
        history = subprocess.run(
            xirang + ["history", "--json"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
        )
        rows = {r["job"]: r for r in json.loads(history.stdout)["jobs"]}
        assert rows["train-1"]["state"] == "cancelled" and "fix-1" not in rows
    finally:
        os.kill(up.pid, signal.SIGTERM)
        up.wait(30)
        stop_job_processes(elsewhere / ".xirang")


def _wait_for_nodes(xirang, cwd, env, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = subprocess.run(
            xirang + ["nodes", "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )
        if done.returncode == 0 and len(json.loads(done.stdout)["nodes"]) >= count:
            return
        time.sleep(0.5)
    raise AssertionError("the hosts of `xirang up` did not join in 60 s")


def _wait_for_start(xirang, cwd, env, job: str) -> None:
    """The example job runs (so `logs` has something and `requeue` has a running job)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = subprocess.run(
            xirang + ["jobs", "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
        )
        rows = {r["job"]: r for r in json.loads(done.stdout)["jobs"]}
        if rows.get(job, {}).get("state") == "running" and rows[job]["progress_s"] > 1:
            return
        time.sleep(0.5)
    raise AssertionError(f"{job} did not start running in 60 s")
