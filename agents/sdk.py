"""The job SDK: what a training loop calls so that preemption costs it nothing but time.

    from agents import sdk
    job = sdk.Job(checkpoint_every_s=60)
    step, state = job.restore() or (0, initial_state)
    while step < steps:
        ...train one step...
        step += 1
        job.safe_point(step, state)      # may checkpoint; on a notice: checkpoint, release, exit

Checkpoints go to the JetStream stream XR_CKPT under the job's own subjects
(transport/checkpoints.py: a few slots, the oldest reused), together with the numpy and
`random` global RNG states, in a format that cannot run code (agents/ckptfile.py:
npz without pickle plus a JSON manifest, sealed with the job's own key), under a SHA-256
digest (`sha256:<hex>`) that is reported to the scheduler and checked again on restore; the
newest K are kept. With the policy's two copies (`XR_CKPT_COPIES`, the default) each object
is also written to this host's disk (`XR_CKPT_COPY_DIR`, agents/ckptcopy.py) while it
uploads, both copies are read back before the checkpoint is reported, and a restore reads
an object the bus has lost or spoiled from the copy on the disk of the host that wrote it
(its agent serves it) before it falls back to an older checkpoint. The job reaches them with its run's own short-lived NATS credentials
($XIRANG_CREDS, minted by its host agent), which allow its own checkpoints and nothing
else. On a resume the SDK restores the checkpoint the scheduler's signed
resume order names; if its digest does not verify it reports `checkpoint_failed {reason:
digest_mismatch, digest}` (the scheduler records the fallback) and tries the previous one
from its sealed index, then reports `started`.

Outages are waited out: the SDK's connection never gives up; its facts go to its run's
durable outbox (`$XR_OUTBOX`), which the host agent delivers in order (once the bus is
back, after an outage), taking only this job's own facts from it; a checkpoint that cannot be uploaded is reported failed and retried at a
later safe point (training goes on meanwhile); a restore waits for the bus.

Outside a host agent (no XR_JOB in the environment) every call is a no-op, so the same
script runs on a laptop. The SDK talks to NATS from a background thread; the training
loop stays synchronous.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from core import types as T

from transport import bus
from transport import checkpoints as ckptstore
from trust.durable import write_durably
from trust.natsauth import CREDS_ENV, job_token
from . import ckptcopy, ckptfile
from .ckptpath import SDK_SCHEME
from .outbox import Outbox

CHECKPOINTS_KEPT = 3
# A run writes its checkpoints in slots of its own (`<run>-<slot>`), at most this many: a
# slot is reused only once a newer checkpoint's report has left the run's outbox, so the
# checkpoint a resume may be told of is never overwritten, however long the host's agent
# is away (a full set of unreported slots makes further saves wait).
SLOTS_PER_RUN_MAX = 8
CALL_TIMEOUT_S = 30.0
# How long a restore waits for the agent holding a second copy to answer (it may be
# restarting) before it gives that copy up.
COPY_WAIT_S = 30.0
# What a restore says it read, by copy number.
COPY_NAMES = {1: "copy 1 (the bus's store)", 2: "copy 2 (the disk of the host that wrote it)"}
# A fact sent while the bus answers slowly goes to the outbox after this long.
REPORT_TIMEOUT_S = 5.0
# A checkpoint that could not be uploaded is retried after this, doubling up to the max.
CKPT_RETRY_FIRST_S = 1.0
CKPT_RETRY_MAX_S = 30.0
# How often the SDK looks whether its host renewed the run's NATS credentials.
CREDS_CHECK_S = 1.0
# A connection replaced by one with renewed credentials is drained this much later.
RETIRE_S = 5.0


def digest_of(data: bytes) -> str:
    """The content digest the log records for checkpoint bytes (`sha256:<hex>`)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Job:
    """The job's side of the protocol. One per process."""

    def __init__(
        self, checkpoint_every_s: float | None = None, keep: int = CHECKPOINTS_KEPT, async_save: bool = True
    ) -> None:
        self.job = os.environ.get("XR_JOB", "")
        self.active = bool(self.job)
        self.checkpoint_every_s = checkpoint_every_s
        # Periodic saves run in the background (training goes on); saves at a notice do not.
        self.async_save = async_save
        self.keep = keep
        self.dir = Path(os.environ.get("XR_JOB_DIR", "."))
        self.run = os.environ.get("XR_RUN", "")
        # Checkpoints are written under this node's subjects (the run's credentials allow no other).
        self.node = os.environ.get("XR_NODE", "") or "local"
        # The run's fencing token: the record that started it (XR_RUN is node/job/n).
        self.attempt = int(self.run.rsplit("/", 1)[-1]) if self.run.rsplit("/", 1)[-1].isdigit() else 0
        self.primary = os.environ.get("XR_PRIMARY", "1") == "1"
        self._notice = False
        self._last_ckpt = time.monotonic()
        self.restored_step = 0
        self.fallbacks: list[str] = []
        self._saved: list[dict] = []  # this run's slots in the order written: n, slot, fact, refs
        self._objects: dict[str, tuple[str, str, int]] = {}  # tensor digest -> (node, object, slot n)
        self._inflight: threading.Thread | None = None
        self._saved_step: int = -1
        self._saved_at: tuple[str, int] | None = None
        self.last_upload_bytes = 0
        # Verified copies a checkpoint needs before it is reported saved (the scheduler's
        # policy, via the host): the bus's store, then this host's disk (agents/ckptcopy.py).
        self.copies = min(2, max(1, int(os.environ.get("XR_CKPT_COPIES", "1") or 1)))
        self.copy_dir = Path(os.environ["XR_CKPT_COPY_DIR"]) if os.environ.get("XR_CKPT_COPY_DIR") else None
        if self.copies > 1 and self.copy_dir is None:
            print(
                "xirang sdk: no host folder for second copies (XR_CKPT_COPY_DIR): one copy", file=sys.stderr
            )
            self.copies = 1
        # Which copy the restore read: 0 none, 1 the bus's, 2 a host's (some object of it).
        self.restored_copy = 0
        self._unreachable: set[str] = set()  # nodes whose agent did not answer this restore
        if not self.active:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.outbox = Outbox(os.environ["XR_OUTBOX"]) if os.environ.get("XR_OUTBOX") else None
        self._ckpt_retry_s = CKPT_RETRY_FIRST_S
        # Never gives up on the bus: the job runs on through an outage.
        self._creds_path = os.environ.get(CREDS_ENV, "")
        self._creds_seen = _mtime(self._creds_path)
        self._retiring: set = set()
        self.nc, self.js = self._call(self._connect(), timeout_s=None)
        if self._creds_path:
            asyncio.run_coroutine_threadsafe(self._keep_credentials_fresh(), self._loop)
        signal.signal(signal.SIGUSR1, self._on_notice)
        write_durably(self.dir / "sdk", str(os.getpid()).encode())  # tells the agent to notify, not kill
        self._notice = (self.dir / "notice.json").exists()  # notified while we were loading

    # ------------------------------------------------------------ plumbing

    def _call(self, coro, timeout_s: float | None = CALL_TIMEOUT_S):
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout_s)
        except BaseException:
            future.cancel()
            raise

    async def _connect(self):
        return await bus.connect_forever(os.environ["XR_NATS_URL"], name=f"job-{self.job}")

    async def _keep_credentials_fresh(self) -> None:
        """The run's credentials expire (the server then closes the connection for good);
        its host agent renews the file well before. On a renewal (or a closed connection)
        connect again with the file's new user, then let the old connection go."""
        while True:
            await asyncio.sleep(CREDS_CHECK_S)
            seen = _mtime(self._creds_path)
            if seen == self._creds_seen and not self.nc.is_closed:
                continue
            old = self.nc
            try:
                self.nc, self.js = await self._connect()
            except Exception as err:  # noqa: BLE001 - tried again at the next check
                print(f"xirang sdk: reconnecting with renewed credentials failed ({err!r})", file=sys.stderr)
                continue
            self._creds_seen = seen
            task = asyncio.get_running_loop().create_task(self._retire(old))
            self._retiring.add(task)  # a task nobody holds may be collected before it ends
            task.add_done_callback(self._retiring.discard)

    @staticmethod
    async def _retire(old) -> None:
        """Let calls already under way on a replaced connection finish, then drain it."""
        await asyncio.sleep(RETIRE_S)
        try:
            await old.drain()
        except Exception:  # noqa: BLE001 - already closed (e.g. its credentials expired)
            pass

    def _connected(self) -> bool:
        return bool(self.nc.is_connected)

    def _report(self, inp: T.Input, suffix: str) -> Path | None:
        """Report a fact: into this run's durable outbox, which the host agent delivers in
        order (and checks: a job speaks only for itself; the job's credentials allow no
        input at all). Outside an agent's outbox, straight to the bus. Returns the fact's
        file while it waits in the outbox (None: sent)."""
        if not self.primary:
            return None
        inp = msgspec.structs.replace(inp, id=f"{self.run}:{suffix}", attempt=self.attempt)
        if self.outbox is not None:
            return self.outbox.put(inp)
        self._call(bus.send_input(self.js, inp, sender=f"job:{self.job}"), timeout_s=REPORT_TIMEOUT_S)
        return None

    def _retry_forever(self, what: str, action):
        """For what a job cannot do without (its checkpoint to restore): wait for the bus."""
        delay = 0.5
        while True:
            try:
                return action()
            except Exception as err:  # noqa: BLE001 - the bus is away
                print(
                    f"xirang sdk: {what} failed ({err!r}); retrying in {delay:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(delay)
                delay = min(bus.CONNECT_BACKOFF_MAX_S, delay * 2)

    def _on_notice(self, _signum, _frame) -> None:
        self._notice = True

    def log_metrics(self, step: int, **values: float) -> None:
        """Print and publish (`xr.job.<job>.metrics`, not stored) training metrics."""
        line = {"job": self.job, "step": step, **values}
        print(json.dumps(line), flush=True)
        if self.active:
            subject = f"xr.job.{job_token(self.job)}.metrics"
            asyncio.run_coroutine_threadsafe(self.nc.publish(subject, json.dumps(line).encode()), self._loop)

    # ------------------------------------------------------------ checkpoints

    def _read_index(self) -> list[dict]:
        data = self._call(ckptstore.get_index(self.js, self.job))
        if data is None:
            return []  # no index yet
        try:
            return json.loads(ckptfile.unseal(data, ckptfile.key_from_env()))
        except (ckptfile.CheckpointError, ValueError):
            print("xirang sdk: the checkpoint index is not sealed for this job; ignoring it", file=sys.stderr)
            return []

    def checkpoint(self, step: int, state: Any) -> tuple[str, int]:
        """Save now, synchronously (a save in progress is waited for first); returns (digest,
        bytes). Reports checkpoint_started and _saved. Only the primary host's process of a
        multi-node job saves (the others hold replicas)."""
        if not self.primary:
            return "", 0
        self.wait_for_save()
        saved = self._try_checkpoint(step, state)
        if saved is None:
            self._report(
                T.CheckpointFailed(job=self.job, reason="upload_failed"),
                f"ckpt-failed-{step}-{time.time_ns()}",
            )
            return "", 0
        return saved

    def checkpoint_async(self, step: int, state: Any) -> bool:
        """Start saving in the background and return at once: the state is copied now (so
        training may change it at once), then written and uploaded by a thread while training
        goes on; only tensors whose content changed since a checkpoint still kept are
        uploaded. False when a save is still in progress (nothing started)."""
        if not self.active or not self.primary or self.saving():
            return False
        if not self._connected():
            self._upload_failed(step, "not connected to NATS")
            return False
        snapshot = self._snapshot(step, state)
        self._last_ckpt = time.monotonic()

        def write() -> None:
            try:
                self._write(snapshot)
            except Exception as err:  # noqa: BLE001 - retried at a later safe point
                self._upload_failed(step, repr(err))
                self._report(
                    T.CheckpointFailed(job=self.job, reason="upload_failed"),
                    f"ckpt-failed-{step}-{time.time_ns()}",
                )

        self._inflight = threading.Thread(target=write, name=f"xirang-save-{step}", daemon=True)
        self._inflight.start()
        return True

    def saving(self) -> bool:
        """Whether a background save is in progress."""
        return self._inflight is not None and self._inflight.is_alive()

    def wait_for_save(self, timeout_s: float | None = None) -> bool:
        """Wait for a background save in progress (at most `timeout_s`); whether none is left."""
        if self._inflight is not None:
            self._inflight.join(timeout_s)
        return not self.saving()

    def _try_checkpoint(self, step: int, state: Any) -> tuple[str, int] | None:
        """Save now; None when the upload failed (the bus is away): the next safe point
        retries, after a backoff, and training goes on meanwhile."""
        if not self._connected():
            self._upload_failed(step, "not connected to NATS")
            return None
        if self._saved_step == step and self._saved_at is not None:
            return self._saved_at  # this very step is saved already (by a save that was in progress)
        self._report(T.CheckpointStarted(job=self.job), f"ckpt-start-{step}-{time.time_ns()}")
        try:
            return self._write(self._snapshot(step, state))
        except Exception as err:  # noqa: BLE001 - retried at a later safe point
            self._upload_failed(step, repr(err))
            return None

    def _snapshot(self, step: int, state: Any) -> dict:
        """What a checkpoint of `step` holds, copied: the state's tensors, the rest as JSON data,
        the random-number states."""
        tree, tensors = ckptfile.split_tensors({"step": step, "state": state, "rng": _rng_states()})
        return {"step": step, "tree": tree, "tensors": tensors}

    def _write(self, snapshot: dict) -> tuple[str, int]:
        """Store a snapshot (format 2, agents/ckptfile.py) in a free slot of this run, report
        it saved, and return (digest, bytes uploaded)."""
        step, key = snapshot["step"], ckptfile.key_from_env()
        index = [e for e in self._read_index() if e["step"] != step]
        n = self._free_slot()
        if n is None:
            raise RuntimeError("every checkpoint slot of this run holds a checkpoint not yet reported")
        slot = f"{self.attempt}-{n}"
        # Objects in the slot about to be written are gone; the others may be pointed at.
        self._objects = {d: at for d, at in self._objects.items() if at[2] != n}
        entries, refs, uploaded = {}, {n}, 0
        for i, (name, (kind, tensor)) in enumerate(snapshot["tensors"].items()):
            content = ckptfile.tensor_digest(kind, tensor)
            at = self._objects.get(content)
            if at is None:
                data = ckptfile.seal(ckptfile.tensor_bytes(kind, tensor), key)
                at = (self.node, f"{slot}_{i}", n)
                self._put_copies(at[1], data)
                uploaded += len(data)
                self._objects[content] = at
            refs.add(at[2])
            entries[name] = {"kind": kind, "digest": content, "node": at[0], "slot": at[1]}
        manifest = {"format": ckptfile.FORMAT_2, "step": step, "tree": snapshot["tree"], "tensors": entries}
        data = ckptfile.seal(json.dumps(manifest).encode(), key)
        digest = digest_of(data)
        self._put_copies(slot, data)
        uploaded += len(data)
        self._saved = [e for e in self._saved if e["n"] != n] + [
            {"n": n, "slot": slot, "fact": None, "refs": refs}
        ]
        index.append({"step": step, "digest": digest, "bytes": len(data), "slot": slot, "node": self.node})
        self._call(
            ckptstore.put_index(
                self.js, self.job, self.node, ckptfile.seal(json.dumps(index[-self.keep :]).encode(), key)
            )
        )
        self._saved[-1]["fact"] = self._report(
            T.CheckpointSaved(
                job=self.job, step=step, digest=digest, bytes=uploaded, path=f"{SDK_SCHEME}{self.node}/{slot}"
            ),
            f"ckpt-saved-{step}-{digest[7:19]}",
        )
        self.last_upload_bytes = uploaded
        self._saved_step, self._saved_at = step, (digest, uploaded)
        self._ckpt_retry_s = CKPT_RETRY_FIRST_S
        return digest, uploaded

    def _put_copies(self, name: str, data: bytes) -> None:
        """Store object `name` in every copy the policy asks for, each read back and checked:
        the bus's (the upload runs while this host's copy is written to its disk)."""
        upload = asyncio.run_coroutine_threadsafe(
            ckptstore.put(self.js, self.job, self.node, name, data), self._loop
        )
        try:
            if self.copies > 1 and self.copy_dir is not None:
                ckptcopy.write_verified(self.copy_dir, name, data)
            upload.result(CALL_TIMEOUT_S)
        except BaseException:
            upload.cancel()
            raise
        stored = self._call(ckptstore.get(self.js, self.job, name, self.node))
        if stored is None or digest_of(stored) != digest_of(data):
            raise RuntimeError(f"the bus's copy of {name} does not read back as written")

    def _free_slot(self) -> int | None:
        """A slot of this run that no checkpoint a resume may name depends on: not one that
        the newest checkpoint whose report was delivered, or any newer one (not delivered yet:
        it may still be recorded), is stored in or points into; the fallbacks' slots (the
        newest keep-1) only when nothing else is free; the one used longest ago first."""
        required: set[int] = set()
        for entry in reversed(self._saved):
            required |= entry["refs"]
            if entry["fact"] is None or not Path(entry["fact"]).exists():
                break
        fallbacks: set[int] = set()
        for entry in self._saved[max(0, len(self._saved) - (self.keep - 1)) :] if self.keep > 1 else []:
            fallbacks |= entry["refs"]
        last_use = {e["n"]: i for i, e in enumerate(self._saved)}
        free = [n for n in range(max(self.keep, SLOTS_PER_RUN_MAX)) if n not in required]
        return min(free, key=lambda n: (n in fallbacks, last_use.get(n, -1))) if free else None

    def _upload_failed(self, step: int, why: str) -> None:
        print(
            f"xirang sdk: checkpoint of step {step} not saved ({why}); retrying in"
            f" {self._ckpt_retry_s:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        # Due again after the backoff, not after a whole interval.
        interval = self.checkpoint_every_s or 0.0
        self._last_ckpt = time.monotonic() - max(0.0, interval - self._ckpt_retry_s)
        self._ckpt_retry_s = min(CKPT_RETRY_MAX_S, self._ckpt_retry_s * 2)

    def restore(self) -> tuple[int, Any] | None:
        """The newest checkpoint whose digest verifies: (step, state), or None to start
        fresh. Reports each bad checkpoint, then `started`."""
        if not self.active:
            return None
        want_digest = os.environ.get("XR_RESUME_DIGEST", "")
        want_step = int(os.environ.get("XR_RESUME_STEP", "0") or 0)
        restored = None
        points = [p for p in json.loads(os.environ.get("XR_RESUME_POINTS") or "[]") if _in_store(p)]
        if want_digest and points and points[0]["digest"] == want_digest:
            # Where the log recorded each checkpoint (the run's own slot), newest first.
            candidates = [_located(p) for p in points]
        elif want_digest:
            index = self._retry_forever("reading the checkpoint index", self._read_index)
            candidates = [e for e in reversed(index) if e["step"] <= want_step]
            if not candidates or candidates[0]["step"] != want_step:
                candidates.insert(0, {"step": want_step, "digest": want_digest})
            candidates[0]["digest"] = want_digest  # the scheduler's record is the authority
        if want_digest:
            for entry in candidates:
                payload = self._load_verified(entry)
                if payload is not None:
                    restored = payload
                    break
                self.fallbacks.append(entry["digest"])
                self._report(
                    T.CheckpointFailed(job=self.job, reason="digest_mismatch", digest=entry["digest"]),
                    f"bad-{entry['digest'][7:23]}",
                )
        if os.environ.get("XR_REPORT_STARTED") == "1":
            self._report(
                T.Started(job=self.job, restored_copy=self.restored_copy if restored else 0), "started"
            )
        self._last_ckpt = time.monotonic()
        if want_digest:
            told = f"restored step {restored['step']}" if restored else "no checkpoint verifies; from step 0"
            copy = f" from {COPY_NAMES[self.restored_copy]}" if restored else ""
            print(f"xirang sdk: {told} (the resume named step {want_step}){copy}", flush=True)
        if restored is None:
            return None
        _set_rng_states(restored["rng"])
        self.restored_step = restored["step"]
        return restored["step"], restored["state"]

    def _load_verified(self, entry: dict) -> dict | None:
        """The checkpoint `entry` names, each of its objects read from the bus's copy, else
        from the copy on the disk of the host that wrote it; None when neither verifies."""
        # A checkpoint the index does not place (e.g. only the resume order names it) is
        # looked for in every slot, newest write on any node; missing fails verification.
        slots = [entry["slot"]] if entry.get("slot") is not None else list(range(self.keep))
        node = entry.get("node") or ckptstore.ANY_NODE
        copies_used: list[int] = []
        data = None
        for slot in slots:
            data = self._read_object(
                f"checkpoint step {entry['step']}",
                str(slot),
                node,
                lambda d: d if digest_of(d) == entry["digest"] else None,
            )
            if data is not None:
                break
        if data is None:
            print(f"xirang sdk: checkpoint step {entry['step']}: no copy verifies", file=sys.stderr)
            return None
        copies_used.append(data[0])
        try:
            payload = self._decode(data[1], copies_used)
        except ckptfile.CheckpointError as err:
            print(f"xirang sdk: checkpoint step {entry['step']} refused: {err}", file=sys.stderr)
            return None
        self.restored_copy = max(copies_used)
        return payload

    def _read_object(self, what: str, name: str, node: str, verified) -> tuple[int, Any] | None:
        """(which copy, `verified(bytes)`): object `name` from the bus's copy, else from the
        copy on `node`'s disk (served by its agent), the first that `verified` accepts (not
        None); None when neither is."""
        data = self._retry_forever(
            f"fetching {what}", lambda: self._call(ckptstore.get(self.js, self.job, name, node))
        )
        value = None if data is None else verified(data)
        if value is not None:
            return 1, value
        why = "is missing" if data is None else "fails its digest check"
        if self.copies < 2 or node == ckptstore.ANY_NODE:
            print(f"xirang sdk: {what}: the bus's copy {why}", file=sys.stderr, flush=True)
            return None
        copy = self._fetch_copy(what, node, name)
        value = None if copy is None else verified(copy)
        if value is not None:
            print(f"xirang sdk: {what}: the bus's copy {why}; read the copy on {node}'s disk", flush=True)
            return 2, value
        its = "is missing" if copy is None else "fails its digest check"
        print(
            f"xirang sdk: {what}: the bus's copy {why}, and {node}'s copy {its}", file=sys.stderr, flush=True
        )
        return None

    def _fetch_copy(self, what: str, node: str, name: str) -> bytes | None:
        """Object `name` from the copy on `node`'s disk; while no agent answers there, asked
        again for up to COPY_WAIT_S (once per node and restore: a node that did not answer
        is not waited for again)."""
        deadline = time.monotonic() + (0.0 if node in self._unreachable else COPY_WAIT_S)
        while True:
            try:
                return self._call(ckptcopy.fetch(self.nc, node, self.job, name), timeout_s=None)
            except ckptcopy.CopyUnreachable as err:
                if time.monotonic() >= deadline:
                    self._unreachable.add(node)
                    print(f"xirang sdk: {what}: {err}; its copy there is out of reach", file=sys.stderr)
                    return None
                time.sleep(1.0)

    def _decode(self, data: bytes, copies_used: list[int] | None = None) -> dict:
        """A checkpoint's payload: format 2 (a manifest and its tensors' objects, each checked
        against the manifest's digest, each from the first copy that verifies) or the npz
        format of earlier releases."""
        key = ckptfile.key_from_env()
        plain = ckptfile.unseal(data, key)
        if not ckptfile.is_format_2(plain):
            return ckptfile.decode(data, key)
        manifest = ckptfile.read_manifest(data, key)
        tensors = {}
        for name, entry in manifest["tensors"].items():

            def verified(stored: bytes, entry=entry) -> Any:
                try:
                    tensor = ckptfile.load_tensor(entry["kind"], ckptfile.unseal(stored, key))
                except ckptfile.CheckpointError:
                    return None
                return tensor if ckptfile.tensor_digest(entry["kind"], tensor) == entry["digest"] else None

            found = self._read_object(f"tensor {name}", entry["slot"], entry["node"], verified)
            if found is None:
                raise ckptfile.CheckpointError(f"tensor {name}: no copy matches its digest")
            if copies_used is not None:
                copies_used.append(found[0])
            tensors[name] = found[1]
        return ckptfile.join_tensors(manifest["tree"], tensors)

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
        self.checkpoint_if_due(step, state)

    def preempting(self) -> bool:
        """Whether a preemption notice (or a stop of the host) is pending: a job whose
        processes must agree on where to stop (a gang's ranks) asks this, tells the others,
        and then calls `safe_point`, which saves, releases and exits."""
        if not self.active or not self._notice:
            return False
        if self._read_notice() is None:
            self._notice = False  # withdrawn
        return self._notice

    def checkpoint_if_due(self, step: int, state: Any) -> None:
        """Save when `checkpoint_every_s` has passed since the last save; never acts on a
        notice (see `preempting`)."""
        if (
            self.active
            and self.checkpoint_every_s
            and time.monotonic() - self._last_ckpt >= self.checkpoint_every_s
        ):
            if self.async_save:
                self.checkpoint_async(step, state)
            else:
                self.checkpoint(step, state)

    def _read_notice(self) -> dict | None:
        try:
            return json.loads((self.dir / "notice.json").read_text())
        except (OSError, ValueError):
            return None

    def _release(self, step: int, state: Any, notice: dict) -> None:
        saga = notice.get("saga", "")
        if notice.get("drain"):
            # The host agent is stopping: save, and exit; the scheduler requeues the job
            # from this checkpoint, so there is no preemption to report.
            if not self._checkpoint_by_deadline(step, state, notice):
                print(f"xirang sdk: stopping at step {step} without a new checkpoint", flush=True)
            write_durably(self.dir / "released", str(step).encode())
            print(f"xirang sdk: host stopping; checkpointed at step {step}, exiting", flush=True)
            self.close()
            sys.exit(0)
        self._report(T.SafePoint(job=self.job), f"{saga}-safe")
        if notice.get("checkpoint_needed", True) and not self._checkpoint_by_deadline(step, state, notice):
            # No checkpoint could be saved (the bus is away): say so, and keep training.
            # The scheduler rolls the preemption back and withdraws the notice.
            self._report(T.CheckpointFailed(job=self.job, reason="upload_failed"), f"{saga}-ckpt-failed")
            (self.dir / "notice.json").unlink(missing_ok=True)
            self._notice = False
            return
        self._report(T.Released(job=self.job), f"{saga}-released")
        write_durably(self.dir / "released", str(step).encode())
        print(f"xirang sdk: preempted at step {step} ({saga}); released", flush=True)
        self.close()
        sys.exit(0)

    def _checkpoint_by_deadline(self, step: int, state: Any, notice: dict) -> bool:
        """Keep trying to save until the notice's deadline (log time, wall-clock ms); a save
        in progress is waited for first, within the same deadline."""
        deadline_s = notice.get("deadline_t", 0) / 1000
        self.wait_for_save(max(0.0, deadline_s - time.time()))
        while True:
            if self._try_checkpoint(step, state) is not None:
                return True
            if time.time() + 1.0 > deadline_s:
                return False
            time.sleep(1.0)

    def close(self) -> None:
        """Finish a save in progress, drain the job's NATS connection and stop its I/O thread."""
        if self.active:
            self.wait_for_save(CALL_TIMEOUT_S)
            try:
                self._call(self.nc.drain())
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)


def _in_store(point: dict) -> bool:
    return str(point.get("path", "")).startswith(SDK_SCHEME)


def _located(point: dict) -> dict:
    """A resume point in the SDK's store (`xr-ckpt:<node>/<slot>`) as an index entry."""
    node, _, slot = point["path"][len(SDK_SCHEME) :].rpartition("/")
    return {"step": point["step"], "digest": point["digest"], "node": node, "slot": slot}


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime if path else 0.0
    except OSError:
        return 0.0


def _rng_states() -> dict:
    """The random-number states: Python's, numpy's global one, and torch's (CPU and every
    CUDA device) when torch is in use."""
    states = {"python": random.getstate(), "numpy": _numpy_rng_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        states["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            states["cuda"] = list(torch.cuda.get_rng_state_all())
    return states


def _set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    _set_numpy_rng_state(states["numpy"])
    torch = sys.modules.get("torch")
    if torch is not None and states.get("torch") is not None:
        torch.set_rng_state(torch.as_tensor(states["torch"], dtype=torch.uint8))
        if states.get("cuda") and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.as_tensor(s, dtype=torch.uint8) for s in states["cuda"]])


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
