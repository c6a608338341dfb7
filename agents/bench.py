"""`xirang bench bus --json`: the live path's speed, measured side by side in one run on one
embedded nats-server (`sync_interval: always`).

- raw: pipelined JetStream publishes of the same submit inputs to a scratch stream
  configured like XR_IN: the ceiling any client sees;
- end to end: the same inputs published the same way to XR_IN, with the scheduler (a
  separate process) stepping them and appending their records to XR_EV in group commits;
  counted until the last input's records are in the log;
- preemption latency: a level-0 job submitted on a full host of training jobs (the
  example, with the SDK) until its start is requested, and the same less the victims'
  checkpoint time (notice to recorded checkpoint), which belongs to the job, not to us.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from nats.js import api

from core import types as T

from transport import bus
from .interrupts import run_until_stopped
from .local_cluster import FAST_POLICY, Cluster, matching, scratch_folder, sleep_command, train_command

RAW_STREAM = "XR_BENCH_RAW"


def _inputs(count: int, prefix: str) -> list[bytes]:
    out = []
    for i in range(count):
        inp = T.Submit(
            job=f"{prefix}-{i}",
            team=f"team-{i % 7}",
            user=f"user-{i % 13}",
            level=3 + i % 5,
            gpus=1 + i % 4,
            gpu_models=["H100"],
            est_runtime_s=3600,
            id=f"{prefix}-{i}",
        )
        out.append(T.encode(inp))
    return out


async def publish_pipelined(js, subject_of, payloads: list[bytes], ids: list[str]) -> float:
    """Publish `payloads` (deduplicated by `ids`) without waiting for each ack; seconds taken."""
    started = time.perf_counter()
    futures = []
    for data, msg_id in zip(payloads, ids):
        futures.append(
            await js.publish_async(subject_of(data), data, headers={"Nats-Msg-Id": msg_id}, wait_stall=30)
        )
    await asyncio.gather(*futures)
    return time.perf_counter() - started


async def _raw(js, count: int, tag: str) -> dict:
    await js.add_stream(
        api.StreamConfig(
            name=RAW_STREAM, subjects=["bench.raw.>"], storage=api.StorageType.FILE, duplicate_window=600
        )
    )
    payloads = _inputs(count, tag)
    elapsed = await publish_pipelined(
        js, lambda _d: "bench.raw.submit", payloads, [f"{tag}-{i}" for i in range(count)]
    )
    await js.delete_stream(RAW_STREAM)
    return {"messages": count, "seconds": round(elapsed, 3), "per_s": round(count / elapsed, 1)}


async def _pool(js) -> None:
    for i in range(8):  # a pool for the jobs; most still queue
        await bus.send_input(js, T.NodeUp(node=f"bench-{i}", gpu_model="H100", gpus=8))
    await bus.wait_for(lambda: _log_has_nodes(js, 8), 30)


async def _end_to_end(js, count: int, tag: str) -> dict:
    payloads = _inputs(count, tag)
    target = await bus.stream_last_seq(js, bus.IN_STREAM) + count
    started = time.perf_counter()
    published_s = await publish_pipelined(
        js, lambda _d: f"{bus.IN_PREFIX}.submit", payloads, [f"{tag}-{i}" for i in range(count)]
    )
    # Poll the log's tail rather than follow it: a follower would steal the publisher's CPU.
    deadline = time.perf_counter() + 120
    while await last_input_seq(js) < target:
        if time.perf_counter() > deadline:
            raise TimeoutError("the scheduler did not catch up within 120 s")
        await asyncio.sleep(0.002)
    elapsed = time.perf_counter() - started
    return {
        "inputs": count,
        "seconds": round(elapsed, 3),
        "per_s": round(count / elapsed, 1),
        "publish_seconds": round(published_s, 3),
    }


async def last_input_seq(js) -> int:
    """The XR_IN sequence of the last input whose records are in the log."""
    last = await bus.stream_last_seq(js, bus.EV_STREAM)
    for seq in range(last, max(0, last - 50), -1):  # a tick's records carry input_seq 0
        seen = T.decode_record((await js.get_msg(bus.EV_STREAM, seq)).data).input_seq
        if seen:
            return seen
    return 0


async def _throughput(url: str, count: int, rounds: int) -> dict:
    """Raw and end-to-end rounds interleaved, so both see the same machine load."""
    nc, js = await bus.connect(url)
    await bus.ensure_streams(js)
    await _pool(js)
    raw, e2e = [], []
    for r in range(rounds):
        raw.append(await _raw(js, count, f"raw{r}"))
        e2e.append(await _end_to_end(js, count, f"e2e{r}"))
    raw.append(await _raw(js, count, f"raw{rounds}"))
    log_messages = await bus.stream_last_seq(js, bus.EV_STREAM)
    await nc.close()
    raw_per_s = statistics.median(x["per_s"] for x in raw)
    e2e_per_s = statistics.median(x["per_s"] for x in e2e)
    return {
        "raw_pipelined_publish": {"rounds": raw, "median_per_s": raw_per_s},
        "end_to_end": {"rounds": e2e, "median_per_s": e2e_per_s, "log_messages": log_messages},
        "end_to_end_vs_raw": round(e2e_per_s / raw_per_s, 3),
    }


async def _log_has_nodes(js, n: int) -> bool:
    records = await bus.all_records(js)
    return sum(isinstance(r.event, T.NodeJoined) for _, r in records) >= n


def _preemption_latency(root: Path, rounds: int) -> dict:
    samples, net = [], []
    # Resumed victims may be preempted again at once, so every round finds the same victims.
    with Cluster(root, tick_ms=200, policy=FAST_POLICY + "min_run_after_restart_ms = 0\n") as c:
        c.scheduler("bench")
        c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1", timeout_s=30)
        victims = [
            T.Submit(
                job=f"victim-{i}",
                team=f"t{i}",
                user=f"u{i}",
                level=6,
                gpus=4,
                gpu_models=["H100"],
                est_runtime_s=600,
                ckpt_interval_s=60,
                ckpt_cost_s=1,
                restore_cost_s=1,
                command=train_command(1_000_000, step_ms=10, seed=i),
            )
            for i in range(2)
        ]
        c.send(*victims)
        for r in range(rounds):
            c.wait(
                lambda rs: all(len(matching(rs, T.JobRunning, job=v.job)) == r + 1 for v in victims),
                timeout_s=30,
                what="victims running",
            )
            time.sleep(2.0)  # the SDK is loaded and training
            job = f"urgent-{r}"
            submitted_ms = int(time.time() * 1000)
            c.send(
                T.Submit(
                    job=job,
                    team="ops",
                    user="kim",
                    level=0,
                    gpus=8,
                    gpu_models=["H100"],
                    est_runtime_s=5,
                    command=sleep_command(0.5),
                )
            )
            records = c.wait_for(T.JobStartRequested, job=job, timeout_s=30)
            start = matching(records, T.JobStartRequested, job=job)[0].event
            saga = matching(records, T.PreemptionPlanned, preemptor=job)[0].event
            ckpt_ms = 0
            for victim in saga.victims:
                began = [
                    x.event.t for x in matching(records, T.CheckpointBegan, job=victim) if x.event.t >= saga.t
                ]
                saved = [
                    x.event.t
                    for x in matching(records, T.CheckpointRecorded, job=victim)
                    if x.event.t >= saga.t
                ]
                if began and saved:
                    ckpt_ms = max(ckpt_ms, saved[0] - began[0])
            samples.append(start.t - submitted_ms)
            net.append(start.t - submitted_ms - ckpt_ms)
            c.wait_for(T.JobFinished, job=job, timeout_s=30)
        for v in victims:
            c.send(T.Cancel(job=v.job))
    return {
        "rounds": rounds,
        "victims": 2,
        "submit_to_start_ms": samples,
        "less_checkpoint_ms": net,
        "median_ms": statistics.median(samples),
        "median_less_checkpoint_ms": statistics.median(net),
    }


def run(args) -> dict:
    """`xirang bench bus`: raw publishes, end-to-end inputs to records, and preemption latency
    on a live local cluster; the numbers as a dict."""
    quick = bool(getattr(args, "quick", False))
    count, rounds = (300, 1) if quick else (3000, 3)
    with scratch_folder("xirang-bench-") as root:
        with Cluster(root / "bus", tick_ms=1000) as c:
            c.scheduler("bench")
            throughput = run_until_stopped(_throughput(c.url, count, rounds))
        latency = _preemption_latency(root / "preempt", 1 if quick else 3)
    return {
        "bench": "bus",
        "quick": quick,
        "sync_interval": "always",
        **throughput,
        "preemption_latency": latency,
        "python": sys.version.split()[0],
        "nats_server": subprocess.run(
            [str(Path(sys.executable).parent / "nats-server"), "--version"], capture_output=True, text=True
        ).stdout.strip(),
    }
