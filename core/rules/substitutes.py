"""Compatible GPU models (`gpu_substitutes` in the policy): a job that asks for one model
may run on another the operator lists as compatible, at a price. `gpu_substitutes` maps a
model to the models that can stand in for it and the slowdown of each (0.5: a job runs
1.5 times as long there). A substitute is taken only when it pays: placement starts a job
on one when its own models have no room and the extra run time costs less than waiting
for them; a preemption weighs a victim set on a substitute with the extra run time at the
preemptor's level weight, against the sets on its own models.
"""

from __future__ import annotations

from ..forecast.waits import earliest_fit, expected_runtime_ms
from ..model.placement import place
from ..model.policy import Policy
from ..model.state import State
from ..model.up_nodes import UpNodes
from ..model.entities import Job
from ..model.types import Slot


def substitutes(p: Policy, job: Job) -> dict[str, float]:
    """Model -> slowdown of the models that may stand in for the job's own (not its own)."""
    if not p.gpu_substitutes or not job.gpu_models:
        return {}
    out: dict[str, float] = {}
    for model in job.gpu_models:
        stand_ins = p.gpu_substitutes.get(model, {})
        for other in sorted(stand_ins):
            if other not in job.gpu_models:
                out[other] = min(out.get(other, stand_ins[other]), stand_ins[other])
    return {model: out[model] for model in sorted(out)}


def substitute_penalty(p: Policy, job: Job, runtime_ms: int, slowdown: float) -> float:
    """The extra run time on a substitute, in GPU-seconds weighted by the job's level."""
    return p.level_weight[job.level] * job.gpus * runtime_ms * slowdown / 1000.0


def substitute_placement(state: State, job: Job, reserved: dict[str, int]) -> list[Slot] | None:
    """A placement on a compatible model, when the job's own models have no room now and the
    extra run time there is shorter than its expected wait for its own (None otherwise)."""
    c = state.canonical
    stand_ins = substitutes(c.policy, job)
    if not stand_ins:
        return None
    runtime = expected_runtime_ms(state, job)
    best: tuple[float, str, list[Slot]] | None = None
    for model in stand_ins:
        extra = runtime * stand_ins[model]
        placement = place(job.gpus, [model], c.nodes, state.index, reserved, c.t + runtime + int(extra))
        if placement is not None and (best is None or extra < best[0]):
            best = (extra, model, placement)
    if best is None:
        return None
    own_nodes = UpNodes(state, job.gpu_models)
    fit = earliest_fit(state, job, own_nodes)
    own_wait = fit[0] if fit is not None else None
    if own_wait is not None and own_wait <= best[0]:
        return None
    return best[2]
