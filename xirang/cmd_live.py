"""The live system's command line: `xirang up | scheduler | agent | submit | jobs | queue |
cancel | demo`, all with `--nats URL` (default: `$XIRANG_NATS`, else the embedded server
that `xirang up` started, whose URL it leaves in `.xirang/nats.url`) and `--json`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

DATA_DIR_DEFAULT = ".xirang"
URL_FILE = "nats.url"
OUTCOME_TIMEOUT_S = 15.0


def register(sub) -> None:
    def common(p, server: bool = False) -> None:
        p.add_argument("--nats", metavar="URL", help="NATS server URL (default: $XIRANG_NATS, "
                       + ("else an embedded server" if server else "else the one `xirang up` started") + ")")
        p.add_argument("--json", action="store_true", help="machine-readable output")
        p.add_argument("--data-dir", default=DATA_DIR_DEFAULT, help="local folder (embedded NATS data, host state)")

    up = sub.add_parser("up", help="embedded NATS, the scheduler and N simulated hosts, until Ctrl-C")
    common(up, server=True)
    up.add_argument("--hosts", type=int, default=2, help="simulated hosts (default 2)")
    up.add_argument("--simulate", default="8xH100,8xA100",
                    help="inventories, comma separated, cycled over the hosts (default 8xH100,8xA100)")
    up.add_argument("--policy", help="policy TOML, applied through a set_policy input")
    up.add_argument("--tick-ms", type=int, default=1000)
    up.set_defaults(func=cmd_up)

    sched = sub.add_parser("scheduler", help="run the scheduler (leader or hot standby)")
    common(sched, server=True)
    sched.add_argument("--id", help="instance name (default: random)")
    sched.add_argument("--policy", help="policy TOML, applied through a set_policy input")
    sched.add_argument("--tick-ms", type=int, default=1000)
    sched.add_argument("--group-max", type=int, default=256, help="inputs per group commit")
    sched.add_argument("--linger-ms", type=float, default=5.0,
                       help="a burst of inputs waits this long to share one group commit")
    sched.add_argument("--node-timeout-ms", type=int, default=10_000)
    sched.add_argument("--lease-ms", type=int, default=3000)
    sched.add_argument("--snapshot-every-events", type=int, default=5000)
    sched.set_defaults(func=cmd_scheduler)

    agent = sub.add_parser("agent", help="run a GPU host agent")
    common(agent, server=True)
    agent.add_argument("--node", required=True, help="this host's name in the pool")
    agent.add_argument("--simulate", metavar="NxMODEL", help="simulated inventory, e.g. 8xH100")
    agent.add_argument("--gpu-model", help="override the discovered model name")
    agent.add_argument("--grace-s", type=float, default=10.0, help="SIGTERM to SIGKILL")
    agent.set_defaults(func=cmd_agent)

    submit = sub.add_parser("submit", help="submit a job; answers accepted or the rejection reason")
    common(submit)
    submit.add_argument("job")
    submit.add_argument("--team", required=True)
    submit.add_argument("--user", default=os.environ.get("USER", "user"))
    submit.add_argument("--level", type=int, required=True, help="0 (emergency) .. 7 (exploration)")
    submit.add_argument("--gpus", type=int, required=True)
    submit.add_argument("--gpu-model", action="append", default=[], help="acceptable model (repeatable)")
    submit.add_argument("--est-runtime-s", type=float)
    submit.add_argument("--ckpt-interval-s", type=float)
    submit.add_argument("--ckpt-cost-s", type=float)
    submit.add_argument("--restore-cost-s", type=float)
    submit.add_argument("--not-preemptible", action="store_true")
    submit.add_argument("--id", help="input id for deduplication (default: random)")
    submit.add_argument("--command", default="",
                        help='what the host runs, one shell-quoted string: "python train.py --steps 100"')
    submit.set_defaults(func=cmd_submit)

    cancel = sub.add_parser("cancel", help="cancel a job")
    common(cancel)
    cancel.add_argument("job")
    cancel.set_defaults(func=cmd_cancel)

    jobs = sub.add_parser("jobs", help="open jobs, from the log")
    common(jobs)
    jobs.set_defaults(func=cmd_jobs)

    queue = sub.add_parser("queue", help="queued and running jobs per level (squeue-like)")
    common(queue)
    queue.set_defaults(func=cmd_queue)

    demo = sub.add_parser("demo", help="the end-to-end demonstration (`make run`)")
    demo.add_argument("--out", help="folder for the log and files (default: a new temporary one)")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON")
    demo.set_defaults(func=cmd_demo)


# ---------------------------------------------------------------- URLs and servers


def _user_error(message: str):
    from xirang.cli import UserError

    return UserError(message)


def client_url(args) -> str:
    url = args.nats or os.environ.get("XIRANG_NATS")
    if url:
        return url
    path = Path(args.data_dir) / URL_FILE
    if path.exists():
        return path.read_text().strip()
    raise _user_error("no NATS server: start one with `xirang up` (in another terminal), "
                      "or pass --nats URL / set XIRANG_NATS")


def server_url(args):
    """(url, embedded server or None): an embedded server unless a URL was given."""
    url = args.nats or os.environ.get("XIRANG_NATS")
    if url:
        return url, None
    from agents.natsd import EmbeddedNats

    data = Path(args.data_dir)
    server = EmbeddedNats(data / "nats").start()
    (data / URL_FILE).write_text(server.url + "\n")
    return server.url, server


def _logging(args) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s",
                        stream=sys.stderr)


def _stop_children(children: list[subprocess.Popen], timeout_s: float = 10.0) -> None:
    for proc in children:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for proc in children:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)


# ---------------------------------------------------------------- server commands


def cmd_scheduler(args) -> int:
    from agents.scheduler import policy_params, run_scheduler
    from core.policy import PolicyError

    params = None
    if args.policy:
        try:
            params = policy_params(args.policy)
        except (OSError, PolicyError) as err:
            raise _user_error(str(err)) from err
    _logging(args)
    url, server = server_url(args)
    try:
        asyncio.run(run_scheduler(
            url, instance=args.id, tick_ms=args.tick_ms, group_max=args.group_max,
            node_timeout_ms=args.node_timeout_ms, lease_ms=args.lease_ms,
            snapshot_every_events=args.snapshot_every_events, policy=params, linger_ms=args.linger_ms))
    finally:
        if server:
            server.stop()
    return 0


def cmd_agent(args) -> int:
    from agents.gpus import NoGpus, discover, parse_simulate
    from agents.host import run_host

    try:
        inventory = parse_simulate(args.simulate) if args.simulate else discover()
    except (ValueError, NoGpus) as err:
        raise _user_error(str(err)) from err
    if args.gpu_model:
        inventory.model = args.gpu_model
    _logging(args)
    url, server = server_url(args)
    try:
        asyncio.run(run_host(url, node=args.node, inventory=inventory,
                             state_dir=Path(args.data_dir) / "hosts", grace_s=args.grace_s))
    finally:
        if server:
            server.stop()
    return 0


def cmd_up(args) -> int:
    specs = [s for s in args.simulate.split(",") if s]
    from agents.gpus import parse_simulate

    try:
        for spec in specs:
            parse_simulate(spec)
    except ValueError as err:
        raise _user_error(str(err)) from err
    if args.hosts < 0 or not specs:
        raise _user_error("--hosts must be >= 0 and --simulate must name at least one inventory")
    url, server = server_url(args)
    children = start_cluster(url, args.data_dir, args.hosts, specs, policy=args.policy, tick_ms=args.tick_ms)
    info = {"nats": url, "data_dir": str(Path(args.data_dir).resolve()),
            "pids": {name: proc.pid for name, proc in children},
            "nats_pid": server.proc.pid if server else None}
    print(json.dumps(info) if args.json else
          f"xirang up: NATS {url}; scheduler and {args.hosts} host(s) running "
          f"(pids {', '.join(str(p.pid) for _, p in children)}). Ctrl-C stops them.", flush=True)
    stop = {"flag": False}

    def _on_signal(_sig, _frame):
        stop["flag"] = True

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    try:
        while not stop["flag"]:
            time.sleep(0.2)
    finally:
        from agents.host import stop_job_processes

        _stop_children([proc for _, proc in children])
        stop_job_processes(args.data_dir)  # the simulated hosts' jobs go with them
        if server:
            server.stop()
    return 0


def start_cluster(url: str, data_dir, hosts: int, specs: list[str], policy: str | None = None,
                  tick_ms: int = 1000, log_dir: Path | None = None, node_names: list[str] | None = None,
                  extra_sched: list[str] | None = None) -> list[tuple[str, subprocess.Popen]]:
    """Start the scheduler and simulated hosts as OS processes; their output goes to files."""
    log_dir = Path(log_dir or Path(data_dir) / "logs")
    log_dir.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "xirang.cli"]
    children = []
    cmd = base + ["scheduler", "--nats", url, "--data-dir", str(data_dir), "--tick-ms", str(tick_ms)]
    if policy:
        cmd += ["--policy", policy]
    children.append(("scheduler", _spawn(cmd + (extra_sched or []), log_dir / "scheduler.log")))
    for i in range(hosts):
        spec = specs[i % len(specs)]
        name = node_names[i] if node_names else f"host-{i + 1}"
        cmd = base + ["agent", "--nats", url, "--data-dir", str(data_dir), "--node", name,
                      "--simulate", spec, "--grace-s", "5"]
        children.append((name, _spawn(cmd, log_dir / f"{name}.log")))
    return children


def _spawn(cmd: list[str], log_path: Path) -> subprocess.Popen:
    out = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out.close()
    return proc


# ---------------------------------------------------------------- client commands


def cmd_submit(args) -> int:
    from core import types as T

    try:
        command = shlex.split(args.command)
    except ValueError as err:
        raise _user_error(f"--command {args.command!r}: {err}") from err
    inp = T.Submit(job=args.job, team=args.team, user=args.user, level=args.level, gpus=args.gpus,
                   gpu_models=args.gpu_model, est_runtime_s=args.est_runtime_s,
                   ckpt_interval_s=args.ckpt_interval_s, ckpt_cost_s=args.ckpt_cost_s,
                   restore_cost_s=args.restore_cost_s, preemptible=not args.not_preemptible,
                   command=command, id=args.id or "")
    return _send_and_answer(args, inp)


def cmd_cancel(args) -> int:
    from core import types as T

    return _send_and_answer(args, T.Cancel(job=args.job))


def _send_and_answer(args, inp) -> int:
    url = client_url(args)
    try:
        answer = asyncio.run(send_and_wait(url, inp))
    except OSError as err:
        raise _user_error(f"cannot reach NATS at {url}: {err}") from err
    if args.json:
        print(json.dumps(answer, sort_keys=True))
    elif answer["outcome"] == "accepted":
        print(f"accepted: {answer['type']} {answer.get('job', '')} (input seq {answer['seq']})")
    elif answer["outcome"] == "rejected":
        print(f"rejected: {answer['reason']}" + (f" ({answer['detail']})" if answer.get("detail") else ""))
    else:
        print(f"{answer['outcome']}: {answer.get('detail', '')}")
    return {"accepted": 0, "rejected": 1}.get(answer["outcome"], 3)


async def send_and_wait(url: str, inp, timeout_s: float = OUTCOME_TIMEOUT_S) -> dict:
    """Send one input and wait for the scheduler's verdict on it in the log."""
    from nats.js import api

    from agents import bus
    from core import types as T

    nc, js = await bus.connect(url, reconnects=2)
    try:
        await bus.ensure_streams(js)
        start = await bus.stream_last_seq(js, bus.EV_STREAM)
        msg_id, seq, duplicate = await bus.send_input(js, inp)
        base = {"type": T.type_name(inp), "job": T.input_job(inp), "id": msg_id, "seq": seq}
        if duplicate:
            return {**base, "outcome": "duplicate", "detail": f"input id {msg_id} was sent before (seq {seq})"}
        found: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_msg(msg) -> None:
            record = T.decode_record(msg.data)
            if record.input_seq == seq and not found.done():
                found.set_result(record)

        sub = await js.subscribe(f"{bus.LOG_PREFIX}.>", stream=bus.EV_STREAM, ordered_consumer=True,
                                 cb=on_msg, config=api.ConsumerConfig(
                                     deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                     opt_start_seq=start + 1))
        try:
            record = await asyncio.wait_for(found, timeout_s)
        except asyncio.TimeoutError:
            return {**base, "outcome": "pending",
                    "detail": f"queued on XR_IN (seq {seq}) but no scheduler answered within {timeout_s:.0f} s"}
        finally:
            await sub.unsubscribe()
        ev = record.event
        if isinstance(ev, T.InputRejected):
            return {**base, "outcome": "rejected", "reason": ev.reason, "detail": ev.detail}
        return {**base, "outcome": "accepted", "record": record.n}
    finally:
        await nc.close()


def _load(args):
    from agents import bus

    url = client_url(args)

    async def go():
        nc, js = await bus.connect(url, reconnects=2)
        try:
            await bus.ensure_streams(js)
            state, _ = await bus.load_state(js)
            return state
        finally:
            await nc.close()

    try:
        return asyncio.run(go())
    except OSError as err:
        raise _user_error(f"cannot reach NATS at {url}: {err}") from err


def job_rows(state) -> list[dict]:
    from core.state import job_progress_ms, last_checkpoint

    rows = []
    for job_id in sorted(state.c.jobs):
        job = state.c.jobs[job_id]
        ckpt = last_checkpoint(job)
        rows.append({
            "job": job.id, "team": job.team, "user": job.user, "level": job.level,
            "eff_level": job.eff_level, "state": job.state, "gpus": job.gpus,
            "placement": [f"{s.node}:{','.join(map(str, s.gpus))}" for s in job.placement],
            "progress_s": round(job_progress_ms(job, state.c.t) / 1000, 1),
            "preempt_count": job.preempt_count, "checkpoint_step": ckpt.step if ckpt else None,
            "saga": job.saga,
        })
    return rows


def cmd_jobs(args) -> int:
    state = _load(args)
    rows = job_rows(state)
    if args.json:
        print(json.dumps({"jobs": rows, "done": dict(sorted(state.c.done.items()))}, sort_keys=True))
        return 0
    print(f"{'JOB':<20} {'TEAM':<10} {'LVL':>3} {'STATE':<11} {'GPUS':>4} {'PLACEMENT':<22} "
          f"{'PROG_S':>7} {'PREEMPT':>7} {'CKPT':>6}")
    for r in rows:
        lvl = f"{r['level']}" + (f"^{r['eff_level']}" if r["eff_level"] != r["level"] else "")
        print(f"{r['job']:<20} {r['team']:<10} {lvl:>3} {r['state']:<11} {r['gpus']:>4} "
              f"{' '.join(r['placement']) or '-':<22} {r['progress_s']:>7} {r['preempt_count']:>7} "
              f"{r['checkpoint_step'] if r['checkpoint_step'] is not None else '-':>6}")
    print(f"{len(rows)} open, {state.c.done_count} done")
    return 0


def cmd_queue(args) -> int:
    from core.queues import queue_order
    from core.state import HOLDING
    from core.types import LEVELS

    state = _load(args)
    c = state.c
    levels = []
    for level in range(LEVELS):
        order = queue_order(state, level, 10_000)
        running = [j for j in sorted(c.jobs) if c.jobs[j].state in HOLDING and c.jobs[j].eff_level == level]
        levels.append({
            "level": level, "policy": c.policy.queue_policy[level],
            "queued": [{"job": j, "team": c.jobs[j].team, "user": c.jobs[j].user, "gpus": c.jobs[j].gpus,
                        "wait_s": round((c.t - c.jobs[j].queued_since_t) / 1000, 1)} for j in order],
            "holding": [{"job": j, "state": c.jobs[j].state, "gpus": c.jobs[j].gpus} for j in running],
        })
    if args.json:
        print(json.dumps({"t": c.t, "levels": levels}, sort_keys=True))
        return 0
    print(f"{'LVL':>3} {'POLICY':<12} {'POS':>3} {'JOB':<20} {'TEAM':<10} {'USER':<8} {'GPUS':>4} {'ST':<10} {'WAIT_S':>7}")
    for lv in levels:
        for pos, q in enumerate(lv["queued"], 1):
            print(f"{lv['level']:>3} {lv['policy']:<12} {pos:>3} {q['job']:<20} {q['team']:<10} "
                  f"{q['user']:<8} {q['gpus']:>4} {'queued':<10} {q['wait_s']:>7}")
        for h in lv["holding"]:
            job = c.jobs[h["job"]]
            print(f"{lv['level']:>3} {lv['policy']:<12} {'-':>3} {h['job']:<20} {job.team:<10} "
                  f"{job.user:<8} {h['gpus']:>4} {h['state']:<10} {'':>7}")
    free = sum(n.holder.count("") for n in c.nodes.values() if n.up)
    total = sum(n.gpus for n in c.nodes.values() if n.up)
    print(f"GPUs free {free}/{total}; sagas open {len(c.sagas)}")
    return 0


def cmd_demo(args) -> int:
    from agents.demo import run_demo

    return run_demo(out_dir=args.out, as_json=args.json)
