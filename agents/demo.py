"""`xirang demo` (`make run`): the whole live system on one machine, end to end.

An embedded nats-server, the scheduler and two simulated 8-GPU hosts of different models
run as separate OS processes. Five teams fill the cluster with low-priority training jobs
(real numpy training loops using the job SDK, plus one plain job without it); then a
level-0 job needing all 8 H100s arrives and preempts the three jobs on the H100 host in one
saga: they reach a safe point, checkpoint to JetStream (their own XR_CKPT subjects), release; the
urgent job runs; the victims resume from their checkpoints and their loss carries on from
where it was. The terminal shows the timeline as the log records it and ends with a
summary. Every process it started is stopped by pid; the log is verified (hash chain and
state digests) and exported to `events.jsonl`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from nats.js import api

from core import rebuild
from core import types as T
from core.explain import human_duration

from transport import bus
from .cluster import start_cluster, stop_children
from .examples import EXAMPLES_DIR
from .host import stop_job_processes
from .interrupts import run_until_stopped
from transport.natsd import EmbeddedNats

DEMO_TIMEOUT_S = 150.0
H100_NODE = "gpu-h100-1"
A100_NODE = "gpu-a100-1"

# Quick preemption for a demo: short safe-point and deadline allowances.
DEMO_POLICY = """\
# Policy for the demo: the defaults, with time allowances scaled down to seconds.
safe_point_ms = 2000
deadline_slack_ms = 15000
deadline_min_ms = 30000
min_run_after_restart_ms = 20000
"""

# The example shipped with xirang, found through the package: the demo runs from anywhere.
TRAIN = [sys.executable, str(EXAMPLES_DIR / "train_numpy.py")]


def _train(steps: int, seed: int, step_ms: int = 10, ckpt_s: float = 6.0) -> list[str]:
    return TRAIN + [
        "--steps",
        str(steps),
        "--seed",
        str(seed),
        "--step-ms",
        str(step_ms),
        "--checkpoint-every-s",
        str(ckpt_s),
        "--log-every",
        "100",
    ]


def workload() -> list[T.Submit]:
    """The demo's jobs: long low-priority training runs, then an urgent job that must preempt
    them."""
    common = {"ckpt_interval_s": 6, "ckpt_cost_s": 1, "restore_cost_s": 1}
    return [
        T.Submit(
            job="vision-ft-1",
            team="vision",
            user="mei",
            level=6,
            gpus=4,
            gpu_models=["H100"],
            est_runtime_s=120,
            command=_train(2600, 1),
            **common,
        ),
        T.Submit(
            job="nlp-sweep-1",
            team="nlp",
            user="raj",
            level=6,
            gpus=2,
            gpu_models=["H100"],
            est_runtime_s=120,
            command=_train(2400, 2),
            **common,
        ),
        T.Submit(
            job="nlp-sweep-2",
            team="nlp",
            user="raj",
            level=7,
            gpus=2,
            gpu_models=["H100"],
            est_runtime_s=120,
            command=_train(2400, 3),
            **common,
        ),
        T.Submit(
            job="search-hp-1",
            team="search",
            user="li",
            level=5,
            gpus=4,
            gpu_models=["A100"],
            est_runtime_s=60,
            command=_train(2000, 4),
            **common,
        ),
        T.Submit(
            job="bio-eval-1",
            team="bio",
            user="ana",
            level=4,
            gpus=2,
            gpu_models=["A100"],
            est_runtime_s=60,
            command=_train(1500, 5),
            **common,
        ),
        T.Submit(
            job="search-etl-1",
            team="search",
            user="li",
            level=7,
            gpus=2,
            gpu_models=["A100"],
            est_runtime_s=30,
            preemptible=True,
            command=[sys.executable, "-c", "import time; time.sleep(12)"],
        ),
    ]


URGENT = T.Submit(
    job="safety-hotfix",
    team="safety",
    user="kim",
    level=0,
    gpus=8,
    gpu_models=["H100"],
    est_runtime_s=15,
    ckpt_interval_s=0,
    command=_train(700, 9, ckpt_s=0),
)


class Timeline:
    """Follows the log and the jobs' metrics; prints what happens as it happens."""

    def __init__(self, started: float, out=None) -> None:
        self.started = started
        self.out = out or sys.stdout  # stderr under --json, so stdout is the JSON alone
        self.records: list[T.Record] = []
        self.loss: dict[str, list[tuple[int, float, bool]]] = {}
        self.loss_at_release: dict[str, tuple[int, float]] = {}
        self.changed = asyncio.Event()
        self.children: list = []

    def dead(self) -> str:
        """The first process of ours that has exited, if any."""
        return next((name for name, proc in self.children if proc.poll() is not None), "")

    def say(self, tag: str, text: str) -> None:
        """Print one line of the demo's story, stamped with the seconds since it began."""
        print(f"  {time.monotonic() - self.started:6.1f}s  {tag:<9} {text}", flush=True, file=self.out)

    async def on_record(self, msg) -> None:
        """A record of the log: keep it and tell the story of its event."""
        record = T.decode_record(msg.data)
        self.records.append(record)
        self._print(record.event)
        self.changed.set()

    async def on_metric(self, msg) -> None:
        """A training metric from a job: show its step and loss, and note a resume."""
        m = json.loads(msg.data)
        job, step, loss = m["job"], m["step"], m["loss"]
        resumed = bool(m.get("resumed"))
        history = self.loss.setdefault(job, [])
        history.append((step, loss, resumed))
        if resumed:
            before = self.loss_at_release.get(job)
            was = f" (was {before[1]:.4f} at step {before[0]} when preempted)" if before else ""
            self.say("LOSS", f"{job} resumed at step {step}: loss {loss:.4f}{was}")
        elif step % 500 == 0:
            self.say("LOSS", f"{job} step {step}: loss {loss:.4f}")

    def _print(self, ev) -> None:
        say = self.say
        if isinstance(ev, T.NodeJoined):
            say("NODE", f"{ev.node} joined: {ev.gpus} x {ev.gpu_model}")
        elif isinstance(ev, T.PolicyChanged):
            say("POLICY", f"set by {ev.by}: {', '.join(f'{k}={v}' for k, v in sorted(ev.params.items()))}")
        elif isinstance(ev, T.JobSubmitted):
            say(
                "SUBMIT",
                f"{ev.job} team={ev.team} level={ev.level} {ev.gpus} x {'/'.join(ev.gpu_models) or 'any'}",
            )
        elif isinstance(ev, T.InputRejected):
            say("REJECT", f"{ev.input_type} {ev.job}: {ev.reason} ({ev.detail})")
        elif isinstance(ev, T.JobStartRequested):
            say("START", f"{ev.job} on {_slots(ev.placement)}")
        elif isinstance(ev, T.JobResumeRequested):
            say(
                "RESUME",
                f"{ev.job} on {_slots(ev.placement)} from checkpoint step {ev.ckpt_step} ({ev.reason})",
            )
        elif isinstance(ev, T.JobRunning):
            say("RUNNING", f"{ev.job} (waited {ev.waited_ms / 1000:.1f}s)")
        elif isinstance(ev, T.PreemptionPlanned):
            say("PREEMPT", f"{ev.saga}: {ev.preemptor} preempts {', '.join(ev.victims)} atomically")
            say("", f"benefit {ev.benefit:.1f} > cost {ev.cost:.1f} (weighted GPU-s): {ev.reason}")
        elif isinstance(ev, T.VictimNotified):
            say(
                "NOTICE",
                f"{ev.job}: reach a safe point"
                + (", checkpoint" if ev.checkpoint_needed else "")
                + f", release (deadline in {(ev.deadline_t - ev.t) / 1000:.0f}s)",
            )
        elif isinstance(ev, T.CheckpointRecorded):
            say("CKPT", f"{ev.job} step {ev.step}, {ev.bytes} bytes, {ev.digest[:19]}...")
        elif isinstance(ev, T.VictimReleased):
            history = self.loss.get(ev.job)
            if history:
                self.loss_at_release[ev.job] = history[-1][:2]
            say("RELEASED", f"{ev.job} ({ev.saga}), lost progress {human_duration(ev.lost_progress_ms)}")
        elif isinstance(ev, T.PreemptionCommitted):
            say("COMMIT", f"{ev.saga}: all {len(ev.victims)} victims released; {ev.preemptor} gets its GPUs")
        elif isinstance(ev, T.PreemptionRolledBack):
            say("ROLLBACK", f"{ev.saga}: {ev.reason}")
        elif isinstance(ev, T.JobRequeued):
            say("REQUEUE", f"{ev.job} boost +{ev.boost} ({ev.reason}, preempted {ev.preempt_count}x)")
        elif isinstance(ev, T.JobFinished):
            say("FINISHED", f"{ev.job} after {ev.run_ms / 1000:.1f}s of run time")
        elif isinstance(ev, T.JobFailed):
            say("FAILED", f"{ev.job}: {ev.reason}")
        elif isinstance(ev, T.CompensationGranted):
            say(
                "COMPENSATE",
                f"{ev.job} ({ev.team}) gets {ev.amount:g} {ev.kind.replace('_', ' ')}"
                f" after {ev.preempt_count} preemptions",
            )
        elif isinstance(ev, T.CheckpointFallback):
            say(
                "FALLBACK",
                f"{ev.job}: checkpoint {ev.bad_digest[:12]} did not verify; back to step"
                f" {ev.to_step} (loses {human_duration(ev.lost_progress_ms)})",
            )
        elif isinstance(ev, T.NodeLost):
            say("NODE", f"{ev.node} lost ({ev.reason}); requeued {', '.join(ev.jobs) or 'no job'}")
        elif isinstance(ev, T.PreemptionDeclined):
            numbers = f": benefit {ev.benefit:.0f} vs cost {ev.cost:.0f}" if ev.benefit or ev.cost else ""
            say("WAIT", f"{ev.job} does not preempt ({ev.reason.replace('_', ' ')}{numbers})")


def _slots(placement) -> str:
    return " ".join(f"{s.node}[{','.join(map(str, s.gpus))}]" for s in placement)


def _count(records, kind) -> int:
    return sum(isinstance(r.event, kind) for r in records)


async def _wait(timeline: Timeline, predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate(timeline.records):
        if timeline.dead():
            raise RuntimeError(f"{timeline.dead()} exited early; see its log in the logs/ folder")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        timeline.changed.clear()
        try:
            await asyncio.wait_for(timeline.changed.wait(), min(remaining, 1.0))
        except asyncio.TimeoutError:
            pass
    return True


def _checkpointed(records, job: str) -> bool:
    return any(isinstance(r.event, T.CheckpointRecorded) and r.event.job == job for r in records)


def _running(records, job: str) -> bool:
    return any(isinstance(r.event, T.JobRunning) and r.event.job == job for r in records)


async def _drive(url: str, timeline: Timeline, deadline: float) -> dict:
    nc, js = await bus.connect(url)
    await bus.ensure_streams(js)
    log_sub = await js.subscribe(
        f"{bus.LOG_PREFIX}.>",
        stream=bus.EV_STREAM,
        ordered_consumer=True,
        cb=timeline.on_record,
        config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL),
    )
    metric_sub = await nc.subscribe("xr.job.*.metrics", cb=timeline.on_metric)
    try:
        ok = await _wait(timeline, lambda rs: _count(rs, T.NodeJoined) >= 2, 30)
        if not ok:
            return {"error": "hosts did not join within 30 s"}
        jobs = workload()
        for inp in jobs:
            await bus.send_input(js, inp)
        await bus.send_input(js, T.Submit(job="typo-job", team="bio", user="ana", level=9, gpus=1))
        ok = await _wait(timeline, lambda rs: all(_running(rs, j.job) for j in jobs), 40)
        if not ok:
            return {"error": "the workload did not start within 40 s"}
        timeline.say(
            "WAIT",
            "cluster full: 16/16 GPUs busy with low-priority work; training until each"
            " H100 job has saved a checkpoint",
        )
        # The urgent job comes once its would-be victims have something to resume from, so the
        # demo shows a resume whichever way the decision model has them let go (a fresh save,
        # or their last checkpoint when losing the few seconds since is cheaper than the wait).
        h100_jobs = [j.job for j in jobs if j.gpu_models == ["H100"]]
        await _wait(timeline, lambda rs: all(_checkpointed(rs, j) for j in h100_jobs), 40)
        await asyncio.sleep(2)
        timeline.say("URGENT", f"{URGENT.job}: level 0, needs 8 x H100 now")
        await bus.send_input(js, URGENT)
        all_jobs = [j.job for j in jobs] + [URGENT.job]

        def all_done(rs) -> bool:
            done = {
                r.event.job for r in rs if isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled))
            }
            return all(j in done for j in all_jobs)

        finished = await _wait(timeline, all_done, max(5.0, deadline - time.monotonic()))
        return {"finished": finished}
    finally:
        await log_sub.unsubscribe()
        await metric_sub.unsubscribe()
        await nc.close()


def _summary(timeline: Timeline, out: Path, outcome: dict, verify: str) -> dict:
    records = timeline.records
    sagas = []
    for r in records:
        ev = r.event
        if isinstance(ev, T.PreemptionPlanned):
            end = next(
                (
                    x
                    for x in records
                    if isinstance(x.event, (T.PreemptionCommitted, T.PreemptionRolledBack))
                    and x.event.saga == ev.saga
                ),
                None,
            )
            sagas.append(
                {
                    "saga": ev.saga,
                    "preemptor": ev.preemptor,
                    "victims": ev.victims,
                    "benefit": ev.benefit,
                    "cost": ev.cost,
                    "reason": ev.reason,
                    "outcome": "none yet"
                    if end is None
                    else (
                        "committed"
                        if isinstance(end.event, T.PreemptionCommitted)
                        else f"rolled back: {end.event.reason}"
                    ),
                    "plan_to_end_ms": None if end is None else end.event.t - ev.t,
                }
            )
    victims = []
    for saga in sagas:
        for job in saga["victims"]:
            released = next(
                (r.event for r in records if isinstance(r.event, T.VictimReleased) and r.event.job == job),
                None,
            )
            resumed = next(
                (
                    r.event
                    for r in records
                    if isinstance(r.event, T.JobResumeRequested) and r.event.job == job
                ),
                None,
            )
            history = timeline.loss.get(job, [])
            after = next(((s, loss) for s, loss, res in history if res), None)
            victims.append(
                {
                    "job": job,
                    "lost_progress_ms": released.lost_progress_ms if released else None,
                    "resumed_from_step": resumed.ckpt_step if resumed else None,
                    "loss_when_preempted": timeline.loss_at_release.get(job),
                    "loss_on_resume": after,
                    "final_loss": history[-1][:2] if history else None,
                    "finished": any(
                        isinstance(r.event, T.JobFinished) and r.event.job == job for r in records
                    ),
                }
            )
    return {
        "outcome": outcome,
        "sagas": sagas,
        "victims": victims,
        "records": len(records),
        "log_verified": verify,
        "out_dir": str(out),
        "events": str(out / "events.jsonl"),
        "nats_store": str(out / "nats"),
        "host_state": str(out / "hosts"),
        "logs": str(out / "logs"),
    }


def _print_summary(s: dict) -> None:
    print("\n=== summary ===")
    if s["outcome"].get("error"):
        print(f"DEMO FAILED: {s['outcome']['error']}")
    elif not s["outcome"].get("finished"):
        print("DEMO INCOMPLETE: not every job finished within the time limit")
    for saga in s["sagas"]:
        print(
            f"{saga['saga']}: {saga['preemptor']} preempted {', '.join(saga['victims'])}: {saga['outcome']}"
            f" in {human_duration(saga['plan_to_end_ms'])}"
        )
        print(
            f"  why: benefit {saga['benefit']} vs cost {saga['cost']} (weighted GPU-seconds); {saga['reason']}"
        )
    for v in s["victims"]:
        before = v["loss_when_preempted"]
        after = v["loss_on_resume"]
        final = v["final_loss"]
        print(
            f"  {v['job']}: lost {human_duration(v['lost_progress_ms'] or 0)} of progress; resumed from step {v['resumed_from_step']}"
            + (
                f"; loss {before[1]:.4f} @ {before[0]} -> {after[1]:.4f} @ {after[0]} on resume"
                if before and after
                else ""
            )
            + (f" -> {final[1]:.4f} @ {final[0]} final" if final else "")
            + ("" if v["finished"] else " (not finished)")
        )
    print(f"log: {s['records']} records, {s['log_verified']}")
    print(
        f"files: {s['out_dir']}  (events.jsonl = the log; nats/ = JetStream store; hosts/ = job runs and"
        " their output; logs/ = scheduler and host logs)"
    )


def run_demo(out_dir: str | None = None, as_json: bool = False) -> int:
    """`xirang demo`: start a local cluster, submit the demo's jobs, narrate what happens, and
    summarise (as JSON with `as_json`)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="xirang-demo-")).resolve()
    say = sys.stderr if as_json else sys.stdout
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy.toml").write_text(DEMO_POLICY)
    started = time.monotonic()
    print(f"xirang demo: files in {out}", flush=True, file=say)
    server = EmbeddedNats(out / "nats").start()
    children = []
    timeline = Timeline(started, say)
    try:
        children = start_cluster(
            server.url,
            out,
            2,
            ["8xH100", "8xA100"],
            policy=str(out / "policy.toml"),
            tick_ms=500,
            log_dir=out / "logs",
            node_names=[H100_NODE, A100_NODE],
        )
        print(
            f"  NATS {server.url} (pid {server.proc.pid}); scheduler pid {children[0][1].pid}; "
            f"hosts {H100_NODE} (8xH100) pid {children[1][1].pid}, {A100_NODE} (8xA100) pid {children[2][1].pid}",
            flush=True,
            file=say,
        )
        timeline.children = children
        try:
            outcome = run_until_stopped(_drive(server.url, timeline, started + DEMO_TIMEOUT_S))
        except RuntimeError as err:
            outcome = {"error": str(err)}
    finally:
        stop_children([proc for _, proc in children])
        stop_job_processes(out)  # none are left when the demo ran to its end
        server.stop()
    verify = _verify_and_export(timeline.records, out / "events.jsonl", out / "keys" / "scheduler.pub")
    summary = _summary(timeline, out, outcome, verify)
    summary["wall_s"] = round(time.monotonic() - started, 1)
    if as_json:
        print(json.dumps(summary, default=list))
    else:
        _print_summary(summary)
        print(f"done in {summary['wall_s']} s; every process started was stopped")
    good = (
        outcome.get("finished")
        and summary["sagas"]
        and all(s["outcome"] == "committed" for s in summary["sagas"])
    )
    return 0 if good else 1


def _verify_and_export(records: list[T.Record], path: Path, keyring_file: Path) -> str:
    from trust.signing import KeyRing, LogVerifier

    with open(path, "wb") as fh:
        for record in records:
            fh.write(T.encode_record(record) + b"\n")
    try:
        verifier = LogVerifier(KeyRing.load(keyring_file))
        trusted = [r for record in records for r, _ in verifier.admit(record)]
        verifier.finish()
        state = rebuild(trusted)
    except ValueError as err:
        return f"VERIFICATION FAILED: {err}"
    return (
        f"hash chain, state digests and {verifier.signatures} scheduler signatures verified "
        f"(head {state.canonical.chain[:16]}; `xirang audit --log {path} --public-key {keyring_file}`)"
    )


def clean(path: str) -> None:
    """Remove a demo's folder."""
    shutil.rmtree(path, ignore_errors=True)
