"""What every part of a gang run is told so that its processes can meet: torchrun-compatible
variables derived, identically on every host, from the signed start record alone.

- Node order: the placement's nodes in the order the placement lists them (its first node
  is the run's primary and its master). `NODE_RANK` is a node's index in that order.
- `MASTER_ADDR`: the address the first node advertised in its `node_up`
  (`xirang agent --advertise-addr`), carried in the start record; a node that advertised
  none is reached by its name.
- `MASTER_PORT`: chosen per run, the same for all parts without any talk between hosts:
  `MASTER_PORT_BASE + run % MASTER_PORT_SPAN`, where `run` is the log position of the start
  record (every run of every job has its own). The range lies below Linux's ephemeral ports,
  so an outgoing connection never holds it by chance. The master's host checks that the port
  is free before it starts its part; when it is not (another program listens there), the
  part cannot start: the gang is stopped whole and queued again, and its next run (a new
  log position) gets another port.
- `WORLD_SIZE` is the run's GPU count, `LOCAL_WORLD_SIZE` this node's; `XR_RANK_OFFSET` the
  first global rank on this node (the GPUs of the nodes before it), for launchers other
  than torchrun and for gangs whose nodes hold different GPU counts (torchrun itself wants
  the same count on every node). torchrun's own `PET_*` variables are set too, so a bare
  `torchrun train.py` picks them up.
"""

from __future__ import annotations

import errno
import socket

from core import types as T

MASTER_PORT_BASE = 20000
MASTER_PORT_SPAN = 10000


def master_port(run: int) -> int:
    """The rendezvous port of the run started by record `run`."""
    return MASTER_PORT_BASE + run % MASTER_PORT_SPAN


def node_order(placement: list[T.Slot]) -> list[str]:
    """The run's nodes in placement order (the first is its primary and master)."""
    return list(dict.fromkeys(slot.node for slot in placement))


def gang_env(node: str, run: int, ev) -> dict[str, str]:
    """The rendezvous variables of `node`'s part of the run started by record `run` (`ev`, a
    JobStartRequested or JobResumeRequested)."""
    order = node_order(ev.placement)
    addrs = dict(zip(ev.nodes, ev.addrs)) if ev.addrs else {}
    gpus = {name: sum(len(s.gpus) for s in ev.placement if s.node == name) for name in order}
    rank = order.index(node) if node in order else 0
    master = (addrs.get(order[0]) or order[0]) if order else "127.0.0.1"
    env = {
        "MASTER_ADDR": master,
        "MASTER_PORT": str(master_port(run)),
        "NNODES": str(len(order)),
        "NODE_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(gpus.get(node, 0)),
        "WORLD_SIZE": str(sum(gpus.values())),
        "XR_RANK_OFFSET": str(sum(gpus[name] for name in order[:rank])),
        "XR_NODES": ",".join(order),
        "XR_NODE_ADDRS": ",".join(addrs.get(name) or name for name in order),
    }
    env.update(
        PET_NNODES=env["NNODES"],
        PET_NODE_RANK=env["NODE_RANK"],
        PET_NPROC_PER_NODE=env["LOCAL_WORLD_SIZE"],
        PET_MASTER_ADDR=env["MASTER_ADDR"],
        PET_MASTER_PORT=env["MASTER_PORT"],
    )
    return env


def port_taken(port: int) -> bool:
    """Whether something on this host already listens on (or holds) TCP `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as err:
            return err.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def default_advertise_addr(nats_url: str) -> str:
    """The address other hosts most likely reach this one at: the local address this host
    uses towards the NATS server (loopback when the server is on this machine)."""
    from urllib.parse import urlparse

    first = nats_url.split(",")[0].strip()
    parsed = urlparse(first if "://" in first else f"nats://{first}")
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 4222
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((host, port))  # UDP: no packet is sent, the route is chosen
            return sock.getsockname()[0]
    except OSError:
        return socket.gethostname()
