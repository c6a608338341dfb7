"""Jobs run as an unprivileged OS user: a host agent started as root under the shipped
config (TLS, JWT users) starts its jobs as `nobody` by default. A job cannot read the host's
credentials file or the agent's state folder (EACCES), yet an SDK job still reads its own
credentials, checkpoints and reports through its outbox; another job, though it runs as the
same user, cannot find that job's run folder (and credentials) by guessing its name; an
agent restarted after SIGKILL adopts the job process it left."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest

from agents.local_cluster import FAST_POLICY, REPO, matching, train_command
from core import types as T
from tests.secure_nats import run_cli, running_cluster, spawn
from tests.test_live_deploy import _wait, wait_for_streams

pytestmark = pytest.mark.timeout(90)

SNOOP = """
import errno, os, sys
creds, state, secret = sys.argv[1], sys.argv[2], sys.argv[3]
refused = []
for what, attempt in (("creds", lambda: open(creds).read()), ("state", lambda: os.listdir(state)),
                      ("secret", lambda: open(secret).read()),
                      ("acted", lambda: open(os.path.join(state, "acted.json")).read()),
                      ("runs", lambda: os.listdir(os.path.join(state, "runs"))),
                      ("outbox", lambda: os.listdir(os.path.join(state, "outbox")))):
    try:
        attempt()
        print(what, "READ")
    except OSError as err:
        print(what, errno.errorcode[err.errno])
        refused.append(err.errno == errno.EACCES)
print("uid", os.getuid(), "home", os.environ.get("HOME"))
sys.exit(0 if len(refused) == 6 and all(refused) else 1)
"""

# Another job running as the same user, knowing a running job's name and start record (the
# log tells both), tries the run folder names it could build from them, lists the runs and
# reads the agent's record of that run.
GUESS = """
import errno, os, sys
runs, job, n = sys.argv[1], sys.argv[2], sys.argv[3]
refused = []
for name in (f"{job}-{n}", f"{job}-{n}-" + "0" * 32, job, f"{job}-{n}-"):
    try:
        open(os.path.join(runs, name, "nats.creds")).read()
        print("guess", name, "READ")
    except OSError as err:
        print("guess", name, errno.errorcode[err.errno])
        refused.append(err.errno in (errno.ENOENT, errno.EACCES))
try:
    print("listed", os.listdir(runs))
except OSError as err:
    print("list", errno.errorcode[err.errno])
    refused.append(err.errno == errno.EACCES)
try:  # the agent's record of the run, which names its folder
    print("record", open(os.path.join(runs, job + ".json")).read())
except OSError as err:
    print("record", errno.errorcode[err.errno])
    refused.append(err.errno == errno.EACCES)
sys.exit(0 if len(refused) == 6 and all(refused) else 1)
"""


def _job_python() -> str:
    """An interpreter `nobody` may run (this venv's may sit below /root, which it may not)."""
    for candidate in (
        os.path.realpath(sys.executable),
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ):
        try:
            if subprocess.run([candidate, "-c", "0"], user="nobody", capture_output=True).returncode == 0:
                return candidate
        except OSError:
            continue  # not there, or not for nobody
    pytest.skip("no python interpreter that nobody may run")


@pytest.fixture
def world_dir():
    """A folder `nobody` may reach (a test's tmp_path is 0700), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="xr-jobuser-"))
    os.chmod(path, 0o711)
    try:
        yield path
    finally:
        from agents.host import stop_job_processes

        stop_job_processes(path)  # the jobs it ran as nobody, by their run folders below it
        shutil.rmtree(path, ignore_errors=True)


PACKAGES = ("core", "transport", "trust", "agents", "projections", "replay", "xirang", "examples")


def _place(source: Path, target: Path) -> None:
    """`source` at `target`, readable by all: a hard link where the file already is (free, and
    nobody then needs no way through the checkout's folders), else a copy."""
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    if source.stat().st_mode & 0o004:
        try:
            os.link(source, target)
            return
        except OSError:
            pass  # another file system: copy it
    shutil.copy2(source, target)
    target.chmod(target.stat().st_mode | 0o444)


def _runtime_distributions() -> list[metadata.Distribution]:
    """The installed distributions xirang needs to run (its dependencies, transitively; not
    the test extras), without xirang itself."""
    found: dict[str, metadata.Distribution] = {}
    todo = ["xirang"]
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        try:
            found[name] = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a dependency for another python (a marker we don't evaluate)
        for requirement in found[name].requires or []:
            if "extra ==" not in requirement:
                todo.append(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    found.pop("xirang", None)
    return list(found.values())


def _install_for_nobody(root: Path) -> tuple[Path, Path]:
    """What an agent and its jobs need, placed below `root` (which nobody can reach) whatever
    folder the checkout and its venv sit in (a CI clone in a 0700 mktemp folder): the
    product's packages and examples as `root/xirang`, the runtime dependencies as
    `root/site`. Returns both folders."""
    repo, site = root / "xirang", root / "site"
    for package in PACKAGES:
        for source in sorted((REPO / package).rglob("*")):
            if source.is_file():
                _place(source, repo / source.relative_to(REPO))
    for dist in _runtime_distributions():
        base = Path(dist.locate_file("")).resolve()
        for entry in dist.files or []:
            source = Path(dist.locate_file(entry)).resolve()
            if source.is_file() and source.is_relative_to(base):
                _place(source, site / source.relative_to(base))
    for folder, _, _ in os.walk(root):
        os.chmod(folder, 0o755)  # whatever the umask made them
    return repo, site


def _uid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid in /proc/{pid}/status")


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent can start jobs as another user only as root")
def test_an_agent_running_as_root_runs_jobs_as_nobody_who_cannot_read_its_secrets(
    tmp_path, monkeypatch, world_dir
):
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    python = _job_python()
    repo, site = _install_for_nobody(world_dir / "install")
    with running_cluster(tmp_path, monkeypatch) as (nats, procs):
        (tmp_path / "policy.toml").write_text(FAST_POLICY)
        sched = ["scheduler", "--nats", nats.url, "--data-dir", str(tmp_path / "sched"), "--tick-ms", "200"]
        procs.append(
            spawn(tmp_path, nats.env("scheduler"), *sched, "--policy", str(tmp_path / "policy.toml"))
        )
        wait_for_streams(nats)
        # the host's credentials where a real host keeps them: a readable folder, the file 0600
        creds = world_dir / "host-h1.creds"
        shutil.copy(nats.creds("host-h1"), creds)
        os.chmod(creds, 0o600)
        data = world_dir / "data"
        data.mkdir(mode=0o711)
        env = {k: v for k, v in nats.env("host-h1").items() if k not in ("XIRANG_JOB_USER", "PYTHONHOME")}
        shutil.copy(nats.ca, world_dir / "ca.pem")  # a public certificate: readable by all
        os.chmod(world_dir / "ca.pem", 0o644)
        env.update(
            XIRANG_CREDS=str(creds),
            XIRANG_TLS_CA=str(world_dir / "ca.pem"),
            PYTHONPATH=os.pathsep.join([str(repo), str(site)]),
        )
        agent_cmd = [python, "-m", "xirang.cli", "agent", "--nats", nats.url, "--node", "h1",
                     "--simulate", "2xH100", "--data-dir", str(data), "--grace-s", "1",
                     "--public-key", str(tmp_path / "sched" / "keys" / "scheduler.pub")]  # fmt: skip

        def start_agent() -> subprocess.Popen:
            out = open(tmp_path / f"agent-{len(procs)}.log", "ab")
            proc = subprocess.Popen(agent_cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=repo, env=env)  # fmt: skip
            procs.append(proc)
            return proc

        agent = start_agent()
        _wait(nats, lambda rs: matching(rs, T.NodeJoined, node="h1"), 30, "h1 joined")
        state = data / "hosts" / "h1"

        def submit(name: str, command: list[str]) -> None:
            code, answer = run_cli(nats.env("client-vision-li"), "submit", name, "--team", "vision", "--user", "li",
                                   "--level", "6", "--gpus", "1", "--gpu-model", "H100", "--ckpt-cost-s", "0.1",
                                   "--command", shlex.join(command), "--nats", nats.url, "--json")  # fmt: skip
            assert code == 0 and answer["outcome"] == "accepted", answer

        submit(
            "snoop", [python, "-c", SNOOP, str(creds), str(state), str(data / "keys" / "checkpoint.secret")]
        )
        train = train_command(100_000, ckpt_s=0.5)
        script = Path(train[1]).relative_to(REPO)
        submit("train", [python, str(repo / script), *train[2:]])
        _wait(nats, lambda rs: matching(rs, T.JobFinished, job="snoop"), 30, "the snooping job finished")
        # it ran as nobody, got EACCES for everything of the host's, and said so by its exit status
        output = next(state.glob("runs/snoop-*/output.log")).read_text()
        for what in ("creds", "secret", "state", "acted", "runs", "outbox"):
            assert f"{what} EACCES" in output, output
        assert f"uid {nobody.pw_uid} " in output, output
        assert not matching(_wait(nats, lambda rs: True, 1, ""), T.JobFailed, job="snoop")  # exit status 0
        # the agent's own secrets stay its own
        assert (os.stat(creds).st_uid, os.stat(creds).st_mode & 0o777) == (0, 0o600)
        assert (os.stat(state).st_uid, os.stat(state).st_mode & 0o777) == (0, 0o711)
        assert os.stat(state / "outbox").st_mode & 0o777 == 0o700
        assert os.stat(state / "acted.json").st_mode & 0o777 == 0o600

        # the SDK job, as nobody, reads its own credentials and reports through its outbox
        _wait(
            nats, lambda rs: matching(rs, T.CheckpointRecorded, job="train"), 30, "train's first checkpoint"
        )
        pid = int(json.loads((state / "runs" / "train.json").read_text())["pid"])
        assert _uid(pid) == nobody.pw_uid
        run_dir = next(state.glob("runs/train-*"))
        assert (
            os.stat(run_dir).st_uid == nobody.pw_uid
            and os.stat(run_dir / "nats.creds").st_uid == nobody.pw_uid
        )

        # another job (same OS user) that guesses train's run folder from its name and start
        # record cannot open its credentials, though nobody could read them by their real path
        started = matching(_wait(nats, lambda rs: True, 1, ""), T.JobStartRequested, job="train")[0]
        submit("guess", [python, "-c", GUESS, str(state / "runs"), "train", str(started.n)])
        ended = (T.JobFinished, T.JobFailed)
        _wait(nats, lambda rs: any(matching(rs, e, job="guess") for e in ended), 30, "the guessing job ended")
        output = next(state.glob("runs/guess-*/output.log")).read_text()
        assert "READ" not in output and "list EACCES" in output and "record EACCES" in output, output
        assert output.count("ENOENT") == 4, output
        assert not matching(_wait(nats, lambda rs: True, 1, ""), T.JobFailed, job="guess")  # exit status 0
        by_real_name = subprocess.run([python, "-c", "import sys; open(sys.argv[1]).read()", str(run_dir / "nats.creds")],
                                      user="nobody", capture_output=True)  # fmt: skip
        assert by_real_name.returncode == 0, by_real_name.stderr

        # an agent restarted after SIGKILL adopts the job (same pid) and its facts still flow
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        seen = len(matching(_wait(nats, lambda rs: True, 1, ""), T.CheckpointRecorded, job="train"))
        start_agent()
        _wait(nats, lambda rs: len(matching(rs, T.CheckpointRecorded, job="train")) > seen + 1, 30,
              "train checkpoints after the restart")  # fmt: skip
        assert int(json.loads((state / "runs" / "train.json").read_text())["pid"]) == pid
        assert _uid(pid) == nobody.pw_uid
        log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
        assert "jobs run as nobody" in log, log[-2000:]


def test_the_job_user_defaults_to_nobody_for_root_and_an_unknown_or_unusable_user_is_refused():
    from agents.jobuser import JobUserError, own_user_name, resolve

    with pytest.raises(JobUserError, match="no such user"):
        resolve("no-such-user-xirang")
    assert resolve(own_user_name()) is None  # the agent's own user: jobs share it (the agent warns)
    if os.geteuid() == 0 and any(entry.pw_name == "nobody" for entry in pwd.getpwall()):
        user = resolve(None)
        assert user is not None and user.name == "nobody" and user.uid != 0
        assert user.popen_kwargs() == {"user": user.uid, "group": user.gid, "extra_groups": []}
    elif os.geteuid() != 0:
        assert resolve(None) is None
        with pytest.raises(JobUserError, match="only an agent running as root"):
            resolve("root")


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")
def test_a_job_cannot_relabel_its_outbox_as_another_jobs_across_an_agent_restart(tmp_path):
    from agents.gpus import parse_simulate
    from agents.host import HostAgent
    from agents.jobuser import resolve
    from agents.outbox import JOB_MARKER

    try:
        user = resolve("nobody")
    except ValueError:
        pytest.skip("no user nobody")
    agent = HostAgent("nats://127.0.0.1:9", node="h1", inventory=parse_simulate("1xH100"), state_dir=tmp_path,
                      job_user=user)  # fmt: skip
    agent.runs_dir.mkdir(parents=True)
    # a live run whose job rewrote its marker, and an ended run's folder with a forged one
    live, ended = agent.runs_dir / "train-3" / "outbox", agent.runs_dir / "old-2" / "outbox"
    for folder in (live, ended):
        folder.mkdir(parents=True)
        (folder / JOB_MARKER).write_text("victim")
        os.chown(folder / JOB_MARKER, user.uid, user.gid)
    (agent.runs_dir / "train.json").write_text(json.dumps({"job": "train", "n": 3, "dir": str(live.parent)}))
    agent._load()
    assert agent.outbox.job_folders == {live: "train"}
