"""The job SDK: what a training loop calls so that preemption costs it nothing but time.

    from agents import sdk
    job = sdk.Job(checkpoint_every_s=60)
    step, state = job.restore() or (0, initial_state)
    while step < steps:
        ...train one step...
        step += 1
        job.safe_point(step, state)      # may checkpoint; on a notice: checkpoint, release, exit

Checkpoints go to the JetStream object store XR_CKPT as `<job>/<step>`, pickled together
with the numpy and `random` global RNG states, under a SHA-256 digest (`sha256:<hex>`)
that is reported to the scheduler and checked again on restore; the newest K are kept.
On a resume the SDK restores the checkpoint the scheduler names; if its digest does not
verify it reports `checkpoint_failed {reason: digest_mismatch, digest}` (the scheduler
records the fallback) and tries the previous one, then reports `started`.

Outside a host agent (no XR_JOB in the environment) every call is a no-op, so the same
script runs on a laptop. The SDK talks to NATS from a background thread; the training
loop stays synchronous.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pickle
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from core import types as T

from . import bus

CHECKPOINTS_KEPT = 3
CALL_TIMEOUT_S = 30.0
INDEX_SUFFIX = "index"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Job:
    """The job's side of the protocol. One per process."""

    def __init__(self, checkpoint_every_s: float | None = None, keep: int = CHECKPOINTS_KEPT) -> None:
        self.job = os.environ.get("XR_JOB", "")
        self.active = bool(self.job)
        self.checkpoint_every_s = checkpoint_every_s
        self.keep = keep
        self.dir = Path(os.environ.get("XR_JOB_DIR", "."))
        self.run = os.environ.get("XR_RUN", "")
        self.primary = os.environ.get("XR_PRIMARY", "1") == "1"
        self._notice = False
        self._last_ckpt = time.monotonic()
        self.restored_step = 0
        self.fallbacks: list[str] = []
        if not self.active:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.nc, self.js = self._call(bus.connect(os.environ["XR_NATS_URL"], name=f"job-{self.job}"))
        self.store = self._call(self.js.object_store(os.environ.get("XR_CKPT_BUCKET", bus.CKPT_BUCKET)))
        signal.signal(signal.SIGUSR1, self._on_notice)
        (self.dir / "sdk").write_text(str(os.getpid()))  # tells the agent to notify, not kill
        self._notice = (self.dir / "notice.json").exists()  # notified while we were loading

    # ------------------------------------------------------------ plumbing

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(CALL_TIMEOUT_S)

    def _report(self, inp: T.Input, suffix: str) -> None:
        if self.primary:
            inp = msgspec.structs.replace(inp, id=f"{self.run}:{suffix}")
            self._call(bus.send_input(self.js, inp))

    def _on_notice(self, _signum, _frame) -> None:
        self._notice = True

    def log_metrics(self, step: int, **values: float) -> None:
        """Print and publish (`xr.job.<job>.metrics`, not stored) training metrics."""
        line = {"job": self.job, "step": step, **values}
        print(json.dumps(line), flush=True)
        if self.active:
            subject = f"xr.job.{bus.node_token(self.job)}.metrics"
            asyncio.run_coroutine_threadsafe(self.nc.publish(subject, json.dumps(line).encode()), self._loop)

    # ------------------------------------------------------------ checkpoints

    def _index_name(self) -> str:
        return f"{self.job}/{INDEX_SUFFIX}"

    def _read_index(self) -> list[dict]:
        try:
            result = self._call(self.store.get(self._index_name()))
        except Exception:  # noqa: BLE001 - no index yet
            return []
        return json.loads(bytes(result.data))

    def _object_name(self, step: int) -> str:
        return f"{self.job}/{step:012d}"

    def checkpoint(self, step: int, state: Any) -> tuple[str, int]:
        """Save now; returns (digest, bytes). Reports checkpoint_started and _saved. Only
        the primary host's process of a multi-node job saves (the others hold replicas)."""
        if not self.primary:
            return "", 0
        self._report(T.CheckpointStarted(job=self.job), f"ckpt-start-{step}-{time.time_ns()}")
        payload = {"step": step, "state": state,
                   "rng": {"python": random.getstate(), "numpy": _numpy_rng_state()}}
        data = pickle.dumps(payload, protocol=5)
        digest = digest_of(data)
        self._call(self.store.put(self._object_name(step), data))
        index = [e for e in self._read_index() if e["step"] != step]
        index.append({"step": step, "digest": digest, "bytes": len(data)})
        for old in index[:-self.keep]:
            try:
                self._call(self.store.delete(self._object_name(old["step"])))
            except Exception:  # noqa: BLE001 - already gone
                pass
        index = index[-self.keep:]
        self._call(self.store.put(self._index_name(), json.dumps(index).encode()))
        self._report(T.CheckpointSaved(job=self.job, step=step, digest=digest, bytes=len(data)),
                     f"ckpt-saved-{step}-{digest[7:19]}")
        self._last_ckpt = time.monotonic()
        return digest, len(data)

    def restore(self) -> tuple[int, Any] | None:
        """The newest checkpoint whose digest verifies: (step, state), or None to start
        fresh. Reports each bad checkpoint, then `started`."""
        if not self.active:
            return None
        want_digest = os.environ.get("XR_RESUME_DIGEST", "")
        want_step = int(os.environ.get("XR_RESUME_STEP", "0") or 0)
        restored = None
        if want_digest:
            candidates = [e for e in reversed(self._read_index()) if e["step"] <= want_step]
            if not candidates or candidates[0]["step"] != want_step:
                candidates.insert(0, {"step": want_step, "digest": want_digest})
            candidates[0]["digest"] = want_digest  # the scheduler's record is the authority
            for entry in candidates:
                payload = self._load_verified(entry)
                if payload is not None:
                    restored = payload
                    break
                self.fallbacks.append(entry["digest"])
                self._report(T.CheckpointFailed(job=self.job, reason="digest_mismatch",
                                                digest=entry["digest"]), f"bad-{entry['digest'][7:23]}")
        if os.environ.get("XR_REPORT_STARTED") == "1":
            self._report(T.Started(job=self.job), "started")
        self._last_ckpt = time.monotonic()
        if restored is None:
            return None
        random.setstate(restored["rng"]["python"])
        _set_numpy_rng_state(restored["rng"]["numpy"])
        self.restored_step = restored["step"]
        return restored["step"], restored["state"]

    def _load_verified(self, entry: dict) -> dict | None:
        try:
            data = bytes(self._call(self.store.get(self._object_name(entry["step"]))).data)
        except Exception:  # noqa: BLE001 - missing counts as failing verification
            return None
        if digest_of(data) != entry["digest"]:
            print(f"xirang sdk: checkpoint step {entry['step']} fails its digest check", file=sys.stderr)
            return None
        return pickle.loads(data)

    # ------------------------------------------------------------ the safe point

    def safe_point(self, step: int, state: Any) -> None:
        """Call between training steps. Checkpoints when due; on a preemption notice it
        checkpoints if asked, reports released and exits the process."""
        if not self.active:
            return
        if self._notice:
            notice = self._read_notice()
            if notice is None:
                self._notice = False  # withdrawn before we got here
            else:
                self._release(step, state, notice)
        if self.checkpoint_every_s and time.monotonic() - self._last_ckpt >= self.checkpoint_every_s:
            self.checkpoint(step, state)

    def _read_notice(self) -> dict | None:
        try:
            return json.loads((self.dir / "notice.json").read_text())
        except (OSError, ValueError):
            return None

    def _release(self, step: int, state: Any, notice: dict) -> None:
        saga = notice.get("saga", "")
        self._report(T.SafePoint(job=self.job), f"{saga}-safe")
        if notice.get("checkpoint_needed", True):
            self.checkpoint(step, state)
        self._report(T.Released(job=self.job), f"{saga}-released")
        (self.dir / "released").write_text(str(step))
        print(f"xirang sdk: preempted at step {step} ({saga}); released", flush=True)
        self.close()
        sys.exit(0)

    def close(self) -> None:
        if self.active:
            try:
                self._call(self.nc.drain())
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)


def _numpy_rng_state():
    try:
        import numpy
    except ImportError:
        return None
    return numpy.random.get_state()


def _set_numpy_rng_state(value) -> None:
    if value is None:
        return
    import numpy

    numpy.random.set_state(value)
