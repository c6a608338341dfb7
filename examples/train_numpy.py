"""A small real training job: logistic regression on a fixed synthetic data set, trained by
minibatch SGD with momentum, using the xirang job SDK.

Preempt it and it checkpoints (weights, momentum, step, RNG state) at its next safe point;
resume it and its loss carries on from where it stopped, because the minibatch sequence
continues from the saved generator state.

    python examples/train_numpy.py --steps 2000 --step-ms 5 --checkpoint-every-s 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from agents import sdk

FEATURES = 32
EXAMPLES = 4096
BATCH = 64


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(EXAMPLES, FEATURES))
    w_true = rng.normal(size=FEATURES) * 2.0
    logits = x @ w_true + rng.normal(scale=0.5, size=EXAMPLES)
    y = (logits > 0).astype(np.float64)
    return x, y


def loss_of(w: np.ndarray, b: float, x: np.ndarray, y: np.ndarray) -> float:
    z = x @ w + b
    # log(1 + e^z) - y z, computed stably
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def initial_state(seed: int) -> dict:
    return {
        "w": np.zeros(FEATURES),
        "b": 0.0,
        "vw": np.zeros(FEATURES),
        "vb": 0.0,
        "rng": np.random.default_rng(seed + 1).bit_generator.state,
    }


def train_step(state: dict, rng: np.random.Generator, x, y, lr: float, momentum: float) -> None:
    idx = rng.integers(0, EXAMPLES, BATCH)
    xb, yb = x[idx], y[idx]
    p = 1.0 / (1.0 + np.exp(-(xb @ state["w"] + state["b"])))
    grad_w = xb.T @ (p - yb) / BATCH
    grad_b = float(np.mean(p - yb))
    state["vw"] = momentum * state["vw"] - lr * grad_w
    state["vb"] = momentum * state["vb"] - lr * grad_b
    state["w"] = state["w"] + state["vw"]
    state["b"] = state["b"] + state["vb"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--step-ms", type=float, default=5.0, help="pause per step, to stretch the run")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--checkpoint-every-s", type=float, default=None)
    parser.add_argument("--log-every", type=int, default=50)
    args = parser.parse_args(argv)

    x, y = make_data(args.seed)
    job = sdk.Job(checkpoint_every_s=args.checkpoint_every_s)
    restored = job.restore()
    step, state = restored if restored else (0, initial_state(args.seed))
    if restored:
        job.log_metrics(step, loss=round(loss_of(state["w"], state["b"], x, y), 6), resumed=1)
    rng = np.random.default_rng()
    rng.bit_generator.state = state["rng"]
    while step < args.steps:
        train_step(state, rng, x, y, args.lr, args.momentum)
        step += 1
        state["rng"] = rng.bit_generator.state
        if step % args.log_every == 0 or step == args.steps:
            job.log_metrics(step, loss=round(loss_of(state["w"], state["b"], x, y), 6))
        if args.step_ms:
            time.sleep(args.step_ms / 1000)
        job.safe_point(step, state)
    job.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
