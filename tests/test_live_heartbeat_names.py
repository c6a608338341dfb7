"""A heartbeat counts for the node its subject names: a host (NATS lets each publish only on
`xr.hb.<its node>`) whose heartbeats name another node cannot keep that node alive, so a
dead host is still found out and its jobs requeued."""

from __future__ import annotations

import asyncio
import json
import threading
import time

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


def test_heartbeats_from_many_unknown_nodes_are_remembered_only_up_to_a_cap(tmp_path, caplog):
    """An open bus: anyone beating on `xr.hb.<anything>`. The scheduler remembers at most
    its cap of nodes the state does not know (saying so once a flood), and a known node's heartbeats
    still keep it alive; once they stop, it is still found silent."""
    from agents.scheduler import Scheduler
    from transport.natsd import EmbeddedNats

    cap, ghosts = 50, 400

    async def records_with(js, kind, **fields):
        records = [r for _, r in await bus.all_records(js)]
        return records if matching(records, kind, **fields) else None

    async def scenario(url: str) -> None:
        sched = Scheduler(url, instance="s1", tick_ms=100, lease_ms=1000, node_timeout_ms=1500,
                          unknown_nodes_heard_max=cap)  # fmt: skip
        task = asyncio.create_task(sched.run())
        nc, js = await bus.connect(url, reconnects=3)
        await sched.leading.wait()
        await bus.send_input(js, T.NodeUp(node="n1", gpu_model="H100", gpus=8))
        await bus.wait_for(lambda: records_with(js, T.NodeJoined, node="n1"), 20)
        deadline = time.monotonic() + 3.0  # two node timeouts of flood
        while time.monotonic() < deadline:
            for i in range(ghosts):
                await nc.publish(f"{bus.HB_PREFIX}.ghost-{i}", b"{}")
            await nc.publish(f"{bus.HB_PREFIX}.n1", json.dumps({"node": "n1"}).encode())
            await nc.flush()
            await asyncio.sleep(0.3)
        marker = time.monotonic()
        await nc.publish(f"{bus.HB_PREFIX}.n1", json.dumps({"node": "n1"}).encode())
        await nc.flush()  # delivered after every ghost beat: it went out after them
        await bus.wait_for(lambda: _true(sched._heard.get("n1", 0) >= marker), 10)
        assert len(sched._heard_unknown) == cap
        assert sorted(sched._heard) == ["n1"]
        records = [r for _, r in await bus.all_records(js)]
        assert not matching(records, T.NodeLost, node="n1")  # its beats counted all along
        await bus.wait_for(lambda: records_with(js, T.NodeLost, node="n1"), 20)  # silent now
        # the flood is over: its ghosts are forgotten, and a second flood is said again
        await bus.wait_for(lambda: _true(len(sched._heard_unknown) == 0), 10)
        for i in range(ghosts):
            await nc.publish(f"{bus.HB_PREFIX}.ghost-{i}", b"{}")
        await nc.flush()
        await bus.wait_for(lambda: _true(len(sched._heard_unknown) == cap), 10)
        await asyncio.sleep(0.5)  # the rest of the beats delivered
        sched.stop()
        await asyncio.wait_for(task, 20)
        await nc.close()

    with EmbeddedNats(tmp_path / "nats") as server:
        asyncio.run(scenario(server.url))
    said = [r for r in caplog.records if "nodes the state does not know" in r.getMessage()]
    assert len(said) == 2  # once a flood, not once a beat


async def _true(value: bool) -> bool | None:
    return True if value else None
