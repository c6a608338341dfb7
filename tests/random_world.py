"""A seeded random world for property tests: a random cluster, a random workload, and
hosts that answer the scheduler's decisions the way real ones might (promptly, late, or
never; checkpoints that fail; nodes that die). Two sources of facts are mixed: the
simulated hosts (`replay.simhost`, the one model of how hosts answer: launches, periodic
checkpoints, safe points, releases, finishes, each delivered late by a random number of
steps or never), and an adversary that makes up facts the hosts might send at any time,
right or wrong. Run as a script it prints the event log, so a test can compare logs across
processes and hash seeds."""

from __future__ import annotations

import random
import sys
from typing import Callable

import msgspec

from core import new_state, step
from core import types as T
from core.log.evolve_jobs import submitted_costs_ms
from core.model.state import State
from replay.simhost import IDLE, SimHosts
from replay.workload import TraceJob

MODELS = ["A100", "H100", "L4"]
HOST_FACT_SHARE = 0.3  # of the inputs, those that are the simulated hosts' next fact


class World:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.state: State = new_state()
        self.t = 0
        self.n_jobs = 0
        self.records: list[T.Record] = []
        self.nodes = [
            (f"node-{i}", self.rng.choice(MODELS), self.rng.choice([4, 8]))
            for i in range(self.rng.randint(2, 6))
        ]
        self.heard: list[T.Input] = []  # the simulated hosts' facts, not delivered yet
        self.hosts = SimHosts(report=self.heard.append)

    def feed(
        self,
        inp: T.Input,
        check: Callable[[State, T.Input, list[T.Record]], None] | None = None,
        before: bytes | None = None,
    ) -> list[T.Record]:
        _, records = step(self.state, inp)
        self.records.extend(records)
        for record in records:
            self._tell_hosts(record.event)
        if check is not None:
            check(self.state, inp, records, before)
        return records

    def boot(self) -> list[T.Input]:
        return [T.NodeUp(t=0, node=name, gpu_model=model, gpus=gpus) for name, model, gpus in self.nodes]

    def _tell_hosts(self, ev: T.Event) -> None:
        """Host-directed events reach the simulated hosts, as they would real ones."""
        hosts, kind = self.hosts, type(ev)
        if kind is T.JobSubmitted:
            hosts.add_job(self._trace_job(ev))
        elif kind is T.JobStartRequested or kind is T.JobResumeRequested:
            job = hosts.jobs[ev.job]
            if job.phase != IDLE:  # the adversary's facts made the core restart it: a fresh process
                hosts.add_job(job.spec)
            placement = [(slot.node, len(slot.gpus)) for slot in ev.placement]
            hosts.start(ev.job, placement, 0 if kind is T.JobStartRequested else None)
        elif kind is T.VictimNotified:
            hosts.notify(ev.job, ev.checkpoint_needed)
        elif kind is T.NoticeWithdrawn:
            hosts.withdraw(ev.job)
        elif kind in (T.JobCancelled, T.JobStopRequested, T.JobFinished, T.JobFailed, T.JobRequeued):
            # the core holds it ended or off its GPUs (the adversary may have said so)
            self._stop_on_hosts(ev.job)
        elif kind is T.NodeLost:
            for job_id in ev.jobs:
                self._stop_on_hosts(job_id)

    def _stop_on_hosts(self, job_id: str) -> None:
        """The hosts stop the job's processes, and what they had not yet said of it is lost."""
        self.hosts.cancel(job_id)
        self.heard[:] = [fact for fact in self.heard if fact.job != job_id]

    def _trace_job(self, ev: T.JobSubmitted) -> TraceJob:
        """The job as its hosts will run it: it often outruns its estimate, which keeps the
        pool full and the sagas coming."""
        duration_ms = max(1000, int(ev.est_runtime_s * 1000 * self.rng.uniform(0.5, 4.0)))
        return TraceJob(
            id=ev.job,
            submit_ms=ev.t,
            duration_ms=duration_ms,
            gpus=ev.gpus,
            team=ev.team,
            user=ev.user,
            level=ev.level,
            gpu_models=list(ev.gpu_models),
            **submitted_costs_ms(ev),
        )

    def next_input(self) -> T.Input:
        rng = self.rng
        self.t += rng.choice([0, 1000, 5000, 30_000, 120_000, 600_000])
        t = self.t
        self.hosts.advance_to(t)
        if self.heard and rng.random() < HOST_FACT_SHARE:
            # the hosts' oldest undelivered fact, arriving now (or, now and then, lost)
            fact = self.heard.pop(0)
            if rng.random() < 0.02:
                return T.Tick(t=t)
            return msgspec.structs.replace(fact, t=t)
        jobs = self.state.canonical.jobs
        by_state: dict[str, list[str]] = {}
        for job_id in sorted(jobs):
            by_state.setdefault(jobs[job_id].state, []).append(job_id)
        roll = rng.random()
        if roll < 0.12:
            return self._submit(t)
        if roll < 0.35:
            if not by_state.get("starting"):
                return T.Tick(t=t)
            job_id = rng.choice(by_state["starting"])
            job = jobs[job_id]
            # (often: the simulated hosts start most jobs promptly, so few wait to be hit)
            if job.resume_pending and job.checkpoints and rng.random() < 0.6:
                return T.CheckpointFailed(
                    t=t, job=job_id, reason="digest_mismatch", digest=job.checkpoints[-1].digest
                )
            return T.Started(t=t, job=job_id)
        if roll < 0.55:
            if not by_state.get("preempting"):
                return T.Tick(t=t)
            return self._victim_answer(t, rng.choice(by_state["preempting"]))
        if roll < 0.80:
            if not by_state.get("running"):
                return T.Tick(t=t)
            return self._running_fact(t, rng.choice(by_state["running"]))
        if roll < 0.81:
            return T.Cancel(t=t, job=rng.choice(sorted(jobs))) if jobs else T.Tick(t=t)
        if roll < 0.815:
            name = rng.choice(self.nodes)[0]
            node = self.state.canonical.nodes.get(name)
            if node is not None and node.up:
                return T.NodeDown(t=t, node=name)
            spec = next(n for n in self.nodes if n[0] == name)
            return T.NodeUp(t=t, node=name, gpu_model=spec[1], gpus=spec[2])
        if roll < 0.82:
            name = rng.choice(self.nodes)
            return T.NodeUp(t=t, node=name[0], gpu_model=name[1], gpus=name[2])
        if roll < 0.825:
            return T.SetPolicy(t=t, params={"victims_per_preemption_max": rng.randint(2, 8)})
        if roll < 0.83:
            return T.parse_input('{"type":"submit","t":%d,"job":"bad","level":99}' % t)
        return T.Tick(t=t)

    def _submit(self, t: int) -> T.Submit:
        rng = self.rng
        self.n_jobs += 1
        models = sorted(rng.sample(MODELS, rng.randint(1, 2))) if rng.random() < 0.8 else []
        return T.Submit(
            t=t,
            job=f"job-{self.n_jobs}",
            team=f"team-{rng.randint(1, 4)}",
            user=f"user-{rng.randint(1, 6)}",
            level=rng.choice([0, 1, 2, 3, 5, 6, 6, 7, 7, 7]),
            gpus=rng.choice([1, 1, 2, 4, 8, 12, 16]),
            gpu_models=models,
            est_runtime_s=rng.choice([60, 600, 3600, 36000]),
            ckpt_interval_s=rng.choice([0, 300, 1800]),
            ckpt_cost_s=rng.choice([5, 30, 120]),
            restore_cost_s=rng.choice([5, 30]),
            preemptible=rng.random() < 0.9,
        )

    def _victim_answer(self, t: int, job_id: str) -> T.Input:
        rng = self.rng
        roll = rng.random()
        if roll < 0.15:
            return T.SafePoint(t=t, job=job_id)
        if roll < 0.35:
            return T.CheckpointSaved(
                t=t, job=job_id, step=t // 1000, digest=f"sha256:{job_id}-{t}", bytes=1 << 20
            )
        if roll < 0.40:
            return T.CheckpointFailed(t=t, job=job_id, reason="disk_full")
        if roll < 0.45:
            return T.Finished(t=t, job=job_id, ok=True)
        if roll < 0.85:
            return T.Released(t=t, job=job_id)
        return T.Tick(t=t)

    def _running_fact(self, t: int, job_id: str) -> T.Input:
        rng = self.rng
        roll = rng.random()
        if roll < 0.4:
            return T.Finished(t=t, job=job_id, ok=rng.random() < 0.9)
        if roll < 0.5:
            return T.CheckpointStarted(t=t, job=job_id)
        return T.CheckpointSaved(
            t=t, job=job_id, step=t // 1000, digest=f"sha256:{job_id}-{t}", bytes=1 << 20
        )

    def settle(self, check=None) -> None:
        """End every open saga: victims release, then time passes the deadlines. A tick may
        plan new sagas, so repeat, for a bounded number of rounds."""
        c = self.state.canonical
        for _ in range(20):
            if not c.sagas:
                return
            for job_id in sorted(c.jobs):
                if c.jobs[job_id].state == "preempting":
                    self.feed(T.Released(t=self.t, job=job_id), check)
            deadline = max((s.deadline_t for s in c.sagas.values()), default=self.t)
            self.t = max(self.t, deadline) + 1
            self.feed(T.Tick(t=self.t), check)


def run_world(seed: int, steps: int, check=None) -> World:
    world = World(seed)
    for inp in world.boot():
        world.feed(inp, check)
    for _ in range(steps):
        world.feed(world.next_input(), check)
    return world


if __name__ == "__main__":
    result = run_world(int(sys.argv[1]), int(sys.argv[2]))
    out = sys.stdout.buffer
    for record in result.records:
        out.write(T.encode(record) + b"\n")
