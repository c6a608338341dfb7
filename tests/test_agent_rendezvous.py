"""The rendezvous variables every part of a gang run derives from the start record alone:
the same master and port on every host, node ranks in placement order, rank offsets for
uneven nodes, and a port someone listens on is seen as taken."""

from __future__ import annotations

import socket

from agents import rendezvous
from core import types as T


def start(n_nodes_first: str = "h2") -> T.JobStartRequested:
    placement = [T.Slot(node=n_nodes_first, gpus=list(range(8))), T.Slot(node="h1", gpus=[0, 1, 2, 3])]
    return T.JobStartRequested(
        t=1, job="g", placement=placement, nodes=["h1", "h2"], addrs=["10.0.0.1", "10.0.0.2"]
    )


def test_every_part_derives_the_same_master_and_port_and_its_own_rank():
    ev = start()
    first, second = rendezvous.gang_env("h2", 12345, ev), rendezvous.gang_env("h1", 12345, ev)
    for env in (first, second):
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.2", str(20000 + 12345 % 10000))
        assert (env["NNODES"], env["WORLD_SIZE"], env["XR_NODES"]) == ("2", "12", "h2,h1")
        assert env["XR_NODE_ADDRS"] == "10.0.0.2,10.0.0.1"
        assert env["PET_MASTER_PORT"] == env["MASTER_PORT"]
    assert (first["NODE_RANK"], first["LOCAL_WORLD_SIZE"], first["XR_RANK_OFFSET"]) == ("0", "8", "0")
    assert (second["NODE_RANK"], second["LOCAL_WORLD_SIZE"], second["XR_RANK_OFFSET"]) == ("1", "4", "8")
    assert (
        rendezvous.gang_env("h2", 12346, ev)["MASTER_PORT"] != first["MASTER_PORT"]
    )  # a new run, a new port


def test_nodes_without_an_advertised_address_are_reached_by_name():
    ev = start()
    ev = T.JobStartRequested(t=1, job="g", placement=ev.placement, nodes=ev.nodes)
    assert rendezvous.gang_env("h1", 7, ev)["MASTER_ADDR"] == "h2"


def test_a_port_someone_listens_on_is_taken():
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen(1)
        assert rendezvous.port_taken(sock.getsockname()[1])
    with socket.socket() as sock:
        sock.bind(("", 0))
        free = sock.getsockname()[1]
    assert not rendezvous.port_taken(free)
