"""`xirang bench NAME --json`: speed and memory goals as benchmarks with JSON output.

Each benchmark is a function `run(args) -> dict` named here by module path, so the parts
of the system can add theirs without touching each other."""

from __future__ import annotations

import importlib
import json

BENCHES = {
    "core": "xirang.bench_core:run",
    "sim": "replay.bench:run",
    "bus": "agents.bench:run",
    "replay": "projections.bench:run",
    "philly": "xirang.bench_philly:run",
    "scale": "xirang.bench_scale:run",
}


def register(sub) -> None:
    """Add the `bench` command(s) to the CLI's subparsers."""
    bench = sub.add_parser("bench", help="benchmarks with JSON output")
    bench.add_argument("name", choices=sorted(BENCHES))
    bench.add_argument("--json", action="store_true", help="print JSON only")
    bench.add_argument("--quick", action="store_true", help="smaller sizes, for tests")
    bench.add_argument(
        "--gpus",
        metavar="N,...",
        help="core, scale: pool sizes in GPUs, e.g. 10000,50000,100000 (core: decision, tick and "
        "per-input cost at each, with the ratios of the largest to the smallest)",
    )
    bench.add_argument(
        "--pending", metavar="N,...", help="core, scale: queued jobs behind the full pool, e.g. 10000"
    )
    bench.add_argument(
        "--heartbeats",
        action="store_true",
        help="scale: then time the steady stream and the decisions again while every host "
        "heartbeats once a second",
    )
    bench.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    """`xirang bench WHAT`: run one benchmark and print its JSON."""
    module_name, func_name = BENCHES[args.name].split(":")
    result = getattr(importlib.import_module(module_name), func_name)(args)
    print(json.dumps(result, indent=None if args.json else 2, sort_keys=True))
    return 0
