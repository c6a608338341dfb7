"""Helpers for given/when/then scenario tests of the core: build inputs tersely, run them,
and look at the events by type."""

from __future__ import annotations

import msgspec

from core import new_state, step
from core import types as T
from core.model.policy import Policy, with_params
from core.model.state import State
from core.model.entities import HOLDING, RESERVED

MIN = 60_000
HOUR = 3_600_000


class Run:
    """A state and every record it produced, fed one input at a time."""

    def __init__(self, policy: Policy | None = None, **params) -> None:
        base = policy or Policy()
        self.state: State = new_state(with_params(base, params) if params else base)
        self.records: list[T.Record] = []
        self.t = 0

    def feed(self, *inputs: T.Input) -> list[T.Event]:
        events: list[T.Event] = []
        for inp in inputs:
            if inp.t == 0 and self.t:
                inp = msgspec.structs.replace(inp, t=self.t)
            self.t = max(self.t, inp.t)
            _, records = step(self.state, inp)
            self.records.extend(records)
            events.extend(r.event for r in records)
        return events

    def at(self, t: int, *inputs: T.Input) -> list[T.Event]:
        self.t = max(self.t, t)
        return self.feed(*(msgspec.structs.replace(i, t=t) for i in inputs))

    def events(self, kind: type | None = None) -> list[T.Event]:
        evs = [r.event for r in self.records]
        return [e for e in evs if kind is None or isinstance(e, kind)]

    def job(self, job_id: str):
        return self.state.canonical.jobs.get(job_id)

    def job_state(self, job_id: str) -> str:
        job = self.state.canonical.jobs.get(job_id)
        return job.state if job else self.state.canonical.done.get(job_id, "unknown")


def node(name: str, model: str = "A100", gpus: int = 8, t: int = 0) -> T.NodeUp:
    return T.NodeUp(t=t, node=name, gpu_model=model, gpus=gpus)


def submit(
    job: str,
    level: int,
    gpus: int,
    team: str = "t1",
    user: str = "u1",
    t: int = 0,
    models: list[str] | None = None,
    **kw,
) -> T.Submit:
    return T.Submit(
        t=t,
        job=job,
        team=team,
        user=user,
        level=level,
        gpus=gpus,
        gpu_models=models if models is not None else ["A100"],
        **kw,
    )


def started(job: str, t: int = 0) -> T.Started:
    return T.Started(t=t, job=job)


def tick(t: int) -> T.Tick:
    return T.Tick(t=t)


def start_all(run: Run, t: int) -> None:
    """Report `started` for every job that was asked to start."""
    for job_id in sorted(run.state.canonical.jobs):
        if run.state.canonical.jobs[job_id].state == "starting":
            run.at(t, started(job_id))


def of(events: list[T.Event], kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def check_invariants(state: State) -> None:
    """What must hold after every step, whatever the workload."""
    c = state.canonical
    seen: dict[tuple[str, int], str] = {}
    for job_id in sorted(c.jobs):
        job = c.jobs[job_id]
        if job.state in HOLDING:
            assert sum(len(s.gpus) for s in job.placement) == job.gpus, f"{job_id} gang not whole"
            models = {c.nodes[s.node].gpu_model for s in job.placement}
            assert len(models) == 1, f"{job_id} gang mixes GPU models {sorted(models)}"
            for slot in job.placement:
                node = c.nodes[slot.node]
                assert node.up, f"{job_id} placed on lost node {slot.node}"
                stand_ins = [m for asked in job.gpu_models for m in c.policy.gpu_substitutes.get(asked, {})]
                if job.state == RESERVED:
                    assert node.gpu_model in job.gpu_models + stand_ins or not job.gpu_models
                else:
                    assert node.gpu_model in job.gpu_models + stand_ins or not job.gpu_models, (
                        f"{job_id} on wrong GPU model"
                    )
                for gpu in slot.gpus:
                    key = (slot.node, gpu)
                    if job.state != RESERVED:
                        assert key not in seen, f"GPU {key} held by {seen.get(key)} and {job_id}"
                        seen[key] = job_id
                        assert node.holder[gpu] == job_id, f"GPU {key} holder mismatch for {job_id}"
    for name in sorted(c.nodes):
        node = c.nodes[name]
        for gpu, holder in enumerate(node.holder):
            if holder:
                assert holder in c.jobs, f"GPU {(name, gpu)} held by unknown job {holder}"
                assert c.jobs[holder].state in HOLDING, f"GPU held by {holder} in {c.jobs[holder].state}"
    for saga_id in sorted(c.sagas):
        saga = c.sagas[saga_id]
        preemptor = c.jobs[saga.preemptor]
        assert preemptor.state == RESERVED
        for victim_id in saga.victims:
            victim = c.jobs.get(victim_id)
            if victim is None:
                continue
            if saga.reclaim:  # by team share, not priority: only from another team
                assert victim.team != preemptor.team, "a team reclaimed from itself"
                assert victim.level >= c.policy.fair_share_from_level, "an urgent job reclaimed"
            else:
                assert victim.level > preemptor.level, "same or higher level preempted"
