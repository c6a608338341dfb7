"""What a host must not forget (how far it acted, its run records, its outbox's facts, a job's
exit status) is replaced durably: the new content whole after the replace, the old content
whole when the write fails half-way, and no temporary file left behind either way."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from trust.durable import TMP_SUFFIX, write_durably
from agents import jobwrap
from agents.gpus import parse_simulate
from agents.host import HostAgent, Run
from agents.local_cluster import REPO
from agents.outbox import Outbox
from core import types as T


def leftovers(folder):
    return sorted(p.name for p in folder.rglob(f"*{TMP_SUFFIX}"))


def test_a_replaced_file_holds_the_new_content_and_no_temporary_file_is_left(tmp_path):
    target = tmp_path / "acted.json"
    write_durably(target, b'{"last_n": 1}')
    write_durably(target, b'{"last_n": 2}')
    assert json.loads(target.read_bytes()) == {"last_n": 2}
    assert leftovers(tmp_path) == []


def test_a_write_failing_half_way_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "acted.json"
    write_durably(target, b'{"last_n": 1}')
    with pytest.raises(TypeError):
        write_durably(target, '{"last_n": 2}')  # type: ignore[arg-type]  # text, not bytes: fails after the temp file is opened
    assert json.loads(target.read_bytes()) == {"last_n": 1}
    assert leftovers(tmp_path) == []


def test_a_replace_the_file_system_refuses_leaves_no_temporary_file(tmp_path):
    taken = tmp_path / "run.json"
    taken.mkdir()
    (taken / "keep").write_text("x")  # a non-empty folder cannot be renamed over
    with pytest.raises(OSError):
        write_durably(taken, b"{}")
    assert (taken / "keep").read_text() == "x"
    assert leftovers(tmp_path) == []


def test_a_restarted_host_remembers_how_far_it_acted_and_its_runs(tmp_path):
    inventory = parse_simulate("1xH100")
    agent = HostAgent("nats://127.0.0.1:9", node="h1", inventory=inventory, state_dir=tmp_path)
    agent._load()
    agent.acted.last_n = 41
    agent._save_acted()
    agent.acted.last_n = 42
    agent._save_acted()
    agent._save_run(Run(job="train", n=42, pid=1234, dir=str(tmp_path / "run")))
    again = HostAgent("nats://127.0.0.1:9", node="h1", inventory=inventory, state_dir=tmp_path)
    again._load()
    assert again.acted.last_n == 42
    assert again.runs["train"].pid == 1234 and again.runs["train"].n == 42
    assert leftovers(tmp_path) == []


def test_a_fact_that_cannot_be_encoded_is_refused_and_leaves_nothing_in_the_outbox(tmp_path):
    box = Outbox(tmp_path / "outbox")
    box.put(T.Finished(id="f-1", job="a", ok=True))
    with pytest.raises(TypeError):
        box.put(T.Finished(id="f-2", job=object(), ok=True))  # type: ignore[arg-type]
    assert len(box.pending()) == 1 and leftovers(tmp_path) == []


def test_the_job_wrapper_records_the_exit_status_and_leaves_no_temporary_file(tmp_path):
    exit_file = tmp_path / "exit.json"
    job = [sys.executable, "-c", "raise SystemExit(3)"]
    command = [sys.executable, "-m", "agents.jobwrap", str(exit_file), "--", *job]
    done = subprocess.run(command, cwd=REPO, timeout=60)
    assert json.loads(exit_file.read_text())["rc"] == 3
    assert done.returncode == 3  # the job's status is the wrapper's own too
    assert leftovers(tmp_path) == []


def test_a_wrapper_that_cannot_write_its_records_still_runs_the_job_and_ends_with_its_status(tmp_path):
    # A full disk, or a folder gone: neither started.json nor exit.json can be written.
    exit_file = tmp_path / "gone" / "exit.json"
    ran = tmp_path / "ran"
    job = [sys.executable, "-c", f"open({str(ran)!r}, 'w').close(); raise SystemExit(3)"]
    command = [sys.executable, "-m", "agents.jobwrap", str(exit_file), "--", *job]
    done = subprocess.run(command, cwd=REPO, timeout=60, capture_output=True, text=True)
    assert ran.exists() and done.returncode == 3
    assert "cannot record started.json" in done.stderr and "cannot record exit.json" in done.stderr
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    done = subprocess.run(command[: -len(job)] + killed, cwd=REPO, timeout=60, capture_output=True)
    assert jobwrap.rc_of_status(done.returncode) == -signal.SIGTERM


def test_the_job_wrapper_status_reads_back_as_the_jobs_exit_status():
    for rc in (0, 1, 3, 127, -9, -15):
        assert jobwrap.rc_of_status(jobwrap.status_of(rc)) == rc


def test_a_restarted_host_removes_the_temporary_files_of_killed_writes_and_keeps_live_ones(tmp_path):
    # given temporary files as write_durably names them: one of a process that is gone (killed
    # mid-write), one of a process that still runs (this test)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    agent = HostAgent("nats://127.0.0.1:9", node="h1", inventory=parse_simulate("1xH100"), state_dir=tmp_path)
    agent.runs_dir.mkdir(parents=True)
    dead = agent.dir / f".acted.json.{gone.pid}-0123abcd{TMP_SUFFIX}"
    dead_run = agent.runs_dir / f".train.json.{gone.pid}-89abcdef{TMP_SUFFIX}"
    live = agent.dir / f".acted.json.{os.getpid()}-0badf00d{TMP_SUFFIX}"
    other = agent.dir / f"notes{TMP_SUFFIX}"  # not a name write_durably gives: someone else's
    for path in (dead, dead_run, live, other):
        path.write_text("half")
    # when the host agent starts on its folder
    agent._load()
    # then the dead writers' files are gone, the rest kept
    assert not dead.exists() and not dead_run.exists()
    assert live.exists() and other.exists()
