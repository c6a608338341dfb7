"""`xirang sim`: run scheduling policies side by side on one trace and one cluster, and
write the scorecard (terminal table, scorecard.json, scorecard.duckdb, PNG charts).

The policies run in separate processes (`--procs`, default 2), xirang's first since it
is the slowest; a progress bar on stderr shows each one's finished jobs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import multiprocessing.managers
import queue as queue_mod
import signal
import sys
import os
import tempfile
import time

from agents.interrupts import STOP_SIGNALS, stop_signals_raise
from replay.peers import POLICIES
from replay.workload import DEFAULTS_HELP

PROGRESS_BAR_WIDTH = 20
POLICIES_HELP = """\
policies (details in replay/peers/*.py):
  none    strict priority then first come first served; greedy fill, no reservation; never preempts
  k8s     kube-scheduler PriorityClass preemption: lowest-priority victims on one node, killed
          after a 30 s grace period whatever their checkpoints
  slurm   multifactor priority (age + QOS), PreemptMode=REQUEUE with GraceTime 60 s, EASY backfill
  xirang  core.step: checkpoint-aware preemption sagas, aging, fairness
hosts: launch 5 s (+ restore when resuming), facts reach the scheduler in 0.2 s, a notice
reaches a safe point in 10 s; lost GPU-hours = progress lost + notice checkpoints + frozen
time + restores, times GPUs.
"""


def register(sub) -> None:
    """Add the `sim` command(s) to the CLI's subparsers."""
    sim = sub.add_parser(
        "sim",
        help="simulate policies on a trace and write a scorecard",
        description="Run a GPU job trace through several scheduling policies on a simulated "
        "cluster (virtual clock; xirang's policy is core.step itself) and compare "
        "queueing delay, JCT, preemptions, lost GPU-hours, utilisation and fairness.",
        epilog=POLICIES_HELP + "\n" + DEFAULTS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sim.add_argument(
        "--trace",
        default="philly",
        help="'philly' (the project's replay/traces/philly.csv.gz), 'alibaba' (Alibaba's GPU "
        "trace of 2023, replay/traces/alibaba-gpu-v2023.csv.gz; its QoS class sets the level band) "
        "or a canonical CSV: "
        "job,submit_s,duration_s,gpus[,gpu_model,team,user,level,ckpt_interval_s,"
        "ckpt_cost_s,restore_cost_s,est_runtime_s]",
    )
    sim.add_argument("--philly-path", help="where the Philly CSV is, if not in the usual place")
    sim.add_argument("--gpus", type=int, default=512, help="GPUs in the cluster (default 512)")
    sim.add_argument("--node-gpus", type=int, default=8, help="GPUs per node (default 8)")
    sim.add_argument(
        "--gpu-models",
        default="V100",
        help="comma-separated GPU models, assigned to nodes in turn (default V100)",
    )
    sim.add_argument(
        "--policies",
        default=",".join(POLICIES),
        help=f"comma-separated, from {', '.join(POLICIES)} (default all)",
    )
    sim.add_argument("--limit", type=int, help="only the first N jobs (by submit time)")
    sim.add_argument("--seed", type=int, default=0, help="seed for missing trace columns (default 0)")
    sim.add_argument("--policy", help="xirang policy TOML (keys of core.Policy)")
    sim.add_argument(
        "--xirang-periodic-ckpt-reports",
        choices=("on", "off"),
        default="on",
        help="whether simulated hosts report every periodic checkpoint to xirang's "
        "core, as live agents do (default on; off saves two core steps per "
        "checkpoint, but the core then sees no victim's checkpoint as fresh)",
    )
    sim.add_argument(
        "--xirang-tick-s",
        type=float,
        default=60.0,
        help="simulated seconds between xirang's re-evaluation ticks while jobs wait "
        "(default 60); aging is rate-limited to the same period",
    )
    sim.add_argument("--procs", type=int, default=2, help="policies run in parallel (default 2)")
    sim.add_argument("--out", required=True, help="folder for scorecard.json, .duckdb and PNGs")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=cmd_sim)


def cmd_sim(args) -> int:
    """`xirang sim`: run a trace through the policies, print the scorecard and write its files."""
    from replay.scorecard import render_table, scorecard, write_outputs

    jobs = _plan(args)
    shown = [p.strip() for p in args.policies.split(",") if p.strip()]
    began = time.perf_counter()
    results, cards = run_policies(jobs, args.procs, quiet=args.quiet)
    results.sort(key=lambda r: shown.index(r.policy))  # as the user listed them
    card = scorecard(results, cards)
    card["wall_s"] = round(time.perf_counter() - began, 1)
    paths = write_outputs(card, results, args.out)
    print(render_table(card))
    print(f"\nall policies in {card['wall_s']} s; wrote " + ", ".join(paths))
    return 0


def check_out_folder(out: str) -> None:
    """Make the output folder now, before hours of simulation, or say why it cannot be."""
    from xirang.errors import UserError

    try:
        os.makedirs(out, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=out, prefix=".xirang-write-check-")
        probe.close()
    except OSError as err:
        raise UserError(
            f"--out {out}: cannot write there ({err.strerror}); pick a folder you can write"
        ) from None


def _plan(args) -> list[dict]:
    from core import PolicyError
    from replay.sim import Cluster
    from xirang.policy_file import load_policy_file
    from replay.workload import TraceError, load_trace
    from xirang.errors import UserError

    names = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise UserError(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
        )
    if len(set(names)) != len(names):
        raise UserError("--policies: a policy is listed twice")
    if getattr(args, "out", None):
        check_out_folder(args.out)
    if args.limit is not None and args.limit <= 0:
        raise UserError("--limit must be positive")
    if not args.xirang_tick_s > 0:
        raise UserError("--xirang-tick-s must be positive")
    if args.procs < 1:
        raise UserError("--procs must be at least 1")
    models = tuple(m.strip() for m in args.gpu_models.split(",") if m.strip())
    try:
        cluster = Cluster.uniform(args.gpus, args.node_gpus, models or ("V100",))
    except ValueError as err:
        raise UserError(f"--gpus/--node-gpus: {err}") from err
    if args.policy:
        try:
            load_policy_file(args.policy)  # checked and noted once here; workers load it quietly
        except (OSError, PolicyError) as err:
            raise UserError(f"--policy: {err}") from err
    try:
        workload = load_trace(args.trace, args.seed, args.limit, args.philly_path)
    except TraceError as err:
        raise UserError(str(err)) from err
    if not workload.jobs:
        raise UserError(f"{args.trace}: no jobs to simulate")
    biggest = max(j.gpus for j in workload.jobs)
    if biggest > cluster.total_gpus:
        raise UserError(
            f"a job asks for {biggest} GPUs but the cluster has {cluster.total_gpus}; raise --gpus"
        )
    asked = sorted({m for j in workload.jobs for m in j.gpu_models} - set(cluster.models))
    if asked:
        raise UserError(
            f"jobs ask for GPU models {', '.join(asked)} that the cluster lacks; list them in --gpu-models"
        )
    # xirang first: it takes longest, so the pool finishes sooner.
    names.sort(key=lambda p: p != "xirang")
    return [
        dict(
            policy=name,
            trace=args.trace,
            philly_path=args.philly_path,
            seed=args.seed,
            limit=args.limit,
            cluster=cluster,
            policy_file=args.policy if name == "xirang" else None,
            periodic=args.xirang_periodic_ckpt_reports == "on",
            tick_s=args.xirang_tick_s,
        )
        for name in names
    ]


def run_policies(jobs: list[dict], procs: int, quiet: bool = False):
    """Run each planned policy, in parallel processes when procs > 1: (results in input order,
    policy -> its `replay.scorecard.policy_card`). Each card is worked out in the process that
    ran the policy as soon as it ends (a whole-Philly card takes ~10 s: the quick policies'
    cards are then made while xirang still runs, off the wall clock)."""
    order = {job["policy"]: i for i, job in enumerate(jobs)}
    bar = ProgressBar([job["policy"] for job in jobs], quiet)
    if procs == 1 or len(jobs) == 1:
        runs = [_run_one(job, bar.update) for job in jobs]
    else:
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        # A SIGTERM (or Ctrl-C) unwinds this process: the pool's workers are terminated and
        # the manager shut down, not left simulating for minutes. One that comes while they
        # start is held until the handlers are in place (the children unblock it and keep
        # the default action), so no moment of the start-up leaves them orphaned.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            manager = mp.managers.SyncManager(ctx=ctx)
            manager.start(_default_stop_signals)
            pool = ctx.Pool(min(procs, len(jobs)), _default_stop_signals)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        with manager, pool, stop_signals_raise():
            signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a stop held meanwhile raises here
            manager_queue = manager.Queue()
            pending = [pool.apply_async(_run_in_worker, (job, manager_queue)) for job in jobs]
            while not all(p.ready() for p in pending):
                _drain(manager_queue, bar)
                time.sleep(0.2)
            _drain(manager_queue, bar)
            runs = [p.get() for p in pending]
    bar.close()
    runs.sort(key=lambda run: order[run[0].policy])
    return [result for result, _ in runs], {result.policy: card for result, card in runs}


def _default_stop_signals() -> None:
    """In the manager or a worker, first thing: SIGINT and SIGTERM unblocked, with their
    default action, whatever the parent held or installed when it forked."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _drain(queue, bar) -> None:
    while True:
        try:
            bar.update(*queue.get_nowait())
        except queue_mod.Empty:
            return


def _run_in_worker(job: dict, queue):
    return _run_one(job, lambda *a: queue.put(a))


def _run_one(job: dict, report):
    """(the policy's result, its scorecard card)."""
    from core import load_policy_toml
    from replay.scorecard import policy_card
    from replay.sim import simulate
    from replay.workload import load_trace

    workload = load_trace(job["trace"], job["seed"], job["limit"], job["philly_path"])
    config: dict = {}
    if job["policy"] == "xirang":
        if job["policy_file"]:
            config["policy"] = load_policy_toml(job["policy_file"])
        config["report_periodic_checkpoints"] = job["periodic"]
        config["tick_s"] = job["tick_s"]
    name = job["policy"]
    cpu_began = time.process_time()
    result = simulate(
        workload,
        job["cluster"],
        name,
        config,
        job["seed"],
        progress=lambda done, total, t: report(name, done, total, t),
    )
    # CPU seconds beside the wall clock (as `xirang sweep`): on a shared machine the wall
    # clock says little.
    result.extra["cpu_s"] = round(time.process_time() - cpu_began, 1)
    return result, policy_card(result)


class ProgressBar:
    """One line on stderr: each policy's share of jobs finished and its simulated clock (so
    it moves from the start, while the first jobs are still running), and the time taken."""

    def __init__(self, names: list[str], quiet: bool) -> None:
        self.done = {name: (0, 0, 0) for name in names}
        self.quiet = quiet or not names
        self.began = time.perf_counter()
        self.tty = sys.stderr.isatty()
        self._last = 0.0

    def update(self, name: str, done: int, total: int, sim_t_ms: int = 0) -> None:
        """One policy's progress: redraw the line (at most every 10 s when not on a terminal)."""
        self.done[name] = (done, total, sim_t_ms)
        now = time.perf_counter()
        if self.quiet or (not self.tty and now - self._last < 10 and done != total):
            return
        self._last = now
        parts = []
        for policy, (d, t, sim_t) in self.done.items():
            frac = d / t if t else 0.0
            filled = int(frac * PROGRESS_BAR_WIDTH)
            clock = f" day {sim_t / 86_400_000:.1f}" if sim_t else ""
            parts.append(f"{policy} [{'#' * filled}{'.' * (PROGRESS_BAR_WIDTH - filled)}] {frac:4.0%}{clock}")
        line = "  ".join(parts) + f"  {now - self.began:5.0f}s"
        sys.stderr.write(("\r" + line) if self.tty else (line + "\n"))
        sys.stderr.flush()

    def close(self) -> None:
        """End the progress line."""
        if not self.quiet and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
