"""Checkpoints cannot run code and are sealed per job: a pickle inside an archive is
refused, a checkpoint sealed for one job cannot be read or forged by another, and the
example's training state (arrays, RNG states, tuples) survives the round trip."""

from __future__ import annotations

import io
import pickle
import random

import numpy as np
import pytest

from agents import ckptfile

SECRET = bytes(range(32))


def _state():
    rng = np.random.default_rng(3)
    return {
        "step": 7,
        "state": {"w": rng.normal(size=5), "b": 0.25, "rng": rng.bit_generator.state},
        "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
    }


def test_a_training_state_round_trips_with_its_rng_states():
    payload = _state()
    back = ckptfile.decode(
        ckptfile.encode(payload, ckptfile.job_key(SECRET, "a")), ckptfile.job_key(SECRET, "a")
    )
    assert np.array_equal(back["state"]["w"], payload["state"]["w"]) and back["state"]["b"] == 0.25
    assert back["state"]["rng"] == payload["state"]["rng"]
    random.setstate(back["rng"]["python"])
    np.random.set_state(back["rng"]["numpy"])


def test_a_checkpoint_sealed_for_one_job_cannot_be_read_or_replaced_by_another():
    data = ckptfile.encode(_state(), ckptfile.job_key(SECRET, "victim"))
    assert b"PK" not in data[:8]  # not a readable archive
    with pytest.raises(ckptfile.CheckpointError, match="another job"):
        ckptfile.decode(data, ckptfile.job_key(SECRET, "attacker"))
    forged = ckptfile.encode({"step": 10**6}, ckptfile.job_key(SECRET, "attacker"))
    with pytest.raises(ckptfile.CheckpointError):
        ckptfile.decode(forged, ckptfile.job_key(SECRET, "victim"))
    with pytest.raises(ckptfile.CheckpointError, match="not sealed"):
        ckptfile.decode(ckptfile.encode({"step": 1}, None), ckptfile.job_key(SECRET, "victim"))
    tampered = bytearray(data)
    tampered[-1] ^= 1
    with pytest.raises(ckptfile.CheckpointError):
        ckptfile.decode(bytes(tampered), ckptfile.job_key(SECRET, "victim"))


class _Boom:
    def __reduce__(self):
        return (exec, ("open('/tmp/xirang-pwned', 'w')",))


def test_a_pickle_is_never_loaded_and_objects_are_not_checkpointed():
    buffer = io.BytesIO()
    np.savez(
        buffer,
        **{
            "__manifest__": np.frombuffer(b'{"__ndarray__": "a0"}', dtype=np.uint8),
            "a0": np.array([_Boom()], dtype=object),
        },
    )
    with pytest.raises(ckptfile.CheckpointError):
        ckptfile.decode(buffer.getvalue(), None)
    with pytest.raises(ckptfile.CheckpointError):
        ckptfile.decode(pickle.dumps({"step": 1}), None)
    with pytest.raises(ckptfile.CheckpointError, match="cannot checkpoint"):
        ckptfile.encode({"model": _Boom()}, None)


def test_a_job_speaks_only_for_itself_through_its_runs_outbox(tmp_path):
    """A job has no input permission: its facts go through its run's outbox, and the host
    delivers only that job's own facts from it, in order with its own."""
    import asyncio

    from agents.outbox import Outbox
    from core import types as T
    from transport import bus
    from transport.natsd import EmbeddedNats

    host = Outbox(tmp_path / "host-outbox", sender="host:h1")
    run = Outbox(host.watch_job(tmp_path / "run" / "outbox", "train"))  # what the SDK opens
    host.put(T.Started(job="train", id="a"))
    run.put(T.CheckpointSaved(job="train", step=3, digest="sha256:00", bytes=1, id="b"))
    run.put(T.Finished(job="other", ok=False, id="c"))  # another job's fact
    run.put(T.NodeDown(node="h1", id="d"))  # the host's
    with EmbeddedNats(tmp_path / "nats") as server:

        async def go():
            nc, js = await bus.connect(server.url)
            try:
                await bus.ensure_streams(js)
                delivered = await host.deliver(js)
                msgs = [await js.get_msg(bus.IN_STREAM, seq) for seq in (1, 2)]
                return delivered, [(m.subject, T.parse_input(m.data).id) for m in msgs]
            finally:
                await nc.close()

        delivered, sent = asyncio.run(go())
    assert delivered == 2 and len(host) == 0
    assert sent == [("xr.in.host.h1.started", "a"), ("xr.in.host.h1.checkpoint_saved", "b")]


def test_the_permissions_name_a_host_as_the_bus_does_even_with_dots_in_its_name():
    from trust.natsauth import bus_node_token, role_permissions, user_tags
    from transport.bus import node_token

    for name in ("gpu-1", "gpu-1.example.com", "节点7", "a_b"):
        assert bus_node_token(name) == node_token(name)
    # the host template names its durable, heartbeat and claim subjects by the node tag ...
    allowed = role_permissions("host", [])["pub"]["allow"]
    assert "$JS.API.CONSUMER.MSG.NEXT.XR_EV.host-{{tag(node)}}" in allowed
    assert "xr.hb.{{tag(node)}}" in allowed and "xr.agent.claim.{{tag(node)}}" in allowed
    # ... which is the bus's token for the node
    assert f"node:{node_token('gpu-1.example.com')}" in user_tags("host", ["gpu-1.example.com"])
