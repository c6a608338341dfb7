"""`xirang chaos --seed S --duration D`: a local cluster under seeded faults (agents/chaos.py),
then the invariants that must survive them; prints the faults injected and the invariants
held, and exits 1 if any did not hold."""

from __future__ import annotations

import json
import sys
import tempfile


def register(sub) -> None:
    """Add the `chaos` command(s) to the CLI's subparsers."""
    p = sub.add_parser("chaos", help="run a local cluster under seeded faults and check its invariants")
    p.add_argument("--seed", type=int, default=0, help="decides the workload and the fault plan")
    p.add_argument(
        "--duration", type=float, default=60.0, metavar="SECONDS", help="how long faults are injected"
    )
    p.add_argument("--data-dir", help="folder for the cluster (default: a new temporary folder)")
    p.add_argument(
        "--spoil-checkpoints",
        action="store_true",
        help="also overwrite the bus's copy of jobs' newest checkpoints (their host copies must restore them)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args) -> int:
    """`xirang chaos`: a seeded chaos run on a local cluster; exit 1 if an invariant broke."""
    from xirang.errors import UserError

    if args.duration <= 0:
        raise UserError("--duration must be a positive number of seconds")
    from agents.chaos import Chaos

    root = args.data_dir or tempfile.mkdtemp(prefix="xirang-chaos-")
    quiet = args.json

    def say(line: str) -> None:
        if not quiet:
            print(line, flush=True)

    say(f"xirang chaos: seed {args.seed}, {args.duration:g} s of faults, cluster in {root}")
    from agents.interrupts import stop_signals_raise

    with stop_signals_raise():  # SIGTERM too unwinds, so the run stops the cluster it started
        report = Chaos(
            root, args.seed, args.duration, log=say, spoil_checkpoints=args.spoil_checkpoints
        ).run()
    if args.json:
        print(json.dumps({**report.as_dict(), "data_dir": root}, indent=1))
    else:
        faults = ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())) or "none"
        print(f"faults injected: {faults}")
        print("jobs: " + ", ".join(f"{k} {v}" for k, v in report.jobs.items()))
        print("sagas: " + ", ".join(f"{k} {v}" for k, v in report.sagas.items()))
        print(
            f"longest overlap of two runs of a job: {report.max_run_overlap_s:.2f} s"
            f" (fencing window {report.as_dict()['fencing_window_s']:g} s)"
        )
        for name, verdict in report.invariants.items():
            print(f"  {'held' if verdict['held'] else 'BROKEN'}: {name} {verdict['detail']}".rstrip())
        print("all invariants held" if report.ok else "INVARIANTS BROKEN", file=sys.stdout)
    return 0 if report.ok else 1
