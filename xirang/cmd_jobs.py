"""The everyday commands of a running cluster, the way Slurm users reach for them:

    xirang submit JOB --team T --level L --gpus G [--dry-run] ...   (sbatch, with --test-only)
    xirang cancel JOB                                               (scancel)
    xirang jobs  [filters] [--watch S]     open jobs, why each waits, expected start (squeue -l)
    xirang queue [filters] [--watch S]     per level, in serving order, with reasons (squeue)
    xirang history [filters] [--since T] [--until T]   every job the log has seen (sacct)
    xirang logs JOB [--follow]             the job's output on its host (slurm-N.out)
    xirang nodes                           nodes: model, GPUs free/used, jobs, state (sinfo)
    xirang node cordon|uncordon NODE       no new work on a node, or again (scontrol drain/resume)
    xirang shares                          teams: quota, fair share, held, limits (sshare)
    xirang hold|release|requeue JOB        keep from scheduling, let go, stop and queue again
    xirang set-level JOB LEVEL             (scontrol hold/release/requeue, update Priority)

The last four act on the user's own jobs; `--operator` sends them on the operators' subject
(`xr.in.op.>`, which NATS permissions reserve for operators) to act on anyone's.

Every command takes `--nats URL` (default `$XIRANG_NATS`, else the server `xirang up`
started) and `--json` (JSON only on stdout). This module only parses, calls and prints:
the rows come from projections/views.py, the reasons from core/explain.py.
"""

from __future__ import annotations

import argparse
import math

import json
import os
import shlex
import sys
import time
from pathlib import Path

from xirang.cmd_live import DATA_DIR_DEFAULT, client_url
from xirang.errors import UserError
from core.model.words import readable_ms_text
from xirang.tables import clock, duration, start_estimate, table


# How fast a team's past usage fades in `xirang shares` (Slurm's PriorityDecayHalfLife).
USAGE_HALF_LIFE_S = 7 * 86400.0


def register(sub) -> None:
    """Add the job (`submit`, `cancel`, `jobs`, `queue`, `history`, `logs`, `nodes`, `shares`,
    `hold`, `release`, `requeue`, `set-level`) command(s) to the CLI's subparsers."""
    _register_submit(sub)
    cancel = sub.add_parser("cancel", help="cancel a job (scancel): yours, or anyone's with --operator")
    common(cancel)
    cancel.add_argument("job")
    cancel.add_argument(
        "--user", default=default_user(), help="who asks (default: the user of $XIRANG_IDENTITY, else $USER)"
    )
    cancel.add_argument("--operator", action="store_true", help="act as an operator (on anyone's job)")
    cancel.set_defaults(func=cmd_cancel)

    jobs = sub.add_parser(
        "jobs", help="open jobs: state, placement, progress; why each waits and when it is expected to start"
    )
    common(jobs)
    filters(jobs)
    watch(jobs)
    jobs.set_defaults(func=cmd_jobs)

    queue = sub.add_parser(
        "queue", help="queued and running jobs per level, in serving order, with reasons (squeue-like)"
    )
    common(queue)
    filters(queue)
    watch(queue)
    queue.set_defaults(func=cmd_queue)

    history = sub.add_parser(
        "history",
        help="every job the log has seen: state, exit code, wait, run"
        " time, preemptions, lost progress, compensation (sacct-like)",
    )
    common(history)
    filters(history)
    history.add_argument(
        "--since", metavar="T", help="submitted at or after T (with --node: ran at or after T); ISO or log ms"
    )
    history.add_argument("--until", metavar="T", help="submitted at or before T (with --node: ran until T)")
    history.add_argument(
        "--node",
        metavar="N",
        help="what ran on node N instead (sacct -N): each run's job, GPUs, start, end and why it ended",
    )
    history.set_defaults(func=cmd_history)

    prio = sub.add_parser(
        "prio",
        help="each factor of a waiting job's place: level, boost, aging, queue position, fair share,"
        " reservations, expected start (sprio-like)",
    )
    common(prio)
    prio.add_argument("job")
    prio.set_defaults(func=cmd_prio)

    logs = sub.add_parser("logs", help="a job's output on its host (local cluster)")
    common(logs)
    logs.add_argument("job")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing while the job runs")
    logs.set_defaults(func=cmd_logs)

    nodes = sub.add_parser("nodes", help="nodes: GPU model, GPUs free and used, jobs, state (sinfo-like)")
    common(nodes)
    nodes.set_defaults(func=cmd_nodes)
    _register_node(sub)

    shares = sub.add_parser(
        "shares",
        help="teams: quota, fair share, GPUs held, protection, downgrade, compensation (sshare-like)",
    )
    common(shares)
    shares.add_argument(
        "--half-life-s",
        type=float,
        default=None,
        metavar="S",
        help="usage decays by half every S seconds (default: the policy's fair_share_half_life_s"
        " when set, else 604800: 7 days, as Slurm's)",
    )
    shares.set_defaults(func=cmd_shares)

    for name, what in (
        ("hold", "keep a queued job from being scheduled until `release`"),
        ("release", "let a held job be scheduled again"),
        ("requeue", "stop a running job and queue it again (it resumes from its checkpoint)"),
        ("set-level", "change a job's level (more urgent needs --operator)"),
    ):
        p = sub.add_parser(name, help=what)
        common(p)
        p.add_argument("job")
        if name == "set-level":
            p.add_argument("level", type=int, help="0 (emergency) .. 7 (exploration)")
        p.add_argument(
            "--user",
            default=default_user(),
            help="who asks (default: the user of $XIRANG_IDENTITY, else $USER)",
        )
        p.add_argument("--operator", action="store_true", help="act as an operator (on anyone's job)")
        p.set_defaults(func=cmd_job_request, request=name)


def _register_node(sub) -> None:
    node = sub.add_parser(
        "node", help="an operator's node changes: cordon (no new work; Slurm's drain) and uncordon"
    )
    verbs = node.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    cordon = verbs.add_parser(
        "cordon",
        help="place no new work on NODE, nor choose preemption victims or reservations there;"
        " its running jobs go on (operators only)",
    )
    uncordon = verbs.add_parser(
        "uncordon", help="NODE takes new work again, whoever cordoned it (operators only)"
    )
    for p in (cordon, uncordon):
        common(p)
        p.add_argument("node")
        p.add_argument(
            "--user",
            default=default_user(),
            help="who asks (default: the user of $XIRANG_IDENTITY, else $USER)",
        )
    cordon.add_argument("--reason", required=True, help="why (told to whoever asks why a job waits)")
    cordon.set_defaults(func=cmd_node_cordon)
    uncordon.set_defaults(func=cmd_node_cordon)


def cmd_node_cordon(args) -> int:
    """`xirang node cordon NODE --reason TEXT` / `xirang node uncordon NODE`: send it (an
    operator's input: the bus lets only operators publish it) and print the outcome."""
    from core import types as T

    if args.verb == "cordon":
        return _send_and_answer(args, T.CordonNode(node=args.node, reason=args.reason, by=args.user))
    return _send_and_answer(args, T.UncordonNode(node=args.node, by=args.user))


def default_user() -> str:
    """The user this terminal acts as: the one its bus identity names (`client:<team>:<user>`,
    `op:<user>`), else the login name."""
    role, _, names = os.environ.get("XIRANG_IDENTITY", "").partition(":")
    if role in ("client", "op") and names:
        return names.split(":")[-1]
    return os.environ.get("USER", "user")


def common(p) -> None:
    """The options every job command takes: --nats, --json, --data-dir."""
    p.add_argument(
        "--nats",
        metavar="URL",
        help="NATS server URL (default: $XIRANG_NATS, else the one `xirang up` started)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (JSON only)")
    p.add_argument("--data-dir", default=DATA_DIR_DEFAULT, help="local folder of `xirang up`")


def filters(p) -> None:
    """The --team / --user / --level / --state filters."""
    p.add_argument("--team")
    p.add_argument("--user")
    p.add_argument("--level", type=int, choices=range(8), metavar="0-7")
    p.add_argument("--state", help="e.g. queued or running,preempting (comma separated)")


def watch(p) -> None:
    """The --watch option (redraw every S seconds)."""
    p.add_argument(
        "--watch",
        type=float,
        metavar="S",
        nargs="?",
        const=2.0,
        help="redraw every S seconds (default 2) until Ctrl-C",
    )


def finite_seconds(text: str) -> float:
    """A number of seconds for argparse: finite and not negative (`inf`, `nan` and `1e400`
    are refused, saying so)."""
    try:
        value = float(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from err
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite number of seconds >= 0, or leave it out")
    return value


def _register_submit(sub) -> None:
    submit = sub.add_parser("submit", help="submit a job; answers accepted or the rejection reason")
    common(submit)
    submit.add_argument("job")
    submit.add_argument("--team", required=True)
    submit.add_argument(
        "--user", default=default_user(), help="default: the user of $XIRANG_IDENTITY, else $USER"
    )
    submit.add_argument("--level", type=int, required=True, help="0 (emergency) .. 7 (exploration)")
    submit.add_argument("--gpus", type=int, required=True)
    submit.add_argument("--gpu-model", action="append", default=[], help="acceptable model (repeatable)")
    # Finite numbers only: JSON has no inf or nan, so one would reach the scheduler as
    # "not given" and silently become the default.
    submit.add_argument("--est-runtime-s", type=finite_seconds)
    submit.add_argument("--ckpt-interval-s", type=finite_seconds)
    submit.add_argument("--ckpt-cost-s", type=finite_seconds)
    submit.add_argument("--restore-cost-s", type=finite_seconds)
    submit.add_argument("--not-preemptible", action="store_true")
    submit.add_argument(
        "--preempt-signal",
        metavar="SIG",
        default="",
        help="what a job without the SDK gets at a preemption notice (Slurm's --signal): USR1, "
        "USR2, TERM (default), INT, HUP or QUIT, to each part's process group",
    )
    submit.add_argument(
        "--grace-s",
        type=finite_seconds,
        metavar="S",
        help="seconds from the notice to SIGKILL (default: the host's --grace-s)",
    )
    submit.add_argument("--id", help="input id for deduplication (default: random)")
    submit.add_argument(
        "--command",
        default="",
        help='what the host runs, one shell-quoted string: "python train.py --steps 100"',
    )
    submit.add_argument(
        "--dry-run",
        action="store_true",
        help="say where and when it would start and whom it would preempt; submit nothing",
    )
    submit.set_defaults(func=cmd_submit)


# ---------------------------------------------------------------- submit and cancel


def cmd_submit(args) -> int:
    """`xirang submit`: send a job and say whether it was accepted (or why not)."""
    from core import types as T

    try:
        command = shlex.split(args.command)
    except ValueError as err:
        raise UserError(f"--command {args.command!r}: {err}") from err
    inp = T.Submit(
        job=args.job,
        team=args.team,
        user=args.user,
        level=args.level,
        gpus=args.gpus,
        gpu_models=args.gpu_model,
        est_runtime_s=args.est_runtime_s,
        ckpt_interval_s=args.ckpt_interval_s,
        ckpt_cost_s=args.ckpt_cost_s,
        restore_cost_s=args.restore_cost_s,
        preemptible=not args.not_preemptible,
        preempt_signal=args.preempt_signal,
        grace_s=args.grace_s,
        command=_resolve_example(command),
        id=args.id or "",
    )
    if args.dry_run:
        return _dry_run(args, inp)
    return _send_and_answer(args, inp)


def _resolve_example(command: list[str]) -> list[str]:
    """`examples/train_numpy.py` in a command means the example shipped with xirang, so the
    README's commands work from any directory."""
    from agents.examples import example_path

    return [example_path(word) or word for word in command]


def cmd_cancel(args) -> int:
    """`xirang cancel`: cancel a job."""
    from core import types as T

    return _send_and_answer(args, T.Cancel(job=args.job, by=args.user, operator=args.operator))


def cmd_job_request(args) -> int:
    """`xirang hold | release | requeue | set-level`: send the request about a job and print the
    outcome."""
    from core import types as T

    kind = {"hold": T.Hold, "release": T.ReleaseHold, "requeue": T.Requeue, "set-level": T.SetLevel}[
        args.request
    ]
    fields = {"job": args.job, "by": args.user, "operator": args.operator}
    if args.request == "set-level":
        fields["level"] = args.level
    return _send_and_answer(args, kind(**fields))


def _send_and_answer(args, inp) -> int:
    from agents.client import send_and_wait

    answer = send_and_wait(client_url(args), inp)
    if args.json:
        print(json.dumps(answer, sort_keys=True))
    elif answer["outcome"] == "accepted":
        print(f"accepted: {answer['type']} {answer.get('job', '')} (input seq {answer['seq']})")
    elif answer["outcome"] == "rejected":
        print(f"rejected: {answer['reason']}" + (f" ({answer['detail']})" if answer.get("detail") else ""))
    else:
        print(f"{answer['outcome']}: {answer.get('detail', '')}")
    return {"accepted": 0, "rejected": 1}.get(answer["outcome"], 3)


def _dry_run(args, inp) -> int:
    from agents.client import load_state
    from projections.dryrun import dry_run

    answer = dry_run(load_state(client_url(args)), inp, now_ms=int(time.time() * 1000))
    if args.json:
        print(json.dumps(answer, sort_keys=True))
    else:
        print(readable_ms_text(answer["summary"]))
        for victim in answer.get("victims", []):
            print(
                f"  would preempt {victim['job']} (team {victim['team']}, level {victim['level']},"
                f" {victim['gpus']} GPUs, loses {_dur(victim['lost_s'])} of progress)"
            )
    return 0 if answer["outcome"] != "rejected" else 1


# ---------------------------------------------------------------- jobs and queue


def _unread_notices(args, state) -> dict[str, int]:
    """Open jobs with notices their user has not read (`xirang notices` marks them read)."""
    from agents.client import records, run
    from projections.notices import LOOKBACK_RECORDS_MAX, ReadMarks, state_lookup, unread_jobs
    from transport import bus

    marks = ReadMarks()
    users = sorted({job.user for job in state.canonical.jobs.values()}) if not args.user else [args.user]
    after = min((marks.get(u) for u in users), default=0)
    url = client_url(args)

    async def last_seq(nc, js):
        return await bus.stream_last_seq(js, bus.EV_STREAM)

    # Only the log's tail: an old unread notice is for `xirang notices`, not for every `jobs`.
    items = records(url, start_seq=max(after + 1, run(url, last_seq) - LOOKBACK_RECORDS_MAX))
    counts: dict[str, int] = {}
    for user in users:
        for job, n in unread_jobs(items, state_lookup(state), marks.get(user), user).items():
            counts[job] = counts.get(job, 0) + n
    return counts


def _state(args):
    """The live state, as of now: a quiet log's last event may be minutes old (a tick that
    changes nothing is not logged), and reasons and expected starts should not be."""
    from agents.client import load_state

    state = load_state(client_url(args))
    state.canonical.t = max(state.canonical.t, now_ms())
    return state


def now_ms() -> int:
    """Wall-clock time in milliseconds."""
    return int(time.time() * 1000)


def _repeat(args, draw) -> int:
    """Draw once, or every --watch seconds until Ctrl-C (clearing the terminal between)."""
    if not getattr(args, "watch", None):
        return draw()
    if args.watch <= 0:
        raise UserError("--watch takes a positive number of seconds")
    from agents.interrupts import stop_signals_raise

    # Ctrl-C raised at once and remembered: a draw runs an asyncio loop, which could swallow
    # it (agents/interrupts.py); the watch stops after that draw, not redraws forever.
    with stop_signals_raise() as stop:
        while not stop:
            if not args.json and sys.stdout.isatty():
                print("\033[2J\033[H", end="")
            draw()
            sys.stdout.flush()
            if not stop:
                time.sleep(args.watch)
    return 0  # not reached: the block raises Interrupted once a signal came


def _filtered(args, rows):
    from projections.views import keep

    return keep(rows, team=args.team, user=args.user, level=args.level, state=args.state)


def cmd_jobs(args) -> int:
    """`xirang jobs`: open jobs with their state, placement and why each waits."""

    def draw() -> int:
        from projections.views import job_rows

        state = _state(args)
        rows = _filtered(args, job_rows(state, now_ms()))
        unread = _unread_notices(args, state)
        for r in rows:
            r["unread_notices"] = unread.get(r["job"], 0)
        if args.json:
            print(
                json.dumps(
                    {
                        "t": state.canonical.t,
                        "jobs": rows,
                        "done": dict(sorted(state.canonical.done.items())),
                    },
                    sort_keys=True,
                )
            )
            return 0
        now = now_ms()
        body = []
        for r in rows:
            lvl = f"{r['level']}" + (f"^{r['eff_level']}" if r["eff_level"] != r["level"] else "")
            start = start_estimate(r["start_in_s"], now) if r["reason_code"] else "-"
            why = readable_ms_text(r["reason"]) or (
                f"checkpoint step {r['checkpoint_step']}" if r["checkpoint_step"] is not None else ""
            )
            body.append(
                [
                    "!" if r["unread_notices"] else "",
                    r["job"],
                    r["team"],
                    r["user"],
                    lvl,
                    r["state"],
                    r["gpus"],
                    " ".join(r["placement"]) or "-",
                    duration(r["progress_s"]),
                    r["preempt_count"],
                    start,
                    why,
                ]
            )
        headers = ["", "JOB", "TEAM", "USER", "LVL", "STATE", "GPUS", "WHERE", "PROGRESS", "PREEMPT", "START"]
        print(table([*headers, "REASON"], body, right=("LVL", "GPUS", "PROGRESS", "PREEMPT")))
        if any(r["eff_level"] != r["level"] for r in rows):
            print(
                "LVL 6^5: level 6 queued at level 5 (aged, or boosted after a preemption): `xirang prio JOB`"
            )
        if args.team or args.user or args.level is not None or args.state:
            # The state keeps no owner for done jobs: the log's history has them.
            print(f"{len(rows)} open matching; `xirang history` with the same filters lists the done ones")
        else:
            print(f"{len(rows)} open, {state.canonical.done_count} done")
        if unread:
            print(
                f"! = unread notices ({sum(unread.values())}): `xirang notices"
                f"{' --user ' + args.user if args.user else ''}` shows them"
            )
        return 0

    return _repeat(args, draw)


def cmd_queue(args) -> int:
    """`xirang queue`: each level's jobs in serving order."""

    def draw() -> int:
        from projections.views import job_rows, queue_levels

        state = _state(args)
        rows = _filtered(args, job_rows(state, now_ms()))
        levels = queue_levels(state, rows)
        if args.level is not None:
            levels = [lv for lv in levels if lv["level"] == args.level]
        shown = {r["job"] for r in rows}
        for lv in levels:
            lv["holding"] = [h for h in lv["holding"] if h["job"] in shown]
            lv["held"] = [h for h in lv["held"] if h["job"] in shown]
        if args.json:
            print(json.dumps({"t": state.canonical.t, "levels": levels}, sort_keys=True))
            return 0
        now = now_ms()
        body = []
        for lv in levels:
            for pos, q in enumerate(lv["queued"], 1):
                body.append(
                    [
                        lv["level"],
                        lv["policy"],
                        pos,
                        q["job"],
                        q["team"],
                        q["user"],
                        q["gpus"],
                        "queued",
                        duration(q["wait_s"]),
                        start_estimate(q["start_in_s"], now),
                        f"{q['reason_code']}: {readable_ms_text(q['reason'])}",
                    ]
                )
            for h in lv["held"]:
                body.append(
                    [
                        lv["level"],
                        lv["policy"],
                        "-",
                        h["job"],
                        h["team"],
                        h["user"],
                        h["gpus"],
                        "held",
                        duration(h["wait_s"]),
                        "-",
                        h["reason"] or f"held until `xirang release {h['job']}`",
                    ]
                )
            for h in lv["holding"]:
                body.append(
                    [
                        lv["level"],
                        lv["policy"],
                        "-",
                        h["job"],
                        h["team"],
                        h["user"],
                        h["gpus"],
                        h["state"],
                        "",
                        "",
                        "",
                    ]
                )
        headers = ["LVL", "POLICY", "POS", "JOB", "TEAM", "USER", "GPUS", "STATE", "WAIT", "START", "REASON"]
        print(table(headers, body, right=("LVL", "POS", "GPUS", "WAIT")))
        c = state.canonical
        free = sum(n.holder.count("") for n in c.nodes.values() if n.up)
        total = sum(n.gpus for n in c.nodes.values() if n.up)
        print(f"GPUs free {free}/{total}; sagas open {len(c.sagas)}")
        return 0

    return _repeat(args, draw)


# ---------------------------------------------------------------- history, logs, nodes, shares


def cmd_history(args) -> int:
    """`xirang history`: every job the log has seen, with how it ended; with --node, what
    ran on that node."""
    from agents.client import records
    from projections.views import history_rows, keep, placement_rows
    from xirang.cmd_data import parse_time

    since_t, until_t = parse_time(args.since), parse_time(args.until)
    if since_t is not None and until_t is not None and until_t < since_t:
        raise UserError("--until must not be before --since")
    items = [record for _, record in records(client_url(args))]
    if args.node:
        return _node_history(args, placement_rows(items, args.node, since_t, until_t))
    rows = history_rows(items, now_ms())
    rows = keep(
        rows,
        team=args.team,
        user=args.user,
        level=args.level,
        state=args.state,
        since_t=since_t,
        until_t=until_t,
    )
    if args.json:
        print(json.dumps({"jobs": rows}, sort_keys=True))
        return 0
    body = []
    for r in rows:
        comp = ", ".join(f"{k} {v:g}" for k, v in sorted(r["compensation"].items())) or "-"
        code = "-" if r["exit_code"] is None else str(r["exit_code"])
        body.append(
            [
                r["job"],
                r["team"],
                r["user"],
                r["level"],
                r["gpus"],
                r["state"],
                code,
                duration(r["wait_s"]),
                duration(r["run_s"]),
                r["preemptions"],
                duration(r["lost_progress_s"]),
                comp,
            ]
        )
    headers = ["JOB", "TEAM", "USER", "LVL", "GPUS", "STATE", "EXIT", "WAIT", "RUN", "PREEMPT", "LOST"]
    print(
        table(
            [*headers, "COMPENSATION"], body, right=("LVL", "GPUS", "EXIT", "WAIT", "RUN", "PREEMPT", "LOST")
        )
    )
    print(f"{len(rows)} job(s)")
    return 0


def _node_history(args, rows: list[dict]) -> int:
    if args.json:
        print(json.dumps({"node": args.node, "placements": rows}, sort_keys=True))
        return 0
    now = now_ms()
    body = [
        [
            r["job"],
            r["run"],
            r["team"],
            r["user"],
            r["gpus"],
            clock(r["start_t"] or r["requested_t"], now),
            clock(r["end_t"], now) if r["end_t"] is not None else "(holds it)",
            duration(((r["end_t"] or now) - (r["start_t"] or r["requested_t"])) / 1000),
            r["ended"] or "-",
        ]
        for r in rows
    ]
    headers = ["JOB", "RUN", "TEAM", "USER", "GPUS", "START", "END", "HELD", "ENDED"]
    print(table(headers, body, right=("RUN", "GPUS", "HELD")))
    print(f"{len(rows)} run(s) on {args.node}")
    return 0


def cmd_prio(args) -> int:
    """`xirang prio`: each factor of a waiting job's place."""
    from projections.views import prio_row

    state = _state(args)
    row = prio_row(state, args.job, now_ms())
    if row is None:
        done = state.canonical.done.get(args.job)
        raise UserError(
            f"job {args.job} is {done} (only an open job has a place)"
            if done
            else f"no open job {args.job}: `xirang jobs` lists them"
        )
    if args.json:
        print(json.dumps(row, sort_keys=True))
        return 0
    now = now_ms()
    boost = f", {row['levels_from_boost']} from a recovery boost" if row["levels_from_boost"] else ""
    aged = f", {row['levels_from_aging']} from aging" if row["levels_from_aging"] else ""
    asked = (
        f" (asked for {row['requested_level']}: its team is downgraded)"
        if row["requested_level"] < row["level"]
        else ""
    )
    position = (
        f"{row['position']} of {row['queued_at_level']} ({row['jobs_ahead']} job(s),"
        f" {row['gpus_ahead']} GPUs ahead)"
        if row["position"]
        else f"not in the queue ({row['state']})"
    )
    lines = [
        ("level", f"{row['level']}{asked}"),
        ("queues at", f"level {row['queue_level']}{boost}{aged}"),
        (
            "next aging",
            "-"
            if row["next_aging_in_s"] is None
            else f"{duration(row['next_aging_in_s'], 'in ')} (up to {row['aging_levels_max']} levels)",
        ),
        ("queue policy", row["queue_policy"]),
        ("position", position),
        ("waiting", duration(row["wait_s"])),
        (
            "fair share",
            f"team {row['team']} holds {row['team_gpus_at_level']} GPUs at level {row['level']}"
            + (
                f" and held {row['team_gpus_lately_at_level']:g} on average lately"
                if row.get("team_gpus_lately_at_level")
                else ""
            )
            + f" for quota {row['team_quota']:g} (ratio {row['team_fair_share_ratio']}; lower is served first"
            " under fair_share)",
        ),
        (
            "reservations",
            (f"holds {', '.join(row['holds_own_nodes'])}" if row["holds_own_nodes"] else "holds none")
            + (
                f"; nodes held for {', '.join(row['holds_for_others'])}"
                if row["holds_for_others"]
                else "; none held for others"
            ),
        ),
        (
            "why it waits",
            f"{row['reason_code']}: {readable_ms_text(row['reason'])}" if row["reason_code"] else "-",
        ),
        ("expected start", start_estimate(row["start_in_s"], now)),
    ]
    print(f"{row['job']} ({row['team']}/{row['user']}, {row['gpus']} GPUs, {row['state']})")
    print(table(["FACTOR", "VALUE"], [list(line) for line in lines]))
    return 0


def cmd_logs(args) -> int:
    """`xirang logs`: a job's output on its host (local cluster)."""
    from agents.client import records
    from agents.logs import job_output_paths

    url = client_url(args)
    items = records(url)
    paths = job_output_paths([r for _, r in items], args.job, Path(args.data_dir) / "hosts")
    if paths is None:
        raise UserError(f"no job {args.job} in the log: see `xirang history` for the jobs it has seen")
    if not paths and not args.follow:
        raise UserError(
            f"{args.job} has not started yet, so it has no output: `xirang prio {args.job}` and"
            " `xirang jobs` say why it waits (`--follow` waits for it)"
        )
    if not paths:
        print(f"{args.job} has not started yet; following from its start (Ctrl-C stops)", file=sys.stderr)
    shown: dict[Path, int] = {}
    for path in paths:
        shown[path] = _print_from(path, 0, header=len(paths) > 1)
    if not args.follow:
        return 0
    from agents.interrupts import stop_signals_raise

    # Only the job's records are kept, and each poll reads only what the log gained since.
    seen_seq = items[-1][0] if items else 0
    mine = [r for _, r in items if getattr(r.event, "job", "") == args.job]
    with stop_signals_raise() as stop:  # each read of the log runs an asyncio loop
        while not stop:
            time.sleep(0.5)
            new = records(url, start_seq=seen_seq + 1)
            seen_seq = new[-1][0] if new else seen_seq
            mine += [r for _, r in new if getattr(r.event, "job", "") == args.job]
            paths = job_output_paths(mine, args.job, Path(args.data_dir) / "hosts") or paths
            for path in paths:
                shown[path] = _print_from(path, shown.get(path, 0), header=len(paths) > 1)
            if _job_ended(mine, args.job):
                return 0
    return 0  # not reached: the block raises Interrupted once a signal came


def _print_from(path: Path, offset: int, header: bool) -> int:
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return offset
    if data:
        if header:
            print(f"==> {path} <==")
        sys.stdout.write(data.decode("utf-8", "replace"))
        sys.stdout.flush()
    return offset + len(data)


def _job_ended(recs, job: str) -> bool:
    from core import types as T

    return any(
        isinstance(r.event, (T.JobFinished, T.JobFailed, T.JobCancelled)) and r.event.job == job for r in recs
    )


def cmd_nodes(args) -> int:
    """`xirang nodes`: each node's GPUs free and used, and its jobs."""
    from projections.views import node_rows

    rows = node_rows(_state(args))
    if args.json:
        print(json.dumps({"nodes": rows}, sort_keys=True))
        return 0
    body = [
        [r["node"], r["gpu_model"], r["gpus"], r["used"], r["free"], r["state"], " ".join(r["jobs"]) or "-"]
        for r in rows
    ]
    cordons = [
        f"{r['node']} cordoned by {r['cordoned_by']}: {r['cordon_reason']}" for r in rows if r["cordoned_by"]
    ]
    print(
        table(
            ["NODE", "MODEL", "GPUS", "USED", "FREE", "STATE", "JOBS"], body, right=("GPUS", "USED", "FREE")
        )
    )
    for line in cordons:
        print(line)
    return 0


def cmd_shares(args) -> int:
    """`xirang shares`: each team's quota, fair share, GPUs held, limits in force, and its
    usage over time, decayed (sshare)."""
    from agents.client import records
    from projections.views import share_rows, usage_rows

    if args.half_life_s is not None and not args.half_life_s > 0:
        raise UserError("--half-life-s must be positive")
    state = _state(args)
    if args.half_life_s is None:
        args.half_life_s = state.canonical.policy.fair_share_half_life_s or USAGE_HALF_LIFE_S
    rows = share_rows(state)
    usage = usage_rows([r for _, r in records(client_url(args))], args.half_life_s, state.canonical.t)
    for r in rows:
        r.update(usage.pop(r["team"], {"gpu_hours": 0.0, "decayed_gpu_hours": 0.0, "decayed_part": None}))
    for team, used in sorted(usage.items()):  # teams with past usage and nothing open now
        rows.append({"team": team, **used})
    if args.json:
        print(json.dumps({"teams": rows, "half_life_s": args.half_life_s}, sort_keys=True))
        return 0
    body = []
    for r in rows:
        part = r.get("decayed_part")
        body.append(
            [
                r["team"],
                f"{r['quota']:g}" if "quota" in r else "-",
                f"{r['fair_share_gpus']:.1f}" if "quota" in r else "-",
                r.get("held_gpus", 0),
                r.get("queued_gpus", 0),
                "-" if r.get("usage") is None else f"{r['usage']:.2f}",
                f"{r['gpu_hours']:.1f}",
                f"{r['decayed_gpu_hours']:.1f}",
                "-" if part is None else f"{part * 100:.0f}%",
                duration(r.get("protected_for_s"), "for "),
                duration(r.get("downgraded_for_s"), "for "),
                f"{r.get('fee_credit', 0):g}",
            ]
        )
    headers = ["TEAM", "QUOTA", "SHARE", "HELD", "QUEUED", "NOW/SHARE", "GPU-H", "DECAYED", "PART"]
    right = ("QUOTA", "SHARE", "HELD", "QUEUED", "NOW/SHARE", "GPU-H", "DECAYED", "PART", "FEE")
    print(table([*headers, "PROTECTED", "DOWNGRADED", "FEE"], body, right=right))
    print(
        f"GPU-H: GPU-hours run; DECAYED: the same, halved every {duration(args.half_life_s)} back;"
        " PART: the team's part of all decayed usage"
    )
    if state.canonical.policy.fair_share_half_life_s > 0:
        standings = [
            f"{r['team']} L{level} {s['standing']:g} ({s['held_gpus']} held, {s['used_gpus_lately']:g} lately)"
            for r in rows
            for level, s in sorted(r.get("levels", {}).items())
        ]
        print(
            "fair share inside levels (GPUs held now plus held on average lately, per quota; lowest"
            f" served first): {'; '.join(standings) or 'none yet'}"
        )
    return 0


_dur = duration
