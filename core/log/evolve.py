"""`evolve(state, event)`: the only code that changes a State.

Decisions emit events; each event is applied here at once, so a replay of the log through
`evolve` alone rebuilds exactly the state the live scheduler had. Handlers trust the
event: checks belong to the decision that emitted it.

One small handler per event type: those of nodes, the policy and the scheduler here, those
of jobs in core/log/evolve_jobs.py, those of sagas, fairness and compensation in
core/log/evolve_sagas.py; an auditor reads those three files for everything that can
change a state.
"""

from __future__ import annotations

import typing

from ..model import types as T
from ..model.scratch import Scratch
from .evolve_jobs import JOB_HANDLERS
from .evolve_sagas import SAGA_HANDLERS
from ..forecast.waits import release_spec
from ..model.policy_defaults import log_policy
from ..model.state import (
    State,
    node_known,
    touch_job,
    _index_node_capacity,
    rebuild_index,
    reindex_victims,
    unindex_node_capacity,
)
from ..model.scratch import forget_node, forget_pass_memory, forget_remaining
from ..model.cordon import OPERATOR_PREFIX, takes_work
from ..model.entities import (
    Node,
    Usage,
)
from ..model.policy import FAIR_SHARE
from ..model.usage import decayed_gpu_ms, usage_key


def evolve(state: State, ev: T.Event) -> None:
    """Apply one event to the state: the only code that changes a State (the clock moves to the
    event's time)."""
    handler = _HANDLERS.get(type(ev))
    if state.canonical.events_n == 0 and handler is not _policy_changed:
        _log_begins(state)
    state.canonical.t = ev.t
    if handler is None:
        return
    if state.canonical.policy.fair_share_half_life_s > 0:
        state.index.hold_changes = []
        handler(state, ev)
        _note_usage(state, ev.t)
    else:
        handler(state, ev)
    for job_id in touched_jobs(ev):
        touch_job(state, job_id, release_spec)


def _note_usage(state: State, t: int) -> None:
    """Bring a team's decayed use of a fair-share level up to `t` where the GPUs it holds
    there changed: until now it held what it held before the event."""
    ix = state.index
    changes, ix.hold_changes = ix.hold_changes or [], None
    c = state.canonical
    if not changes:
        return
    policies = c.policy.queue_policy
    half_life_ms = c.policy.fair_share_half_life_s * 1000.0
    first: dict[tuple[int, str], int] = {}
    for level, team, before in changes:
        first.setdefault((level, team), before)
    for (level, team), before in sorted(first.items()):
        if policies[level] != FAIR_SHARE or ix.level_team_gpus[level].get(team, 0) == before:
            continue
        key = usage_key(level, team)
        c.usage[key] = Usage(gpu_ms=decayed_gpu_ms(c.usage.get(key), before, t, half_life_ms), t=t)


def touched_jobs(ev: T.Event) -> list[str]:
    """The jobs an event's handler may change: the one it names, or a saga's preemptor and
    victims. Handlers must not change any other job (a test compares the kept digest with
    one computed from scratch)."""
    fields = _JOB_FIELDS.get(type(ev))
    if fields is None:  # not an event type of the union: read every field that may name jobs
        fields = ("job", "preemptor", "victims")
    if not fields:
        return []
    if fields == ("job",):  # most events name one job
        job = getattr(ev, "job", "")
        return [job] if job else []
    names = [getattr(ev, "job", ""), getattr(ev, "preemptor", "")] + list(getattr(ev, "victims", []))
    return [name for name in names if name]


# Event type -> which of the fields that name jobs it has ("job", "preemptor", "victims").
_JOB_FIELDS = {
    cls: tuple(name for name in ("job", "preemptor", "victims") if name in cls.__struct_fields__)
    for cls in typing.get_args(T.Event)
}


# ---------------------------------------------------------------- nodes


def _node_joined(s: State, ev: T.NodeJoined) -> None:
    node = Node(name=ev.node, gpu_model=ev.gpu_model, gpus=ev.gpus, holder=[""] * ev.gpus, addr=ev.addr)
    known = s.canonical.nodes.get(ev.node)
    if known is not None:
        node_known(s.index, known, -1)
        if known.cordoned_by.startswith(OPERATOR_PREFIX):
            # An operator's cordon outlasts a restart of the node; the node's own report
            # of its health is made again by the agent that joins.
            node.cordoned_by, node.cordon_reason = known.cordoned_by, known.cordon_reason
    node_known(s.index, node, 1)
    s.canonical.nodes[ev.node] = node
    s.index.nodes_stale[ev.node] = None
    s.scratch.nodes_sorted = None
    forget_node(s.scratch, ev.node)
    if takes_work(node):
        _index_node_capacity(s.index, s.scratch, node)


def _node_lost(s: State, ev: T.NodeLost) -> None:
    node = s.canonical.nodes[ev.node]
    if takes_work(node):
        unindex_node_capacity(s.index, node)
    node.up = False
    node.holder = [""] * node.gpus
    s.index.nodes_stale[node.name] = None
    s.index.jobs_by_node.pop(node.name, None)
    forget_node(s.scratch, node.name)


def _node_cordoned(s: State, ev: T.NodeCordoned) -> None:
    node = s.canonical.nodes[ev.node]
    if takes_work(node):
        unindex_node_capacity(s.index, node)
    node.cordoned_by, node.cordon_reason = ev.by, ev.reason
    s.index.nodes_stale[node.name] = None
    forget_node(s.scratch, node.name)


def _node_uncordoned(s: State, ev: T.NodeUncordoned) -> None:
    node = s.canonical.nodes[ev.node]
    node.cordoned_by, node.cordon_reason = "", ""
    s.index.nodes_stale[node.name] = None
    forget_node(s.scratch, node.name)
    if takes_work(node):
        _index_node_capacity(s.index, s.scratch, node)


# ---------------------------------------------------------------- jobs


# ---------------------------------------------------------------- checkpoints


# ---------------------------------------------------------------- sagas


# ---------------------------------------------------------------- fairness, ledger, policy


def _log_begins(s: State) -> None:
    """The first record of a log that does not name its defaults version (one written before
    versions existed): the log was decided under the legacy defaults, whatever this release's
    are (core/model/policy_defaults.py)."""
    s.canonical.policy = log_policy(s.canonical.policy_params)


def _policy_changed(s: State, ev: T.PolicyChanged) -> None:
    before = s.canonical.policy
    # The policy in force is always the log's defaults version with what the log set on top:
    # recomputed, so a change of `defaults_version` moves every parameter the log never set.
    s.canonical.policy_params = {**s.canonical.policy_params, **ev.params}
    s.canonical.policy = log_policy(s.canonical.policy_params)
    s.scratch.variant_policies.clear()
    forget_remaining(s.scratch)
    s.scratch.placement_dirty = True
    reindex_victims(s.index, s.canonical)  # a victim's requeue level is the policy's
    if s.canonical.policy.aging_levels_max != before.aging_levels_max:
        # Which jobs may still age changed: the index anew, and with it the scratch (as
        # before the two were apart: the passes' memory and the caches start afresh).
        s.scratch = Scratch()
        s.index = rebuild_index(s.canonical, s.scratch)


def _scheduler_started(s: State, ev: T.SchedulerStarted) -> None:
    forget_pass_memory(s.scratch)


def _input_rejected(s: State, ev: T.InputRejected) -> None:
    if ev.reason == T.INTERNAL_ERROR:  # the state was folded back from the log
        forget_pass_memory(s.scratch)


_HANDLERS: dict[type, typing.Callable[[State, typing.Any], None]] = {
    T.InputRejected: _input_rejected,
    T.SchedulerStarted: _scheduler_started,
    T.NodeJoined: _node_joined,
    T.NodeLost: _node_lost,
    T.NodeCordoned: _node_cordoned,
    T.NodeUncordoned: _node_uncordoned,
    T.PolicyChanged: _policy_changed,
    **JOB_HANDLERS,
    **SAGA_HANDLERS,
}
