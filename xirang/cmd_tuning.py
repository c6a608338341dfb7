"""The tuning loop's user-facing commands: the survey, the notices, the quarterly review.

    xirang feedback JOB --score 1..5 [--comment TEXT] [--user U]
    xirang notices  [--user U] [--all] [--follow] [--publish] (--log FILE | --nats URL)
    xirang review   [--quarter 2026Q4 | --from T --to T] [--db FILE] (--log FILE | --nats URL) [--out FILE.html]

The logic lives in projections/ (notices.py, review.py); this module parses, calls, prints.
"""

from __future__ import annotations

import json
import os

from xirang.cmd_jobs import _send_and_answer, common
from xirang.errors import UserError

DEFAULT_USER = os.environ.get("USER", "user")


def register(sub) -> None:
    """Add the `feedback`, `notices` and `review` command(s) to the CLI's subparsers."""
    _register_feedback(sub)
    _register_notices(sub)
    _register_review(sub)


# ---------------------------------------------------------------- feedback


def _register_feedback(sub) -> None:
    p = sub.add_parser("feedback", help="tell how a job was treated: a score 1 (bad) .. 5 (good)")
    common(p)
    p.add_argument("job")
    p.add_argument(
        "--score", type=int, required=True, choices=range(1, 6), metavar="1..5", help="1 (bad) .. 5 (good)"
    )
    p.add_argument("--comment", default="", help="what went well or badly (at most 500 characters)")
    p.add_argument("--user", default=DEFAULT_USER, help="who answers (default $USER)")
    p.set_defaults(func=cmd_feedback)


def cmd_feedback(args) -> int:
    """`xirang feedback`: send a score (and comment) about how a job was treated."""
    from core import types as T

    return _send_and_answer(
        args, T.Feedback(job=args.job, user=args.user, score=args.score, comment=args.comment)
    )


# ---------------------------------------------------------------- notices


def _register_notices(sub) -> None:
    from xirang.cmd_data import add_source

    p = sub.add_parser(
        "notices",
        help="what you were told about your jobs: preemptions, checkpoint"
        " fallbacks, compensation, downgrades",
    )
    add_source(p)
    p.add_argument("--user", default=DEFAULT_USER, help="whose notices (default $USER)")
    p.add_argument("--all", action="store_true", help="every notice, not only the unread ones")
    p.add_argument("--everyone", action="store_true", help="every user's notices (operators)")
    p.add_argument("--follow", action="store_true", help="keep printing new notices (NATS)")
    p.add_argument(
        "--publish",
        action="store_true",
        help="publish every user's notices on their own"
        " subject xr.notice.<user> (NATS; with --follow, as they happen)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    p.set_defaults(func=cmd_notices)


def cmd_notices(args) -> int:
    """`xirang notices`: a user's notices from the log (new ones, or all), or publish
    everyone's."""
    from projections.notices import Notifier, ReadMarks
    from xirang.cmd_data import resolve_source

    resolve_source(args)
    if (args.follow or args.publish) and not args.nats:
        raise UserError("--follow and --publish need the live log: give --nats URL (or run `xirang up`)")
    if args.publish:
        from agents.interrupts import run_until_stopped

        return run_until_stopped(_publish(args.nats, args.follow, args.json))
    marks = ReadMarks()
    user = None if args.everyone else args.user
    after = 0 if (args.all or args.everyone) else marks.get(args.user)
    notifier = Notifier()
    shown = 0

    def show(seq: int, record) -> None:
        nonlocal shown
        for notice in notifier.feed(seq, record):
            if (user is None or notice.user == user) and seq > after:
                print(
                    json.dumps(notice.as_dict(), sort_keys=True) if args.json else notice.line(), flush=True
                )
                shown += 1
                if user is not None:
                    marks.set(user, seq)

    if args.log:
        from core import types as T
        from projections.logsource import jsonl_batches

        signed = _genuine()
        for batch in jsonl_batches(args.log):
            for pos, data in signed(batch):
                show(pos, T.decode_record(data))
    else:
        from agents.interrupts import run_until_stopped

        run_until_stopped(_read_nats(args.nats, args.follow, show))
    if not shown and not args.json:
        who = "anyone" if user is None else user
        print(f"no {'' if args.all or args.everyone else 'unread '}notices for {who}")
    return 0


def _genuine():
    """A filter of log batches that passes only the scheduler's records (signed ones with
    $XIRANG_PUBLIC_KEY): a foreign message on the log never becomes a notice."""
    from projections.logsource import SignedOnly
    from trust.signing import find_keyring

    return SignedOnly(find_keyring(None, None))


async def _publish(url: str, follow: bool, as_json: bool) -> int:
    """Every user's notices, each on the user's own subject; prints how many went where."""
    from core import types as T
    from projections.logsource import read_batches
    from projections.notices import Notifier, subject
    from xirang.cmd_data import connect_or_explain

    nc, js = await connect_or_explain(url)
    notifier = Notifier()
    sent: dict[str, int] = {}
    signed = _genuine()
    try:
        async for batch in read_batches(js, 1, follow=follow):
            for seq, data in signed(batch):
                for notice in notifier.feed(seq, T.decode_record(data)):
                    await nc.publish(
                        subject(notice.user), json.dumps(notice.as_dict(), sort_keys=True).encode()
                    )
                    sent[notice.user] = sent.get(notice.user, 0) + 1
        await nc.flush()
    finally:
        await nc.close()
    if as_json:
        print(json.dumps({"published": dict(sorted(sent.items()))}))
    else:
        print(f"published {sum(sent.values())} notices to {len(sent)} users (xr.notice.<user>)")
    return 0


async def _read_nats(url: str, follow: bool, show) -> None:
    from core import types as T
    from projections.logsource import read_batches
    from xirang.cmd_data import connect_or_explain

    nc, js = await connect_or_explain(url)
    signed = _genuine()
    try:
        async for batch in read_batches(js, 1, follow=follow):
            for seq, data in signed(batch):
                show(seq, T.decode_record(data))
    finally:
        await nc.close()


# ---------------------------------------------------------------- review


def _register_review(sub) -> None:
    from xirang.cmd_data import add_source

    p = sub.add_parser(
        "review",
        help="the quarterly review as HTML: net benefit against no preemption,"
        " per level, fairness, satisfaction, recommended changes",
    )
    add_source(p)
    window = p.add_mutually_exclusive_group()
    window.add_argument(
        "--quarter", metavar="YYYYQn", help="e.g. 2026Q4 (default: the last full quarter in the log)"
    )
    window.add_argument("--from", dest="from_t", metavar="T", help="period start (log ms or ISO time)")
    p.add_argument("--to", dest="to_t", metavar="T", help="period end (with --from; default the log's end)")
    p.add_argument(
        "--out", default="xirang-review.html", help="HTML file to write (default xirang-review.html)"
    )
    p.add_argument(
        "--tune-evals",
        type=int,
        default=2,
        help="replays per parameter for the recommendations (0: none; default 2)",
    )
    p.add_argument(
        "--tune-param", action="append", metavar="P", help="only these parameters (default: all groups)"
    )
    p.add_argument(
        "--urgent-tick-s",
        type=float,
        default=5.0,
        help="replays: re-evaluation period of a waiting urgent job (default 5 s)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.set_defaults(func=cmd_review)


def cmd_review(args) -> int:
    """`xirang review`: the quarterly review as HTML."""
    from projections import review, tuner, windows
    from xirang.cmd_data import load_records, parse_time

    if args.to_t and not args.from_t:
        raise UserError("--to goes with --from (or give --quarter)")
    if args.tune_evals < 0 or args.urgent_tick_s <= 0:
        raise UserError("--tune-evals must be >= 0 and --urgent-tick-s > 0")
    for label in args.tune_param or []:
        try:
            tuner.param_by_label(label)
        except KeyError as err:
            raise UserError(str(err.args[0])) from err
    quarter = None
    if args.quarter:
        try:
            quarter = windows.quarter_bounds(args.quarter)
        except ValueError as err:
            raise UserError(str(err)) from err
    records = load_records(args)
    first_t, last_t = windows.record_span(records)
    if quarter:
        span = windows.Span(quarter[0], quarter[1], f"the quarter {args.quarter.upper()}")
    elif args.from_t:
        span = windows.resolve(parse_time(args.from_t), parse_time(args.to_t), first_t, last_t)
    else:
        span = windows.last_full_quarter(first_t, last_t)
    if span.to_t <= span.from_t:
        raise UserError("--to must be after --from")
    try:
        data = review.gather(
            records,
            span,
            tune_evals=args.tune_evals,
            tune_params=args.tune_param,
            sim_options={"urgent_tick_s": args.urgent_tick_s},
        )
    except ValueError as err:
        raise UserError(f"review: {err}") from err
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(review.render(data))
    if args.json:
        print(json.dumps(dict(data, out=args.out), indent=1, default=str))
    else:
        rec = data["net_benefit"]["recorded"]
        print(
            f"review of the {span.describe()}: {data['jobs']} jobs; net benefit of preemption"
            f" {rec['objective_gpu_h']:+.2f} GPU-h against no preemption;"
            f" {len(data['recommendations'])} recommended change(s)"
        )
        print(f"wrote {args.out}")
    return 0
