"""Seeded chaos: a local cluster (real nats-server, a scheduler with a hot standby, host
agents, SDK training jobs) under a stream of submissions while faults are injected at
seeded random times, then the invariants that must survive any of them are checked.

Faults: SIGKILL of a scheduler (restarted), SIGKILL of an agent (restarted: it adopts its
jobs), SIGSTOP/SIGCONT of an agent (sometimes past the node timeout: its jobs are given
away and it must stop them on resuming), SIGTERM of an agent (an orderly stop: its jobs
checkpoint and requeue; restarted), and a SIGKILL of nats-server (restarted on the same
store after a few seconds). With `spoil_checkpoints` (`xirang chaos --spoil-checkpoints`),
a little after each fault also the bus's copy of a job's newest checkpoint is overwritten
with other bytes (a queued job's, whose resume will name it, when there is one; drawn apart
from the seed's plan, which stays as without it): its resume must read the second copy, on the disk
of the host that wrote it, and restore the same step.

Invariants, checked once the faults stop and the cluster has settled:
- every input the bus accepted (acknowledged on XR_IN) is in the log;
- no job ended twice (finished, failed or cancelled);
- no submitted job is lost: each one ends;
- no two runs of one job held GPUs at the same time beyond the fencing window, by the
  hosts' own records (agents/jobwrap.py writes when each run started and ended);
- every preemption saga resolved (committed or rolled back);
- no resume lost progress: no checkpoint fell back (chaos spoils at most one copy of any
  checkpoint), and every run that restored a checkpoint restored the step its resume named
  (the SDK says which, and from which copy, in the run's output);
- `xirang audit` verifies the log.

Some jobs are 2-node gangs (examples/train_ddp.py: ranks on both hosts all-reducing over
TCP), so faults also hit one part of a run whose other part lives on another host.

The seed decides the workload and the fault plan (what, when, for how long); how the OS
interleaves the processes does not repeat, which is the point.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from core import rebuild
from core import types as T
from transport import checkpoints as ckptstore
from transport.natsd import EmbeddedNats

from .jobwrap import STARTED_FILE
from .local_cluster import REPO, Cluster, matching, train_command
from .runfolders import run_of

FAULTS = ("kill_scheduler", "kill_agent", "stop_agent", "term_agent", "kill_nats")
SDK_SCHEME = "xr-ckpt:"
HOSTS = 2
GPUS_PER_HOST = 8
NODE_TIMEOUT_MS = 3000
GRACE_S = 1.0
STOP_MAX_S = 6.0  # SIGSTOP lasts up to this: past the node timeout about half the time
# Two runs of one job may overlap while a stopped host has not yet learned that its run
# was given away: at most the stop, then the grace time to stop the run, plus slack.
FENCING_WINDOW_S = STOP_MAX_S + GRACE_S + 4.0
SUBMIT_EVERY_S = (1.0, 4.0)
FAULT_EVERY_S = (3.0, 9.0)
# After the faults, the cluster works off its backlog: settling goes on while jobs still end
# (a job is lost when nothing ends for SETTLE_IDLE_S with it unended), at most SETTLE_S_MAX.
SETTLE_IDLE_S = 120.0
SETTLE_S_MAX = 900.0
# Of the submissions, this share are 2-node gangs (12 or 16 GPUs) of 100-500 steps: with the
# single-host jobs the pool is loaded about 70%, so the backlog drains once the faults stop.
GANG_SHARE = 0.1
# What the SDK prints when a run restores from the second copy (agents/sdk.py `restore`).
FROM_COPY_2 = re.compile(r"xirang sdk: restored step \d+ \(the resume named step \d+\) from copy 2")
# What the SDK prints when a run restores (agents/sdk.py `restore`).
RESTORE_LINE = re.compile(
    r"xirang sdk: (?:restored step (\d+)|no checkpoint verifies; from step 0) \(the resume named step (\d+)\)"
)


@dataclass
class Report:
    """What a chaos run did (faults injected, jobs, sagas) and whether each invariant held."""

    seed: int
    duration_s: float
    faults: dict[str, int] = field(default_factory=dict)
    jobs: dict[str, int] = field(default_factory=dict)
    sagas: dict[str, int] = field(default_factory=dict)
    invariants: dict[str, dict] = field(default_factory=dict)
    max_run_overlap_s: float = 0.0
    spoiled: dict[str, int] = field(default_factory=dict)  # bus copies spoiled, by job state

    @property
    def ok(self) -> bool:
        """Whether every invariant held."""
        return all(v["held"] for v in self.invariants.values())

    def as_dict(self) -> dict:
        """The report as JSON-ready data."""
        return {
            "seed": self.seed,
            "duration_s": self.duration_s,
            "ok": self.ok,
            "faults": self.faults,
            "jobs": self.jobs,
            "sagas": self.sagas,
            "invariants": self.invariants,
            "max_run_overlap_s": round(self.max_run_overlap_s, 3),
            "spoiled": self.spoiled,
            "fencing_window_s": FENCING_WINDOW_S,
        }


class Chaos:
    """A seeded chaos run: a live local cluster (two schedulers, host agents, SDK jobs) under
    submissions and seeded faults (kills, stops, a nats-server restart), then the invariants
    checked."""

    def __init__(
        self,
        root: str | os.PathLike,
        seed: int,
        duration_s: float,
        log=print,
        spoil_checkpoints: bool = False,
    ) -> None:
        self.root = Path(root)
        self.spoil_rng = random.Random(f"{seed}:spoil") if spoil_checkpoints else None
        self.seed = seed
        self.duration_s = duration_s
        self.rng = random.Random(seed)
        self.log = log
        self.report = Report(seed=seed, duration_s=duration_s)
        self.accepted: dict[str, int] = {}  # job -> XR_IN seq of its submit
        self.pending: list[tuple[float, str, str]] = []  # (when, action, target)
        self.stopped: set[str] = set()
        self.c: Cluster | None = None
        self.scheds: dict[str, subprocess.Popen] = {}
        self.agents: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------ the run

    def run(self) -> Report:
        """Run the cluster under faults for `duration_s`, let it settle, and check the
        invariants."""
        with Cluster(self.root, node_timeout_ms=NODE_TIMEOUT_MS) as c:
            self.c = c
            for name in ("s1", "s2"):  # a leader and a hot standby
                self.scheds[name] = c.scheduler(name)
            for i in range(HOSTS):
                self._start_agent(f"h{i + 1}")
            c.wait_for(T.NodeJoined, count=HOSTS, timeout_s=30)
            self._storm()
            self._heal()
            self._settle()
            self._check()
        return self.report

    def _storm(self) -> None:
        now = time.monotonic()
        end = now + self.duration_s
        next_submit = now + self.rng.uniform(*SUBMIT_EVERY_S)
        next_fault = now + self.rng.uniform(*FAULT_EVERY_S)
        n = 0
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_submit:
                self._submit(f"c{self.seed}-{n}")
                n += 1
                next_submit = now + self.rng.uniform(*SUBMIT_EVERY_S)
            if now >= next_fault:
                self._inject(self.rng.choice(FAULTS))
                if self.spoil_rng is not None:
                    # a little after the fault, when the jobs it requeued wait to resume
                    self.pending.append((now + self.spoil_rng.uniform(0.5, 3.0), "spoil", ""))
                next_fault = now + self.rng.uniform(*FAULT_EVERY_S)
            self._due()
            time.sleep(0.1)

    def _submit(self, job: str) -> None:
        level = self.rng.choice([0, 1, 3, 4, 5, 6, 7, 7])
        gpus = self.rng.choice([1, 2, 4, 8])
        steps = self.rng.randrange(200, 1200)
        command = train_command(steps, step_ms=10, ckpt_s=2.0)
        # Gangs are drawn apart (from the seed and the job), so the rest of a seed's plan is
        # the same as without them.
        gang_draw = random.Random(f"{self.seed}:{job}")
        if gang_draw.random() < GANG_SHARE:
            gpus = gang_draw.choice([12, 16])  # more than a host: a 2-node gang
            steps = gang_draw.randrange(100, 500)
            command = [
                sys.executable,
                str(REPO / "examples" / "train_ddp.py"),
                *("--steps", str(steps), "--step-ms", "10", "--checkpoint-every-s", "2"),
                *("--ranks-per-node", "1", "--log-every", "100"),
            ]
        inp = T.Submit(
            job=job,
            team=f"team-{self.rng.randrange(3)}",
            user="chaos",
            level=level,
            gpus=gpus,
            gpu_models=["H100"],
            est_runtime_s=steps / 100,
            ckpt_interval_s=2,
            ckpt_cost_s=0.2,
            restore_cost_s=0.2,
            command=command,
            id=f"chaos-{job}",
        )
        try:
            [(_, seq, _)] = self.c.send(inp)
        except Exception as err:  # noqa: BLE001 - the bus is down: not accepted, not counted
            self.log(f"chaos: submit {job} not accepted ({type(err).__name__})")
            return
        self.accepted[job] = seq

    # ------------------------------------------------------------ faults

    def _inject(self, fault: str) -> None:
        self.report.faults[fault] = self.report.faults.get(fault, 0) + 1
        later = time.monotonic() + self.rng.uniform(1.0, 3.0)
        if fault == "kill_scheduler":
            name = self.rng.choice(sorted(self.scheds))
            self.c.kill(self.scheds[name])
            self.pending.append((later, "start_scheduler", name))
        elif fault == "kill_nats":
            if any(action == "start_nats" for _, action, _ in self.pending):
                return
            self.c.nats.kill()
            self.pending.append((time.monotonic() + self.rng.uniform(2.0, 8.0), "start_nats", ""))
        else:
            name = self.rng.choice(sorted(self.agents))
            proc = self.agents[name]
            if name in self.stopped or proc.poll() is not None:
                return  # already down: this fault is a no-op
            if fault == "kill_agent":
                self.c.kill(proc)
                self.pending.append((later, "start_agent", name))
            elif fault == "term_agent":
                self.c.terminate(proc)
                self.pending.append((later, "start_agent", name))
            else:
                os.kill(proc.pid, signal.SIGSTOP)
                self.stopped.add(name)
                self.pending.append(
                    (time.monotonic() + self.rng.uniform(1.0, STOP_MAX_S), "cont_agent", name)
                )
        self.log(f"chaos: {fault}")

    def _spoil(self, rng: random.Random) -> None:
        """Overwrite the bus's copy of the newest checkpoint of a queued job (its resume will
        name it), else of a running one, with other bytes; its second copy is left whole."""
        try:
            state = rebuild(self.c.records())
        except Exception:  # noqa: BLE001 - the bus is away: nothing spoiled this time
            self.log("chaos: spoil_checkpoint skipped (no log)")
            return
        jobs = state.canonical.jobs
        holders = [
            j
            for j in sorted(jobs)
            if jobs[j].checkpoints and jobs[j].checkpoints[-1].path.startswith(SDK_SCHEME)
        ]
        queued = [j for j in holders if jobs[j].state == "queued"]
        pool = queued or [j for j in holders if jobs[j].state == "running"]
        if not pool:
            return
        job = rng.choice(pool)
        node, _, slot = jobs[job].checkpoints[-1].path[len(SDK_SCHEME) :].rpartition("/")

        async def spoil(nc, js):
            found = await ckptstore.get_located(js, job, slot, node)
            if found is None:
                return False
            data = bytearray(found[1])
            data[len(data) // 2] ^= 0xFF
            await ckptstore.put(js, job, found[0], slot, bytes(data))
            return True

        try:
            spoiled = self.c._run(spoil)
        except Exception:  # noqa: BLE001 - the bus went away meanwhile
            spoiled = False
        if spoiled:
            key = "spoiled_queued" if queued else "spoiled_running"
            self.report.spoiled[key] = self.report.spoiled.get(key, 0) + 1
            self.log(f"chaos: spoiled the bus's copy of {job}'s checkpoint in {slot}")

    def _due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for item in sorted(self.pending):
            when, action, name = item
            if when > now and not everything:
                continue
            self.pending.remove(item)
            if action == "start_scheduler":
                self.scheds[name] = self.c.scheduler(name)
            elif action == "start_agent":
                self._start_agent(name)
            elif action == "cont_agent":
                os.kill(self.agents[name].pid, signal.SIGCONT)
                self.stopped.discard(name)
            elif action == "spoil" and self.spoil_rng is not None:
                self._spoil(self.spoil_rng)
            elif action == "start_nats":
                self.c.nats = EmbeddedNats(self.root / "nats", port=self.c.nats.port).start()

    def _start_agent(self, name: str) -> None:
        self.agents[name] = self.c.agent(name, f"{GPUS_PER_HOST}xH100", grace_s=GRACE_S)

    def _heal(self) -> None:
        self._due(everything=True)
        for name, proc in sorted(self.scheds.items()):
            if proc.poll() is not None:
                self.scheds[name] = self.c.scheduler(name)
        for name, proc in sorted(self.agents.items()):
            if proc.poll() is not None:
                self._start_agent(name)

    def _settle(self) -> None:
        """Until every accepted job has ended, or no job has ended for SETTLE_IDLE_S (the rest
        are stuck), or SETTLE_S_MAX is up: a long storm leaves a backlog that takes time."""
        deadline = time.monotonic() + SETTLE_S_MAX
        last_progress, ended_before = time.monotonic(), -1
        while time.monotonic() < deadline and time.monotonic() - last_progress < SETTLE_IDLE_S:
            try:
                records = self.c.records()
            except Exception:  # noqa: BLE001 - the bus may still be electing
                time.sleep(1.0)
                continue
            ended = {
                r.event.job
                for r in records
                if isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled))
            }
            if all(job in ended for job in self.accepted):
                return
            if len(ended) != ended_before:
                last_progress, ended_before = time.monotonic(), len(ended)
            time.sleep(1.0)

    # ------------------------------------------------------------ invariants

    def _check(self) -> None:
        records = self.c.records()
        rep = self.report
        ends: dict[str, int] = {}
        for r in records:
            if isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled)):
                ends[r.event.job] = ends.get(r.event.job, 0) + 1
        in_log = {r.input_seq for r in records}
        missing = sorted(job for job, seq in self.accepted.items() if seq not in in_log)
        twice = sorted(job for job, count in ends.items() if count > 1)
        lost = sorted(job for job in self.accepted if job not in ends)
        planned = {r.event.saga for r in records if isinstance(r.event, T.PreemptionPlanned)}
        committed = {r.event.saga for r in records if isinstance(r.event, T.PreemptionCommitted)}
        rolled = {r.event.saga for r in records if isinstance(r.event, T.PreemptionRolledBack)}
        open_sagas = sorted(planned - committed - rolled)
        overlaps = self._run_overlaps()
        rep.max_run_overlap_s = max((o for _, o in overlaps), default=0.0)
        beyond = [(job, round(o, 2)) for job, o in overlaps if o > FENCING_WINDOW_S]
        fallbacks = sorted({r.event.job for r in matching(records, T.CheckpointFallback)})
        restores, short = self._restores()
        audit_ok, audit_detail = self._audit()
        rep.jobs = {
            "accepted": len(self.accepted),
            "finished": len(matching(records, T.JobFinished)),
            "failed": len(matching(records, T.JobFailed)),
            "cancelled": len(matching(records, T.JobCancelled)),
            "requeued": len(matching(records, T.JobRequeued)),
            "resumes": len(matching(records, T.JobResumeRequested)),
            "restores_checked": restores,
            "restores_from_copy_2": self._restores_from_copy_2(),
            "gangs": len([r for r in matching(records, T.JobSubmitted) if r.event.gpus > GPUS_PER_HOST]),
            "stale_facts_refused": len(matching(records, T.InputRejected, reason="stale_run")),
        }
        rep.sagas = {"planned": len(planned), "committed": len(committed), "rolled_back": len(rolled)}
        rep.invariants = {
            "accepted_inputs_in_log": _held(not missing, f"missing: {missing[:10]}"),
            "no_job_ended_twice": _held(not twice, f"twice: {twice[:10]}"),
            "no_job_lost": _held(not lost, f"never ended: {lost[:10]}"),
            "no_two_runs_at_once_beyond_fencing_window": _held(not beyond, f"overlaps: {beyond[:10]}"),
            "every_saga_resolved": _held(not open_sagas, f"open: {open_sagas[:10]}"),
            "no_resume_lost_progress": _held(
                not fallbacks and not short, f"fell back: {fallbacks[:10]}; restored short: {short[:10]}"
            ),
            "audit_verifies": _held(audit_ok, audit_detail),
        }

    def _run_overlaps(self) -> list[tuple[str, float]]:
        """Per job, the longest time two of its runs (different starts) were both alive,
        by the hosts' own records: started.json and exit.json (or, for a run killed with
        its wrapper, the last write to its output)."""
        now = time.time()
        runs: dict[str, dict[str, tuple[float, float]]] = {}
        for started in self.root.glob(f"hosts/*/runs/*/{STARTED_FILE}"):
            run_dir = started.parent
            job, n = run_of(run_dir.name) or (run_dir.name, 0)
            begin = json.loads(started.read_text())["t"]
            end = _end_of(run_dir, now)
            span = runs.setdefault(job, {}).get(n)
            runs[job][n] = (min(begin, span[0]), max(end, span[1])) if span else (begin, end)
        out = []
        for job, by_run in sorted(runs.items()):
            spans = sorted(by_run.values())
            worst = 0.0
            for i, (b1, e1) in enumerate(spans):
                for b2, e2 in spans[i + 1 :]:
                    worst = max(worst, min(e1, e2) - max(b1, b2))
            out.append((job, worst))
        return out

    def _restores(self) -> tuple[int, list[str]]:
        """How many runs restored a checkpoint, and those that restored less than their resume
        named (`<run folder>: <restored> < <named>`), from the runs' own output."""
        count, short = 0, []
        for output in sorted(self.root.glob("hosts/*/runs/*/output.log")):
            for restored, named in RESTORE_LINE.findall(output.read_text(errors="replace")):
                count += 1
                if int(restored or 0) < int(named):
                    short.append(f"{output.parent.name}: {restored or 0} < {named}")
        return count, short

    def _restores_from_copy_2(self) -> int:
        """How many runs restored their checkpoint from its second copy (their own output)."""
        return sum(
            len(FROM_COPY_2.findall(output.read_text(errors="replace")))
            for output in sorted(self.root.glob("hosts/*/runs/*/output.log"))
        )

    def _audit(self) -> tuple[bool, str]:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "xirang.cli",
                "audit",
                "--nats",
                self.c.url,
                "--json",
                "--public-key",
                str(self.root / "keys" / "scheduler.pub"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        try:
            summary = json.loads(done.stdout)
        except ValueError:
            return False, (done.stdout + done.stderr)[-300:]
        return done.returncode == 0 and bool(summary.get("ok")), summary.get("problem") or "ok"


def _held(held: bool, detail: str) -> dict:
    return {"held": held, "detail": "" if held else detail}


def _end_of(run_dir: Path, now: float) -> float:
    try:
        return json.loads((run_dir / "exit.json").read_text())["t"]
    except (OSError, ValueError, KeyError):
        pass
    job_token, _ = run_of(run_dir.name) or (run_dir.name, 0)
    try:  # the agent still tracks this very run: it is running
        if Path(json.loads((run_dir.parent / f"{job_token}.json").read_text())["dir"]) == run_dir.resolve():
            return now
    except (OSError, ValueError, KeyError):
        pass
    output = run_dir / "output.log"
    return output.stat().st_mtime if output.exists() else now
