"""`xirang sweep`: the scorecard over several pool sizes, trace windows and seeds, one table
(replay/sweep.py). For checking a rule at every operating point, overloaded pools included.
`xirang panel`: the project's panel of pools (replay/panel.py), default policy, every
acceptance check per pool and seed, one table with the misses marked.
"""

from __future__ import annotations

import json
import os
import sys

POLICIES_DEFAULT = "none,k8s,xirang"


def register(sub) -> None:
    """Add the `sweep` command(s) to the CLI's subparsers."""
    sweep = sub.add_parser(
        "sweep",
        help="run the scorecard over pool sizes, windows and seeds; one table",
        description="Run policies on every combination of --gpus, --windows and --seeds of one "
        "trace and print one markdown table of xirang's acceptance checks (a value "
        "marked ! misses its target). Cases run one after another: this is heavy.",
    )
    sweep.add_argument(
        "--trace",
        default="philly",
        help="'philly', 'alibaba' (Alibaba's GPU trace of 2023, replay/traces/SOURCE.md), "
        "'bursts' (generated for each pool size: urgent bursts over an overloaded background) "
        "or a canonical CSV",
    )
    sweep.add_argument("--gpus", default="64,256,512", help="comma-separated pool sizes")
    sweep.add_argument(
        "--windows", default="", help="comma-separated START:COUNT job windows (default: the whole trace)"
    )
    sweep.add_argument("--seeds", default="0", help="comma-separated seeds")
    sweep.add_argument("--policies", default=POLICIES_DEFAULT, help=f"default {POLICIES_DEFAULT}")
    sweep.add_argument("--policy", help="xirang policy TOML")
    sweep.add_argument("--out", required=True, help="folder for sweep.json and sweep.md")
    sweep.add_argument(
        "--cache",
        help="folder keeping the peers' results (none, k8s, slurm) for "
        "reuse: they do not change with xirang's rules",
    )
    sweep.set_defaults(func=cmd_sweep)

    from replay.panel import DEFAULT_POOLS, DEFAULT_SEEDS

    panel = sub.add_parser(
        "panel",
        help="run the panel of pools (none, k8s-style, xirang's default policy); one table",
        description="Run no preemption, Kubernetes-style preemption and xirang's default policy "
        "on every pool of the panel with every seed, and write panel.json and panel.md: per pool "
        "and seed, each of levels 3-7's mean wait over no preemption's (at most 1.25), team "
        "fairness inside levels 3-5 against no preemption's (at least as fair), the level 0-1 p99 "
        "wait over Kubernetes-style's (at most 1.5), lost GPU-hours over Kubernetes-style's (at "
        "most a third) and whether every job started; a miss is marked !. Progress goes to "
        "stderr, the table to stdout. Heavy: the default panel takes tens of minutes of CPU.",
    )
    panel.add_argument(
        "--pools",
        default=",".join(p.spec() for p in DEFAULT_POOLS),
        help="comma-separated TRACE@GPUS[/START:COUNT] (a trace as --trace of `xirang sweep` takes "
        "it; START:COUNT a window of its jobs); default: %(default)s",
    )
    panel.add_argument(
        "--seeds",
        default=",".join(str(s) for s in DEFAULT_SEEDS),
        help="comma-separated seeds (default %(default)s)",
    )
    panel.add_argument("--out", required=True, help="folder for panel.json and panel.md")
    panel.add_argument(
        "--cache",
        help="folder keeping the peers' results (none, k8s) for reuse, as `xirang sweep --cache` "
        "(default: OUT/cache)",
    )
    panel.add_argument(
        "--jobs", type=int, default=1, help="cases run at once, each in its own process (default 1)"
    )
    panel.set_defaults(func=cmd_panel)


def _ints(text: str, name: str) -> list[int]:
    from xirang.errors import UserError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--{name}: comma-separated whole numbers, got {text!r}") from None
    if not values:
        raise UserError(f"--{name}: give at least one")
    return values


def _windows(text: str) -> list[tuple[int, int] | None]:
    from xirang.errors import UserError

    if not text.strip():
        return [None]
    out = []
    for part in text.split(","):
        try:
            start, count = (int(x) for x in part.split(":"))
        except ValueError:
            raise UserError(f"--windows: START:COUNT, got {part!r}") from None
        if start < 0 or count <= 0:
            raise UserError(f"--windows: {part!r} needs START >= 0 and COUNT > 0")
        out.append((start, count))
    return out


def cmd_sweep(args) -> int:
    """`xirang sweep`: the scorecard over many operating points, one table."""
    from core import PolicyError
    from replay.peers import POLICIES
    from replay.sweep import Case, run_case, sweep_table
    from xirang.errors import UserError
    from xirang.policy_file import load_policy_file

    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise UserError(
            f"--policies: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(POLICIES)}"
        )
    config = {}
    if args.policy:
        try:
            config["policy"] = load_policy_file(args.policy)
        except (OSError, PolicyError) as err:
            raise UserError(f"--policy: {err}") from err
    cases = [
        Case(args.trace, gpus, seed, window)
        for window in _windows(args.windows)
        for gpus in _ints(args.gpus, "gpus")
        for seed in _ints(args.seeds, "seeds")
    ]
    for gpus in sorted({case.gpus for case in cases}):
        if gpus % 8:
            raise UserError(f"--gpus: {gpus} does not split into nodes of 8")
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for case in cases:
        print(f"running {case.label} ...", file=sys.stderr, flush=True)
        try:
            rows.append(run_case(case, policies, config, args.cache))
        except ValueError as err:
            raise UserError(str(err)) from err
        table = sweep_table(rows)
        with open(os.path.join(args.out, "sweep.md"), "w", encoding="utf-8") as fh:
            fh.write(table + "\n")
        with open(os.path.join(args.out, "sweep.json"), "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=1, sort_keys=True, default=str)
    print(sweep_table(rows))
    return 0


def cmd_panel(args) -> int:
    """`xirang panel`: the panel of pools and seeds, default policy, one table."""
    from replay.panel import panel_cases, panel_table, parse_pools, run_panel
    from replay.sweep import Case, case_workload
    from replay.workload import TraceError
    from xirang.errors import UserError

    try:
        pools = parse_pools(args.pools)
    except ValueError as err:
        raise UserError(f"--pools: {err}") from None
    seeds = _ints(args.seeds, "seeds")
    if args.jobs < 1:
        raise UserError(f"--jobs: at least 1, got {args.jobs}")
    cases = panel_cases(pools, seeds)
    try:
        for pool in pools:  # a bad trace or window is told before the long run, not after
            case_workload(Case(pool.trace, pool.gpus, seeds[0], pool.window))
    except (TraceError, ValueError) as err:
        raise UserError(str(err)) from err
    entries = run_panel(cases, args.out, args.cache or os.path.join(args.out, "cache"), workers=args.jobs)
    print(panel_table(entries))
    return 0
