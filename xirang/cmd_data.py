"""Data commands: the DuckDB projection and everything that reads it or the log.

    xirang project   (--nats URL | --log FILE) [--db FILE] [--follow] [--rebuild]
    xirang sql       "SELECT ..." [--db FILE] [--json | --csv]
    xirang export    --parquet DIR [--db FILE]
    xirang audit     (--nats URL | --log FILE) [--to-seq N | --to-time T] [--job J] [--json]
    xirang dashboard (--nats URL | --log FILE) [--db FILE] [--port P]
    xirang alerts    [--db FILE] [--json]
    xirang ab report [--db FILE] [--json] [--seed S]
    xirang tune      (--log FILE | --nats URL) [--from T] [--to T] [--out FILE | --apply [--every S]]
    xirang report    --from T --to T [--db FILE] [--out FILE.html]
    xirang whatif    --policy ALT.toml (--log FILE | --nats URL) [--from T --to T]

Times (`--to-time`, `--from`, `--to`) are log milliseconds or ISO 8601 datetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import datetime as dt
import json
import os
import sys
import threading

from agents.interrupts import run_until_stopped, stop_signals_raise

DEFAULT_DB = os.path.join(".xirang", "projection.duckdb")
# The dashboard projects into its own copy: DuckDB lets one process write a file and no
# other open it meanwhile, so sharing the analysts' file would lock them out while it runs.
DASHBOARD_DB = os.path.join(".xirang", "dashboard.duckdb")


def _user_error(message: str):
    from xirang.errors import UserError

    return UserError(message)


def register(sub) -> None:
    """Add the data (`project`, `sql`, `export`, `audit`, `dashboard`, `alerts`, `ab report`,
    `tune`, `whatif`, `report`) command(s) to the CLI's subparsers."""
    _register_project(sub)
    _register_sql(sub)
    _register_export(sub)
    _register_audit(sub)
    _register_dashboard(sub)
    _register_alerts(sub)
    _register_ab(sub)
    _register_tune(sub)
    _register_whatif(sub)
    _register_report(sub)


def add_source(parser) -> None:
    """The --nats / --log choice of where to read the log."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--nats",
        metavar="URL",
        help="read XR_EV from this NATS server (default: $XIRANG_NATS, else the server `xirang up` started)",
    )
    group.add_argument("--log", metavar="FILE", help="read an exported log (JSONL, one record a line)")


def resolve_source(args) -> None:
    """Fill in args.nats the way the live commands do when neither source is given."""
    if args.log:
        check_log_file(args.log)
        return
    if args.nats:
        return
    args.nats = os.environ.get("XIRANG_NATS")
    url_file = os.path.join(".xirang", "nats.url")
    if not args.nats and os.path.exists(url_file):
        with open(url_file, encoding="utf-8") as fh:
            args.nats = fh.read().strip()
    if not args.nats:
        raise _user_error(
            "no log to read: pass --log FILE or --nats URL (or set XIRANG_NATS,"
            " or start the system with `xirang up`)"
        )


def add_db(parser, default: str = DEFAULT_DB) -> None:
    """The --db option (the projection's DuckDB file)."""
    parser.add_argument("--db", default=default, help=f"DuckDB file (default {default})")


def parse_time(text: str | None) -> int | None:
    """Log milliseconds, or an ISO 8601 datetime (UTC unless it says otherwise)."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise _user_error(
            f"time {text!r}: give log milliseconds (e.g. 3600000) or an ISO"
            " datetime (e.g. 2026-11-29T03:12:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


LOG_FILE_HINT = "export one with `xirang replay run INPUTS --events-out FILE` or `xirang export`"


def check_log_file(path: str) -> None:
    """Refuse, saying how to make one, a log file that does not exist or is not a log (its
    first line is no record of the log): reading it would project nothing, or fail later."""
    if not os.path.isfile(path):
        raise _user_error(f"log file {path} does not exist ({LOG_FILE_HINT})")
    import msgspec

    from core import types as T
    from projections.logsource import jsonl_batches

    try:
        first = next((batch[0] for batch in jsonl_batches(path, batch_max=1)), None)
    except OSError as err:
        raise _user_error(f"cannot read log file {path}: {err.strerror}") from err
    if first is None:
        raise _user_error(f"log file {path} is empty: no records to read ({LOG_FILE_HINT})")
    line_no, payload = first
    try:
        T.decode_record(payload)
    except msgspec.DecodeError as err:
        raise _user_error(
            f"{path} is not a xirang log: line {line_no} is no record of one ({err}); {LOG_FILE_HINT}"
        ) from None


# ---------------------------------------------------------------- project


def _register_project(sub) -> None:
    p = sub.add_parser("project", help="project the log into DuckDB tables (exactly once)")
    add_source(p)
    add_db(p)
    p.add_argument("--follow", action="store_true", help="keep projecting new records (JetStream)")
    p.add_argument("--rebuild", action="store_true", help="drop the database and project from seq 1")
    p.add_argument("--batch", type=int, default=20000, help="records per transaction at most")
    p.add_argument("--progress", action="store_true", help="print each committed position")
    p.add_argument(
        "--public-key",
        metavar="FILE",
        help="project only records the scheduler signed (default $XIRANG_PUBLIC_KEY; none: all)",
    )
    p.set_defaults(func=cmd_project)


def open_projector(db: str, rebuild: bool = False, stream: str = "XR_EV"):
    """A projector on the DuckDB file `db` (deleted first with `rebuild`); a locked file is
    explained."""
    import duckdb

    from projections.projector import Projector

    if rebuild:
        for path in (db, db + ".wal"):
            if os.path.exists(path):
                os.remove(path)
    os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
    try:
        return Projector(db, stream=stream, pending_reasons=True)
    except duckdb.IOException as err:
        raise _user_error(f"cannot open {db}: {err} (is another projector or dashboard using it?)") from err


def cmd_project(args) -> int:
    """`xirang project`: fold the log (file or XR_EV) into the DuckDB projection, once or
    following it."""
    if args.batch < 1:
        raise _user_error("--batch must be at least 1")
    resolve_source(args)
    if args.log:
        return _project_file(args)
    return run_until_stopped(_project_nats(args))


def _project_file(args) -> int:
    from projections.logsource import jsonl_batches
    from projections.projector import ProjectionError

    proj = open_projector(args.db, args.rebuild, stream=f"file:{os.path.abspath(args.log)}")
    applied = 0
    signed = _signed_only(args, proj)
    try:
        for batch in jsonl_batches(args.log, proj.last_seq + 1, args.batch):
            applied += proj.apply(signed(batch))
            _progress(args, proj)
        signed.finish()
    except (ProjectionError, ValueError) as err:
        raise _user_error(str(err)) from err
    proj.refresh_pending()
    print(json.dumps({"applied": applied, "last_seq": proj.last_seq, "last_record": proj.last_n}))
    return 0


def _signed_only(args, proj):
    """Only the scheduler's records are projected: with --public-key (or
    $XIRANG_PUBLIC_KEY), those its signature covers; any other message on the log is passed
    over with a warning that names it (trust/foreign.py)."""
    from projections.logsource import SignedOnly
    from trust.signing import KeyFileError, find_keyring

    try:
        return SignedOnly(find_keyring(getattr(args, "public_key", None), None), proj.last_n, proj.last_hash)
    except KeyFileError as err:
        raise _user_error(str(err)) from err


def _progress(args, proj) -> None:
    if args.progress:
        print(f"committed seq {proj.last_seq} record {proj.last_n}", flush=True)


async def _project_nats(args) -> int:
    from transport import bus
    from projections.logsource import read_batches
    from projections.projector import ProjectionError

    proj = open_projector(args.db, args.rebuild)
    nc, js = await connect_or_explain(args.nats)
    applied = 0
    signed = _signed_only(args, proj)
    try:
        async for batch in read_batches(js, proj.last_seq + 1, args.batch, follow=args.follow):
            applied += await asyncio.to_thread(proj.apply, signed(batch))
            _progress(args, proj)
        signed.finish()
    except (ProjectionError, ValueError) as err:
        raise _user_error(str(err)) from err
    finally:
        await nc.close()
    proj.refresh_pending()
    print(
        json.dumps(
            {
                "applied": applied,
                "last_seq": proj.last_seq,
                "last_record": proj.last_n,
                "stream": bus.EV_STREAM,
            }
        )
    )
    return 0


async def connect_or_explain(url: str):
    """Connect to NATS at `url`, or raise a UserError saying what to check."""
    from transport import bus

    try:
        nc, js = await bus.connect(url, reconnects=2)
    except Exception as err:  # noqa: BLE001 - any failure to connect is the user's to fix
        from xirang.errors import explain_failure

        raise _user_error(explain_failure(err, url)) from err
    try:
        await js.stream_info(bus.EV_STREAM)
    except Exception as err:  # noqa: BLE001
        await nc.close()
        raise _user_error(
            f"{url} has no {bus.EV_STREAM} stream (is the scheduler running there?): {err!r}"
        ) from err
    return nc, js


# ---------------------------------------------------------------- sql and export


def _register_sql(sub) -> None:
    p = sub.add_parser("sql", help="run SQL on the projection and print a table")
    p.add_argument("query", help='e.g. "SELECT * FROM preemption_stats"')
    add_db(p)
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="one JSON array of objects")
    fmt.add_argument("--csv", action="store_true", help="CSV with a header line")
    p.set_defaults(func=cmd_sql)


READ_WAIT_S = 5.0  # how long a reader waits for a writer's batch to end


def open_readonly(db: str):
    """The projection opened read-only (retrying while a projector holds it); a missing file is
    explained."""
    import duckdb

    if not os.path.exists(db):
        raise _user_error(
            f"no projection at {db}: run `xirang project --log FILE` or"
            " `xirang project --nats URL` first (or pass --db)"
        )
    import time

    deadline = time.monotonic() + READ_WAIT_S
    while True:
        try:
            return duckdb.connect(db, read_only=True)
        except duckdb.IOException as err:
            # A projector writing a batch holds the file for a moment: wait it out.
            if time.monotonic() > deadline:
                raise _user_error(
                    f"cannot open {db}: another process holds it for writing (a"
                    " `xirang project --follow`, or a dashboard given this --db); stop"
                    " it, or read the dashboard's own copy (--db .xirang/dashboard.duckdb"
                    " is written by it, /api/sql serves it)"
                ) from err
            time.sleep(0.2)
        except duckdb.Error as err:
            raise _user_error(f"cannot open {db}: {err}") from err


def cmd_sql(args) -> int:
    """`xirang sql`: run one read-only SQL query on the projection and print a table or JSON."""
    import duckdb

    con = open_readonly(args.db)
    try:
        cur = con.execute(args.query)
    except duckdb.Error as err:
        raise _user_error(f"SQL error: {err}") from err
    if cur.description is None:
        return 0
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    if args.json:
        print(json.dumps([dict(zip(names, r)) for r in rows], default=str, indent=1))
    elif args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(names)
        writer.writerows(rows)
    else:
        print(format_table(names, rows))
    return 0


def format_table(names: list[str], rows: list[tuple]) -> str:
    """Rows as an aligned text table under their column names."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(n)] + [len(r[i]) for r in cells]) for i, n in enumerate(names)]
    line = "  ".join(n.ljust(w) for n, w in zip(names, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    for row in cells:
        out.append("  ".join(c.rjust(w) if _numeric(c) else c.ljust(w) for c, w in zip(row, widths)))
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _cell(value) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.0f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _register_export(sub) -> None:
    p = sub.add_parser("export", help="export every table and view of the projection")
    p.add_argument("--parquet", metavar="DIR", required=True, help="write DIR/<table>.parquet")
    add_db(p)
    p.set_defaults(func=cmd_export)


def cmd_export(args) -> int:
    """`xirang export`: every projection table as a Parquet file in a folder."""
    con = open_readonly(args.db)
    os.makedirs(args.parquet, exist_ok=True)
    names = [
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY table_name"
        ).fetchall()
    ]
    written = {}
    for name in names:
        path = os.path.join(args.parquet, f"{name}.parquet")
        con.execute(f"COPY (SELECT * FROM \"{name}\") TO '{_sql_str(path)}' (FORMAT parquet)")
        written[name] = con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0]
    print(json.dumps({"dir": args.parquet, "rows": written}, indent=1))
    return 0


def _sql_str(text: str) -> str:
    return text.replace("'", "''")


# ---------------------------------------------------------------- audit


def _register_audit(sub) -> None:
    p = sub.add_parser("audit", help="rebuild state from the log and verify every hash and digest")
    add_source(p)
    window = p.add_mutually_exclusive_group()
    window.add_argument("--to-seq", type=int, metavar="N", help="stop after record N of the chain")
    window.add_argument("--to-time", metavar="T", help="stop after log time T")
    p.add_argument("--job", metavar="J", help="tell this job's history in plain words")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument(
        "--public-key",
        metavar="FILE",
        help="the scheduler's public keyring; every record must carry or be covered by its "
        "signature (default: $XIRANG_PUBLIC_KEY, else .xirang/keys/scheduler.pub if there)",
    )
    p.add_argument(
        "--redecide",
        action="store_true",
        help="once the log verifies, step every accepted input again through this release's "
        "core and say whether it decides the same, or where it first does not",
    )
    p.set_defaults(func=cmd_audit)


def cmd_audit(args) -> int:
    """`xirang audit`: verify the log's hash chain, state digests and signatures, optionally
    follow one job or stop at a point."""
    from projections.audit import Audit

    if args.to_seq is not None and args.to_seq < 0:
        raise _user_error("--to-seq must be a record number >= 0")
    audit = Audit(
        job=args.job or "",
        to_n=args.to_seq,
        to_t=parse_time(args.to_time),
        keyring=_log_keyring(args.public_key),
    )
    resolve_source(args)
    pos_name = "line" if args.log else "stream seq"
    feed_log(args, audit)
    audit.finish()
    summary = audit.summary(pos_name)
    redecided = _redecide(args, audit) if args.redecide and audit.problem is None else None
    if redecided is not None:
        summary["redecide"] = redecided.summary()
        summary["redecide_words"] = redecided.words()
    if args.job and args.job not in audit.jobs:
        summary["job_problem"] = f"job {args.job} does not appear in the audited log"
    _print_audit(args, audit, summary)
    return 0 if audit.problem is None else 1


def feed_log(args, reader) -> None:
    """Every record of the audited log (file or stream), in order, to `reader.feed`."""
    from projections.logsource import jsonl_batches

    if args.log:
        for batch in jsonl_batches(args.log):
            if not all(reader.feed(pos, data) for pos, data in batch):
                break
    else:
        run_until_stopped(_audit_nats(args.nats, reader))


def _redecide(args, audit):
    """A second pass over a verified log: its decisions re-made (projections/redecide.py),
    with the policy defaults of the older release whose digests it matched, if any."""
    from projections.redecide import Redecide, legacy_policy

    release = audit.legacy_releases[0] if audit.legacy_releases else ""
    redecide = Redecide(legacy_policy(release), release) if release else Redecide()
    feed_log(args, _Window(redecide, audit.state.canonical.events_n, audit.keyring))
    redecide.finish()
    return redecide


class _Window:
    """Passes the scheduler's records (foreign messages set aside as the audit did) up to
    record `last_n` (where the audit stopped) to `reader`."""

    def __init__(self, reader, last_n: int, keyring=None) -> None:
        from trust.foreign import LogSorter

        from core import types

        self.encode = types.encode_record
        self.reader, self.last_n = reader, last_n
        self.sorter = LogSorter(keyring)

    def feed(self, pos: int, data: bytes) -> bool:
        for record, record_pos in self.sorter.feed(pos, data):
            if record.n > self.last_n or not self.reader.feed(record_pos, self.encode(record)):
                return False
        return True


def _log_keyring(public_key: str | None):
    from trust.signing import KeyFileError, find_keyring

    try:
        return find_keyring(public_key, ".xirang")  # `xirang up`'s key when run beside it
    except KeyFileError as err:
        raise _user_error(str(err)) from err


async def _audit_nats(url: str, audit) -> None:
    from projections.logsource import read_batches

    nc, js = await connect_or_explain(url)
    try:
        async for batch in read_batches(js, 1):
            if not all(audit.feed(pos, data) for pos, data in batch):
                break
    finally:
        await nc.close()


def _only_the_key_is_missing(audit) -> bool:
    """Whether the audit's one problem is that a signed log came without a key to check it."""
    return audit.keyring is None and bool(audit.signed_records) and "no public key" in audit.problem.problem


def _print_audit(args, audit, summary: dict) -> None:
    if args.json:
        if args.job:
            summary["job"] = args.job
            summary["story"] = audit.story
        print(json.dumps(summary, indent=1))
        return
    if audit.problem and _only_the_key_is_missing(audit):
        # Not a sign of tampering: everything that can be checked without the key held.
        print(
            f"SIGNATURES NOT CHECKED: the log is signed and no public key was given; pass"
            f" --public-key FILE (or set XIRANG_PUBLIC_KEY). Without it: {audit.records} records,"
            f" hash chain intact, {audit.digest_words()}"
        )
    elif audit.problem:
        print(f"LOG DOES NOT VERIFY: {summary['problem']}")
        print(f"verified {audit.records} records before it ({audit.digests} state digests)")
    else:
        print(
            f"log verified: {audit.records} records, hash chain intact, {audit.digest_words()};"
            f" scheduler signatures: {summary['signatures']}"
        )
        print(f"chain head {summary['chain_head']}; state digest {summary['state_digest']}")
    print(
        f"state at record {summary['last_record']}: {summary['jobs_open']} open jobs,"
        f" {summary['jobs_done']} done, {summary['sagas_open']} open preemptions"
    )
    if summary["foreign_messages"]:
        pos_name = "line" if args.log else "stream seq"
        print(
            f"foreign messages passed over (not the scheduler's records): {summary['foreign_messages']},"
            f" {summary['disowned']} of them disowned by the scheduler"
        )
        for item in summary["foreign"]:
            by = (
                f"disowned by record {item['disowned_by_record']}"
                if item["disowned_by_record"]
                else "NOT disowned"
            )
            print(f"  {pos_name} {item[pos_name.replace(' ', '_')]}: {item['problem']} ({by})")
    if "redecide_words" in summary:
        print(summary["redecide_words"])
    if args.job:
        print(f"\nhistory of {args.job}:")
        if "job_problem" in summary:
            print(f"  {summary['job_problem']}")
        for line in audit.story:
            print(f"  {line}")


# ---------------------------------------------------------------- dashboard and alerts


def _register_dashboard(sub) -> None:
    p = sub.add_parser(
        "dashboard",
        help="live web dashboard and /metrics, projecting as it goes"
        " (into its own copy: sql, alerts, report and project keep working)",
    )
    add_source(p)
    add_db(p, DASHBOARD_DB)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8321, help="port (0 picks a free one; default 8321)")
    p.add_argument(
        "--sql-token-file",
        metavar="FILE",
        help="file holding the token analysts send to /api/sql (Authorization: Bearer); "
        "default $XIRANG_SQL_TOKEN; without either /api/sql is off",
    )
    p.add_argument("--sql-time-limit-s", type=float, default=5.0, help="stop a query after this long")
    p.add_argument("--sql-rows-max", type=int, default=10_000, help="rows an /api/sql answer holds at most")
    p.add_argument(
        "--public-key",
        metavar="FILE",
        help="show only records the scheduler signed (default $XIRANG_PUBLIC_KEY; none: all)",
    )
    p.set_defaults(func=cmd_dashboard)


def cmd_dashboard(args) -> int:
    """`xirang dashboard`: serve the live dashboard, metrics and (with a token) analyst SQL over
    HTTP."""
    from projections import dashboard
    from projections.analyst_sql import AnalystSql, token_from
    from projections.logsource import jsonl_batches

    resolve_source(args)
    stream = f"file:{os.path.abspath(args.log)}" if args.log else "XR_EV"
    try:
        sql = AnalystSql(
            token=token_from(args.sql_token_file),
            time_limit_s=args.sql_time_limit_s,
            rows_max=args.sql_rows_max,
        )
    except OSError as err:
        raise _user_error(f"cannot read --sql-token-file: {err}") from err
    proj = open_projector(args.db, stream=stream)
    live: dict = {}
    try:
        server = dashboard.serve(proj.con, args.host, args.port, sql, live)
    except OSError as err:
        raise _user_error(
            f"cannot listen on {args.host}:{args.port}: {err.strerror}"
            " (pick another --port, or 0 for a free one)"
        ) from err
    host, port = server.server_address[:2]
    print(f"dashboard on http://{host}:{port}/ (metrics at /metrics)", flush=True)
    try:
        with stop_signals_raise():  # Ctrl-C or a supervisor's SIGTERM: an orderly stop, at once
            signed = _signed_only(args, proj)
            if args.log:
                for batch in jsonl_batches(args.log, proj.last_seq + 1):
                    proj.apply(signed(batch))
                signed.finish()
                proj.refresh_pending()
                print(f"projected {args.log} up to record {proj.last_n}; serving until Ctrl-C", flush=True)
                threading.Event().wait()
            else:
                run_until_stopped(_follow(args.nats, proj, live, signed))
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
    return 0


FOLLOW_BATCH_MAX = 20000  # a shorter batch from the follower means the log went quiet


async def _follow(url: str, proj, live: dict | None = None, signed=None) -> None:
    from projections.logsource import read_batches

    nc, js = await connect_or_explain(url)
    watcher = asyncio.create_task(_watch_input_backlog(js, proj, live)) if live is not None else None
    batches = read_batches(js, proj.last_seq + 1, batch_max=FOLLOW_BATCH_MAX, follow=True)
    try:
        async with contextlib.aclosing(batches):  # closed here, while the connection is open
            async for batch in batches:
                await asyncio.to_thread(proj.apply, signed(batch) if signed is not None else batch)
                if len(batch) < FOLLOW_BATCH_MAX:  # the log went quiet: caught up, so reasons are due
                    await asyncio.to_thread(proj.refresh_pending, True)
    finally:
        if watcher:
            watcher.cancel()
        await nc.close()


INPUT_BACKLOG_EVERY_S = 5.0


async def _watch_input_backlog(js, proj, live: dict) -> None:
    """Inputs on XR_IN the log has not answered (the newest input sequence an event names
    against XR_IN's last sequence): a backlog that stays is a stuck scheduler."""
    from transport import bus

    while True:
        try:
            last_in = await bus.stream_last_seq(js, bus.IN_STREAM)
            answered = proj.state.canonical.last_input_seq if proj.state is not None else 0
            live["input_backlog"] = max(0, last_in - answered)
        except Exception:  # noqa: BLE001 - a missed sample only leaves the gauge as it was
            pass
        await asyncio.sleep(INPUT_BACKLOG_EVERY_S)


def _register_alerts(sub) -> None:
    p = sub.add_parser("alerts", help="alerts firing at the newest time of the projection")
    add_db(p)
    p.add_argument("--at", metavar="T", help="evaluate at this log time instead")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_alerts)


def cmd_alerts(args) -> int:
    """`xirang alerts`: the alerts that hold at a time."""
    from projections import alerts, metrics

    con = open_readonly(args.db)
    now = parse_time(args.at) if args.at else metrics.now_t(con)
    fired = alerts.evaluate(con, now)
    if args.json:
        print(json.dumps([a.as_dict() for a in fired], indent=1))
    else:
        for alert in fired:
            print(f"ALERT {alert.kind} {alert.subject}: {alert.message}")
        if not fired:
            print("no alerts")
    return 0


# ---------------------------------------------------------------- A/B and tuning


def _register_ab(sub) -> None:
    p = sub.add_parser("ab", help="A/B experiments on policy variants")
    asub = p.add_subparsers(dest="ab_command", metavar="ACTION")
    asub.required = True
    rep = asub.add_parser("report", help="per-variant metrics with bootstrap confidence intervals")
    add_db(rep)
    rep.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    rep.add_argument("--from", dest="from_t", metavar="T", help="jobs submitted at or after T")
    rep.add_argument("--to", dest="to_t", metavar="T", help="jobs submitted at or before T")
    rep.add_argument("--json", action="store_true")
    rep.set_defaults(func=cmd_ab_report)


def cmd_ab_report(args) -> int:
    """`xirang ab report`: each A/B variant against control, with bootstrap intervals."""
    from projections import ab, windows

    con = open_readonly(args.db)
    span = windows.resolve(parse_time(args.from_t), parse_time(args.to_t), *windows.log_span(con))
    rep = ab.report(con, args.seed, span.from_t, span.to_t)
    rep["window"] = dict(span.as_dict(), text=f"jobs submitted in the {span.describe()}")
    print(json.dumps(rep, indent=1) if args.json else ab.render(rep))
    return 0


def _register_tune(sub) -> None:
    p = sub.add_parser("tune", help="learn policy changes by replaying the recent log (set_policy inputs)")
    add_source(p)
    p.add_argument(
        "--from", dest="from_t", metavar="T", help="window start (default: --window-ms before the end)"
    )
    p.add_argument("--to", dest="to_t", metavar="T", help="window end (default: the log's last time)")
    p.add_argument("--window-ms", type=int, default=None, help="recent log to replay (default 6 h)")
    p.add_argument(
        "--group",
        action="append",
        metavar="G",
        help="parameter group(s) to tune (default:"
        " all of guaranteed_shares, decision_model, fairness, safe_points)",
    )
    p.add_argument(
        "--param",
        action="append",
        metavar="P",
        help="only these parameters (e.g."
        " net_benefit_min, level_weight[0]; default: every one of the groups)",
    )
    p.add_argument("--evals", type=int, default=4, help="replays per parameter at most (default 4)")
    p.add_argument(
        "--urgent-weight", type=float, default=1.0, help="objective: weight of an urgent GPU-hour of wait"
    )
    p.add_argument(
        "--lost-weight", type=float, default=1.0, help="objective: weight of a GPU-hour of lost work"
    )
    p.add_argument("--fairness-weight", type=float, default=1.0, help="objective: weight of the Jain drop")
    p.add_argument(
        "--urgent-tick-s",
        type=float,
        default=5.0,
        help="replays: how often a waiting urgent"
        " job is re-evaluated (default 5 s; coarser is faster and less faithful)",
    )
    p.add_argument("--out", metavar="FILE", help="append the proposals to FILE as set_policy inputs")
    p.add_argument("--apply", action="store_true", help="publish them to XR_IN (needs --nats)")
    p.add_argument(
        "--every",
        type=float,
        metavar="S",
        help="with --apply: run every S seconds, watching"
        " each change over the next window and reverting it if it made things worse",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    """`xirang tune`: replay the recent window under candidate policies and propose (or apply) a
    better one."""
    from projections import tuner

    if args.window_ms is not None and args.window_ms <= 0:
        raise _user_error("--window-ms must be positive")
    if args.evals < 1:
        raise _user_error("--evals must be at least 1")
    if args.urgent_tick_s <= 0:
        raise _user_error("--urgent-tick-s must be positive")
    for group in args.group or []:
        if group not in tuner.GROUPS:
            raise _user_error(f"--group {group!r}: one of {', '.join(tuner.GROUPS)}")
    for label in args.param or []:
        try:
            tuner.param_by_label(label)
        except KeyError as err:
            raise _user_error(str(err.args[0])) from err
    resolve_source(args)
    if args.apply and not args.nats:
        raise _user_error("--apply publishes to XR_IN: read the log from --nats URL (or write --out FILE)")
    if args.every is not None and (args.every <= 0 or not args.apply):
        raise _user_error("--every S needs --apply and S > 0")
    objective = tuner.Objective(args.urgent_weight, args.lost_weight, args.fairness_weight)
    if args.every is None:
        _tune_once(args, objective)
        return 0
    import time

    with stop_signals_raise() as stop:  # Ctrl-C or SIGTERM ends the loop at once
        while not stop:
            _tune_once(args, objective)
            time.sleep(args.every)
    return 0  # not reached: the block raises Interrupted once a signal came


def _tuner_input(proposal, records, last_t: int):
    """The proposal as a set_policy whose id is the same until the log shows a newer tuner
    change, so a loop that runs again before the scheduler applied it is deduplicated on
    XR_IN rather than applied twice."""
    import hashlib

    import msgspec

    from projections import tuner

    last = tuner.last_tuner_change(records)
    key = json.dumps([proposal.params, last.t if last else 0], sort_keys=True, default=str)
    inp = proposal.as_input(t=last_t)
    return msgspec.structs.replace(inp, id="tuner-" + hashlib.sha256(key.encode()).hexdigest()[:24])


def _tune_once(args, objective) -> None:
    from projections import tuner, windows

    records = load_records(args)
    first_t, last_t = windows.record_span(records)
    window_ms = args.window_ms or tuner.WINDOW_MS
    given_from, given_to = parse_time(args.from_t), parse_time(args.to_t)
    span = windows.resolve(given_from, given_to, first_t, last_t)
    if given_from is None:
        span = windows.Span(
            max(first_t, span.to_t - window_ms),
            span.to_t,
            f"the last {window_ms / 3_600_000:g} h of the log" if given_to is None else span.chosen,
        )
    try:
        result = tuner.cycle(
            records,
            span.from_t,
            span.to_t,
            objective,
            args.group,
            args.evals,
            window_ms,
            only=args.param,
            sim_options={"urgent_tick_s": args.urgent_tick_s},
        )
    except tuner.NothingToReplay as err:
        if not args.apply:
            raise _user_error(f"tune: {err}") from err
        # A turn of the loop on a quiet window (an idle cluster, a fresh log): nothing to
        # learn from and nothing to change, which is no failure of the timer or CronJob.
        if args.json:
            print(
                json.dumps({"window": span.as_dict(), "quiet": str(err), "proposals": []}, indent=1),
                flush=True,
            )
        else:
            print(f"tune: {span.describe()}: {err}; nothing changed this turn", flush=True)
        return
    except ValueError as err:
        raise _user_error(f"tune: {err}") from err
    inputs = [_tuner_input(p, records, last_t) for p in result.proposals]
    if args.out and inputs:
        from core import types as T

        with open(args.out, "ab") as fh:
            for inp in inputs:
                fh.write(T.encode(inp) + b"\n")
    sent = run_until_stopped(_send_inputs(args.nats, inputs)) if args.apply and inputs else []
    out = {
        "window": span.as_dict(),
        "objective": objective.describe(),
        "watched": result.watched,
        "proposals": [p.as_dict() for p in result.proposals],
        "replays": result.runs,
        "written_to": args.out if inputs else None,
        "published_xr_in_seqs": sent,
    }
    if args.json:
        print(json.dumps(out, indent=1), flush=True)
        return
    print(f"tune: {span.describe()}; objective: {objective.describe()}")
    if result.watched:
        print(f"last change {json.dumps(result.watched['params'])}: {result.watched['verdict']}")
    for p in result.proposals:
        print(f"propose {json.dumps(p.params)}: {p.reason}")
    if not result.proposals:
        print("no change proposed: no candidate beat the current policy by the margin on the replay")
    print(flush=True)


async def _send_inputs(url: str, inputs) -> list[int]:
    from transport import bus

    try:
        nc, js = await bus.connect(url, reconnects=2)
    except Exception as err:  # noqa: BLE001
        raise _user_error(f"cannot connect to NATS at {url}: {err!r}") from err
    try:
        await bus.ensure_streams(js)
        return [(await bus.send_input(js, inp))[1] for inp in inputs]
    finally:
        await nc.close()


# ---------------------------------------------------------------- what-if


def _register_whatif(sub) -> None:
    p = sub.add_parser("whatif", help="re-run a window's recorded inputs under another policy (simulator)")
    p.add_argument("--policy", required=True, metavar="ALT.toml", help="the alternative policy")
    add_source(p)
    p.add_argument("--from", dest="from_t", metavar="T", help="window start (log ms or ISO time)")
    p.add_argument("--to", dest="to_t", metavar="T", help="window end (log ms or ISO time)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args) -> int:
    """`xirang whatif`: a window of the log re-run under another policy, beside what happened."""
    from core import PolicyError
    from projections import windows
    from replay import whatif
    from xirang.policy_file import load_policy_file

    try:
        alt = load_policy_file(args.policy)
    except OSError as err:
        raise _user_error(f"cannot read {args.policy}: {err.strerror}") from err
    except PolicyError as err:
        raise _user_error(str(err)) from err
    from_t, to_t = parse_time(args.from_t), parse_time(args.to_t)
    if from_t is not None and to_t is not None and to_t <= from_t:
        raise _user_error("--to must be after --from")
    records = load_records(args)
    try:
        span = windows.resolve(from_t, to_t, *windows.record_span(records))
        result = whatif.run(records, alt, span, args.seed)
    except ValueError as err:
        raise _user_error(f"what-if: {err}") from err
    print(json.dumps(result, indent=1, default=str) if args.json else whatif.render(result))
    return 0


def load_records(args) -> list:
    """Every record of the log (file or JetStream), decoded."""
    from core import types as T
    from projections.logsource import jsonl_batches

    from projections.logsource import SignedOnly
    from trust.signing import find_keyring

    resolve_source(args)
    signed = SignedOnly(find_keyring(None, None))  # only the scheduler's records
    if args.log:
        return [T.decode_record(data) for batch in jsonl_batches(args.log) for _, data in signed(batch)]

    async def go():
        from projections.logsource import read_batches

        nc, js = await connect_or_explain(args.nats)
        try:
            return [T.decode_record(data) async for batch in read_batches(js, 1) for _, data in signed(batch)]
        finally:
            await nc.close()

    return run_until_stopped(go())


# ---------------------------------------------------------------- periodic review


def _register_report(sub) -> None:
    p = sub.add_parser("report", help="periodic review as HTML with charts")
    p.add_argument("--from", dest="from_t", metavar="T", help="window start (default: the log's first time)")
    p.add_argument("--to", dest="to_t", metavar="T", help="window end (default: the log's last time)")
    add_db(p)
    p.add_argument("--out", default="xirang-report.html", help="HTML file to write")
    p.add_argument("--json", action="store_true", help="also print the numbers as JSON")
    p.set_defaults(func=cmd_report)


def cmd_report(args) -> int:
    """`xirang report`: the period report as HTML."""
    from projections import report, windows

    con = open_readonly(args.db)
    span = windows.resolve(parse_time(args.from_t), parse_time(args.to_t), *windows.log_span(con))
    if span.to_t <= span.from_t:
        raise _user_error("--to must be after --from")
    data = report.gather(con, span.from_t, span.to_t)
    with open(args.out, "w", encoding="utf-8") as fh:
        fh.write(report.render(data))
    summary = {k: v for k, v in data.items() if not isinstance(v, list)}
    summary["out"] = args.out
    summary["window"] = span.as_dict()
    print(json.dumps(summary, indent=1) if args.json else f"{span.describe()}\nwrote {args.out}")
    return 0
