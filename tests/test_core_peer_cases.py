"""Victim choice checked against the peers' own preemption tests.

Kueue (kubernetes-sigs/kueue, pkg/scheduler/preemption/preemption_test.go) and the
Kubernetes scheduler (kubernetes/kubernetes,
pkg/scheduler/framework/plugins/defaultpreemption/default_preemption_test.go) keep tables
of preemption cases. Each case below is one of theirs mapped by hand onto xirang's inputs,
and cites the peer test it ports:

- priority to level. Kubernetes: veryHigh (10000) -> 0, high (1000) -> 1, mid (100) -> 3,
  low (0) -> 5, neg (-100) -> 7. Kueue: 1 -> 2, 0 -> 4, -1 -> 7. Under the default policy a
  level preempts only less urgent levels (`preempts_from_level`), never its own.
- CPU to GPUs: Kubernetes' 100m -> 1 GPU (its 500m nodes hold 5 GPUs); Kueue's 1 CPU -> 1 GPU,
  a ClusterQueue's quota -> the GPUs of its nodes, a ClusterQueue -> a team.
- flavor to GPU model; a node to a node. Each node has a model of its own unless a case
  says otherwise, so a job lands on the node the peer test names, and a pod (or a
  Kueue workload) never spans nodes, as a job that fits one node never does here.
- a pod's start time to when a job started: with no checkpoint, a later start loses less.

`AGREE` holds the cases whose outcome xirang shares (the victims, or no preemption), under
the default policy or under the opt-in fair-share guarantee where the peer's rule is one of
guaranteed shares. `DIFFER` holds cases where xirang decides otherwise by design, each with
the reason, and checks xirang's own outcome. `REGRESSIONS` are the two pricing defects found
by porting these cases: a shared wait once per victim set, and a victim's requeue
wait added up from free GPUs on different nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from core import types as T
from scenario import HOUR, MIN, Run

K8S = "kubernetes/kubernetes pkg/scheduler/framework/plugins/defaultpreemption/default_preemption_test.go"
KUEUE = "kubernetes-sigs/kueue pkg/scheduler/preemption/preemption_test.go"
# Kubernetes' priorities and Kueue's, as levels (see the module doc).
VERY_HIGH, HIGH, MID, LOW, NEG = 0, 1, 3, 5, 7
KQ_HIGH, KQ_MID, KQ_LOW = 2, 4, 7
RUNNING_EST_S = 10 * 3600  # running jobs are far from their end: only preemption frees GPUs
PREEMPTOR_AT = 2 * HOUR
# Kubernetes lets any higher priority preempt any lower one: the opt-in policy that does.
ANY_LOWER = {"preempts_from_level": [1, 2, 3, 4, 5, 6, 7, 8]}


@dataclass
class Job:
    name: str
    level: int
    gpus: int
    node: str  # where it runs (a node of its own model unless the case shares one)
    started_min: int = 0  # minutes after the start of the test
    team: str = ""  # default: a team of its own
    ckpt_interval_s: float = 0.0  # no checkpoint: everything since the start is lost
    ckpt_age_min: int | None = None  # a checkpoint saved this long before the preemptor came
    preemptible: bool = True


@dataclass
class Case:
    name: str  # the peer test case's name, as the peer spells it
    peer: str  # the peer test file and function
    nodes: dict[str, int]  # node -> GPUs
    running: list[Job]
    preemptor_level: int
    preemptor_gpus: int
    victims: list[str] | None  # None: no preemption
    preemptor_models: list[str] | None = None  # default: any node's model
    preemptor_team: str = "incoming"
    preemptor_est_s: float = 1800.0
    shared_model: str = ""  # all nodes of this one model
    policy: dict = field(default_factory=dict)
    why: str = ""  # for DIFFER: why xirang decides otherwise


def model_of(case: Case, node: str) -> str:
    return case.shared_model or f"M-{node}"


def run_case(case: Case) -> tuple[list[str] | None, list[str]]:
    """(the victims of the preemptor's first plan or None, the decline reasons recorded)."""
    run = Run(**case.policy)
    run.at(
        0,
        *(
            T.NodeUp(t=0, node=name, gpu_model=model_of(case, name), gpus=gpus)
            for name, gpus in sorted(case.nodes.items())
        ),
    )
    for job in case.running:
        run.at(
            0,
            T.Submit(
                t=0,
                job=job.name,
                team=job.team or f"team-{job.name}",
                user=f"user-{job.name}",
                level=job.level,
                gpus=job.gpus,
                gpu_models=[model_of(case, job.node)],
                est_runtime_s=RUNNING_EST_S,
                ckpt_interval_s=job.ckpt_interval_s,
                ckpt_cost_s=30,
                restore_cost_s=30,
                preemptible=job.preemptible,
            ),
        )
        placed = run.job(job.name).placement
        assert [slot.node for slot in placed] == [job.node], f"set-up: {job.name} is not on {job.node}"
    for job in sorted(case.running, key=lambda j: (j.started_min, j.name)):
        run.at(job.started_min * MIN + 1, T.Started(t=0, job=job.name))
    for job in case.running:
        if job.ckpt_age_min is not None:
            at = PREEMPTOR_AT - job.ckpt_age_min * MIN
            run.at(at, T.CheckpointStarted(t=0, job=job.name))
            run.at(at + 1, T.CheckpointSaved(t=0, job=job.name, step=1, digest=f"sha256:{job.name}", bytes=1))
    models = case.preemptor_models or sorted({model_of(case, name) for name in case.nodes})
    events = run.at(
        PREEMPTOR_AT,
        T.Submit(
            t=0,
            job="incoming",
            team=case.preemptor_team,
            user="user-incoming",
            level=case.preemptor_level,
            gpus=case.preemptor_gpus,
            gpu_models=models,
            est_runtime_s=case.preemptor_est_s,
        ),
    )
    events += run.at(PREEMPTOR_AT + MIN, T.Tick(t=0))
    plans = [e for e in events if isinstance(e, T.PreemptionPlanned) and e.preemptor == "incoming"]
    declines = [e.reason for e in events if isinstance(e, T.PreemptionDeclined) and e.job == "incoming"]
    return (sorted(plans[0].victims) if plans else None), declines


AGREE = [
    # ---------------------------------------------------------------- Kubernetes
    Case(
        "a pod that fits on both nodes when lower priority pods are preempted",
        f"{K8S} TestDryRunPreemption",
        nodes={"node1": 5, "node2": 5},
        running=[Job("p1", MID, 3, "node1"), Job("p2", MID, 3, "node2")],
        preemptor_level=HIGH,
        preemptor_gpus=3,
        victims=["p1"],
    ),  # either node; ties go by name
    Case(
        "a pod that would fit on the nodes, but other pods running are higher priority, no preemption would happen",
        f"{K8S} TestDryRunPreemption",
        nodes={"node1": 5, "node2": 5},
        running=[Job("p1", MID, 3, "node1"), Job("p2", MID, 3, "node2")],
        preemptor_level=LOW,
        preemptor_gpus=3,
        victims=None,
    ),
    Case(
        "medium priority pod is preempted, but lower priority one stays as it is small",
        f"{K8S} TestDryRunPreemption",
        nodes={"node1": 5, "node2": 5},
        running=[Job("p1.1", LOW, 1, "node1"), Job("p1.2", MID, 3, "node1"), Job("p2", MID, 3, "node2")],
        preemptor_level=HIGH,
        preemptor_gpus=3,
        victims=["p1.2"],
    ),
    Case(
        "mixed priority pods are preempted",
        f"{K8S} TestDryRunPreemption",
        nodes={"node1": 5, "node2": 5},
        running=[
            Job("p1.1", MID, 1, "node1"),
            Job("p1.2", LOW, 1, "node1"),
            Job("p1.3", MID, 2, "node1"),
            Job("p1.4", HIGH, 1, "node1"),
            Job("p2", HIGH, 3, "node2"),
        ],
        preemptor_level=HIGH,
        preemptor_gpus=3,
        victims=["p1.2", "p1.3"],
    ),
    Case(
        "mixed priority pods are preempted, pick later StartTime one when priorities are equal",
        f"{K8S} TestDryRunPreemption",
        nodes={"node1": 5, "node2": 5},
        running=[
            Job("p1.1", LOW, 1, "node1", started_min=50),
            Job("p1.2", LOW, 1, "node1", started_min=40),
            Job("p1.3", MID, 2, "node1", started_min=30),
            Job("p1.4", HIGH, 1, "node1", started_min=20),
            Job("p2", HIGH, 3, "node2", started_min=10),
        ],
        preemptor_level=HIGH,
        preemptor_gpus=3,
        victims=["p1.1", "p1.3"],
    ),
    Case(
        "node with min highest priority pod is picked",
        f"{K8S} TestSelectBestCandidate",
        nodes={"node1": 5, "node2": 5, "node3": 5},
        running=[
            Job("p1.1", MID, 2, "node1"),
            Job("p1.2", MID, 3, "node1"),
            Job("p2.1", MID, 2, "node2"),
            Job("p2.2", LOW, 2, "node2"),
            Job("p3.1", LOW, 2, "node3"),
            Job("p3.2", LOW, 2, "node3"),
        ],
        preemptor_level=HIGH,
        preemptor_gpus=5,
        victims=["p3.1", "p3.2"],
    ),
    Case(
        "same priority, same number of victims, different start time for each node's pod",
        f"{K8S} TestSelectBestCandidate",
        nodes={"node1": 5, "node2": 5, "node3": 5},
        running=[
            Job("p1.1", MID, 2, "node1", started_min=20),
            Job("p1.2", MID, 2, "node1", started_min=20),
            Job("p2.1", MID, 2, "node2", started_min=30),
            Job("p2.2", MID, 2, "node2", started_min=30),
            Job("p3.1", MID, 2, "node3", started_min=10),
            Job("p3.2", MID, 2, "node3", started_min=10),
        ],
        preemptor_level=HIGH,
        preemptor_gpus=5,
        victims=["p2.1", "p2.2"],
    ),
    Case(
        "same priority, same number of victims, different start time for all pods",
        f"{K8S} TestSelectBestCandidate",
        nodes={"node1": 5, "node2": 5, "node3": 5},
        running=[
            Job("p1.1", MID, 2, "node1", started_min=40),
            Job("p1.2", MID, 2, "node1", started_min=20),
            Job("p2.1", MID, 2, "node2", started_min=50),
            Job("p2.2", MID, 2, "node2", started_min=10),
            Job("p3.1", MID, 2, "node3", started_min=30),
            Job("p3.2", MID, 2, "node3", started_min=60),
        ],
        preemptor_level=HIGH,
        preemptor_gpus=5,
        victims=["p3.1", "p3.2"],
    ),
    Case(
        "pod with tied priority is still unschedulable",
        f"{K8S} TestPostFilter",
        nodes={"node1": 1},
        running=[Job("p1", MID, 1, "node1")],
        preemptor_level=MID,
        preemptor_gpus=1,
        victims=None,
    ),
    Case(
        "pod can be made schedulable on one node",
        f"{K8S} TestPostFilter",
        nodes={"node1": 1, "node2": 1},
        running=[Job("p1", HIGH, 1, "node1"), Job("p2", LOW, 1, "node2")],
        preemptor_level=MID,
        preemptor_gpus=1,
        victims=["p2"],
        policy=ANY_LOWER,
    ),
    Case(
        "filter for matching pod label: mid priority",
        f"{K8S} TestCustomSelection",
        # the label filter as xirang's own: a job submitted not preemptible is never a victim
        nodes={"node1": 3, "node2": 3, "node3": 3, "node4": 3},
        running=[
            Job("v1", MID, 3, "node1", preemptible=False),
            Job("v2", MID, 3, "node2"),
            Job("v3", LOW, 3, "node3"),
            Job("v4", LOW, 3, "node4", preemptible=False),
        ],
        preemptor_level=MID,
        preemptor_gpus=3,
        victims=["v3"],
        policy=ANY_LOWER,
    ),
    # ---------------------------------------------------------------- Kueue
    Case(
        "preempt lowest priority",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[
            Job("low", KQ_LOW, 2, "standalone"),
            Job("mid", KQ_MID, 2, "standalone"),
            Job("high", KQ_HIGH, 2, "standalone"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=2,
        victims=["low"],
    ),
    Case(
        "preempt multiple",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[
            Job("low", KQ_LOW, 2, "standalone"),
            Job("mid", KQ_MID, 2, "standalone"),
            Job("high", KQ_HIGH, 2, "standalone"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=3,
        victims=["low", "mid"],
    ),
    Case(
        "no preemption for low priority",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[Job("low", KQ_LOW, 3, "standalone"), Job("mid", KQ_MID, 3, "standalone")],
        preemptor_level=KQ_LOW,
        preemptor_gpus=1,
        victims=None,
    ),
    Case(
        "not enough low priority workloads",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[Job("low", KQ_LOW, 3, "standalone"), Job("mid", KQ_MID, 3, "standalone")],
        preemptor_level=KQ_MID,
        preemptor_gpus=4,
        victims=None,
    ),
    Case(
        "some free quota, preempt low priority",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[
            Job("low", KQ_LOW, 1, "standalone"),
            Job("mid", KQ_MID, 1, "standalone"),
            Job("high", KQ_HIGH, 3, "standalone"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=2,
        victims=["low"],
    ),
    Case(
        "minimal set excludes low priority",
        f"{KUEUE} TestPreemption",
        nodes={"standalone": 6},
        running=[
            Job("low", KQ_LOW, 1, "standalone"),
            Job("mid", KQ_MID, 2, "standalone"),
            Job("high", KQ_HIGH, 3, "standalone"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=2,
        victims=["mid"],
    ),
    Case(
        "only preempt workloads using the chosen flavor",
        f"{KUEUE} TestPreemption",
        nodes={"alpha": 3, "beta": 3},
        running=[
            Job("low", KQ_LOW, 2, "alpha"),
            Job("mid", KQ_MID, 1, "beta"),
            Job("high", KQ_HIGH, 1, "beta"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=2,
        preemptor_models=["M-beta"],
        victims=["mid"],
    ),
    Case(
        "no workloads borrowing",
        f"{KUEUE} TestPreemption",
        # ClusterQueues c1 and c2 lend to each other (a cohort of 8 GPUs, 4 each): c2 holds
        # no more than its share, so under the fair-share guarantee c1 may not take from it.
        nodes={"n1": 4, "n2": 4},
        shared_model="cohort",
        running=[Job("c1-high", KQ_HIGH, 4, "n1", team="c1"), Job("c2-low-1", KQ_LOW, 4, "n2", team="c2")],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=4,
        preemptor_team="c1",
        victims=None,
        policy={"fair_share_guarantee": True, "fair_share_from_level": 2},
    ),
]

DIFFER = [
    Case(
        "preempt newer workloads with the same priority",
        f"{KUEUE} TestPreemption",
        nodes={"pool": 6},
        running=[
            Job("wl1", KQ_HIGH - 1, 2, "pool"),
            Job("wl2", KQ_HIGH, 2, "pool", started_min=30),
            Job("wl3", KQ_HIGH, 2, "pool", started_min=10),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=2,
        victims=None,
        why="a job never preempts a job of its own level (Kueue's LowerOrNewerEqualPriority lets a newer "
        "one of the same priority go): the model's first rule; ageing, not preemption, bounds such a wait",
    ),
    Case(
        "no candidate nodes found, no enough resource after removing low priority pods",
        f"{K8S} TestPostFilter",
        nodes={"node1": 2, "node2": 2},
        shared_model="A100",
        running=[Job("p1", LOW, 2, "node1"), Job("p2", LOW, 2, "node2")],
        preemptor_level=HIGH,
        preemptor_gpus=3,
        victims=["p1", "p2"],
        why="a job larger than any node is one gang across nodes of one GPU model (a pod never spans "
        "nodes): freeing both nodes makes room for it",
    ),
    Case(
        "reclaim quota from borrower",
        f"{KUEUE} TestPreemption",
        nodes={"c1": 6, "c2": 6},
        shared_model="cohort",
        running=[
            Job("c1-low", KQ_LOW, 3, "c1", team="c1"),
            Job("c2-mid", KQ_MID, 3, "c1", team="c2"),
            Job("c2-high", KQ_HIGH, 6, "c2", team="c2"),
        ],
        preemptor_level=KQ_HIGH,
        preemptor_gpus=3,
        preemptor_team="c1",
        victims=["c1-low"],
        why="victims are priced, not ranked by whose quota they use: the team's own least urgent job "
        "(level 7) costs less than another team's borrowed level-4 GPUs; a team below its share "
        "reclaims only when priority offers it nothing (opt-in fair_share_guarantee)",
    ),
]


REGRESSIONS = [
    Case(
        "a whole-node job takes two level-6 one-GPU jobs, not one level-2 two-GPU job",
        "found porting the peer cases (the two-victim set paid the shared wait twice)",
        nodes={"n1": 5, "n2": 5},
        running=[
            Job("l6-a", 6, 1, "n1", ckpt_interval_s=600, ckpt_age_min=1),
            Job("l6-b", 6, 1, "n1", ckpt_interval_s=600, ckpt_age_min=1),
            Job("l2", 2, 2, "n2", ckpt_interval_s=600, ckpt_age_min=1),
        ],
        preemptor_level=1,
        preemptor_gpus=5,
        victims=["l6-a", "l6-b"],
    ),
    Case(
        "a level-0 job takes two level-7 jobs, not one level-1 job, when their checkpoints are as fresh",
        "found porting the peer cases (the fresher checkpoints made the two victims as cheap as one)",
        nodes={"n1": 4, "n2": 4},
        running=[
            Job("l7-a", 7, 1, "n1", ckpt_interval_s=600, ckpt_age_min=1),
            Job("l7-b", 7, 1, "n1", ckpt_interval_s=600, ckpt_age_min=1),
            Job("l1", 1, 2, "n2", ckpt_interval_s=600, ckpt_age_min=1),
        ],
        preemptor_level=0,
        preemptor_gpus=4,
        victims=["l7-a", "l7-b"],
    ),
    Case(
        "a victim that fits one node is not priced as restarting on free GPUs of two nodes",
        "found porting the peer cases (v2 would wait hours for a whole-node-free 2-GPU slot: one free GPU on n3 and n4 each)",
        nodes={"n1": 8, "n2": 8, "n3": 8, "n4": 8},
        shared_model="A100",
        running=[
            Job("fill-1", 0, 6, "n1"),
            Job("v2", 2, 2, "n1", ckpt_interval_s=600, ckpt_age_min=1),
            Job("fill-2", 0, 6, "n2"),
            Job("w1", 6, 1, "n2", started_min=100),
            Job("w2", 6, 1, "n2", started_min=100),
            Job("fill-3", 0, 7, "n3"),
            Job("fill-4", 0, 7, "n4"),
        ],
        preemptor_level=1,
        preemptor_gpus=2,
        preemptor_est_s=10 * 3600,
        victims=["w1", "w2"],
    ),
]


@pytest.mark.parametrize("case", AGREE, ids=[c.name for c in AGREE])
def test_xirang_agrees_with_the_peer_case(case: Case):
    victims, declines = run_case(case)
    assert victims == case.victims, f"{case.peer}: {case.name!r} (declined: {declines})"


@pytest.mark.parametrize("case", DIFFER, ids=[c.name for c in DIFFER])
def test_xirang_differs_from_the_peer_case_by_design(case: Case):
    assert case.why, "every difference says why"
    victims, declines = run_case(case)
    assert victims == case.victims, f"{case.peer}: {case.name!r} (declined: {declines})"


@pytest.mark.parametrize("case", REGRESSIONS, ids=[c.name for c in REGRESSIONS])
def test_a_victim_set_is_priced_as_it_really_lets_go(case: Case):
    victims, declines = run_case(case)
    assert victims == case.victims, f"{case.name} (declined: {declines})"


def test_the_tables_port_at_least_fifteen_peer_cases_each_citing_its_test():
    assert len(AGREE) >= 15
    for case in AGREE + DIFFER:
        assert case.peer.startswith((K8S, KUEUE)) and " Test" in case.peer
