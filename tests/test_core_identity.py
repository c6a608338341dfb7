"""The core refuses an input whose authenticated sender (`origin`, stamped by the
scheduler from the bus subject) may not send it: a team acts only as itself."""

from __future__ import annotations

import pytest

from core import new_state, step
from core import types as T


def _rejection(state, inp) -> tuple[str, str] | None:
    _, records = step(state, inp)
    rejected = [r.event for r in records if isinstance(r.event, T.InputRejected)]
    return (rejected[0].reason, rejected[0].detail) if rejected else None


@pytest.fixture
def state():
    state = new_state()
    step(state, T.NodeUp(t=1, node="h1", gpu_model="H100", gpus=8, origin="host:h1"))
    step(state, T.NodeUp(t=2, node="h2", gpu_model="H100", gpus=8, origin="host:h2"))
    assert (
        _rejection(
            state,
            T.Submit(t=3, job="mine", team="vision", user="li", level=5, gpus=8, origin="client:vision:li"),
        )
        is None
    )
    return state


def test_a_client_cannot_submit_as_another_team_or_user(state):
    other_team = T.Submit(t=10, job="x", team="safety", user="li", level=0, gpus=1, origin="client:vision:li")
    assert _rejection(state, other_team)[0] == "identity_mismatch"
    other_user = T.Submit(t=11, job="y", team="vision", user="wu", level=5, gpus=1, origin="client:vision:li")
    assert _rejection(state, other_user)[0] == "identity_mismatch"
    assert "x" not in state.canonical.jobs and "y" not in state.canonical.jobs


def test_a_client_cancels_only_its_own_jobs_and_an_operator_cancels_any(state):
    assert _rejection(state, T.Cancel(t=10, job="mine", origin="client:vision:wu"))[0] == "identity_mismatch"
    assert _rejection(state, T.Cancel(t=11, job="mine", origin="client:other:li"))[0] == "identity_mismatch"
    assert "mine" in state.canonical.jobs
    assert _rejection(state, T.Cancel(t=12, job="mine", origin="op:alice")) is None
    assert "mine" not in state.canonical.jobs


def test_a_client_may_not_change_policy_or_nodes(state):
    policy = T.SetPolicy(t=10, params={"victims_per_preemption_max": 1}, origin="client:vision:li")
    assert _rejection(state, policy)[0] == "not_permitted_for_role"
    down = T.NodeDown(t=11, node="h1", origin="client:vision:li")
    assert _rejection(state, down)[0] == "not_permitted_for_role"
    assert state.canonical.nodes["h1"].up
    assert (
        _rejection(state, T.SetPolicy(t=12, params={"victims_per_preemption_max": 1}, origin="op:alice"))
        is None
    )


def test_a_host_speaks_only_for_its_node_and_the_jobs_placed_on_it(state):
    assert _rejection(state, T.NodeDown(t=10, node="h1", origin="host:h2"))[0] == "identity_mismatch"
    placed = state.canonical.jobs["mine"].placement[0].node
    stranger = "h2" if placed == "h1" else "h1"
    assert (
        _rejection(state, T.Finished(t=11, job="mine", ok=False, origin=f"host:{stranger}"))[0]
        == "identity_mismatch"
    )
    assert (
        _rejection(
            state, T.Submit(t=12, job="z", team="a", user="b", level=0, gpus=1, origin=f"host:{placed}")
        )[0]
        == "not_permitted_for_role"
    )
    run = state.canonical.jobs["mine"].run
    assert _rejection(state, T.Started(t=13, job="mine", attempt=run, origin=f"host:{placed}")) is None


def test_a_job_speaks_only_for_itself(state):
    fact = T.CheckpointSaved(t=10, job="mine", step=1, digest="sha256:0", bytes=1, origin="job:other")
    assert _rejection(state, fact)[0] == "identity_mismatch"
    assert _rejection(state, T.Cancel(t=11, job="mine", origin="job:mine"))[0] == "not_permitted_for_role"


def test_inputs_without_an_origin_are_not_checked_so_old_logs_and_scenarios_replay(state):
    assert _rejection(state, T.Cancel(t=10, job="mine")) is None


def test_a_client_gives_feedback_and_makes_requests_only_as_itself(state):
    feedback = T.Feedback(t=10, job="mine", user="wu", score=1, origin="client:vision:li")
    assert _rejection(state, feedback)[0] == "identity_mismatch"
    hold = T.Hold(t=11, job="mine", by="wu", origin="client:vision:li")
    assert _rejection(state, hold)[0] == "identity_mismatch"
    lower = T.SetLevel(t=12, job="mine", by="li", level=6, origin="client:vision:li")
    assert _rejection(state, lower) is None


def test_a_host_or_job_fact_that_names_no_run_is_refused_where_the_job_has_one(state):
    job = state.canonical.jobs["mine"]
    host = f"host:{job.placement[0].node}"
    assert job.run > 0
    # attempt 0 used to read as "unfenced": a fact from anywhere on the job's host, or a job
    # process of an earlier run, would then pass the stale-run fence and kill the run
    unnamed = T.Finished(t=10, job="mine", ok=False, origin=host)
    assert _rejection(state, unnamed)[0] == "run_not_named"
    from_job = T.CheckpointSaved(t=11, job="mine", step=1, digest="sha256:0", bytes=1, origin="job:mine")
    assert _rejection(state, from_job)[0] == "run_not_named"
    assert state.canonical.jobs["mine"].state == "starting"
    # an operator's word and an offline scenario need no run
    assert _rejection(state, T.Started(t=12, job="mine")) is None


@pytest.mark.parametrize(
    "subject",
    [
        "xr.in.client.vision.li.x.submit",  # one token too many after a client's name
        "xr.in.client.vision.li.x.y.cancel",
        "xr.in.client.vision.submit",  # one too few
        "xr.in.host.h2.x.finished",
        "xr.in.host.finished",
        "xr.in.op.alice.x.set_policy",
        "xr.in.job.mine.x.checkpoint_saved",
        "xr.in.sched.s1.x.node_up",
        "xr.in.nosuchrole.a.submit",
        "xr.in.submit",
        "xr.in.raw",
    ],
)
def test_on_an_authenticated_bus_a_subject_that_names_no_sender_is_refused_unknown_sender(state, subject):
    from agents.scheduler import stamped_input

    before = {job_id: (job.state, job.level) for job_id, job in state.canonical.jobs.items()}
    nodes = sorted(state.canonical.nodes)
    for inp in (
        T.Submit(job="ghost", team="safety", user="kim", level=0, gpus=1),
        T.SetPolicy(params={"victims_per_preemption_max": 1}),
        T.NodeUp(node="ghost-node", gpu_model="H100", gpus=256),
        T.Finished(job="mine", ok=False),
        T.SetLevel(job="mine", level=7, by="li"),
    ):
        seq = state.canonical.last_input_seq + 1
        stamped = stamped_input(T.encode(inp), seq, 1_000, state.canonical.t, subject, senders_required=True)
        assert stamped.origin == f"unknown:{subject}"
        assert _rejection(state, stamped)[0] == "unknown_sender"
        # on an open bus nobody is authenticated: the same subject names nobody, and nothing is checked
        assert stamped_input(T.encode(inp), seq, 1_000, 0, subject).origin == ""
    assert {job_id: (job.state, job.level) for job_id, job in state.canonical.jobs.items()} == before
    assert sorted(state.canonical.nodes) == nodes and "ghost" not in state.canonical.jobs


@pytest.mark.parametrize(
    ("subject", "origin"),
    [
        ("xr.in.client.vision.li.submit", "client:vision:li"),
        ("xr.in.host.h1.finished", "host:h1"),
        ("xr.in.op.alice.set_policy", "op:alice"),
        ("xr.in.sched.s1.tick", "sched:s1"),
        ("xr.in.client.~612e62.li.submit", "client:a.b:li"),
    ],
)
def test_a_subject_of_the_parsed_shape_names_its_sender_on_any_bus(subject, origin):
    from core.identity import origin_of_subject

    assert origin_of_subject(subject, senders_required=True) == origin
    assert origin_of_subject(subject) == origin


def test_a_host_cordons_and_uncordons_only_itself(state):
    other = T.NodeHealth(t=10, node="h1", healthy=False, reason="full", origin="host:h2")
    reason, detail = _rejection(state, other)
    assert reason == "identity_mismatch" and "a host speaks for itself" in detail
    assert state.canonical.nodes["h1"].cordoned_by == ""
    assert (
        _rejection(state, T.NodeHealth(t=11, node="h2", healthy=False, reason="full", origin="host:h2"))
        is None
    )
    assert state.canonical.nodes["h2"].cordoned_by == "host:h2"
    healthy_other = T.NodeHealth(t=12, node="h2", healthy=True, origin="host:h1")
    assert _rejection(state, healthy_other)[0] == "identity_mismatch"
    assert state.canonical.nodes["h2"].cordoned_by == "host:h2"
    # Nor may a host use the operator's command, on itself or another node.
    for node in ("h1", "h2"):
        assert (
            _rejection(state, T.UncordonNode(t=20, node=node, origin="host:h2"))[0]
            == "not_permitted_for_role"
        )
        assert _rejection(state, T.CordonNode(t=20, node=node, reason="x", origin="host:h2"))[0] == (
            "not_permitted_for_role"
        )
    assert state.canonical.nodes["h2"].cordoned_by == "host:h2"


def test_only_an_operator_cordons_a_node_and_is_recorded_as_the_one_who_did(state):
    for origin in ("client:vision:li", "job:mine"):
        assert _rejection(state, T.CordonNode(t=10, node="h1", reason="x", origin=origin))[0] == (
            "not_permitted_for_role"
        )
        assert _rejection(state, T.NodeHealth(t=10, node="h1", healthy=False, origin=origin))[0] == (
            "not_permitted_for_role"
        )
    assert state.canonical.nodes["h1"].cordoned_by == ""
    # The operator the bus authenticated, not the name the body claims.
    assert (
        _rejection(state, T.CordonNode(t=11, node="h1", reason="PSU", by="mallory", origin="op:alice"))
        is None
    )
    assert state.canonical.nodes["h1"].cordoned_by == "op:alice"
    assert _rejection(state, T.UncordonNode(t=12, node="h1", origin="op:bob")) is None
    assert state.canonical.nodes["h1"].cordoned_by == ""
