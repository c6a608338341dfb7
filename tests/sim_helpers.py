"""Small workloads and a scripted policy for the simulator tests."""

from __future__ import annotations

from replay.sim import Cluster, Simulator
from replay.workload import TraceJob, Workload


def job(
    job_id: str,
    submit_s: float,
    duration_s: float,
    gpus: int = 1,
    level: int = 4,
    team: str = "a",
    ckpt_interval_s: float = 600,
    ckpt_cost_s: float = 20,
    restore_cost_s: float = 30,
    est_runtime_s: float | None = None,
    user: str = "",
) -> TraceJob:
    return TraceJob(
        id=job_id,
        submit_ms=int(submit_s * 1000),
        duration_ms=int(duration_s * 1000),
        gpus=gpus,
        team=team,
        user=user or f"{team}-u1",
        level=level,
        gpu_models=[],
        ckpt_interval_ms=int(ckpt_interval_s * 1000),
        ckpt_cost_ms=int(ckpt_cost_s * 1000),
        restore_cost_ms=int(restore_cost_s * 1000),
        est_runtime_ms=int((est_runtime_s or duration_s) * 1000),
    )


def workload(*jobs: TraceJob) -> Workload:
    return Workload(name="test", jobs=sorted(jobs, key=lambda j: j.submit_ms), seed=0)


def one_node(gpus: int = 8) -> Cluster:
    return Cluster.uniform(gpus, gpus)


class ScriptedPolicy:
    """Does what a test tells it, at the times it says: [(t_ms, command, args...)].
    Records every fact it receives."""

    name = "scripted"
    wants_periodic_checkpoints = True

    def __init__(self, script) -> None:
        self.script = sorted(script, key=lambda s: s[0])
        self.facts = []
        self.steps = 0

    def bind(self, sim: Simulator) -> None:
        self.sim = sim
        for i, (t, *_rest) in enumerate(self.script):
            sim._push(t, self._do, i)

    def _do(self, i: int) -> None:
        _, command, *args = self.script[i]
        getattr(self.sim, command)(*args)

    def on_submit(self, spec, t) -> None:
        pass

    def on_fact(self, inp) -> None:
        self.facts.append(inp)

    def on_wake(self, t) -> None:
        pass

    def summary(self) -> dict:
        return {}

    def fact_times(self, kind: str, job_id: str) -> list[int]:
        return [f.t for f in self.facts if f.__struct_config__.tag == kind and f.job == job_id]


def run_scripted(wl: Workload, script, cluster: Cluster | None = None):
    policy = ScriptedPolicy(script)
    sim = Simulator(wl, cluster or one_node(), policy)
    sim.run()
    return sim, policy
