"""What-if: re-run the recorded inputs of a window under another policy, through the
simulator (`replay.sim.simulate`, which runs `core.step` itself), and set the simulated
scorecard beside what really happened. What really happened is read into the simulator's
own types (`JobOutcome` per job, a `SimResult` for the window), so that one scorecard
(`replay.scorecard.policy_card`) and the tuner's objective read all three alike.

From the log (every accepted input is in it, as `InputAccepted`):
- the cluster: every node that joined up to the window's end (the simulator's cluster is
  static, so nodes lost in the window are not modelled);
- the workload: every `submit` accepted in the window, with its submitted level, GPUs,
  models and checkpoint costs; a job's compute is its training time at `JobFinished`
  (`run_ms`), else its own estimate;
- what really happened to those jobs, followed to the end of the log (the simulator also
  runs them to completion; jobs submitted after the window, which competed with them in
  reality, are not in the simulation): per job, the first `JobRunning`, the `JobFinished`, preemptions
  (`JobRequeued` for a preemption), lost progress (requeues and checkpoint fallbacks),
  and the preemption overhead (a checkpoint save and a restore per preemption, as the
  simulator counts it), scored with the simulator's own `policy_card`, so the columns
  mean the same thing.

Three columns: recorded; simulated under the policy in force at the window's start (how
far the simulator's model is from reality); simulated under the alternative policy. Read
the third against the second.
"""

from __future__ import annotations

from core.model.words import readable_number

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable

from core import types as T
from core.model.policy import Policy, PolicyError
from core.model.policy_defaults import log_policy

from .scorecard import policy_card
from .sim import Cluster, JobOutcome, SimResult, simulate
from .workload import TraceJob, Workload


@dataclass
class Window:
    """What a log says about a window: its cluster and policy, its submits and their fate."""

    from_t: int
    to_t: int
    nodes: dict[str, tuple[str, int]] = field(default_factory=dict)
    # As the core folds it: the log's defaults version (the legacy one if it names none)
    # with the parameters it set up to the window's start (core/model/policy_defaults.py).
    policy: Policy = field(default_factory=lambda: log_policy({}))
    policy_params: dict = field(default_factory=dict)
    submits: dict[str, T.Submit] = field(default_factory=dict)
    outcomes: dict[str, JobOutcome] = field(default_factory=dict)
    run_ms: dict[str, int] = field(default_factory=dict)
    last_t: int = 0  # newest time inside the window
    fate_end_t: int = 0  # newest event of the window's jobs, wherever it falls


def scan(records: Iterable[T.Record], from_t: int | None, to_t: int | None) -> Window:
    """One pass over the log: the cluster, the jobs submitted in the window, their fate."""
    win = Window(from_t=from_t if from_t is not None else 0, to_t=to_t if to_t is not None else 2**62)
    for record in records:
        ev = record.event
        if ev.t > win.to_t:
            _fate(win, ev)  # the window's jobs, after the window
            continue
        win.last_t = ev.t
        if isinstance(ev, T.NodeJoined):
            win.nodes[ev.node] = (ev.gpu_model, ev.gpus)
        elif isinstance(ev, T.PolicyChanged) and ev.t <= win.from_t:
            try:
                win.policy = log_policy({**win.policy_params, **ev.params})
                win.policy_params = {**win.policy_params, **ev.params}
            except PolicyError:
                pass
        elif isinstance(ev, T.InputAccepted) and isinstance(ev.input, T.Submit) and ev.t >= win.from_t:
            win.submits[ev.input.job] = ev.input
        elif isinstance(ev, T.JobSubmitted) and ev.job in win.submits:
            win.outcomes[ev.job] = JobOutcome(
                id=ev.job,
                team=ev.team,
                user=ev.user,
                level=win.submits[ev.job].level,
                gpus=ev.gpus,
                submit_ms=ev.t - win.from_t,
                duration_ms=int(ev.est_runtime_s * 1000),
            )
        else:
            _fate(win, ev)
    return win


def _fate(win: Window, ev: T.Event) -> None:
    out = win.outcomes.get(getattr(ev, "job", ""))
    if out is None:
        return
    rel = ev.t - win.from_t
    win.fate_end_t = max(win.fate_end_t, ev.t)
    if isinstance(ev, T.JobRunning) and out.first_start_ms < 0:
        out.first_start_ms = rel
    elif isinstance(ev, T.JobFinished):
        out.finish_ms = rel
        out.duration_ms = ev.run_ms
        win.run_ms[ev.job] = ev.run_ms
    elif isinstance(ev, T.JobRequeued) and ev.reason == "preempted":
        out.preemptions += 1
        out.lost_progress_ms += ev.lost_progress_ms
        sub = win.submits[ev.job]
        out.overhead_ms += int(1000 * ((sub.ckpt_cost_s or 0) + (sub.restore_cost_s or 0)))
    elif isinstance(ev, T.CheckpointFallback):
        out.lost_progress_ms += ev.lost_progress_ms


def _held_spans(records: Iterable[T.Record], win: Window) -> None:
    """When each job held GPUs, relative to the window: from a start request to its end,
    release or requeue."""
    since: dict[str, int] = {}
    for record in records:
        ev = record.event
        job = getattr(ev, "job", "")
        out = win.outcomes.get(job)
        if out is None:
            continue
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)):
            since[job] = ev.t
        elif isinstance(ev, (T.JobFinished, T.JobFailed, T.JobCancelled, T.VictimReleased, T.JobRequeued)):
            if job in since:
                out.held_spans.append((since.pop(job) - win.from_t, ev.t - win.from_t))
    for job, t in since.items():
        win.outcomes[job].held_spans.append((t - win.from_t, win.fate_end_t - win.from_t))


def workload(win: Window) -> Workload:
    """The window's accepted submits as the simulator's workload (times from the window's start)."""
    jobs = []
    for job_id, sub in win.submits.items():
        out = win.outcomes.get(job_id)
        if out is None:
            continue  # accepted input whose submit was refused later in the step
        jobs.append(
            TraceJob(
                id=job_id,
                submit_ms=sub.t - win.from_t,
                duration_ms=max(1, out.duration_ms),
                gpus=sub.gpus,
                team=sub.team,
                user=sub.user,
                level=sub.level,
                gpu_models=list(sub.gpu_models),
                ckpt_interval_ms=int(1000 * (sub.ckpt_interval_s or 0)),
                ckpt_cost_ms=int(1000 * (sub.ckpt_cost_s or 0)),
                restore_cost_ms=int(1000 * (sub.restore_cost_s or 0)),
                est_runtime_ms=int(1000 * (sub.est_runtime_s or 0)) or out.duration_ms,
            )
        )
    jobs.sort(key=lambda j: (j.submit_ms, j.id))
    return Workload(name=f"recorded[{win.from_t},{win.to_t}]", jobs=jobs, seed=0)


def cluster(win: Window) -> Cluster:
    """Every node that joined up to the window's end."""
    return Cluster(tuple((name, model, gpus) for name, (model, gpus) in sorted(win.nodes.items())))


def recorded_result(records, win: Window, wl: Workload, cl: Cluster, seed: int = 0) -> SimResult:
    """What really happened to the window's jobs, as the simulator's result type (so the
    scorecard and the tuner's objective read it like a simulated run)."""
    _held_spans(records, win)
    return SimResult(
        policy="recorded",
        workload=wl.name,
        seed=seed,
        total_gpus=cl.total_gpus,
        jobs=[win.outcomes[j.id] for j in wl.jobs],
        end_ms=max(1, win.last_t - win.from_t, win.fate_end_t - win.from_t),
        wall_s=0.0,
        steps=0,
        events=0,
    )


def run(records: list[T.Record], alt: Policy, span, seed: int = 0) -> dict:
    """Recorded, simulated-as-recorded and simulated-alternative scorecards of the window
    `span` (a `projections.windows.Span`: from_t, to_t and how it was chosen, which the
    result's window repeats, its end cut to the log's last event)."""
    win = scan(records, span.from_t, span.to_t)
    if not win.outcomes:
        raise ValueError("no job was submitted in this window")
    if not win.nodes:
        raise ValueError("no node joined before the window's end: nothing to run jobs on")
    wl, cl = workload(win), cluster(win)
    recorded = recorded_result(records, win, wl, cl, seed)
    as_recorded = simulate(wl, cl, "xirang", {"policy": win.policy}, seed=seed)
    as_recorded.policy = "simulated_recorded_policy"
    alternative = simulate(wl, cl, "xirang", {"policy": alt}, seed=seed)
    alternative.policy = "simulated_alternative"
    window = dataclasses.replace(span, to_t=min(win.to_t, win.last_t)).as_dict()
    window.update(jobs=len(wl.jobs), gpus=cl.total_gpus, nodes=len(cl.nodes))
    return {
        "window": window,
        "cards": {r.policy: policy_card(r) for r in (recorded, as_recorded, alternative)},
    }


ROWS = [
    ("jobs", lambda c: c["jobs"]),
    ("unstarted", lambda c: c["unstarted"]),
    ("unfinished", lambda c: c["unfinished"]),
    ("wait mean s", lambda c: c["wait_s"]["mean"]),
    ("wait p99 s", lambda c: c["wait_s"]["p99"]),
    ("wait L0-1 p99 s", lambda c: c["wait_s_levels_0_1"]["p99"]),
    ("JCT mean s", lambda c: c["jct_s"]["mean"]),
    ("JCT p99 s", lambda c: c["jct_s"]["p99"]),
    ("preempted (victims)", lambda c: c["preemptions"]),
    ("jobs preempted", lambda c: c["jobs_preempted"]),
    ("lost GPU-h", lambda c: c["lost_gpu_h"]),
    ("utilisation", lambda c: c["util"]),
    ("Jain (teams, service)", lambda c: c["jain_teams"]),
]


def render(result: dict) -> str:
    """The three scorecards side by side, as text."""
    cards = result["cards"]
    names = list(cards)
    w = result["window"]
    lines = [
        f"what-if over {w['from']} .. {w['to']} ({w['chosen']}): {w['jobs']} jobs on"
        f" {w['gpus']} GPUs ({w['nodes']} nodes)",
        f"{'':<18}" + "".join(f"{n:>28}" for n in names),
    ]
    for label, get in ROWS:
        cells = []
        for n in names:
            value = get(cards[n])
            cells.append(f"{readable_number(value):>28}")
        lines.append(f"{label:<18}" + "".join(cells))
    lines.append("read the alternative against simulated_recorded_policy; recorded is what happened")
    lines.append(
        "preempted (victims): each job preempted counts once per preemption (the dashboard counts"
        " preemptions, one per preempting job); Jain (teams, service): over the teams' served/needed"
        " GPU-time"
    )
    return "\n".join(lines)
