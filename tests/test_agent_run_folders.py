"""Run folders carry a secret the agent draws (a job cannot guess another's), and an agent
that crashed between starting a run and recording it still finds that run's process and
folder after its restart instead of starting the job twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from agents.gpus import parse_simulate
from agents.host import MARKER_ENV, HostAgent
from agents.local_cluster import REPO
from agents.runfolders import new_run_folder, run_folders, run_of


def test_each_run_folder_name_carries_a_fresh_secret_and_still_names_its_job_and_record(tmp_path):
    names = {new_run_folder(tmp_path, "train-a", 12).name for _ in range(50)}
    assert len(names) == 50
    for name in names:
        assert name.startswith("train-a-12-") and run_of(name) == ("train-a", 12)
        assert len(name) - len("train-a-12-") == 32  # 128 random bits
    for not_a_run in ("train-a-12", "train-a", "train-a-12-xyz", "train.json", "outbox"):
        assert run_of(not_a_run) is None


def test_run_folders_finds_only_that_jobs_record_among_similar_names(tmp_path):
    mine = new_run_folder(tmp_path, "a", 1)
    for folder in (mine, new_run_folder(tmp_path, "a-1", 5), new_run_folder(tmp_path, "a", 11)):
        folder.mkdir()
    (tmp_path / "a-1").mkdir()  # an older agent's name: no secret
    assert run_folders(tmp_path, "a", 1) == [mine]


def test_an_agent_that_crashed_before_recording_a_run_adopts_its_process_and_folder(tmp_path):
    agent = HostAgent("nats://127.0.0.1:9", node="h1", inventory=parse_simulate("1xH100"), state_dir=tmp_path)
    agent.runs_dir.mkdir(parents=True)
    folder = new_run_folder(agent.runs_dir, "train", 7)
    folder.mkdir()
    marker = "h1/train/7"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "agents.jobwrap", str(folder / "exit.json"), "--", sys.executable, "-c",
         "import time; time.sleep(30)"],
        env={**os.environ, MARKER_ENV: marker, "XR_JOB_DIR": str(folder)},
        cwd=REPO, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for_exec(wrapper.pid)
        assert agent._unrecorded_run("train", 7, marker) == (wrapper.pid, folder)
        # a folder made but no process started: reused, not a second folder
        left = new_run_folder(agent.runs_dir, "train", 8)
        left.mkdir()
        assert agent._unrecorded_run("train", 8, "h1/train/8") == (0, left)
        # nothing yet: a new folder with a new secret each time
        pid, fresh = agent._unrecorded_run("train", 9, "h1/train/9")
        assert pid == 0 and not fresh.exists() and run_of(fresh.name) == ("train", 9)
        assert agent._unrecorded_run("train", 9, "h1/train/9")[1] != fresh
    finally:
        os.killpg(wrapper.pid, signal.SIGKILL)
        wrapper.wait(10)


def _wait_for_exec(pid: int) -> None:
    """Right after exec the kernel shows an empty command line for a moment; a crashed
    agent's wrapper has long passed that point, so wait for it rather than race it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if fh.read():
                return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed its command line")
