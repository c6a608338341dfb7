"""The README and the user guide followed as written, from a directory outside the repository,
on a fresh copy of it: `xirang up` in one terminal, then every command of the README's
quickstart block, and every command of the user guide's everyday block, in another, each
answering without an error or a traceback. The commands are read from the files themselves,
so the test follows the docs as they are."""

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
from doc_blocks import block_after

pytestmark = pytest.mark.timeout(300)

README = REPO / "README.md"
USER_GUIDE = REPO / "docs" / "USER-GUIDE.md"
XIRANG = [sys.executable, "-m", "xirang.cli"]
# Commands that need their job running (not merely accepted) to do what the docs say.
NEEDS_A_RUNNING_JOB = ("logs", "requeue")


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


class Terminal:
    """A shell in a folder outside the repository, where `xirang up` runs."""

    def __init__(self, cwd: Path, env: dict) -> None:
        self.cwd, self.env = cwd, env

    def run(self, words: list[str]) -> subprocess.CompletedProcess:
        assert words[0] == "xirang", words
        return subprocess.run(
            XIRANG + words[1:], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=60
        )

    def json(self, *words: str) -> dict:
        done = self.run(["xirang", *words, "--json"])
        assert done.returncode == 0, (words, done.stdout + done.stderr)
        return json.loads(done.stdout)

    def follow(self, block: list[list[str]]) -> None:
        """Every command of a docs block, in order, as a reader would type them."""
        for words in block:
            if words[1] in NEEDS_A_RUNNING_JOB:
                self.wait_for_running(words[2])
            done = self.run(words)
            said = done.stdout + done.stderr
            assert done.returncode == 0, (words, said)
            assert "Traceback" not in said and "rejected" not in said, (words, said)

    def wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done = self.run(["xirang", "nodes", "--json"])
            if done.returncode == 0 and len(json.loads(done.stdout)["nodes"]) >= count:
                return
            time.sleep(0.5)
        raise AssertionError("the hosts of `xirang up` did not join in 60 s")

    def wait_for_running(self, job: str) -> None:
        """The example job runs and has made progress (so `logs` has output to show and
        `requeue` has a run to stop)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            rows = {r["job"]: r for r in self.json("jobs")["jobs"]}
            if rows.get(job, {}).get("state") == "running" and rows[job]["progress_s"] > 1:
                return
            time.sleep(0.5)
        raise AssertionError(f"{job} did not start running in 60 s")


@pytest.fixture(scope="module")
def terminal(tmp_path_factory):
    """`xirang up` as the README starts it, run from a fresh copy of the repository."""
    tmp_path = tmp_path_factory.mktemp("docs")
    clone = fresh_copy(tmp_path / "clone")
    elsewhere = tmp_path / "somewhere" / "else"
    elsewhere.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(clone)}
    env.pop("XIRANG_NATS", None)
    up_line = shlex.split(re.search(r"`(xirang up [^`]+)`", README.read_text()).group(1))
    up = subprocess.Popen(
        XIRANG + up_line[1:] + ["--json"],
        cwd=elsewhere,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    try:
        started = json.loads(up.stdout.readline())
        assert Path(started["data_dir"]).parent == elsewhere
        shell = Terminal(elsewhere, env)
        shell.wait_for_nodes(2)
        yield shell
    finally:
        os.kill(up.pid, signal.SIGTERM)
        up.wait(30)
        stop_job_processes(elsewhere / ".xirang")


def test_the_readme_quickstart_works_from_another_directory(terminal):
    block = block_after(README, "Other terminals find it through")
    assert [w[1] for w in block if w[1] == "submit"], "the quickstart submits a job"
    terminal.follow(block)
    rows = {r["job"]: r for r in terminal.json("history")["jobs"]}
    assert rows["train-1"]["state"] == "cancelled" and "fix-1" not in rows


def test_the_user_guides_everyday_commands_work(terminal):
    block = block_after(USER_GUIDE, "## Everyday commands")
    used = {words[1] for words in block}
    assert {"submit", "jobs", "queue", "cancel", "hold", "logs", "history", "audit"} <= used
    terminal.follow(block)
    rows = {r["job"]: r for r in terminal.json("history")["jobs"]}
    assert rows["sweep-2"]["state"] == "cancelled"
    assert rows["resnet-1"]["state"] in ("queued", "starting", "running")
