"""`xirang sweep`: the scorecard over several pool sizes, trace windows and seeds, one table
(replay/sweep.py). For checking a rule at every operating point, overloaded pools included.
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
        help="'philly', 'bursts' (generated for each pool size: urgent bursts over "
        "an overloaded background) or a canonical CSV",
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
