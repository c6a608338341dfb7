"""Sealing one step's events into the log: `Ctx` collects the records of one step, applies
each event to the state at once (`evolve`) and chains it into the hash chain, with a
`StateDigest` every `digest_every_events`. `reject` records a bad input's reason. A log's
first record names the policy it starts under (`pin_event`).

A simulation that keeps no log steps with `sealed=False`: every event is still applied and
numbered (a run's fencing token is its record's `n`), but nothing is hashed: records carry
no chain (`prev`/`hash` empty) and each `StateDigest` no digest. Decisions never read the
chain, so they are the same; such records are not a log (nothing can audit them).

Replay's twin is `core.replay.apply_record`: what is sealed here is what it checks.
"""

from __future__ import annotations

import hashlib

from ..model import types as T
from ..model.bounds import NAME_CHARS_MAX, T_MS_MAX, TEXT_CHARS_MAX
from .evolve import evolve
from ..model.policy_defaults import is_pin, pin_params
from ..model.state import DIGEST_SCHEMA, State, live_digest


class Ctx:
    """Collects the records of one step; every emit applies the event at once."""

    __slots__ = ("state", "inp", "records", "accepted", "sealed")

    def __init__(self, state: State, inp: T.Input, sealed: bool = True) -> None:
        self.state = state
        self.inp = inp
        self.records: list[T.Record] = []
        self.accepted = False
        self.sealed = sealed

    def emit(self, ev: T.Event) -> None:
        """Seal an event (after the input's `InputAccepted`, once): applied to the state at
        once."""
        if not self.accepted and not isinstance(ev, T.InputRejected):
            self.accepted = True
            self._seal(T.InputAccepted(t=self.inp.t, input=self.inp))
        self._seal(ev)

    def _seal(self, ev: T.Event) -> None:
        c = self.state.canonical
        if c.events_n == 0 and not (isinstance(ev, T.PolicyChanged) and is_pin(ev.params)):
            self._seal(pin_event(self.state, ev.t))
        evolve(self.state, ev)
        n = c.events_n + 1
        c.events_n = n
        if self.sealed:
            prev = c.chain
            digest = hashlib.sha256(prev.encode() + T.encode(ev)).hexdigest()
            c.chain = digest
        else:
            prev = digest = ""
        seq = self.inp.seq
        if seq > c.last_input_seq:
            c.last_input_seq = seq
        self.records.append(T.Record(n=n, prev=prev, hash=digest, input_seq=seq, event=ev))
        if n % c.policy.digest_every_events == 0 and not isinstance(ev, T.StateDigest):
            state_digest = live_digest(self.state) if self.sealed else ""
            self._seal(T.StateDigest(t=c.t, digest=state_digest, events=n, schema=DIGEST_SCHEMA))


def pin_event(state: State, t: int) -> T.PolicyChanged:
    """A log's first record: the defaults version its policy starts from, and every parameter
    in which it differs from that version's table, so the log folds back to the same policy
    whichever release folds it (core/model/policy_defaults.py)."""
    return T.PolicyChanged(
        t=t,
        params=pin_params(state.canonical.policy),
        by="xirang",
        reason="the policy this log starts under: its defaults version and what differs from it",
    )


def reject(ctx: Ctx, reason: str, detail: str = "") -> None:
    """Record why the step's input was refused (`InputRejected`); nothing else changes."""
    inp = ctx.inp
    # An input out of bounds must not carry its time or its job id into the log as they are.
    t = inp.t if isinstance(inp.t, int) and 0 <= inp.t <= T_MS_MAX else 0
    job = T.input_job(inp)
    job = job[:NAME_CHARS_MAX].encode("utf-8", "replace").decode("utf-8") if isinstance(job, str) else ""
    ctx.emit(
        T.InputRejected(
            t=max(t, ctx.state.canonical.t),
            reason=reason,
            detail=detail[:TEXT_CHARS_MAX],
            input_type=T.type_name(inp),
            job=job,
        )
    )
