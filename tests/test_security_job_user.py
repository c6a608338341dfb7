"""Each job run has its own unprivileged OS user: a host agent started as root under the
shipped config (TLS, JWT users) starts every run as its own uid and gid from --job-uid-range
(no passwd entry, no supplementary groups). A job cannot read the host's credentials file or
the agent's state folder (EACCES), yet an SDK job still reads its own credentials,
checkpoints and reports through its outbox; another running job can neither guess that job's
run folder nor, knowing its real path and pid, read the folder, its credentials or the job's
/proc environment and working folder; an agent restarted after SIGKILL adopts the job process
it left, and the uid stays that run's (a run started after it draws another); an ended run's
uid is free again and its folder goes back to the agent."""

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
import time
from importlib import metadata
from pathlib import Path

import pytest
import random

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

# Another job, knowing a running job's name and start record (the log tells both), tries the
# run folder names it could build from them, lists the runs and reads the agent's record of
# that run; then, given the folder's real path and the job's pid (as if leaked), reads its
# credentials, lists the folder, reads the job's environment and working folder in /proc.
GUESS = """
import errno, os, sys
runs, job, n, real, pid = sys.argv[1:6]
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
for what, attempt in (("real-creds", lambda: open(os.path.join(real, "nats.creds")).read()),
                      ("real-dir", lambda: os.listdir(real)),
                      ("environ", lambda: open(f"/proc/{pid}/environ", "rb").read()),
                      ("cwd", lambda: os.listdir(f"/proc/{pid}/cwd"))):
    try:
        attempt()
        print(what, "READ")
    except OSError as err:
        print(what, errno.errorcode[err.errno])
        refused.append(err.errno == errno.EACCES)
print("uid", os.getuid(), "groups", os.getgroups())
sys.exit(0 if len(refused) == 10 and all(refused) else 1)
"""


def _job_python(uid: int) -> str:
    """An interpreter user `uid` may run (this venv's may sit below /root, which it may not)."""
    for candidate in (
        os.path.realpath(sys.executable),
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ):
        try:
            done = subprocess.run(
                [candidate, "-c", "0"], user=uid, group=uid, extra_groups=[], capture_output=True
            )
            if done.returncode == 0:
                return candidate
        except OSError:
            continue  # not there, or not for that uid
    pytest.skip(f"no python interpreter that uid {uid} may run")


def _with_agent_capabilities_only() -> list[str]:
    """A command prefix that leaves root only AGENT_CAPABILITIES (as the deploy files do)."""
    from agents.jobuser import AGENT_CAPABILITIES

    if shutil.which("setpriv") is None:
        return []  # util-linux's setpriv missing: the agent runs with all of root's
    return ["setpriv", "--bounding-set", ",".join(["-all", *(f"+{c.lower()}" for c in AGENT_CAPABILITIES)])]


def _uid_range() -> tuple[int, int]:
    """A block of the default range of its own, so that test runs side by side draw apart."""
    first = 2_000_000_000 + 1000 * random.randrange(60)
    return first, first + 999


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


def _uid(pid: int, field: str = "Uid:") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def _gid(pid: int) -> int:
    return _uid(pid, "Gid:")


def _wait_until(condition, what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent can start jobs as another user only as root")
def test_each_job_run_has_its_own_uid_and_reads_neither_the_agents_secrets_nor_another_jobs(
    tmp_path, monkeypatch, world_dir
):
    first, last = _uid_range()
    python = _job_python(first)
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
        agent_cmd = [*_with_agent_capabilities_only(), python, "-m", "xirang.cli", "agent", "--nats", nats.url, "--node", "h1",
                     "--simulate", "3xH100", "--data-dir", str(data), "--grace-s", "1",
                     "--job-uid-range", f"{first}-{last}",
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
        # it ran as a uid of the range, got EACCES for everything of the host's, and said so by
        # its exit status; once it ended, its folder went back to the agent
        snoop_dir = next(state.glob("runs/snoop-*"))
        output = (snoop_dir / "output.log").read_text()
        for what in ("creds", "secret", "state", "acted", "runs", "outbox"):
            assert f"{what} EACCES" in output, output
        snoop_uid = int(re.search(r"uid (\d+) ", output).group(1))
        assert first <= snoop_uid <= last, output
        _wait_until(lambda: not (state / "runs" / "snoop.json").exists(), "snoop's run record dropped")
        assert os.stat(snoop_dir).st_uid == 0 and os.stat(snoop_dir / "output.log").st_uid == 0
        assert not matching(_wait(nats, lambda rs: True, 1, ""), T.JobFailed, job="snoop")  # exit status 0
        # the agent's own secrets stay its own
        assert (os.stat(creds).st_uid, os.stat(creds).st_mode & 0o777) == (0, 0o600)
        assert (os.stat(state).st_uid, os.stat(state).st_mode & 0o777) == (0, 0o711)
        assert os.stat(state / "outbox").st_mode & 0o777 == 0o700
        assert os.stat(state / "acted.json").st_mode & 0o777 == 0o600

        # the SDK job, as its own uid, reads its own credentials and reports through its outbox
        _wait(
            nats, lambda rs: matching(rs, T.CheckpointRecorded, job="train"), 30, "train's first checkpoint"
        )
        record = json.loads((state / "runs" / "train.json").read_text())
        pid, train_uid = int(record["pid"]), int(record["job_uid"])
        assert first <= train_uid <= last and _uid(pid) == train_uid and _gid(pid) == train_uid
        run_dir = next(state.glob("runs/train-*"))
        assert os.stat(run_dir).st_uid == train_uid and os.stat(run_dir / "nats.creds").st_uid == train_uid
        assert os.stat(run_dir).st_mode & 0o077 == 0  # nobody else's

        # another job (its own uid) that guesses train's run folder from its name and start
        # record cannot open its credentials; given the real path and pid, it reads nothing
        # either; train's uid reads its credentials by that path
        started = matching(_wait(nats, lambda rs: True, 1, ""), T.JobStartRequested, job="train")[0]
        submit(
            "guess",
            [python, "-c", GUESS, str(state / "runs"), "train", str(started.n), str(run_dir), str(pid)],
        )
        ended = (T.JobFinished, T.JobFailed)
        _wait(nats, lambda rs: any(matching(rs, e, job="guess") for e in ended), 30, "the guessing job ended")
        output = next(state.glob("runs/guess-*/output.log")).read_text()
        assert "READ" not in output and "list EACCES" in output and "record EACCES" in output, output
        for what in ("real-creds", "real-dir", "environ", "cwd"):
            assert f"{what} EACCES" in output, output
        assert output.count("ENOENT") == 4, output
        guess_uid = int(re.search(r"uid (\d+) groups \[\]", output).group(1))
        assert first <= guess_uid <= last and guess_uid != train_uid, output
        assert not matching(_wait(nats, lambda rs: True, 1, ""), T.JobFailed, job="guess")  # exit status 0
        by_real_name = subprocess.run([python, "-c", "import sys; open(sys.argv[1]).read()", str(run_dir / "nats.creds")],
                                      user=train_uid, group=train_uid, extra_groups=[], capture_output=True)  # fmt: skip
        assert by_real_name.returncode == 0, by_real_name.stderr

        # an agent restarted after SIGKILL adopts the job (same pid) and its facts still flow
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(10)
        seen = len(matching(_wait(nats, lambda rs: True, 1, ""), T.CheckpointRecorded, job="train"))
        start_agent()
        _wait(nats, lambda rs: len(matching(rs, T.CheckpointRecorded, job="train")) > seen + 1, 30,
              "train checkpoints after the restart")  # fmt: skip
        record = json.loads((state / "runs" / "train.json").read_text())
        assert (int(record["pid"]), int(record["job_uid"]), _uid(pid)) == (pid, train_uid, train_uid)
        # a run started by the restarted agent draws a uid train does not hold
        submit("after", [python, "-c", "import os; print('uid', os.getuid())"])
        _wait(nats, lambda rs: matching(rs, T.JobFinished, job="after"), 30, "the job after the restart")
        output = next(state.glob("runs/after-*/output.log")).read_text()
        after_uid = int(re.search(r"uid (\d+)", output).group(1))
        assert first <= after_uid <= last and after_uid != train_uid, output
        log = "".join(p.read_text() for p in tmp_path.glob("agent-*.log"))
        assert "each job run has its own uid" in log, log[-2000:]


def test_root_gives_each_run_its_own_uid_by_default_and_job_user_pins_one_user():
    from agents.jobuser import (
        DEFAULT_JOB_UID_RANGE,
        JobUserError,
        UidPool,
        own_user_name,
        resolve,
        resolve_job_users,
    )

    with pytest.raises(JobUserError, match="no such user"):
        resolve_job_users("no-such-user-xirang", None)
    assert resolve_job_users(own_user_name(), None) is None  # the agent's own user: jobs share it (it warns)
    with pytest.raises(JobUserError, match="exclude each other"):
        resolve_job_users("nobody", "2000000000-2000000009")
    if os.geteuid() == 0:
        pool = resolve_job_users(None, None)
        assert isinstance(pool, UidPool) and f"{pool.first}-{pool.last}" == DEFAULT_JOB_UID_RANGE
        user = pool.sample()
        assert user.uid == user.gid == pool.first and user.popen_kwargs()["extra_groups"] == []
        if any(entry.pw_name == "nobody" for entry in pwd.getpwall()):
            user = resolve_job_users("nobody", None)
            assert user.name == "nobody" and user.popen_kwargs() == {
                "user": user.uid,
                "group": user.gid,
                "extra_groups": [],
            }
    else:
        assert resolve(None) is None and resolve_job_users(None, None) is None
        with pytest.raises(JobUserError, match="only an agent running as root"):
            resolve("root")
        with pytest.raises(JobUserError, match="only an agent running as root"):
            resolve_job_users(None, "2000000000-2000000009")


def test_a_uid_range_must_be_unprivileged_ids_nobody_else_was_given(tmp_path, monkeypatch):
    from agents import jobuser
    from agents.jobuser import JobUserError, parse_uid_range

    assert parse_uid_range("2000000000-2000000009") == (2_000_000_000, 2_000_000_009)
    for bad, says in (
        ("2000-1000", "upwards"),
        ("0-999", "upwards"),
        ("1000", "FIRST-LAST"),
        ("a-b", "FIRST-LAST"),
    ):
        with pytest.raises(JobUserError, match=says):
            parse_uid_range(bad)
    subuid = tmp_path / "subuid"
    subuid.write_text("ana:100000:65536\nbo:2000000500:65536\n")
    monkeypatch.setattr(jobuser, "SUBORDINATE_ID_FILES", (str(subuid),))
    with pytest.raises(JobUserError, match="overlaps bo's subordinate ids 2000000500-2000066035"):
        parse_uid_range("2000000000-2000000999")
    assert parse_uid_range("2000000000-2000000499") == (2_000_000_000, 2_000_000_499)


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another uid needs root")
def test_a_uid_held_by_a_run_or_owning_a_live_process_is_not_drawn(tmp_path):
    from agents.jobuser import JobUserError, UidPool

    first, _ = _uid_range()
    pool = UidPool(first, first + 2, tmp_path / "uids.lock")
    # a job's stray process, its run long gone, still runs as `first`
    stray = subprocess.Popen(["sleep", "30"], user=first, group=first, extra_groups=[])
    try:
        with pool.lease(held={first + 1}) as user:
            assert (user.uid, user.gid) == (first + 2, first + 2)
        with pytest.raises(JobUserError, match="every uid is held"):
            with pool.lease(held={first + 1, first + 2}):
                pass
    finally:
        stray.kill()
        stray.wait(5)
    # once the process is gone its uid is drawn again; round robin draws freed uids late
    with pool.lease(held={first + 1}) as user:
        assert user.uid == first
    with pool.lease(held=set()) as user:
        assert user.uid == first + 1


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


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")
def test_a_run_an_older_agent_started_as_the_one_job_user_keeps_that_user_under_per_run_uids(tmp_path):
    from agents.gpus import parse_simulate
    from agents.host import HostAgent
    from agents.jobuser import UidPool

    first, last = _uid_range()
    agent = HostAgent("nats://127.0.0.1:9", node="h1", inventory=parse_simulate("1xH100"), state_dir=tmp_path,
                      job_user=UidPool(first, last))  # fmt: skip
    agent.runs_dir.mkdir(parents=True)
    old, new = agent.runs_dir / "old-3-x", agent.runs_dir / "new-4-x"
    for folder, owner in ((old, 65534), (new, first + 7)):
        folder.mkdir()
        os.chown(folder, owner, owner)
    (agent.runs_dir / "old.json").write_text(json.dumps({"job": "old", "n": 3, "dir": str(old)}))
    (agent.runs_dir / "new.json").write_text(
        json.dumps({"job": "new", "n": 4, "dir": str(new), "job_uid": first + 7})
    )
    agent._load()
    assert agent.user_of(agent.runs["old"]).uid == 65534  # its notices and renewed creds go to it
    assert agent.user_of(agent.runs["new"]).uid == first + 7
    with UidPool(first + 7, first + 8).lease({r.job_uid for r in agent.runs.values()}) as user:
        assert user.uid == first + 8  # a uid a run record holds is not drawn


def test_the_deploy_files_grant_the_agent_exactly_the_capabilities_it_needs():
    from agents.jobuser import AGENT_CAPABILITIES

    deploy = Path(REPO) / "deploy"
    unit = (deploy / "systemd" / "xirang-agent.service").read_text()
    bounding = re.search(r"^CapabilityBoundingSet=(.*)$", unit, re.M).group(1).split()
    assert sorted(bounding) == sorted(f"CAP_{c}" for c in AGENT_CAPABILITIES)
    manifest = (deploy / "k8s" / "xirang.yaml").read_text()
    added = re.search(r"^\s*drop: \[ALL\]\n\s*add: \[(.*)\]$", manifest, re.M).group(1)
    assert sorted(c.strip() for c in added.split(",")) == sorted(AGENT_CAPABILITIES)
    docker = (deploy / "Dockerfile").read_text()
    assert "--cap-drop ALL" in docker and sorted(re.findall(r"--cap-add (\w+)", docker)) == sorted(
        AGENT_CAPABILITIES
    )
