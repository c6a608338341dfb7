"""PyTorch DistributedDataParallel under torchrun, with xirang's preemption contract and
checkpoints the job writes itself (no xirang SDK): the recipe of docs/TRAINING.md, runnable.

Every part of a gang run starts, unchanged:

    torchrun --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node $LOCAL_WORLD_SIZE \\
        --master-addr $MASTER_ADDR --master-port $MASTER_PORT examples/train_torch_ddp.py

- Training: a small MLP regression on a fixed synthetic data set, gloo (CPU) or NCCL, DDP
  all-reducing gradients. Each step's minibatch depends only on the seed, the step and the
  rank, so a run preempted and resumed ends where an uninterrupted one does.
- The notice: the job's signal (SIGTERM by default, the one torchrun forwards to its
  workers; `--preempt-signal` names another) sets a flag; the ranks all-reduce it every step,
  so all of them stop after the same step.
- Checkpoints: every `--checkpoint-every` steps and at the notice, rank 0 writes
  `$XR_CKPT_DIR/step-<N>.pt` (model, optimizer, step, RNG states), every rank waits at a
  barrier, then rank 0 runs `xirang job checkpoint-saved --step N --path ...`: one report,
  once the checkpoint is whole. At the notice the job then exits; its host reports the
  release.
- Resume: `$XR_RESUME_PATH`, the newest recorded checkpoint that still matches its digest
  (the host checked it), is loaded on every rank.

Outside xirang (no `$XR_CKPT_DIR`) it trains, checkpoints to `--ckpt-dir` if given, and
reports nothing.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16
EXAMPLES = 2048
BATCH_PER_RANK = 32


def make_data(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(EXAMPLES, FEATURES, generator=gen)
    w = torch.randn(FEATURES, 1, generator=gen)
    return x, torch.tanh(x @ w) + 0.1 * torch.randn(EXAMPLES, 1, generator=gen)


def model_of(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def batch(x, y, seed: int, step: int, rank: int):
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
    idx = torch.randint(0, EXAMPLES, (BATCH_PER_RANK,), generator=gen)
    return x[idx], y[idx]


def report(step: int, path: str) -> None:
    """Tell the scheduler the checkpoint is whole (through the run's own outbox)."""
    if os.environ.get("XR_OUTBOX"):
        subprocess.run(["xirang", "job", "checkpoint-saved", "--step", str(step), "--path", path], check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--ckpt-dir", default=os.environ.get("XR_CKPT_DIR", ""))
    parser.add_argument("--out", default="", help="rank 0 writes the final parameters here")
    args = parser.parse_args(argv)

    notice = torch.zeros(1)
    sig = getattr(signal, os.environ.get("XR_PREEMPT_SIGNAL", "SIGTERM"), signal.SIGTERM)
    signal.signal(sig, lambda *_: notice.fill_(1.0))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = make_data(args.seed)
    model = DistributedDataParallel(model_of(args.seed))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    resume = os.environ.get("XR_RESUME_PATH", "")
    if resume:
        state = torch.load(resume, map_location="cpu", weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        torch.set_rng_state(state["rng"])
        if rank == 0:
            print(f"resumed from {resume} at step {step}", flush=True)
    if rank == 0:
        print(f"{world} ranks at {os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}", flush=True)

    def save(step: int) -> None:
        if not args.ckpt_dir:
            return
        path = os.path.join(args.ckpt_dir, f"step-{step}.pt")
        if rank == 0:
            state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "step": step}
            torch.save({**state, "rng": torch.get_rng_state()}, path + ".tmp")
            os.replace(path + ".tmp", path)
        dist.barrier()  # the checkpoint is whole on every rank before it is reported
        if rank == 0:
            report(step, path)

    while step < args.steps:
        stop = notice.clone()
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # every rank stops after the same step
        if stop.item():
            save(step)
            if rank == 0:
                print(f"preempted: saved step {step}, exiting", flush=True)
            dist.destroy_process_group()
            return 0
        xb, yb = batch(x, y, args.seed, step, rank)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
        step += 1
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
        if rank == 0 and step % 50 == 0:
            with torch.no_grad():
                print(f"step {step} loss {torch.nn.functional.mse_loss(model(x), y).item():.6f}", flush=True)
        if step % args.checkpoint_every == 0:
            save(step)
    if rank == 0 and args.out:
        torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, args.out)
        print(f"done at step {step}; parameters in {args.out}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
