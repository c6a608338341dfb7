"""Data-parallel training over several nodes, numpy only: a real gang job.

Every part of the run (one per node) starts the node's ranks as processes (local rank 0 is
the part's own process, the others its children); the ranks meet at
`MASTER_ADDR:MASTER_PORT` over TCP, the variables a host agent gives every part of a gang
run (as torchrun would read them: `NNODES`, `NODE_RANK`, `LOCAL_WORLD_SIZE`, `WORLD_SIZE`).
Every step each rank computes the gradient of logistic regression on its own shard of the
step's minibatch, and the gradients are all-reduced (summed in rank order at rank 0, the
average sent back to all), so every rank applies the same update and holds the same
parameters, as in PyTorch DDP.

Checkpoints and preemption use the job SDK on rank 0 (the parameters are the same on every
rank, so rank 0's copy is the checkpoint): at a notice, rank 0 tells every rank to stop
after the step all of them finished, saves, reports released and exits; the others exit
with it. A resume restores rank 0's checkpoint and sends the parameters to every rank. The
minibatch of a step depends only on the seed, the step and the rank, so a run preempted
and resumed ends with exactly the parameters of an uninterrupted run.

    NNODES=1 NODE_RANK=0 LOCAL_WORLD_SIZE=4 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 \\
        MASTER_PORT=29511 python examples/train_ddp.py --steps 200 --out params.npz
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np

FEATURES = 32
EXAMPLES = 4096
BATCH_PER_RANK = 16
GO, STOP = 0, 1
CONNECT_TIMEOUT_S = 120.0
# A rank that loses its peers waits this long to be stopped by its host (the scheduler
# stops the whole gang when one part fails) before it exits with an error itself.
PEER_LOST_WAIT_S = 60.0


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES))
    w_true = rng.normal(size=FEATURES) * 2.0
    y = ((x @ w_true + rng.normal(scale=0.5, size=EXAMPLES)) > 0).astype(np.float64)
    return x, y


def gradient(params: np.ndarray, x, y, seed: int, step: int, rank: int) -> np.ndarray:
    """This rank's gradient (weights then bias) on its shard of step `step`'s minibatch."""
    idx = np.random.default_rng([seed, step, rank]).integers(0, EXAMPLES, BATCH_PER_RANK)
    xb, yb = x[idx], y[idx]
    w, b = params[:FEATURES], params[FEATURES]
    err = 1.0 / (1.0 + np.exp(-(xb @ w + b))) - yb
    return np.concatenate([xb.T @ err / BATCH_PER_RANK, [float(np.mean(err))]])


def loss_of(params: np.ndarray, x, y) -> float:
    z = x @ params[:FEATURES] + params[FEATURES]
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


# ---------------------------------------------------------------- framed TCP messages


def send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(struct.pack("!I", len(data)) + data)


def recv(sock: socket.socket) -> bytes:
    (size,) = struct.unpack("!I", _exactly(sock, 4))
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise ConnectionError("peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class PeerLost(Exception):
    """Another rank went away mid-run."""


class Group:
    """The ranks' process group: rank 0 holds one connection to every other rank."""

    def __init__(self, rank: int, world: int, addr: str, port: int) -> None:
        self.rank, self.world = rank, world
        self.peers: list[socket.socket] = []
        if world == 1:
            return
        if rank == 0:
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind(("", port))
            server.listen(world)
            server.settimeout(CONNECT_TIMEOUT_S)
            by_rank: dict[int, socket.socket] = {}
            while len(by_rank) < world - 1:
                conn, _ = server.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(None)
                by_rank[struct.unpack("!I", recv(conn))[0]] = conn
            server.close()
            self.peers = [by_rank[r] for r in sorted(by_rank)]
        else:
            deadline = time.monotonic() + CONNECT_TIMEOUT_S
            while True:
                try:
                    sock = socket.create_connection((addr, port), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(None)
            send(sock, struct.pack("!I", rank))
            self.peers = [sock]

    def all_reduce_mean(self, grad: np.ndarray, control: int) -> tuple[np.ndarray, int]:
        """The mean of every rank's `grad` (summed in rank order), and rank 0's control word."""
        if self.world == 1:
            return grad, control
        try:
            if self.rank == 0:
                total = grad.copy()
                for peer in self.peers:
                    total += np.frombuffer(recv(peer), dtype=np.float64)
                mean = total / self.world
                for peer in self.peers:
                    send(peer, bytes([control]) + mean.tobytes())
                return mean, control
            send(self.peers[0], grad.tobytes())
            data = recv(self.peers[0])
            return np.frombuffer(data[1:], dtype=np.float64).copy(), data[0]
        except OSError as err:
            raise PeerLost(str(err)) from err

    def broadcast(self, values: np.ndarray) -> np.ndarray:
        """Rank 0's `values` on every rank."""
        if self.world == 1:
            return values
        try:
            if self.rank == 0:
                for peer in self.peers:
                    send(peer, values.tobytes())
                return values
            return np.frombuffer(recv(self.peers[0]), dtype=np.float64).copy()
        except OSError as err:
            raise PeerLost(str(err)) from err


# ---------------------------------------------------------------- one rank


def train(args, rank: int, world: int, job) -> int:
    x, y = make_data(args.seed)
    group = Group(
        rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0"))
    )
    step, params, velocity = 0, np.zeros(FEATURES + 1), np.zeros(FEATURES + 1)
    if rank == 0 and job is not None:
        restored = job.restore()
        if restored:
            step, state = restored
            params, velocity = state["params"], state["velocity"]
            print(f"rank 0: resumed at step {step}", flush=True)
    start = group.broadcast(np.concatenate([[float(step)], params, velocity]))
    step = int(start[0])
    params, velocity = start[1 : FEATURES + 2].copy(), start[FEATURES + 2 :].copy()
    if rank == 0:
        where = f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '-')}"
        print(f"rank 0: {world} ranks met at step {step} at {where}", flush=True)
    while step < args.steps:
        control = STOP if rank == 0 and job is not None and job.preempting() else GO
        grad, control = group.all_reduce_mean(gradient(params, x, y, args.seed, step, rank), control)
        if control == STOP:
            break  # rank 0 stopped before this step: no one applies it
        velocity = args.momentum * velocity - args.lr * grad
        params = params + velocity
        step += 1
        if rank == 0:
            if step % args.log_every == 0 or step == args.steps:
                print(f"step {step} loss {loss_of(params, x, y):.6f}", flush=True)
            if args.step_ms:
                time.sleep(args.step_ms / 1000)
            if job is not None:
                job.checkpoint_if_due(step, {"params": params, "velocity": velocity})
    if rank == 0 and job is not None and job.preempting():
        job.safe_point(step, {"params": params, "velocity": velocity})  # saves, releases, exits
    if rank == 0 and step >= args.steps and args.out:
        np.savez(args.out, params=params, velocity=velocity, step=np.array(step))
        print(f"rank 0: done at step {step}; parameters in {args.out}", flush=True)
    return 0


def _wait_to_be_stopped(rank: int, why: str) -> int:
    print(f"rank {rank}: lost its peers ({why}); waiting to be stopped", file=sys.stderr, flush=True)
    time.sleep(PEER_LOST_WAIT_S)
    return 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--step-ms", type=float, default=0.0, help="pause per step, to stretch the run")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--checkpoint-every-s", type=float, default=None)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--ranks-per-node", type=int, default=0, help="default: $LOCAL_WORLD_SIZE")
    parser.add_argument("--out", default="", help="rank 0 writes the final parameters here (.npz)")
    parser.add_argument("--local-rank", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    nnodes = int(os.environ.get("NNODES", "1"))
    node_rank = int(os.environ.get("NODE_RANK", "0"))
    per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    world, rank = nnodes * per_node, node_rank * per_node + args.local_rank
    # A notice reaches the whole process group; only rank 0 acts on it (through the SDK).
    signal.signal(signal.SIGUSR1, lambda *_: None)
    children = []
    job = None
    if args.local_rank == 0:
        argv = list(argv if argv is not None else sys.argv[1:])
        for local in range(1, per_node):
            cmd = [sys.executable, os.path.abspath(__file__), *argv, "--ranks-per-node", str(per_node)]
            children.append(subprocess.Popen([*cmd, "--local-rank", str(local)]))
        from agents import sdk

        # Every part's first process holds the SDK (its host then signals notices as
        # SIGUSR1); only the first node's saves and reports.
        job = sdk.Job(checkpoint_every_s=args.checkpoint_every_s)
    try:
        rc = train(args, rank, world, job if rank == 0 else None)
    except PeerLost as err:
        rc = _wait_to_be_stopped(rank, str(err))
    for child in children:
        rc = rc or child.wait()
    if job is not None:
        job.close()
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
