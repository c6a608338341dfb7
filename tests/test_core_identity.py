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
    assert _rejection(state, T.Started(t=13, job="mine", origin=f"host:{placed}")) is None


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
