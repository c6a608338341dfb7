"""`xirang bench scale --json`: the live scheduler at frontier scale.

A real nats-server and the scheduler as its own OS process (agents/local_cluster.py), fed
through the bus the stream a pool of `--gpus` GPUs produces (default 100,000: 12,500
8-GPU hosts), hosts simulated in this process, which publishes what they would:

- filling: every host's `node_up`, two level-5 4-GPU jobs a node with each one's
  `started` fact right behind its submit, then `--pending` jobs queued behind them
  (xirang/bench_core.py's `full_pool_inputs`, the same stream `xirang bench core --gpus`
  steps in process), published pipelined; counted from the first publish until the
  scheduler has logged the last input's records;
- steady: the inputs a full pool sees all the time, interleaved: checkpoint facts of
  running jobs (started and saved) and level-6 submits that queue; counted the same way;
- decisions: level-1 8-GPU jobs submitted one at a time into the full pool; each is timed
  from its publish until the scheduler's PreemptionPlanned for it is in the log (and from
  the time the scheduler took it, the `t` it stamped, to this process seeing the record,
  and to the server storing it, its atomic batch committed: the last is the scheduler's
  share alone, whatever delays this process, which also publishes the heartbeats), then
  cancelled.

Hosts answer no decisions here (a notified victim never reaches its safe point; the
cancel rolls the saga back), and do not heartbeat: the scheduler's host timeout is set
past the run, so silence is not taken for a lost host. Its ticks (one a second), group
commits, signing and snapshots all run as they do in production.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

from nats.js.errors import NotFoundError

from core import types as T
from transport import bus
from xirang.bench_core import GPUS_PER_NODE, full_pool_inputs, parse_sizes, urgent_submit

from agents.bench import last_input_seq, publish_pipelined
from agents.interrupts import run_until_stopped
from agents.local_cluster import Cluster, scratch_folder

# Hosts do not heartbeat in this benchmark: their timeout outlasts any run of it.
HOST_TIMEOUT_MS = 24 * 3_600_000
APPLY_TIMEOUT_S = 1800.0


def _progress(message: str) -> None:
    print(f"bench scale: {message}", file=sys.stderr, flush=True)


def run(args) -> dict:
    """`xirang bench scale`: inputs per second and decision latency of the live scheduler
    fed a synthetic pool's stream; the numbers as a dict."""
    quick = bool(getattr(args, "quick", False))
    gpus_sizes = parse_sizes(getattr(args, "gpus", None), "--gpus") or [800 if quick else 100_000]
    pendings = parse_sizes(getattr(args, "pending", None), "--pending") or [100 if quick else 10_000]
    samples = 3 if quick else 10
    steady = 300 if quick else 3_000
    heartbeats = bool(getattr(args, "heartbeats", False))
    results = []
    with scratch_folder("xirang-bench-scale-") as tmp:
        for gpus in gpus_sizes:
            for pending in pendings:
                root = Path(tmp) / f"{gpus}-{pending}"
                with Cluster(root, tick_ms=1000, node_timeout_ms=HOST_TIMEOUT_MS) as cluster:
                    cluster.scheduler("bench")
                    results.append(
                        run_until_stopped(measure(cluster.url, gpus, pending, samples, steady, heartbeats))
                    )
    return {"bench": "scale", "quick": quick, "sizes": results, "python": sys.version.split()[0]}


async def measure(
    url: str, gpus: int, pending: int, samples: int, steady: int, heartbeats: bool = False
) -> dict:
    """Fill the pool through the bus, then time a steady stream and `samples` decisions; with
    `heartbeats`, then the same again while every host beats once a second."""
    nc, js = await bus.connect(url)
    try:
        await bus.ensure_streams(js)
        what = f"{gpus} GPUs, {pending} pending"
        await _leader_ready(js)
        fill = list(full_pool_inputs(gpus, pending))
        _progress(f"{what}: publishing {len(fill)} inputs that fill the pool")
        filling = await _stream(js, fill, "fill", what)
        running = [f"run-{i}" for i in range(gpus // GPUS_PER_NODE * 2)]
        _progress(f"{what}: a steady stream of {steady} inputs")
        steady_result = await _stream(js, _steady_inputs(running, steady, "steady"), "steady", what)
        _progress(f"{what}: {samples} preemption decisions")
        decisions = await _decisions(nc, js, samples, what, first=0)
        beating = None
        if heartbeats:
            beating = await _with_heartbeats(nc, js, gpus // GPUS_PER_NODE, running, samples, steady, what)
    finally:
        await nc.close()
    result = {
        "gpus": gpus,
        "nodes": gpus // GPUS_PER_NODE,
        "running_jobs": len(running),
        "pending": pending,
        "filling": filling,
        "steady": steady_result,
        "decision": decisions,
    }
    if beating is not None:
        result["with_heartbeats"] = beating
    return result


async def _with_heartbeats(
    nc, js, nodes: int, running: list[str], samples: int, steady: int, what: str
) -> dict:
    """The steady stream and the decisions again, while every host of the pool publishes its
    heartbeat once a second (a host agent's body, on its own `xr.hb.<node>` subject)."""
    stop = asyncio.Event()
    sent = [0]
    began = time.monotonic()
    beats = asyncio.create_task(_heartbeats(nc, [f"n{i:05d}" for i in range(nodes)], stop, sent))
    try:
        await asyncio.sleep(2.0)  # the beats are flowing before anything is timed
        _progress(f"{what}: with {nodes} hosts beating, a steady stream of {steady} inputs")
        steady_result = await _stream(
            js, _steady_inputs(running, steady, "steady-hb", first_step=steady), "steady-hb", what
        )
        _progress(f"{what}: with {nodes} hosts beating, {samples} preemption decisions")
        decisions = await _decisions(nc, js, samples, what, first=samples)
    finally:
        stop.set()
        await beats
    return {
        "hosts": nodes,
        "heartbeats_per_s": round(sent[0] / (time.monotonic() - began), 1),
        "steady": steady_result,
        "decision": decisions,
    }


async def _heartbeats(nc, nodes: list[str], stop: asyncio.Event, sent: list[int]) -> None:
    """Each node's heartbeat once a second until `stop`, spread over the second."""
    bodies = [
        (
            f"{bus.HB_PREFIX}.{bus.node_token(name)}",
            json.dumps(
                {"healthy": True, "problem": "", "node": name, "gpu_model": "A100", "gpus": GPUS_PER_NODE}
                | {"jobs": [], "t": 0, "instance": "bench", "pid": 0, "host": "bench"}
            ).encode(),
        )
        for name in nodes
    ]
    chunk = max(1, len(bodies) // 20)
    while not stop.is_set():
        second_began = time.monotonic()
        for start in range(0, len(bodies), chunk):
            for subject, body in bodies[start : start + chunk]:
                await nc.publish(subject, body)
            sent[0] += len(bodies[start : start + chunk])
            await asyncio.sleep(max(0.0, second_began + (start + chunk) / len(bodies) - time.monotonic()))
            if stop.is_set():
                return


def _steady_inputs(running: list[str], count: int, prefix: str, first_step: int = 0) -> list[T.Input]:
    """Checkpoint facts of running jobs (started, then saved) and, one input in five, a
    level-6 submit that queues behind the full pool."""
    out: list[T.Input] = []
    i = 0
    while len(out) < count:
        if i % 3 == 2:
            out.append(
                T.Submit(
                    job=f"{prefix}-{i}",
                    team=f"team-{i % 16}",
                    user=f"user-{i % 64}",
                    level=6,
                    gpus=4,
                    gpu_models=["A100"],
                    est_runtime_s=3600,
                )
            )
        else:
            job = running[i * 7919 % len(running)]
            out.append(T.CheckpointStarted(job=job))
            out.append(
                T.CheckpointSaved(job=job, step=first_step + i + 1, digest=f"sha256:{i:064x}", bytes=1 << 30)
            )
        i += 1
    return out[:count]


async def _leader_ready(js, timeout_s: float = 60.0) -> None:
    """Wait until the scheduler leads: its first records (SchedulerStarted) are in the log."""
    deadline = time.monotonic() + timeout_s
    while await bus.stream_last_seq(js, bus.EV_STREAM) == 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the scheduler did not start leading within {timeout_s} s")
        await asyncio.sleep(0.05)


async def _stream(js, inputs: list[T.Input], tag: str, what: str) -> dict:
    """Publish `inputs` pipelined and wait until the scheduler has logged the last one's
    records; the rate is counted over that whole time."""
    target = await bus.stream_last_seq(js, bus.IN_STREAM) + len(inputs)
    payloads = [T.encode(inp) for inp in inputs]
    subjects = {data: bus.input_subject(inp) for data, inp in zip(payloads, inputs)}
    ids = [f"{tag}-{i}" for i in range(len(inputs))]
    started = time.perf_counter()
    publisher = asyncio.create_task(publish_pipelined(js, subjects.__getitem__, payloads, ids))
    applied, shown = 0, started
    deadline = started + APPLY_TIMEOUT_S
    while applied < target:
        if time.perf_counter() > deadline:
            publisher.cancel()
            raise TimeoutError(f"the scheduler did not log {len(inputs)} inputs within {APPLY_TIMEOUT_S} s")
        await asyncio.sleep(0.1)
        applied = await last_input_seq(js)
        if time.perf_counter() - shown >= 5:
            shown = time.perf_counter()
            done = applied - (target - len(inputs))
            _progress(
                f"{what}: {tag} {done} of {len(inputs)} inputs logged ({done / (shown - started):.0f}/s)"
            )
    elapsed = time.perf_counter() - started
    published_s = await publisher
    return {
        "inputs": len(inputs),
        "seconds": round(elapsed, 3),
        "inputs_per_s": round(len(inputs) / elapsed, 1),
        "publish_seconds": round(published_s, 3),
    }


async def _decisions(nc, js, samples: int, what: str, first: int) -> dict:
    planned: asyncio.Queue = asyncio.Queue()
    cancelled: asyncio.Queue = asyncio.Queue()

    async def on_planned(msg) -> None:
        planned.put_nowait((time.time() * 1000, T.decode_record(msg.data).event))

    async def on_cancelled(msg) -> None:
        cancelled.put_nowait(T.decode_record(msg.data).event)

    subs = [
        await nc.subscribe(f"{bus.LOG_PREFIX}.PreemptionPlanned", cb=on_planned),
        await nc.subscribe(f"{bus.LOG_PREFIX}.JobCancelled", cb=on_cancelled),
    ]
    await nc.flush()
    submit_to_logged, taken_to_logged, taken_to_stored = [], [], []
    try:
        for s in range(samples):
            urgent = urgent_submit(0, first + s)
            published_ms = time.time() * 1000
            await bus.send_input(js, urgent)
            seen_ms, event = await _next_of(planned, urgent.job, "preemptor")
            submit_to_logged.append(seen_ms - published_ms)
            taken_to_logged.append(seen_ms - event.t)
            taken_to_stored.append(await _stored_ms(js, urgent.job) - event.t)
            await bus.send_input(js, T.Cancel(job=urgent.job))
            await _next_of(cancelled, urgent.job, "job")
            _progress(f"{what}: decision {s + 1}: {submit_to_logged[-1]:.0f} ms from its publish to the log")
    finally:
        for sub in subs:
            await sub.unsubscribe()
    return {
        "samples": samples,
        "submit_to_logged_median_ms": round(statistics.median(submit_to_logged), 1),
        "submit_to_logged_max_ms": round(max(submit_to_logged), 1),
        "taken_to_logged_median_ms": round(statistics.median(taken_to_logged), 1),
        "taken_to_stored_median_ms": round(statistics.median(taken_to_stored), 1),
        "taken_to_stored_max_ms": round(max(taken_to_stored), 1),
    }


async def _stored_ms(js, job: str, timeout_s: float = 60.0) -> float:
    """When the server stored the PreemptionPlanned of `job` (its clock, this machine's):
    the scheduler's share of a decision, whatever delays this process's reading of the log.
    A subscriber sees an atomic batch's messages as they are sent, before the batch is
    committed, so this waits for the stored one."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stored = await js.get_last_msg(bus.EV_STREAM, f"{bus.LOG_PREFIX}.PreemptionPlanned")
        except NotFoundError:
            stored = None  # none stored yet
        if stored is not None and T.decode_record(stored.data).event.preemptor == job:
            return stored.time.timestamp() * 1000
        if time.monotonic() > deadline:
            raise TimeoutError(f"the PreemptionPlanned of {job} was not stored within {timeout_s} s")
        await asyncio.sleep(0.005)


async def _next_of(queue: asyncio.Queue, job: str, field: str, timeout_s: float = 300.0):
    """The next item on `queue` about `job` (an event whose `field` names it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        item = await asyncio.wait_for(queue.get(), timeout=max(0.1, deadline - time.monotonic()))
        event = item[1] if isinstance(item, tuple) else item
        if getattr(event, field) == job:
            return item
