"""`xirang replay run INPUTS.jsonl`: feed a scenario file through the core."""

from __future__ import annotations

import itertools
import json
import sys

from core import PolicyError, new_state, parse_input, rebuild
from xirang.policy_file import read_policy_file
from core.replay import step_guarded
from core.model.state import state_digest
from core.model.types import SetPolicy, encode, type_name


def register(sub) -> None:
    """Add the `replay run` command(s) to the CLI's subparsers."""
    replay = sub.add_parser("replay", help="run scenario files through the core")
    rsub = replay.add_subparsers(dest="replay_command", metavar="ACTION")
    rsub.required = True
    run = rsub.add_parser("run", help="feed INPUTS.jsonl (one input a line) through step()")
    run.add_argument("inputs", help="scenario file, one JSON input a line ('-' for stdin)")
    run.add_argument("--events-out", help="write every sealed record, one JSON a line")
    run.add_argument("--policy", help="policy TOML file (defaults documented in core/model/policy.py)")
    run.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    """`xirang replay run`: feed a scenario file through the core and print (or write) the
    records."""
    from xirang.errors import UserError

    policy_params = None
    if args.policy:
        try:
            policy_params = read_policy_file(args.policy)  # validates, naming the field to fix
        except (OSError, PolicyError) as err:
            raise UserError(str(err)) from err
    try:
        source = sys.stdin if args.inputs == "-" else open(args.inputs, encoding="utf-8", errors="replace")
    except OSError as err:
        raise UserError(f"cannot read {args.inputs}: {err.strerror}") from err
    out = open(args.events_out, "wb") if args.events_out else None
    summary = run_lines(source, policy_params, out)
    if out:
        out.close()
        summary["events_out"] = args.events_out
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0


def run_lines(lines, policy_params: dict | None = None, out=None) -> dict:
    """Step every line; a policy enters the log as a first `set_policy` input, so that an
    audit of the written log rebuilds the same state."""
    state = new_state()
    by_type: dict[str, int] = {}
    rejected: list[dict] = []
    inputs = 0
    first_line = 1
    done: list = []  # every record so far: folding them again undoes a failed step
    if policy_params:
        lines = itertools.chain(
            [encode(SetPolicy(t=0, params=policy_params, by="replay --policy")).decode()], lines
        )
        first_line = 0
    for line_no, line in enumerate(lines, first_line):
        if not line.strip():
            continue
        inputs += 1
        # An input that makes step raise is rejected (internal_error), the state restored.
        state, records, _ = step_guarded(state, parse_input(line), lambda: rebuild(done))
        done.extend(records)
        for record in records:
            name = type_name(record.event)
            by_type[name] = by_type.get(name, 0) + 1
            if name == "InputRejected":
                rejected.append(
                    {"line": line_no, "reason": record.event.reason, "detail": record.event.detail}
                )
            if out is not None:
                out.write(encode(record) + b"\n")
    c = state.canonical
    return {
        "inputs": inputs,
        "events": c.events_n,
        "events_by_type": dict(sorted(by_type.items())),
        "rejected": rejected,
        "final_t": c.t,
        "final_state_digest": state_digest(c),
        "chain_head": c.chain,
        "jobs_open": len(c.jobs),
        "jobs_done": c.done_count,
        "sagas_open": len(c.sagas),
    }
