"""xirang's own policy in the simulator: every decision is `core.step`, the same code the
live scheduler runs.

The adapter turns trace arrivals into `submit` inputs and the hosts' facts into inputs
(they already are core inputs), steps the core, and hands the host-directed events to the
simulated hosts: JobStartRequested -> start from scratch, JobResumeRequested -> start from
the named checkpoint, VictimNotified -> notice, NoticeWithdrawn -> withdraw, JobCancelled ->
kill. It wakes the core with `tick` inputs: at a saga's deadline exactly, and for aging
(`core.next_due_t`) and re-evaluation of blocked jobs at most once per `tick_s` (60 s of
simulated time) while jobs wait, so blocked jobs are reconsidered as running jobs
progress. Rate-limiting aging to the tick period (a live scheduler ticks every few
seconds) makes aging up to 60 s late; without the limit a deep queue asks for a tick
almost every second, and each costs a full scheduling pass. While a job of an urgent level
(below the policy's `urgent_levels`: 0-1) waits outside a saga, ticks come every `urgent_tick_s` (5 s) instead: one declined at
submit tries again as soon as a live scheduler would let it. No ticks when nothing waits.

Config keys: those of `core.Policy` (as in a policy TOML file), or `policy` (a
`core.Policy`), plus `tick_s`, `urgent_tick_s`, `report_periodic_checkpoints`, and, to keep
the run's log: `log_path` (every record the core seals, one JSON a line, the format of
`xirang replay run --events-out`, so the audit, the projection, what-if, the tuner and the
review read it like a live log) or `keep_records` (true: the same records kept in memory,
`XirangPolicy.records`), `inputs` (more inputs for the core, each at its own `t`, e.g. a
`set_policy` part-way) and `epoch_ms` (log time of the simulation's start, e.g.
the first millisecond of a quarter; default 0). The latter defaults to
true, as live agents report every checkpoint: the core then knows each running job's
unsaved progress, and releases a victim whose last checkpoint is fresh enough (or that
has little to lose) without making the preemptor wait for a save. On Philly that is
~0.6 million periodic checkpoints, two core steps each (about a quarter of xirang's
simulated time). False reports only the checkpoints a notice asked for, and the core
then sees every victim's whole progress as unsaved.
"""

from __future__ import annotations

import msgspec

from core import Policy, new_state, next_due_t, step, with_params
from core import types as T

from ..workload import TraceJob

TICK_MS = 60_000  # re-evaluation period while jobs wait (simulated time)
# ... and while a job of an urgent level (0-1) waits outside a saga: a live scheduler ticks
# every second, and an urgent job declined at submit should not wait a minute for its next try.
URGENT_TICK_MS = 5_000

# The events of a host's checkpoint report that the core accepted and acted on alone (no
# pass decided anything after it): they change a running job's checkpoint fields only.
CHECKPOINT_EVENTS = (T.CheckpointBegan, T.CheckpointRecorded)

ADAPTER_KEYS = (
    "policy",
    "tick_s",
    "urgent_tick_s",
    "report_periodic_checkpoints",
    "log_path",
    "epoch_ms",
    "keep_records",
    "inputs",
)


class XirangPolicy:
    """xirang's policy in the simulator: `core.step` decides, this adapter turns arrivals and
    host facts into inputs and the core's host-directed events into host commands."""

    name = "xirang"

    def __init__(self, config: dict, cluster, seed: int) -> None:
        config = dict(config)
        policy = config.pop("policy", None) or Policy()
        self.tick_ms = int(1000 * float(config.pop("tick_s", TICK_MS / 1000)))
        self.urgent_tick_ms = int(1000 * float(config.pop("urgent_tick_s", URGENT_TICK_MS / 1000)))
        self.wants_periodic_checkpoints = bool(config.pop("report_periodic_checkpoints", True))
        self.epoch_ms = int(config.pop("epoch_ms", 0))
        log_path = config.pop("log_path", None)
        self.log = open(log_path, "wb") if log_path else None  # closed by summary(), at the end
        self.records: list[T.Record] | None = [] if config.pop("keep_records", False) else None
        self.timed_inputs: list[T.Input] = list(config.pop("inputs", ()))
        if config:
            policy = with_params(policy, config)  # PolicyError names a bad key
        # A kept log must say which policy it ran under, so that it folds back to the same
        # state: it starts from the defaults and records the differences as a set_policy.
        kept = self.log is not None or self.records is not None
        # Without a kept log nothing is hashed (core.step sealed=False): the same decisions,
        # records without a hash chain.
        self.sealed = kept
        self.initial_params = _differences(policy) if kept else {}
        self.state = new_state(Policy() if self.initial_params else policy)
        self.cluster = cluster
        self.steps = 0
        self.last_tick_t = 0
        self.sim = None
        self.counts: dict[str, int] = {}
        self.rejections: dict[str, int] = {}
        self.downgraded: list[str] = []  # jobs that entered the queue below their asked level

    def bind(self, sim) -> None:
        """Attach to the simulator: record the run's policy (when the log is kept), the nodes,
        and queue the timed inputs."""
        self.sim = sim
        if self.initial_params:
            self._step(
                T.SetPolicy(
                    t=self.epoch_ms,
                    params=self.initial_params,
                    by="simulator",
                    reason="the policy of the simulated run",
                )
            )
        for name, model, gpus in self.cluster.nodes:
            self._step(T.NodeUp(t=self.epoch_ms, node=name, gpu_model=model, gpus=gpus))
        for inp in self.timed_inputs:
            sim.at(inp.t - self.epoch_ms, self._step, inp)

    def on_submit(self, spec: TraceJob, t: int) -> None:
        """A trace arrival as a `submit` input."""
        self._step(
            T.Submit(
                t=t + self.epoch_ms,
                job=spec.id,
                team=spec.team,
                user=spec.user,
                level=spec.level,
                gpus=spec.gpus,
                gpu_models=list(spec.gpu_models),
                est_runtime_s=spec.est_runtime_ms / 1000,
                ckpt_interval_s=spec.ckpt_interval_ms / 1000,
                ckpt_cost_s=spec.ckpt_cost_ms / 1000,
                restore_cost_s=spec.restore_cost_ms / 1000,
            )
        )

    def on_fact(self, inp: T.Input) -> None:
        """A host's fact, stepped through the core as it is (its time shifted by `epoch_ms`)."""
        self._step(msgspec.structs.replace(inp, t=inp.t + self.epoch_ms) if self.epoch_ms else inp)

    def on_wake(self, t: int) -> None:
        """A `tick` input at `t`."""
        self.last_tick_t = t
        self._step(T.Tick(t=t + self.epoch_ms))

    def _urgent_retry_t(self) -> int | None:
        """When the first blocked job of an urgent level may plan again (past its retry
        backoff), or None when none waits outside a saga."""
        jobs = self.state.canonical.jobs
        # The urgent levels are the policy's (`urgent_levels`): each of their jobs is tried
        # for preemption on every pass.
        urgent_levels = self.state.canonical.policy.urgent_levels
        waiting = [
            jobs[job_id].preempt_retry_t
            for level in range(urgent_levels)
            for _, job_id in self.state.index.waiting_by_level[level]
        ]
        return min(waiting) - self.epoch_ms if waiting else None

    def summary(self) -> dict:
        """Events by type, rejections by input and reason, and the jobs that entered below their
        level; closes the kept log."""
        if self.log is not None:
            self.log.close()
            self.log = None
        return {
            "events": dict(sorted(self.counts.items())),
            "rejected": dict(sorted(self.rejections.items())),
            "downgraded": list(self.downgraded),
        }

    def _step(self, inp: T.Input) -> None:
        self.steps += 1
        _, records = step(self.state, inp, self.sealed)
        sim = self.sim
        counts = self.counts
        if self.log is not None:
            self.log.write(b"".join(T.encode(record) + b"\n" for record in records))
        if self.records is not None:
            self.records.extend(records)
        for record in records:
            ev = record.event
            kind = type(ev)
            name = kind.__name__
            counts[name] = counts.get(name, 0) + 1
            if kind is T.JobStartRequested:
                sim.start(ev.job, ev.placement, 0)
            elif kind is T.JobResumeRequested:
                sim.start(ev.job, ev.placement, ev.ckpt_step)
            elif kind is T.VictimNotified:
                sim.notify(ev.job, ev.checkpoint_needed)
            elif kind is T.NoticeWithdrawn:
                sim.withdraw(ev.job)
            elif kind is T.JobCancelled:
                sim.cancel(ev.job)
            elif kind is T.JobSubmitted and ev.level != ev.requested_level:
                self.downgraded.append(ev.job)
            elif kind is T.InputRejected:
                key = f"{ev.input_type}:{ev.reason}"
                self.rejections[key] = self.rejections.get(key, 0) + 1
        if not self._wake_stands(records):
            self._plan_wake(inp.t)

    def _wake_stands(self, records: list[T.Record]) -> bool:
        """Whether the wake-up the steps before asked for still stands after these records,
        so `_plan_wake` would ask for nothing new: most of a long run's steps (full Philly:
        ~1.5 of 1.9 million) are periodic checkpoint reports that change only the
        reporting job's checkpoint fields. `_plan_wake` reads the sagas, the aging and
        urgent waiting jobs, the downgraded jobs' ends and `last_tick_t`; none of them
        changes with those events, except a downgrade's end, which moves with the clock
        (`core.rules.fairness.team_downgrade_ends_t`), so not while a downgraded job queues. The
        last `_plan_wake` left a wake pending at or before max(due, its step's t) (or none,
        when nothing was due); a wake that fired since was a tick, which planned again. So
        asking for max(due, t) at this later t is a no-op (`Simulator.wake_at` keeps the
        earliest request)."""
        return (
            len(records) == 2
            and type(records[1].event) in CHECKPOINT_EVENTS
            and not self.state.index.downgraded_queued
        )

    def _plan_wake(self, t: int) -> None:
        """Saga deadlines exactly; aging and re-evaluation at most once per tick period.
        (In simulated time: the core's times less `epoch_ms`.)"""
        epoch = self.epoch_ms
        t -= epoch
        due = next_due_t(self.state)
        due = None if due is None else due - epoch
        sagas = self.state.canonical.sagas
        deadline = min(saga.deadline_t for saga in sagas.values()) + 1 - epoch if sagas else None
        if any(self.state.index.aging):
            periodic = self.last_tick_t + self.tick_ms
            due = periodic if due is None else min(due, periodic)
        if due is not None:
            due = max(due, self.last_tick_t + self.tick_ms)
        urgent = self._urgent_retry_t()
        if urgent is not None:
            urgent = max(urgent, self.last_tick_t + self.urgent_tick_ms)
            due = urgent if due is None else min(due, urgent)
        if deadline is not None:
            due = deadline if due is None else min(due, deadline)
        if due is not None:
            self.sim.wake_at(max(due, t))


def _differences(policy: Policy) -> dict:
    """The parameters where `policy` differs from the defaults."""
    mine, default = msgspec.structs.asdict(policy), msgspec.structs.asdict(Policy())
    return {name: mine[name] for name in sorted(mine) if mine[name] != default[name]}
