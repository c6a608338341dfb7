"""The live system's command line: `xirang up | scheduler | agent | demo`, all with `--nats URL` (default: `$XIRANG_NATS`, else the embedded server
that `xirang up` started, whose URL it leaves in `.xirang/nats.url`) and `--json`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

from transport.locks import AlreadyRunning, InstanceLock

DATA_DIR_DEFAULT = ".xirang"
URL_FILE = "nats.url"


def register(sub) -> None:
    """Add the live-cluster (`up`, `scheduler`, `agent`, `demo`) command(s) to the CLI's
    subparsers."""

    def common(p, server: bool = False) -> None:
        p.add_argument(
            "--nats",
            metavar="URL",
            help="NATS server URL (default: $XIRANG_NATS, "
            + ("else an embedded server" if server else "else the one `xirang up` started")
            + ")",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument(
            "--data-dir", default=DATA_DIR_DEFAULT, help="local folder (embedded NATS data, host state)"
        )

    up = sub.add_parser("up", help="embedded NATS, the scheduler and N simulated hosts, until Ctrl-C")
    common(up, server=True)
    up.add_argument("--hosts", type=int, default=2, help="simulated hosts (default 2)")
    up.add_argument(
        "--simulate",
        default="8xH100,8xA100",
        help="inventories, comma separated, cycled over the hosts (default 8xH100,8xA100)",
    )
    up.add_argument("--policy", help="policy TOML, applied through a set_policy input")
    up.add_argument("--tick-ms", type=int, default=1000)
    _disk_options(up, auto=True)
    up.set_defaults(func=cmd_up)

    sched = sub.add_parser("scheduler", help="run the scheduler (leader or hot standby)")
    common(sched, server=True)
    sched.add_argument("--id", help="instance name (default: random)")
    sched.add_argument("--policy", help="policy TOML, applied through a set_policy input")
    sched.add_argument("--tick-ms", type=int, default=1000)
    sched.add_argument("--group-max", type=int, default=256, help="inputs per group commit")
    sched.add_argument(
        "--linger-ms",
        type=float,
        default=5.0,
        help="a burst of inputs waits this long to share one group commit",
    )
    sched.add_argument("--node-timeout-ms", type=int, default=10_000)
    sched.add_argument("--lease-ms", type=int, default=3000)
    sched.add_argument("--snapshot-every-events", type=int, default=5000)
    sched.add_argument(
        "--signing-key",
        metavar="FILE",
        help="the scheduler's Ed25519 private key (default: $XIRANG_SIGNING_KEY, else "
        "DATA_DIR/keys/scheduler.key, made there on first use)",
    )
    sched.add_argument(
        "--public-key",
        metavar="FILE",
        help="trusted public keyring, for records signed by rotated keys (default: "
        "$XIRANG_PUBLIC_KEY, else DATA_DIR/keys/scheduler.pub)",
    )
    sched.set_defaults(func=cmd_scheduler)

    agent = sub.add_parser("agent", help="run a GPU host agent")
    common(agent, server=True)
    agent.add_argument("--node", required=True, help="this host's name in the pool")
    agent.add_argument("--simulate", metavar="NxMODEL", help="simulated inventory, e.g. 8xH100")
    agent.add_argument("--gpu-model", help="override the discovered model name")
    agent.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL")
    agent.add_argument(
        "--advertise-addr",
        metavar="ADDR",
        default="",
        help="the address other hosts reach this one's jobs at, a gang's MASTER_ADDR when this "
        "node comes first (default: this host's address towards the NATS server)",
    )
    agent.add_argument(
        "--ckpt-root",
        metavar="DIR",
        action="append",
        default=[],
        help="a (shared) folder where jobs write checkpoints of their own, each in its folder "
        "<DIR>/<job>; `xirang job checkpoint-saved --path` must name a path there "
        "(repeatable; default <data-dir>/ckpt)",
    )
    agent.add_argument(
        "--job-creds-ttl-s",
        type=float,
        default=3600.0,
        help="lifetime of each job run's own NATS credentials, minted with the job signing "
        "key in the agent's creds file ($XIRANG_CREDS) and renewed while the run "
        "lives (default 3600); the agent's own credentials never reach a job",
    )
    agent.add_argument(
        "--job-user",
        metavar="NAME",
        default=os.environ.get("XIRANG_JOB_USER"),
        help="one OS user an agent running as root starts ALL its jobs as (default "
        "$XIRANG_JOB_USER; unset: each run gets its own uid, see --job-uid-range); jobs sharing "
        "a user can read each other's environment in /proc; an agent not running as root runs "
        "jobs as its own user (and warns)",
    )
    agent.add_argument(
        "--job-uid-range",
        metavar="FIRST-LAST",
        default=os.environ.get("XIRANG_JOB_UID_RANGE"),
        help="an agent running as root starts each job run as its own uid and gid from this "
        "range, with no supplementary groups and no passwd entry, so a job can read neither the "
        "agent's files nor another job's (default $XIRANG_JOB_UID_RANGE, else "
        "2000000000-2000065535; ids must belong to nobody else on the host)",
    )
    agent.add_argument(
        "--ckpt-secret-file",
        metavar="FILE",
        default=os.environ.get("XIRANG_CKPT_SECRET_FILE"),
        help="the hosts' shared secret that seals each job's checkpoints under its own key "
        "(default $XIRANG_CKPT_SECRET_FILE, else DATA_DIR/keys/checkpoint.secret, made there "
        "on first use; every host of a cluster needs the same one)",
    )
    agent.add_argument(
        "--public-key",
        metavar="FILE",
        help="the scheduler's public keyring: decisions are acted on only if signed "
        "(default: $XIRANG_PUBLIC_KEY, else DATA_DIR/keys/scheduler.pub)",
    )
    _disk_options(agent, auto=False)
    agent.set_defaults(func=cmd_agent)

    demo = sub.add_parser("demo", help="the end-to-end demonstration (`make run`)")
    demo.add_argument("--out", help="folder for the log and files (default: a new temporary one)")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.set_defaults(func=cmd_demo)


# ---------------------------------------------------------------- URLs and servers


def _user_error(message: str):
    from xirang.cli import UserError

    return UserError(message)


def client_url(args) -> str:
    """The NATS URL a client command uses: --nats, $XIRANG_NATS, else the one `xirang up` wrote;
    a UserError says how to start one."""
    url = args.nats or os.environ.get("XIRANG_NATS")
    path = Path(args.data_dir) / URL_FILE
    if not url and path.exists():
        url = path.read_text().strip()
    if url:
        args.nats = url  # for the one-line message should the server not answer
        return url
    raise _user_error(
        f"no NATS server: {path} is not there. Started `xirang up` from another folder? pass"
        " --data-dir THAT_FOLDER/.xirang; else start one with `xirang up` (in another terminal),"
        " or pass --nats URL / set XIRANG_NATS"
    )


def server_url(args):
    """(url, embedded server or None): an embedded server unless a URL was given."""
    url = args.nats or os.environ.get("XIRANG_NATS")
    if url:
        return url, None
    from transport.natsd import EmbeddedNats

    data = Path(args.data_dir)
    try:
        server = EmbeddedNats(data / "nats").start()
    except AlreadyRunning as err:
        raise _user_error(str(err)) from err
    (data / URL_FILE).write_text(server.url + "\n")
    return server.url, server


def _logging(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)


# ---------------------------------------------------------------- server commands


def cmd_scheduler(args) -> int:
    """`xirang scheduler`: run the scheduler (leader or hot standby) until stopped."""
    from agents.scheduler import run_scheduler
    from core.model.policy import PolicyError
    from xirang.policy_file import read_policy_file

    params = None
    if args.policy:
        try:
            params = read_policy_file(args.policy)
        except (OSError, PolicyError) as err:
            raise _user_error(str(err)) from err
    signer, keyring = scheduler_keys(args)
    _logging(args)
    # Two processes under one id would both hold the lease (it names the id): one per
    # folder and id. Schedulers under other ids are hot standbys, fenced on the log.
    lock = (
        _hold(
            InstanceLock(
                Path(args.data_dir) / f"scheduler-{args.id}.lock",
                f"a scheduler with id {args.id} in {args.data_dir}",
            )
        )
        if args.id
        else None
    )
    url, server = server_url(args)
    try:
        asyncio.run(
            run_scheduler(
                url,
                instance=args.id,
                tick_ms=args.tick_ms,
                group_max=args.group_max,
                node_timeout_ms=args.node_timeout_ms,
                lease_ms=args.lease_ms,
                snapshot_every_events=args.snapshot_every_events,
                policy=params,
                linger_ms=args.linger_ms,
                signer=signer,
                keyring=keyring,
            )
        )
    finally:
        if server:
            server.stop()
        if lock:
            lock.release()
    return 0


def scheduler_keys(args):
    """The scheduler's signing key and the keys it trusts (its own plus the keyring's)."""
    from trust.signing import KeyFileError, KeyRing, find_keyring, find_signer

    signing_key = args.signing_key or os.environ.get("XIRANG_SIGNING_KEY")
    try:
        signer = find_signer(signing_key, args.data_dir, create=True)
        ring = find_keyring(args.public_key, args.data_dir)
        if (
            ring is None and signing_key
        ):  # the keyring beside the key (`xirang key rotate` keeps old keys there)
            beside = Path(signing_key).resolve().parent / "scheduler.pub"
            ring = KeyRing.load(beside) if beside.exists() else None
    except KeyFileError as err:
        raise _user_error(str(err)) from err
    keys = dict(ring.keys) if ring else {}
    keys.update(signer.keyring().keys)
    return signer, KeyRing(keys, ring.adopted if ring else None)


def checkpoint_secret(path: str | None, data_dir: str) -> bytes:
    """The hosts' checkpoint secret: the named file, else DATA_DIR/keys/checkpoint.secret
    (made on first use, mode 0600)."""
    from trust.durable import PRIVATE_MODE, make_private_folder, write_durably

    secret_path = Path(path) if path else Path(data_dir) / "keys" / "checkpoint.secret"
    if not secret_path.exists():
        if path:
            raise _user_error(f"no checkpoint secret at {path}")
        make_private_folder(secret_path.parent)  # keys/: the scheduler's signing key lives there too
        try:  # whole or absent, even after a power cut; 0600 from its first moment
            write_durably(secret_path, (os.urandom(32).hex() + "\n").encode(), PRIVATE_MODE, exclusive=True)
        except FileExistsError:
            pass  # another agent made it meanwhile
    text = secret_path.read_text().strip()
    if not text:  # an older version's half-made file (it was written in place, unsynced)
        raise _user_error(
            f"the checkpoint secret {secret_path} is empty: remove it, a new one is made "
            "(checkpoints signed with the empty one will no longer verify)"
        )
    return bytes.fromhex(text)


def job_minter(ttl_s: float):
    """What mints each job run's own NATS user: the job signing key in the agent's creds
    file; None on an open server (no creds)."""
    from trust.natsauth import CREDS_ENV, JobMinter, RosterError

    path = os.environ.get(CREDS_ENV)
    try:
        minter = JobMinter.from_creds(path, ttl_s)
    except RosterError as err:
        raise _user_error(str(err)) from err
    if path and minter is None:
        raise _user_error(
            f"{path} holds no job signing key: a host agent needs the creds file of a "
            f"`xirang nats add-user host NODE` user (its jobs get credentials minted with it)"
        )
    return minter


def _disk_options(p, auto: bool) -> None:
    sized = " (default: an eighth of the data folder's free space, at most %s)" if auto else " (default %s)"
    p.add_argument(
        "--job-output-max-mb",
        type=float,
        default=None,
        help="output (stdout and stderr) each job run keeps on disk, rotated beyond it"
        + sized % OUTPUT_MAX_MB,
    )
    p.add_argument(
        "--disk-floor-mb",
        type=float,
        default=None,
        help="free space below which a host takes no new runs and drops job output, left to "
        "the bus and the agent" + sized % DISK_FLOOR_MB,
    )


OUTPUT_MAX_MB = 64
DISK_FLOOR_MB = 16


def disk_limits(args, folder: str) -> tuple[int, int]:
    """(job output max, disk floor) in bytes: as given, else the defaults, or for `xirang
    up` (sharing one disk with the bus's store) each at most an eighth of the free space."""
    from agents.diskwatch import free_bytes

    cap_mb = OUTPUT_MAX_MB
    floor_mb = DISK_FLOOR_MB
    if getattr(args, "func", None) is cmd_up:
        Path(folder).mkdir(parents=True, exist_ok=True)
        eighth_mb = free_bytes(folder) / 8 / 2**20
        cap_mb, floor_mb = min(cap_mb, eighth_mb), min(floor_mb, eighth_mb)
    for name, value in (
        ("--job-output-max-mb", args.job_output_max_mb),
        ("--disk-floor-mb", args.disk_floor_mb),
    ):
        if value is not None and not (value > 0 and value < float("inf")):
            raise _user_error(f"{name} must be a positive number of MiB, got {value}")
    cap_mb = args.job_output_max_mb if args.job_output_max_mb is not None else cap_mb
    floor_mb = args.disk_floor_mb if args.disk_floor_mb is not None else floor_mb
    return max(4096, int(cap_mb * 2**20)), int(floor_mb * 2**20)


def cmd_agent(args) -> int:
    """`xirang agent`: run a GPU host agent until stopped."""
    from agents.gpus import NoGpus, discover, parse_simulate
    from agents.host import StateFileError, run_host
    from agents.jobuser import JobUserError, resolve_job_users

    try:
        inventory = parse_simulate(args.simulate) if args.simulate else discover()
    except (ValueError, NoGpus) as err:
        raise _user_error(str(err)) from err
    if args.gpu_model:
        inventory.model = args.gpu_model
    try:
        hosts_dir = Path(args.data_dir) / "hosts"
        job_user = resolve_job_users(
            args.job_user, args.job_uid_range, lock_path=hosts_dir / ".job-uids.lock"
        )
    except JobUserError as err:
        raise _user_error(str(err)) from err
    _logging(args)
    url, server = server_url(args)
    try:
        from trust.signing import keyring_path

        asyncio.run(
            run_host(
                url,
                node=args.node,
                inventory=inventory,
                state_dir=hosts_dir,
                grace_s=args.grace_s,
                keyring_path=keyring_path(args.public_key, args.data_dir),
                job_minter=job_minter(args.job_creds_ttl_s),
                ckpt_secret=checkpoint_secret(args.ckpt_secret_file, args.data_dir),
                job_user=job_user,
                advertise_addr=args.advertise_addr,
                ckpt_roots=args.ckpt_root or None,
                **dict(zip(("output_max_bytes", "disk_floor_bytes"), disk_limits(args, args.data_dir))),
            )
        )
    except (AlreadyRunning, JobUserError, StateFileError) as err:
        raise _user_error(str(err)) from err
    finally:
        if server:
            server.stop()
    return 0


def cmd_up(args) -> int:
    """`xirang up`: embedded NATS, the scheduler and N simulated hosts, until Ctrl-C."""
    specs = [s for s in args.simulate.split(",") if s]
    from agents.gpus import parse_simulate

    try:
        for spec in specs:
            parse_simulate(spec)
    except ValueError as err:
        raise _user_error(str(err)) from err
    if args.hosts < 0 or not specs:
        raise _user_error("--hosts must be >= 0 and --simulate must name at least one inventory")
    if args.policy:
        from core.model.policy import PolicyError
        from xirang.policy_file import read_policy_file

        try:
            read_policy_file(args.policy)  # the scheduler reads it again; its notes go to its log
        except (OSError, PolicyError) as err:
            raise _user_error(str(err)) from err
    # Before anything is started or written: a second `up` in a folder in use changes nothing.
    lock = _hold(InstanceLock(Path(args.data_dir) / "up.lock", f"xirang up in {args.data_dir}"))
    url, server = server_url(args)
    from agents.cluster import start_cluster, stop_cluster

    output_max, disk_floor = disk_limits(args, args.data_dir)
    children = start_cluster(
        url,
        args.data_dir,
        args.hosts,
        specs,
        policy=args.policy,
        tick_ms=args.tick_ms,
        extra_agent=[
            "--job-output-max-mb",
            f"{output_max / 2**20:g}",
            "--disk-floor-mb",
            f"{disk_floor / 2**20:g}",
        ],
    )
    info = {
        "nats": url,
        "data_dir": str(Path(args.data_dir).resolve()),
        "pids": {name: proc.pid for name, proc in children},
        "nats_pid": server.proc.pid if server else None,
    }
    print(
        json.dumps(info)
        if args.json
        else f"xirang up: NATS {url}; scheduler and {args.hosts} host(s) running "
        f"(pids {', '.join(str(p.pid) for _, p in children)}). Ctrl-C stops them.",
        flush=True,
    )
    stop = {"flag": False}

    def _on_signal(_sig, _frame):
        stop["flag"] = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    from agents.storewatch import StoreWatch

    watch = StoreWatch(server, disk_floor, say=lambda words: print(words, flush=True)) if server else None
    try:
        while not stop["flag"]:
            time.sleep(0.2)
            if watch is not None:
                watch.tick()
    finally:
        from agents.host import stop_job_processes

        stop_cluster(children)  # agents checkpoint their SDK jobs, which are requeued
        stop_job_processes(args.data_dir)  # any the agents could not stop go with them
        if server:
            server.stop()
        lock.release()
    return 0


def _hold(lock):
    """Take an instance lock, or stop with the holder's name."""
    try:
        return lock.acquire()
    except AlreadyRunning as err:
        raise _user_error(str(err)) from err


def cmd_demo(args) -> int:
    """`xirang demo`: the end-to-end demonstration."""
    from agents.demo import run_demo
    from agents.interrupts import stop_signals_raise

    with stop_signals_raise():  # SIGTERM too unwinds, so the demo stops what it started
        return run_demo(out_dir=args.out, as_json=args.json)
