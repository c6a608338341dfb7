"""`xirang bench replay --json`: projection rebuild throughput against raw reads of XR_EV.

One run, one embedded nats-server, one stream: the log of a synthetic workload (made by
`core.step` through the simulator: `replay.synthetic_log`) is appended the way the scheduler appends it
(log copy plus host copies, atomic batches). Then, alternating so that neither side gets
a warmer machine, it times
- raw reads: an ordered consumer on `xr.ev.log.>` handing over (seq, payload) batches,
  doing nothing with them;
- a rebuild: the same reader feeding the projector into a fresh DuckDB file, every batch
  committed with its position;
and reports the best of each. Target: rebuild >= 50% of raw reads. Ctrl-C or SIGTERM stops
it within a few seconds, its nats-server and temporary folder gone (exit 130 or 143).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from agents.interrupts import run_until_stopped
from transport import bus
from transport.natsd import EmbeddedNats
from core import types as T

from .logsource import publish_records, read_batches
from .projector import Projector
from replay.synthetic_log import Spec, generate

TARGET_RATIO = 0.5
ROUNDS = 2


async def _raw(js) -> tuple[int, float]:
    began = time.perf_counter()
    count = 0
    async for batch in read_batches(js, 1):
        count += len(batch)
    return count, time.perf_counter() - began


async def _rebuild(js, db: str) -> tuple[int, float]:
    began = time.perf_counter()
    proj = Projector(db)
    count = 0
    async for batch in read_batches(js, 1):
        count += await asyncio.to_thread(proj.apply, batch)
    proj.con.close()
    return count, time.perf_counter() - began


async def _measure(records: list[T.Record], tmp: str) -> dict:
    with EmbeddedNats(os.path.join(tmp, "nats")) as server:
        nc, js = await bus.connect(server.url)
        try:
            await bus.ensure_streams(js)
            began = time.perf_counter()
            last_seq = await publish_records(nc, js, records, writer="bench")
            publish_s = time.perf_counter() - began
            raw_rates, rebuild_rates = [], []
            for round_no in range(ROUNDS):
                n, secs = await _raw(js)
                assert n == len(records), f"raw read {n} of {len(records)} records"
                raw_rates.append(n / secs)
                n, secs = await _rebuild(js, os.path.join(tmp, f"rebuild-{round_no}.duckdb"))
                assert n == len(records), f"rebuild applied {n} of {len(records)} records"
                rebuild_rates.append(n / secs)
        finally:
            await nc.close()
    return {
        "stream_messages": last_seq,
        "publish_s": round(publish_s, 3),
        "raw_reads_per_s": [round(r) for r in raw_rates],
        "rebuild_records_per_s": [round(r) for r in rebuild_rates],
    }


def _file_rate(records: list[T.Record], tmp: str) -> float:
    items = [(i, T.encode_record(r)) for i, r in enumerate(records, 1)]
    proj = Projector(os.path.join(tmp, "file.duckdb"))
    began = time.perf_counter()
    for i in range(0, len(items), 5000):
        proj.apply(items[i : i + 5000])
    rate = len(items) / (time.perf_counter() - began)
    proj.con.close()
    return rate


def run(args) -> dict:
    """`xirang bench replay`: publish a synthetic log to an embedded nats-server, then time raw
    reads against projection rebuilds."""
    jobs = 150 if getattr(args, "quick", False) else 2500
    began = time.perf_counter()
    records = generate(Spec(jobs=jobs, seed=11)).records
    generate_s = time.perf_counter() - began
    with tempfile.TemporaryDirectory(prefix="xirang-bench-replay-") as tmp:
        measured = run_until_stopped(_measure(records, tmp))  # Ctrl-C/SIGTERM stop its nats-server
        file_rate = _file_rate(records, tmp)
    raw = max(measured["raw_reads_per_s"])
    rebuild = max(measured["rebuild_records_per_s"])
    ratio = rebuild / raw
    return {
        "bench": "replay",
        "records": len(records),
        "jobs": jobs,
        "generate_s": round(generate_s, 3),
        **measured,
        "raw_reads_per_s_best": raw,
        "rebuild_records_per_s_best": rebuild,
        "rebuild_over_raw": round(ratio, 3),
        "target_ratio": TARGET_RATIO,
        "ok": ratio >= TARGET_RATIO,
        "projector_only_records_per_s": round(file_rate),
    }
