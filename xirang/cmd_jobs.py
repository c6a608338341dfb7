"""The everyday commands of a running cluster, the way Slurm users reach for them:

    xirang submit JOB --team T --level L --gpus G [--dry-run] ...   (sbatch, with --test-only)
    xirang cancel JOB                                               (scancel)
    xirang jobs  [filters] [--watch S]     open jobs, why each waits, expected start (squeue -l)
    xirang queue [filters] [--watch S]     per level, in serving order, with reasons (squeue)
    xirang history [filters] [--since T] [--until T]   every job the log has seen (sacct)
    xirang logs JOB [--follow]             the job's output on its host (slurm-N.out)
    xirang nodes                           nodes: model, GPUs free/used, jobs, state (sinfo)
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

import json
import os
import shlex
import sys
import time
from pathlib import Path

from xirang.cmd_live import DATA_DIR_DEFAULT, client_url
from xirang.errors import UserError


def register(sub) -> None:
    """Add the job (`submit`, `cancel`, `jobs`, `queue`, `history`, `logs`, `nodes`, `shares`,
    `hold`, `release`, `requeue`, `set-level`) command(s) to the CLI's subparsers."""
    _register_submit(sub)
    cancel = sub.add_parser("cancel", help="cancel a job (scancel)")
    common(cancel)
    cancel.add_argument("job")
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
    history.add_argument("--since", metavar="T", help="submitted at or after T (ISO datetime or log ms)")
    history.add_argument("--until", metavar="T", help="submitted at or before T")
    history.set_defaults(func=cmd_history)

    logs = sub.add_parser("logs", help="a job's output on its host (local cluster)")
    common(logs)
    logs.add_argument("job")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing while the job runs")
    logs.set_defaults(func=cmd_logs)

    nodes = sub.add_parser("nodes", help="nodes: GPU model, GPUs free and used, jobs, state (sinfo-like)")
    common(nodes)
    nodes.set_defaults(func=cmd_nodes)

    shares = sub.add_parser(
        "shares",
        help="teams: quota, fair share, GPUs held, protection, downgrade, compensation (sshare-like)",
    )
    common(shares)
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
    submit.add_argument("--est-runtime-s", type=float)
    submit.add_argument("--ckpt-interval-s", type=float)
    submit.add_argument("--ckpt-cost-s", type=float)
    submit.add_argument("--restore-cost-s", type=float)
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
        type=float,
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

    return _send_and_answer(args, T.Cancel(job=args.job))


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
        print(answer["summary"])
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
        print(
            f"  {'JOB':<18} {'TEAM':<9} {'USER':<8} {'LVL':>3} {'STATE':<10} {'GPUS':>4} {'WHERE':<16} "
            f"{'PROGRESS':>8} {'PREEMPT':>7} {'START':>8}  REASON"
        )
        for r in rows:
            lvl = f"{r['level']}" + (f"^{r['eff_level']}" if r["eff_level"] != r["level"] else "")
            where = " ".join(r["placement"]) or "-"
            start = _dur(r["start_in_s"], "in ") if r["reason_code"] else "-"
            why = r["reason"] or (
                f"checkpoint step {r['checkpoint_step']}" if r["checkpoint_step"] is not None else ""
            )
            mark = "! " if r["unread_notices"] else "  "
            print(
                f"{mark}{r['job']:<18} {r['team']:<9} {r['user']:<8} {lvl:>3} {r['state']:<10} {r['gpus']:>4} "
                f"{where:<16} {_dur(r['progress_s']):>8} {r['preempt_count']:>7} {start:>8}  {why}"
            )
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
        if args.json:
            print(json.dumps({"t": state.canonical.t, "levels": levels}, sort_keys=True))
            return 0
        print(
            f"{'LVL':>3} {'POLICY':<11} {'POS':>3} {'JOB':<18} {'TEAM':<9} {'USER':<8} {'GPUS':>4} "
            f"{'STATE':<10} {'WAIT':>7} {'START':>8}  REASON"
        )
        for lv in levels:
            for pos, q in enumerate(lv["queued"], 1):
                print(
                    f"{lv['level']:>3} {lv['policy']:<11} {pos:>3} {q['job']:<18} {q['team']:<9} "
                    f"{q['user']:<8} {q['gpus']:>4} {'queued':<10} {_dur(q['wait_s']):>7} "
                    f"{_dur(q['start_in_s'], 'in '):>8}  {q['reason_code']}: {q['reason']}"
                )
            for h in lv["holding"]:
                print(
                    f"{lv['level']:>3} {lv['policy']:<11} {'-':>3} {h['job']:<18} {h['team']:<9} "
                    f"{h['user']:<8} {h['gpus']:>4} {h['state']:<10} {'':>7} {'':>8}"
                )
        c = state.canonical
        free = sum(n.holder.count("") for n in c.nodes.values() if n.up)
        total = sum(n.gpus for n in c.nodes.values() if n.up)
        print(f"GPUs free {free}/{total}; sagas open {len(c.sagas)}")
        return 0

    return _repeat(args, draw)


# ---------------------------------------------------------------- history, logs, nodes, shares


def cmd_history(args) -> int:
    """`xirang history`: every job the log has seen, with how it ended."""
    from agents.client import records
    from projections.views import history_rows, keep
    from xirang.cmd_data import parse_time

    rows = history_rows(record for _, record in records(client_url(args)))
    rows = keep(
        rows,
        team=args.team,
        user=args.user,
        level=args.level,
        state=args.state,
        since_t=parse_time(args.since),
        until_t=parse_time(args.until),
    )
    if args.json:
        print(json.dumps({"jobs": rows}, sort_keys=True))
        return 0
    print(
        f"{'JOB':<18} {'TEAM':<9} {'USER':<8} {'LVL':>3} {'GPUS':>4} {'STATE':<10} {'EXIT':>4} "
        f"{'WAIT':>7} {'RUN':>7} {'PREEMPT':>7} {'LOST':>7}  COMPENSATION"
    )
    for r in rows:
        comp = ", ".join(f"{k} {v:g}" for k, v in sorted(r["compensation"].items())) or "-"
        code = "-" if r["exit_code"] is None else str(r["exit_code"])
        print(
            f"{r['job']:<18} {r['team']:<9} {r['user']:<8} {r['level']:>3} {r['gpus']:>4} {r['state']:<10} "
            f"{code:>4} {_dur(r['wait_s']):>7} {_dur(r['run_s']):>7} {r['preemptions']:>7} "
            f"{_dur(r['lost_progress_s']):>7}  {comp}"
        )
    print(f"{len(rows)} job(s)")
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
    if not paths:
        raise UserError(
            f"{args.job} has not started yet, so it has no output: `xirang prio {args.job}` and"
            " `xirang jobs` say why it waits"
        )
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
    print(f"{'NODE':<14} {'MODEL':<8} {'GPUS':>4} {'USED':>4} {'FREE':>4} {'STATE':<9}  JOBS")
    for r in rows:
        print(
            f"{r['node']:<14} {r['gpu_model']:<8} {r['gpus']:>4} {r['used']:>4} {r['free']:>4} "
            f"{r['state']:<9}  {' '.join(r['jobs']) or '-'}"
        )
    return 0


def cmd_shares(args) -> int:
    """`xirang shares`: each team's quota, fair share, GPUs held and limits in force."""
    from projections.views import share_rows

    rows = share_rows(_state(args))
    if args.json:
        print(json.dumps({"teams": rows}, sort_keys=True))
        return 0
    print(
        f"{'TEAM':<12} {'QUOTA':>6} {'SHARE':>7} {'HELD':>5} {'QUEUED':>6} {'USAGE':>6} "
        f"{'PROTECTED':>10} {'DOWNGRADED':>10} {'FEE':>7}"
    )
    for r in rows:
        usage = "-" if r["usage"] is None else f"{r['usage']:.2f}"
        print(
            f"{r['team']:<12} {r['quota']:>6g} {r['fair_share_gpus']:>7.1f} {r['held_gpus']:>5} "
            f"{r['queued_gpus']:>6} {usage:>6} {_dur(r['protected_for_s'], 'for '):>10} "
            f"{_dur(r['downgraded_for_s'], 'for '):>10} {r['fee_credit']:>7g}"
        )
    return 0


def _dur(seconds, prefix: str = "") -> str:
    from core.explain import human_duration

    if seconds is None:
        return "-"
    if prefix == "in " and seconds <= 0:
        return "now"
    return prefix + human_duration(int(seconds * 1000))
