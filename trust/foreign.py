"""Telling the scheduler's records from foreign messages on the log, so that a message
someone else appended to XR_EV never stops a reader.

XR_EV denies delete and purge (the log is kept forever), so a message that is not the
scheduler's cannot be removed: anyone who may publish on `xr.ev.log.>` (on a secured bus,
whoever holds the scheduler's NATS credentials without its signing key; on an open one,
anyone) can append garbage, an unsigned record, or a copy of a genuine one. Every reader
therefore sorts what it reads: `LogSorter.feed` releases, in log order, exactly the
records that belong to the scheduler's hash chain and that a trusted signature covers,
and sets every other message aside as `Foreign` (never folded, never acted on).

Which records a signature covers: the scheduler signs the last record of each input's
records (`trust.signing.sign_records`); the records before it are unsigned and covered by
the hash chain that runs back from the signed one (each record's hash covers its event
and its `prev`). So when a signed record arrives, the sorter walks back from its `prev`
through the records it holds to the last record it released: the records on that path
are the scheduler's, the others it holds are foreign. A signed record that does not link
back is foreign when it claims a position already taken (a copy, perhaps with another
event under the copied hash) and fatal (`ChainError`) when it claims a later one: then
the scheduler's own records are missing, which no append can cause. Without a keyring (an
open, unsigned log) a record is the scheduler's when it follows the chain, a foreign one
when it does not.

The scheduler, finding foreign messages, records a signed `RecordDisowned` for each
(core/types.py: its stream sequence and the SHA-256 of its bytes) and raises an alert;
`xirang audit` lists them and passes only when every foreign message was disowned. A log
without foreign messages releases the same records in the same order as before, so its
fold (and every digest in it) is exactly what it was.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from core import ChainError
from core import types as T

from .signing import KeyRing, SignatureError

# Reason codes of a foreign message (the `reason` of its `RecordDisowned`).
NOT_A_RECORD = "not_a_record"
UNSIGNED = "unsigned"
BAD_SIGNATURE = "bad_signature"
COPY = "copy_of_a_record"
OFF_CHAIN = "off_chain"


@dataclass
class Foreign:
    """A message on the log that is not one of the scheduler's records."""

    pos: int  # stream sequence (or line of an exported file)
    digest: str  # SHA-256 of the message's bytes
    reason: str  # a code above
    problem: str  # in words
    n: int  # the record position it claims (the expected one for garbage)
    disowned_by: int = 0  # the record n of the `RecordDisowned` that names it, once seen


def message_digest(payload: bytes) -> str:
    """The SHA-256 (hex) of a message's bytes: how a `RecordDisowned` names it."""
    return hashlib.sha256(payload).hexdigest()


def chain_problem(record: T.Record, n: int, chain: str) -> str | None:
    """Why `record` cannot follow record `n` (hash `chain`), in an auditor's words; None
    when it can."""
    expected = n + 1
    if record.n > expected:
        missing = f"record {expected}" if record.n == expected + 1 else f"records {expected}..{record.n - 1}"
        return f"{missing} missing just before it (dropped, or moved later)"
    if record.n < expected:
        return f"record {record.n} appears again after record {n} (moved or duplicated)"
    if record.prev != chain:
        return "does not follow the previous record's hash"
    if not T.content_matches(record):
        return "content does not match its hash (modified)"
    return None


class LogSorter:
    """Feed the log's messages in order (`feed`); each call returns the scheduler's
    records it now knows to be genuine, in order, with their positions; `finish()` at the
    end of what was read. Foreign messages collect in `foreign`. `n` and `chain` are where
    the reader's state stands (the record it folded last)."""

    def __init__(self, keyring: KeyRing | None = None, n: int = 0, chain: str = T.GENESIS_HASH) -> None:
        self.keyring = keyring
        self.n, self.chain = n, chain
        self.foreign: list[Foreign] = []
        # `RecordDisowned` records that name no foreign message this reader saw (an
        # exported copy without it, or a read that started after it).
        self.disowns_unmatched: list[T.RecordDisowned] = []
        self.signatures = 0
        self.keys_seen: set[str] = set()
        self._held: list[tuple[T.Record, int, bytes]] = []  # unsigned, waiting for a signature
        self._adopting: list[tuple[T.Record, int]] = []  # up to the adopted history's head
        self._adopt_n, self._adopt_chain = n, chain

    # ------------------------------------------------------------ feeding

    def feed(self, pos: int, payload: bytes) -> list[tuple[T.Record, int]]:
        """The records now known to be the scheduler's (possibly none) after this message."""
        try:
            record = T.decode_record(payload)
        except msgspec.DecodeError as err:
            words = f"not a log record: {err}"
            if str(err).startswith("Invalid value") and str(err).endswith("`$.type`"):
                words += (
                    " (an event type this release does not know: was the log written by a newer"
                    " xirang? read it with that release or a later one)"
                )
            self._set_aside(pos, payload, NOT_A_RECORD, words, self.n + len(self._held) + 1)
            return []
        return self.feed_record(pos, record, payload)

    def feed_record(
        self, pos: int, record: T.Record, payload: bytes | None = None
    ) -> list[tuple[T.Record, int]]:
        """`feed` for a record already decoded (`payload`, its bytes, names it if foreign)."""
        # The message's bytes: hashed to name it only if it is set aside.
        raw = payload if payload is not None else T.encode_record(record)
        if self.keyring is None:
            return self._by_chain(pos, record, raw)
        adopted = self.keyring.adopted
        if adopted is not None and self.n < adopted.n:
            return self._adopt(pos, record, raw, adopted)
        if not record.sig:
            self._held.append((record, pos, raw))
            return []
        problem = self.keyring.problem(record)
        if problem:
            self._set_aside(pos, raw, BAD_SIGNATURE, problem, record.n)
            return []
        path = self._path_to(record)
        if path is None:
            if not T.content_matches(record):
                words = "a copy of a signed record with another event under its hash"
            elif record.n <= self.n:
                words = f"a copy of signed record {record.n}, which the log holds already"
            else:
                # A genuine signature on a record that cannot follow: records before it
                # were deleted or altered in the store. No append explains that.
                self._raise_altered(record)
            self._set_aside(pos, raw, COPY, words, record.n)
            return []
        self.signatures += 1
        self.keys_seen.add(record.key)
        on_path = {id(r) for r, _ in path}
        for held, held_pos, held_raw in self._held:
            if id(held) not in on_path:
                self._set_aside(held_pos, held_raw, UNSIGNED, _UNCOVERED, held.n)
        self._held = []
        released = [*path, (record, pos)]
        return self._release(released)

    def finish(self) -> list[tuple[T.Record, int]]:
        """The read ended: what waits for a signature is foreign (a batch of the
        scheduler's always ends on a signed record). Raises `SignatureError` when the log
        ends inside the history the keyring adopted (records were deleted)."""
        if self._adopting:
            first, pos = self._adopting[0]
            raise SignatureError(
                first.n,
                f"the log ends at record {self._adopting[-1][0].n}, before record "
                f"{self.keyring.adopted.n} that the keyring adopted: records were deleted",
                pos,
            )
        for held, held_pos, held_raw in self._held:
            self._set_aside(held_pos, held_raw, UNSIGNED, _UNCOVERED, held.n)
        self._held = []
        return []

    @property
    def held(self) -> list[tuple[T.Record, int]]:
        """Records read and not yet known to be the scheduler's, in order."""
        return [*self._adopting, *((r, p) for r, p, _ in self._held)]

    def undisowned(self) -> list[Foreign]:
        """The foreign messages no `RecordDisowned` has named yet."""
        return [f for f in self.foreign if not f.disowned_by]

    # ------------------------------------------------------------ inside

    def _by_chain(self, pos: int, record: T.Record, raw: bytes) -> list[tuple[T.Record, int]]:
        problem = chain_problem(record, self.n, self.chain)
        if problem:
            reason = COPY if record.n <= self.n else OFF_CHAIN
            self._set_aside(pos, raw, reason, problem, record.n)
            return []
        return self._release([(record, pos)])

    def _adopt(self, pos: int, record: T.Record, raw: bytes, adopted) -> list[tuple[T.Record, int]]:
        """Unsigned history a trusted key vouches for (`xirang key adopt`): held while it
        follows the chain, released once its head has the adopted hash."""
        problem = chain_problem(record, self._adopt_n, self._adopt_chain)
        if problem:
            self._set_aside(pos, raw, OFF_CHAIN, problem, record.n)
            return []
        if record.n == adopted.n and record.hash != adopted.hash:
            raise SignatureError(
                record.n,
                "is not the head of the history the keyring adopted (`xirang key adopt`): the log "
                "up to it was altered",
                pos,
            )
        self._adopting.append((record, pos))
        self._adopt_n, self._adopt_chain = record.n, record.hash
        if record.n < adopted.n:
            return []
        released, self._adopting = self._adopting, []
        return self._release(released)

    def _path_to(self, record: T.Record) -> list[tuple[T.Record, int]] | None:
        """The held records on the hash chain from the last released record to `record`, in
        order; None when `record` does not link back to it."""
        if not T.content_matches(record):
            return None
        need, path = record.prev, []
        for held, pos, _ in reversed(self._held):  # the newest first: the batch just read
            if need == self.chain:
                break
            if held.hash == need and T.content_matches(held):
                path.append((held, pos))
                need = held.prev
        if need != self.chain:
            return None
        path.reverse()
        first_n = self.n + 1
        if [r.n for r, _ in path] + [record.n] != list(range(first_n, first_n + len(path) + 1)):
            return None
        return path

    def _release(self, records: list[tuple[T.Record, int]]) -> list[tuple[T.Record, int]]:
        last = records[-1][0]
        self.n, self.chain = last.n, last.hash
        self._adopt_n, self._adopt_chain = self.n, self.chain
        for record, _ in records:
            if isinstance(record.event, T.RecordDisowned):
                self._note_disown(record)
        return records

    def _note_disown(self, record: T.Record) -> None:
        ev = record.event
        for foreign in self.foreign:
            if foreign.digest == ev.digest and not foreign.disowned_by:
                foreign.disowned_by = record.n
                return
        self.disowns_unmatched.append(ev)

    def _raise_altered(self, record: T.Record) -> None:
        """Stop at the first record the scheduler wrote that is not on the log as written: the
        message set aside in its place when there is one (an altered record names itself),
        else the signed record that cannot follow (records before it are gone)."""
        gap = [f for f in self.foreign if self.n < f.n < record.n]
        if gap:
            # the first one set aside in the gap: the records held before it waited for its signature
            in_its_place = min(gap, key=lambda f: (f.n, f.pos))
            raise SignatureError(
                in_its_place.n,
                f"{in_its_place.problem}: it stands where the scheduler's record {in_its_place.n}"
                " was, so the log was altered there",
                in_its_place.pos,
            )
        raise ChainError(record.n, chain_problem(record, self.n, self.chain) or "off the chain")

    def _set_aside(self, pos: int, raw: bytes, reason: str, problem: str, n: int) -> None:
        self.foreign.append(Foreign(pos=pos, digest=message_digest(raw), reason=reason, problem=problem, n=n))


_UNCOVERED = "not signed by the scheduler: no signature covers it (appended or altered by someone else)"
