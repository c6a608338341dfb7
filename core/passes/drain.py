"""Draining a node for an urgent gang. When every node mixes work an urgent job may not
preempt (its own level or more urgent, or not preemptible) with work it may, no victim set
frees a whole node for an urgent single-node gang, and the GPUs the unpreemptible work
lets go are taken at once by whatever queues behind. So the urgent gang's reservation goes
to the node where the work it cannot preempt ends soonest: nothing else starts there (save
backfill that ends in time), and as soon as what remains is preemptible, a victim set
exists and the gang preempts it (urgent jobs are tried on every pass). Kubernetes-style
preemption, which only looks for a node with enough lower-priority victims now, waits
there as long as no preemption would.
"""

from __future__ import annotations

from ..rules.decision import Decision
from ..rules.eligibility import may_take
from ..forecast.waits import remaining_or_runtime
from ..model.placement import gpus_on
from ..model.state import State
from ..model.entities import Job, node_free_count


def drain_fit(state: State, job: Job, nodes) -> tuple[int, list[str]] | None:
    """(ms until the node's unpreemptible work has let go of enough GPUs, [node]) for the
    best node to drain for `job`, or None (a gang larger than any node, or no node).
    `nodes` in name order (an `UpNodes`): the first node that needs no wait is the best,
    and the nodes after it are not read (in a busy pool of preemptible work, the first)."""
    jobs = state.canonical.jobs
    decision = Decision(state, job)
    best: tuple[int, str] | None = None
    for node in nodes:
        if node.gpus < job.gpus:
            continue
        free = node_free_count(node)
        preemptible = 0
        blockers: list[tuple[int, int]] = []
        for other_id in sorted(state.index.jobs_by_node.get(node.name, {})):
            other = jobs[other_id]
            gpus = len(gpus_on(other, node.name))
            if may_take(decision, other):
                preemptible += gpus
            else:
                blockers.append((remaining_or_runtime(state, other_id), gpus))
        need = job.gpus - free - preemptible
        wait = 0
        for at_ms, gpus in sorted(blockers):
            if need <= 0:
                break
            need -= gpus
            wait = at_ms
        if need > 0 or (wait == 0 and job.last_decline == "benefit_below_cost"):
            continue  # never frees enough, or a set exists and the decision model said no
        if best is None or (wait, node.name) < best:
            best = (wait, node.name)
            if wait == 0:
                break  # no node after it in name order can come before it
    return None if best is None else (best[0], [best[1]])
