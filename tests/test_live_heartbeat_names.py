"""A heartbeat counts for the node its subject names: a host (NATS lets each publish only on
`xr.hb.<its node>`) whose heartbeats name another node cannot keep that node alive, so a
dead host is still found out and its jobs requeued."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from agents.local_cluster import Cluster, matching, sleep_command
from agents.scheduler import heartbeat_node
from core import types as T
from transport import bus

pytestmark = pytest.mark.timeout(90)


def test_the_subject_decides_whose_heartbeat_it_is():
    assert heartbeat_node("xr.hb.h1", json.dumps({"node": "h1"}).encode()) == "h1"
    assert (
        heartbeat_node(f"xr.hb.{bus.node_token('gpu 1')}", json.dumps({"node": "gpu 1"}).encode()) == "gpu 1"
    )
    assert heartbeat_node("xr.hb.h2", json.dumps({"node": "h1"}).encode()) is None
    assert heartbeat_node("xr.hb.h2", b"not json") == "h2"
    assert heartbeat_node("xr.hb.h2", b"[1, 2]") == "h2"


def beat_as(url: str, subject: str, body: dict, stop: threading.Event) -> None:
    async def go() -> None:
        nc, _ = await bus.connect(url)
        try:
            while not stop.is_set():
                await nc.publish(subject, json.dumps(body).encode())
                await asyncio.sleep(0.3)
        finally:
            await nc.close()

    asyncio.run(go())


def test_a_host_naming_another_node_in_its_heartbeats_cannot_keep_it_alive(tmp_path):
    with Cluster(tmp_path, node_timeout_ms=2000) as c:
        c.scheduler()
        agent = c.agent("h1", "8xH100")
        c.wait_for(T.NodeJoined, node="h1")
        c.send(T.Submit(job="j", team="a", user="u", level=5, gpus=4, command=sleep_command(60)))
        c.wait_for(T.JobRunning, job="j")
        stop = threading.Event()
        spoofer = threading.Thread(
            target=beat_as, args=(c.url, f"{bus.HB_PREFIX}.h2", {"node": "h1"}, stop), daemon=True
        )
        spoofer.start()
        try:
            c.kill(agent)
            records = c.wait_for(T.NodeLost, node="h1", timeout_s=20)
        finally:
            stop.set()
            spoofer.join(10)
        assert matching(records, T.JobRequeued, job="j")
        assert "they name another node" in (c.logs / "s1.log").read_text()
