"""The simulated hosts: the one model of how hosts and the jobs on them answer a scheduler,
used by the simulator (`replay.sim`, every policy), what-if and the tuner (through the
simulator), the synthetic logs of the projection tests (`replay.synthetic_log`) and
`xirang bench core`.

`SimHosts` owns a virtual clock and a heap of due moments (t, seq): host timers (a launch
completing, a checkpoint finishing, a job ending, a safe point) and facts on their way to
the scheduler. A scheduler commands hosts with `start`, `notify`, `withdraw`, `kill` and
`cancel` and hears back through `report(input)`, the facts as core inputs (`started`,
`checkpoint_started`, `checkpoint_saved`, `safe_point`, `released`, `finished`). A
subclass adds what arrives and who decides (`replay.sim.Simulator`).

The job model (the hosts are the truth; schedulers only see facts):
- progress accrues while the job computes; every `ckpt_interval` of progress it pauses
  for `ckpt_cost` to write a periodic checkpoint (jobs with interval 0 never do);
- a start takes `launch_ms`, plus `restore_cost` when resuming from a checkpoint; then
  the job reports `started` and computes from the checkpoint's progress;
- a preemption notice (xirang) takes the job to its next safe point (`safe_point_ms`, or
  the end of a periodic checkpoint being written), then, if asked, it writes a
  checkpoint, then it releases: nothing is lost when it saved;
- a kill (k8s, Slurm) lets the job compute through the grace period, then it dies:
  progress since its last completed periodic checkpoint is lost, and it will restart
  from that checkpoint;
- a job whose trace row says it fails (`TraceJob.fails`) computes to its end and then
  reports `finished` with ok=false;
- facts reach the scheduler `report_ms` after they happen; commands reach a host
  `report_ms` after the scheduler decides.

Lost GPU-time counts, per preemption: progress thrown away, the checkpoint written
because of the notice, the time frozen at a safe point, and the restore on restart, all
times the job's GPUs (`JobOutcome`). Periodic checkpoints are counted apart
(`periodic_ckpt_ms`): every policy pays them alike.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from core import types as T

from .workload import TraceJob

CKPT_BYTES_PER_GPU = 1 << 30


@dataclass(frozen=True)
class HostLatency:
    """How long hosts take: a launch, a report or command on the wire, a notice to the next safe
    point."""

    launch_ms: int = 5_000  # start command -> process running (container and framework start)
    report_ms: int = 200  # a fact to the scheduler, or a command to a host
    safe_point_ms: int = 10_000  # notice -> next safe point (an iteration boundary)


@dataclass(slots=True)
class JobOutcome:
    """What happened to one job, measured by the hosts."""

    id: str
    team: str
    user: str
    level: int
    gpus: int
    submit_ms: int
    duration_ms: int
    first_start_ms: int = -1  # when it first reported started; -1 never
    finish_ms: int = -1
    preemptions: int = 0
    lost_progress_ms: int = 0
    overhead_ms: int = 0  # preemption checkpoints, frozen time, restores
    periodic_ckpt_ms: int = 0
    # [(from_ms, to_ms)] of the job's GPU allocations to a process (launching, running,
    # stopping)
    held_spans: list = field(default_factory=list)

    @property
    def held_ms(self) -> int:
        """Milliseconds the job held GPUs, over all its allocations."""
        return sum(end - start for start, end in self.held_spans)


# Host-side job phases
IDLE = "idle"  # not on any host
LAUNCHING = "launching"
COMPUTING = "computing"
PERIODIC_CKPT = "periodic_ckpt"
TO_SAFE_POINT = "to_safe_point"  # notified, computing until the next safe point
SAVING = "saving"  # writing the checkpoint a notice asked for
FROZEN = "frozen"  # at a safe point, releasing or waiting for a withdrawal
DYING = "dying"  # SIGTERM sent, computing through the grace period
DONE = "done"


@dataclass(slots=True)
class HostJob:
    """A job as its hosts see it: its phase, progress, checkpoints, and the outcome being
    measured."""

    spec: TraceJob
    out: JobOutcome
    phase: str = IDLE
    done_ms: int = 0  # progress banked up to seg_start
    seg_start: int = -1  # start of the current computing segment, -1 when not computing
    ckpt_step: int = 0  # newest completed checkpoint
    ckpt_progress: dict = field(default_factory=dict)  # step -> progress ms
    gen: int = 0  # bumps to cancel pending timers
    held_since: int = -1
    placement: list = field(default_factory=list)
    notice_save: bool = False  # the notice asked for a checkpoint
    frozen_since: int = -1
    ckpt_started: int = -1
    ever_preempted: bool = False


class SimHosts:
    """The hosts of a simulated cluster and the jobs on them, on a virtual clock: a
    scheduler's commands (`start`, `notify`, `withdraw`, `kill`, `cancel`) act on them, and
    they answer with facts through `report(input)`, `report_ms` after they happen.
    `periodic_reports`: whether every periodic checkpoint is reported (live agents do), or
    only the ones a notice asked for."""

    def __init__(
        self,
        latency: HostLatency | None = None,
        report: Callable[[T.Input], None] | None = None,
        periodic_reports: bool = True,
    ) -> None:
        self.lat = latency or HostLatency()
        self.report = report or _unheard
        self.periodic_reports = periodic_reports
        self.now = 0
        self._heap: list = []
        self._seq = 0
        self.jobs: dict[str, HostJob] = {}
        self.finished = 0
        self.events = 0

    def add_job(self, spec: TraceJob) -> HostJob:
        """Make `spec` known to the hosts (not running anywhere yet)."""
        out = JobOutcome(
            id=spec.id,
            team=spec.team,
            user=spec.user,
            level=spec.level,
            gpus=spec.gpus,
            submit_ms=spec.submit_ms,
            duration_ms=spec.duration_ms,
        )
        job = self.jobs[spec.id] = HostJob(spec=spec, out=out)
        return job

    def at(self, t: int, fn, *args) -> None:
        """Call `fn(*args)` at virtual time `t` (after what is already due at `t`)."""
        self._push(t, fn, *args)

    def _push(self, t: int, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run_due(self, until: Callable[[], bool] | None = None) -> None:
        """Advance the clock through everything due, in (t, seq) order, until nothing is
        left or `until()` holds after a step."""
        heap = self._heap
        while heap:
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            self.events += 1
            fn(*args)
            if until is not None and until():
                return

    def advance_to(self, t: int) -> None:
        """Run everything due up to and including virtual time `t`, then set the clock to `t`."""
        heap = self._heap
        while heap and heap[0][0] <= t:
            due, _, fn, args = heapq.heappop(heap)
            self.now = due
            self.events += 1
            fn(*args)
        self.now = max(self.now, t)

    def job_finished(self, job: HostJob) -> None:
        """Called when a job has computed to its end (a subclass counts progress here)."""

    # ------------------------------------------------------------ facts to the scheduler

    def _fact(self, inp: T.Input) -> None:
        self._push(self.now + self.lat.report_ms, self.report, inp)

    def _fact_now(self, cls, job: HostJob, **kw):
        return cls(t=self.now + self.lat.report_ms, job=job.spec.id, **kw)

    # ------------------------------------------------------------ commands from the scheduler

    def start(self, job_id: str, placement: list, ckpt_step: int | None = None) -> None:
        """Start the job on `placement`, restoring checkpoint `ckpt_step` (0: from scratch;
        None: the newest the job has, as a training script that resumes on its own)."""
        self._push(self.now + self.lat.report_ms, self._host_start, job_id, list(placement), ckpt_step)

    def notify(self, job_id: str, checkpoint_needed: bool) -> None:
        """A preemption notice: go to the next safe point, save if `checkpoint_needed`, then
        release."""
        self._push(self.now + self.lat.report_ms, self._host_notify, job_id, checkpoint_needed)

    def withdraw(self, job_id: str) -> None:
        """The notice is withdrawn: a job not yet released carries on computing."""
        self._push(self.now + self.lat.report_ms, self._host_withdraw, job_id)

    def kill(self, job_id: str, grace_ms: int) -> None:
        """SIGTERM now, SIGKILL after `grace_ms`; the job reports `released` when gone."""
        self._push(self.now + self.lat.report_ms, self._host_kill, job_id, grace_ms)

    def cancel(self, job_id: str) -> None:
        """Stop the job at once and free its GPUs; nothing is reported."""
        self._push(self.now + self.lat.report_ms, self._host_cancel, job_id)

    # ------------------------------------------------------------ the host model

    def _timer(self, job: HostJob, delay_ms: int, fn) -> None:
        self._push(self.now + max(0, delay_ms), self._fire, job, job.gen, fn)

    def _fire(self, job: HostJob, gen: int, fn) -> None:
        if job.gen == gen:
            fn(job)

    def _host_start(self, job_id: str, placement: list, ckpt_step: int) -> None:
        job = self.jobs[job_id]
        if job.phase != IDLE:
            raise SimError(f"{job_id}: start while {job.phase}")
        job.gen += 1
        job.placement = placement
        job.held_since = self.now
        job.phase = LAUNCHING
        restore = 0
        if ckpt_step is None:
            ckpt_step = job.ckpt_step
        if ckpt_step:
            job.done_ms = job.ckpt_progress[ckpt_step]
            restore = job.spec.restore_cost_ms
            if job.ever_preempted:
                job.out.overhead_ms += restore
        else:
            job.done_ms = 0
        self._timer(job, self.lat.launch_ms + restore, self._launched)

    def _launched(self, job: HostJob) -> None:
        notified = job.phase == TO_SAFE_POINT
        job.phase = COMPUTING
        job.seg_start = self.now
        if job.out.first_start_ms < 0:
            job.out.first_start_ms = self.now
        self._fact(self._fact_now(T.Started, job))
        if notified:  # a notice arrived during the launch: the first iteration is a safe point
            job.phase = TO_SAFE_POINT
            self._timer(job, 0, self._at_safe_point_timer)
        else:
            self._schedule_compute(job)

    def _schedule_compute(self, job: HostJob) -> None:
        """Next moment the computing job does something on its own: finish or checkpoint."""
        spec = job.spec
        left = spec.duration_ms - job.done_ms
        interval = spec.ckpt_interval_ms
        if interval > 0:
            next_ckpt = (job.done_ms // interval + 1) * interval
            if next_ckpt < spec.duration_ms:
                self._timer(job, next_ckpt - job.done_ms, self._periodic_ckpt)
                return
        self._timer(job, left, self._finish)

    def _bank(self, job: HostJob) -> None:
        if job.seg_start >= 0:
            job.done_ms = min(job.spec.duration_ms, job.done_ms + self.now - job.seg_start)
            job.seg_start = -1

    def _periodic_ckpt(self, job: HostJob) -> None:
        self._bank(job)
        job.gen += 1
        if job.phase != DYING:  # a dying job keeps writing, and may finish in its grace time
            job.phase = PERIODIC_CKPT
        job.ckpt_started = self.now
        if self.periodic_reports:
            self._fact(self._fact_now(T.CheckpointStarted, job))
        self._timer(job, job.spec.ckpt_cost_ms, self._periodic_ckpt_done)

    def _periodic_ckpt_done(self, job: HostJob) -> None:
        job.out.periodic_ckpt_ms += self.now - job.ckpt_started
        # A checkpoint that serves a notice is reported even when periodic ones are not.
        self._record_ckpt(job, periodic=job.phase != TO_SAFE_POINT)
        job.gen += 1
        if job.phase == PERIODIC_CKPT:
            job.phase = COMPUTING
            job.seg_start = self.now
            self._schedule_compute(job)
        elif job.phase == TO_SAFE_POINT:  # notified while writing: done, stop here
            self._freeze(job)
            self._fact(self._fact_now(T.SafePoint, job))
            self._release(job)
        elif job.phase == DYING:  # the checkpoint landed inside the grace period
            job.seg_start = self.now
            self._schedule_compute(job)

    def _record_ckpt(self, job: HostJob, periodic: bool) -> None:
        job.ckpt_step += 1
        job.ckpt_progress[job.ckpt_step] = job.done_ms
        job.ckpt_started = -1
        if periodic and not self.periodic_reports:
            return
        self._fact(
            self._fact_now(
                T.CheckpointSaved,
                job,
                step=job.ckpt_step,
                digest=f"{job.spec.id}/{job.ckpt_step}",
                bytes=job.spec.gpus * CKPT_BYTES_PER_GPU,
            )
        )

    def _finish(self, job: HostJob) -> None:
        self._bank(job)
        job.gen += 1
        job.phase = DONE
        self._free(job)
        job.out.finish_ms = self.now
        self.finished += 1
        self._fact(self._fact_now(T.Finished, job, ok=not job.spec.fails))
        self.job_finished(job)

    def _free(self, job: HostJob) -> None:
        if job.held_since >= 0:
            job.out.held_spans.append((job.held_since, self.now))
            job.held_since = -1

    # --- notices (xirang)

    def _host_notify(self, job_id: str, checkpoint_needed: bool) -> None:
        job = self.jobs[job_id]
        job.notice_save = checkpoint_needed
        if job.phase == COMPUTING:
            job.phase = TO_SAFE_POINT
            job.gen += 1
            left = job.spec.duration_ms - job.done_ms - (self.now - job.seg_start)
            if left <= self.lat.safe_point_ms:
                self._timer(job, left, self._finish)
            else:
                self._timer(job, self.lat.safe_point_ms, self._at_safe_point_timer)
        elif job.phase == PERIODIC_CKPT:
            job.phase = TO_SAFE_POINT  # _periodic_ckpt_done takes it from here
        elif job.phase == LAUNCHING:
            # Not running yet: the notice waits for the launch, then acts at once.
            job.phase = TO_SAFE_POINT
        # DONE/IDLE: the job is gone; the scheduler learns from the finished fact.

    def _at_safe_point_timer(self, job: HostJob) -> None:
        self._bank(job)
        job.gen += 1
        self._at_safe_point(job)

    def _at_safe_point(self, job: HostJob) -> None:
        self._freeze(job)
        self._fact(self._fact_now(T.SafePoint, job))
        fresh = job.ckpt_step and job.ckpt_progress[job.ckpt_step] == job.done_ms
        if job.notice_save and job.spec.ckpt_interval_ms > 0 and not fresh:
            job.phase = SAVING
            job.ckpt_started = self.now
            self._fact(self._fact_now(T.CheckpointStarted, job))
            self._timer(job, job.spec.ckpt_cost_ms, self._notice_saved)
        else:
            self._release(job)

    def _freeze(self, job: HostJob) -> None:
        job.phase = FROZEN
        job.frozen_since = self.now

    def _notice_saved(self, job: HostJob) -> None:
        job.gen += 1
        self._record_ckpt(job, periodic=False)
        job.phase = FROZEN
        self._release(job)

    def _release(self, job: HostJob) -> None:
        """The process exits after a notice: count the loss, report `released`."""
        lost = job.done_ms - (job.ckpt_progress[job.ckpt_step] if job.ckpt_step else 0)
        self._preempted(job, lost)
        job.out.overhead_ms += self.now - job.frozen_since
        job.frozen_since = -1
        self._fact(self._fact_now(T.Released, job))

    def _preempted(self, job: HostJob, lost_ms: int) -> None:
        job.out.preemptions += 1
        job.out.lost_progress_ms += max(0, lost_ms)
        job.ever_preempted = True
        job.done_ms = job.ckpt_progress[job.ckpt_step] if job.ckpt_step else 0
        job.phase = IDLE
        job.gen += 1
        self._free(job)

    def _host_withdraw(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if job.phase == TO_SAFE_POINT:
            job.phase = COMPUTING
            if job.seg_start < 0:  # it was launching or checkpointing; those timers continue
                job.phase = PERIODIC_CKPT if job.ckpt_started >= 0 else LAUNCHING
                return
            self._bank(job)
            job.gen += 1
            job.seg_start = self.now
            self._schedule_compute(job)
        elif job.phase in (FROZEN, SAVING):
            job.ckpt_started = -1  # a save in progress is abandoned: the job keeps training
            job.out.overhead_ms += self.now - job.frozen_since
            job.frozen_since = -1
            job.gen += 1
            job.phase = COMPUTING
            job.seg_start = self.now
            self._schedule_compute(job)

    # --- kills (k8s, Slurm)

    def _host_kill(self, job_id: str, grace_ms: int) -> None:
        job = self.jobs[job_id]
        if job.phase in (IDLE, DONE, DYING):
            return
        if job.phase == LAUNCHING:
            job.gen += 1
            job.phase = DYING
            self._timer(job, grace_ms, self._killed)
            return
        # Keeps computing (and may finish or complete a periodic checkpoint) until SIGKILL.
        job.phase = DYING
        self._push(self.now + grace_ms, self._killed_at, job, job.out.preemptions)

    def _killed_at(self, job: HostJob, preemptions_then: int) -> None:
        if job.phase == DYING and job.out.preemptions == preemptions_then:
            self._killed(job)

    def _killed(self, job: HostJob) -> None:
        self._bank(job)
        if job.ckpt_started >= 0:  # a periodic checkpoint cut short is worth nothing
            job.out.periodic_ckpt_ms += self.now - job.ckpt_started
            job.ckpt_started = -1
        lost = job.done_ms - (job.ckpt_progress[job.ckpt_step] if job.ckpt_step else 0)
        self._preempted(job, lost)
        self._fact(self._fact_now(T.Released, job))

    def _host_cancel(self, job_id: str) -> None:
        job = self.jobs[job_id]
        if job.phase in (IDLE, DONE):
            return
        job.gen += 1
        job.phase = IDLE
        self._free(job)


class SimError(RuntimeError):
    """The simulator or a policy broke the host model's rules (a bug, not bad input)."""


def _unheard(inp: T.Input) -> None:
    """No scheduler listens: facts are dropped."""
