"""A small closed-loop workload driver: seeded synthetic jobs fed through `core.step`, with
hosts that answer the scheduler the way real ones would (start, checkpoint, reach a safe
point, release, finish). It produces realistic logs (preemptions, requeues, compensation,
aging) for the projection tests, the dashboard demo and `xirang bench replay`.

This is not the simulator (that lives in `replay/`): it has no baselines and no scorecard,
only enough behaviour to make every projection table fill up. An optional preemption
storm (a burst of urgent jobs from one team) exercises the alerts.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from dataclasses import dataclass, field

import msgspec

from core import new_state, next_due_t, step
from core import types as T
from core.policy import Policy

SEC = 1000
MIN = 60 * SEC
TEAMS = ("vision", "lm", "search", "safety")
LEVEL_WEIGHTS = (1, 2, 3, 6, 8, 10, 12, 10)  # few urgent jobs, many batch ones
TICK_MS = MIN


@dataclass
class Spec:
    seed: int = 7
    jobs: int = 200
    nodes: int = 6
    gpus_per_node: int = 8
    mean_gap_ms: int = 4 * MIN  # about 90% of a 48-GPU pool busy
    duration_ms: tuple[int, int] = (10 * MIN, 90 * MIN)
    storm_t: int | None = None  # when a burst of urgent jobs arrives
    storm_jobs: int = 0
    storm_level: int = 1
    storm_gpus: int = 2
    storm_team: str = "storm"
    policy: Policy | None = None
    extra_inputs: list[T.Input] = field(default_factory=list)  # e.g. set_policy at a time


@dataclass
class _Job:
    duration_ms: int
    ckpt_interval_ms: int
    token: int = 0  # bumped whenever the job's scheduled future inputs become stale
    progress_ms: int = 0
    run_start_t: int = 0


class Driver:
    """Feeds inputs in time order and schedules the hosts' answers to each event."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.state = new_state()
        self.heap: list[tuple[int, int, T.Input, str, int]] = []
        self.order = 0
        self.jobs: dict[str, _Job] = {}
        self.inputs: list[T.Input] = []
        self.records: list[T.Record] = []

    def at(self, t: int, inp: T.Input, job: str = "", token: int = -1) -> None:
        self.order += 1
        heapq.heappush(self.heap, (t, self.order, inp, job, token))

    def run(self) -> "Driver":
        self._plan_arrivals()
        while self.heap:
            t, _, inp, job, token = heapq.heappop(self.heap)
            if job and token != self.jobs[job].token:
                continue  # superseded: the job was preempted or rescheduled meanwhile
            due = next_due_t(self.state)
            if due is not None and due < t:
                self._feed(T.Tick(t=due))
            self._feed(_with_t(inp, max(t, self.state.canonical.t)))
        self._drain_ticks()
        return self

    def _drain_ticks(self) -> None:
        for _ in range(50):
            due = next_due_t(self.state)
            if due is None or self.heap:
                return
            self._feed(T.Tick(t=due))
            while self.heap:
                t, _, inp, job, token = heapq.heappop(self.heap)
                if job and token != self.jobs[job].token:
                    continue
                self._feed(_with_t(inp, max(t, self.state.canonical.t)))

    def _plan_arrivals(self) -> None:
        spec, rng = self.spec, self.rng
        if spec.policy is not None:
            # through the log, as live, so that a replay of the log has the same policy
            self.at(0, T.SetPolicy(params=policy_params(spec.policy), by="workload"))
        for i in range(spec.nodes):
            self.at(0, T.NodeUp(node=f"node-{i:02d}", gpu_model="A100", gpus=spec.gpus_per_node))
        t = SEC
        for i in range(spec.jobs):
            t += int(rng.expovariate(1 / spec.mean_gap_ms))
            level = rng.choices(range(T.LEVELS), weights=LEVEL_WEIGHTS)[0]
            team = rng.choice(TEAMS)
            self._submit(t, f"{team}-{i:05d}", team, f"{team}-u{rng.randint(1, 3)}", level)
        if spec.storm_t is not None:
            for i in range(spec.storm_jobs):
                self._submit(spec.storm_t + i * SEC, f"{spec.storm_team}-{i:03d}", spec.storm_team,
                             f"{spec.storm_team}-u{i % 3 + 1}", spec.storm_level, gpus=spec.storm_gpus)
        for inp in spec.extra_inputs:
            self.at(inp.t, inp)

    def _submit(self, t: int, job: str, team: str, user: str, level: int, gpus: int = 0) -> None:
        rng = self.rng
        gpus = gpus or rng.choice((1, 2, 4, 4, 8))
        duration = rng.randint(*self.spec.duration_ms)
        ckpt = rng.choice((5, 10, 20)) * MIN
        self.jobs[job] = _Job(duration_ms=duration, ckpt_interval_ms=ckpt)
        self.at(t, T.Submit(job=job, team=team, user=user, level=level, gpus=gpus,
                            gpu_models=["A100"], est_runtime_s=duration / 1000,
                            ckpt_interval_s=ckpt / 1000, ckpt_cost_s=20.0, restore_cost_s=15.0))

    def _feed(self, inp: T.Input) -> None:
        self.inputs.append(inp)
        _, records = step(self.state, inp)
        self.records.extend(records)
        for record in records:
            self._react(record.event)

    def _react(self, ev: T.Event) -> None:
        t = ev.t
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            job = self._bump(ev.job)
            self.at(t + self.rng.randint(2, 20) * SEC, T.Started(job=ev.job), ev.job, job.token)
        elif isinstance(ev, T.JobRunning):
            job = self.jobs[ev.job]
            job.run_start_t = t
            self._plan_run(ev.job, t)
        elif isinstance(ev, T.VictimNotified):
            self._answer_notice(ev)
        elif isinstance(ev, T.NoticeWithdrawn):
            self._plan_run(ev.job, t)
        elif isinstance(ev, T.JobRequeued):
            job = self._bump(ev.job)
            job.progress_ms = max(0, job.progress_ms)

    def _bump(self, job_id: str) -> _Job:
        job = self.jobs[job_id]
        job.token += 1
        return job

    def _plan_run(self, job_id: str, t: int) -> None:
        """Schedule the job's next checkpoint and its finish, superseding earlier plans."""
        job = self._bump(job_id)
        core_job = self.state.canonical.jobs.get(job_id)
        done_ms = core_job.progress_ms if core_job else 0
        remaining = max(SEC, job.duration_ms - done_ms)
        ckpt_t = t + job.ckpt_interval_ms
        while ckpt_t + 20 * SEC < t + remaining:
            self.at(ckpt_t, T.CheckpointStarted(job=job_id), job_id, job.token)
            self.at(ckpt_t + 20 * SEC, _saved(job_id, ckpt_t), job_id, job.token)
            ckpt_t += job.ckpt_interval_ms
        self.at(t + remaining, T.Finished(job=job_id, ok=self.rng.random() > 0.03), job_id, job.token)

    def _answer_notice(self, ev: T.VictimNotified) -> None:
        job = self._bump(ev.job)
        rng = self.rng
        t = ev.t + rng.randint(2, 25) * SEC
        self.at(t, T.SafePoint(job=ev.job), ev.job, job.token)
        if ev.checkpoint_needed:
            self.at(t + SEC, T.CheckpointStarted(job=ev.job), ev.job, job.token)
            t += 21 * SEC
            self.at(t, _saved(ev.job, t), ev.job, job.token)
        self.at(t + SEC, T.Released(job=ev.job), ev.job, job.token)


def policy_params(policy: Policy) -> dict:
    """The fields of `policy` that differ from the defaults, as set_policy params."""
    mine, base = msgspec.structs.asdict(policy), msgspec.structs.asdict(Policy())
    return {k: msgspec.to_builtins(v) for k, v in mine.items() if v != base[k]}


def _saved(job: str, t: int) -> T.CheckpointSaved:
    digest = "sha256:" + hashlib.sha256(f"{job}@{t}".encode()).hexdigest()
    return T.CheckpointSaved(job=job, step=t // SEC, digest=digest, bytes=1 << 30)


def _with_t(inp: T.Input, t: int) -> T.Input:
    return msgspec.structs.replace(inp, t=t)


def generate(spec: Spec | None = None, **kw) -> Driver:
    """Run a workload to completion; `.records` is the log, `.inputs` what was fed."""
    return Driver(spec or Spec(**kw)).run()
