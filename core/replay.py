"""Folding a log back into state, and running inputs through `step`.

`apply_record` is the replay twin of sealing in `log_seal.Ctx`: it checks the record's place
in the hash chain (over the event as stored), verifies a `StateDigest` against the rebuilt
state (as the digest's schema says: core/log/digest.py), and applies the event with `evolve`. A modified, dropped or reordered record raises `ChainError` naming
its position.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from .model import types as T
from .log.evolve import evolve
from .machine import new_state, reject_input, step
from .passes.placement import reserved_nodes
from .log.digest import digest_problem
from .model.state import State, load_snapshot, snapshot_bytes


class ChainError(ValueError):
    """The log is not the one the scheduler wrote: names the first bad record."""

    def __init__(self, n: int, problem: str) -> None:
        super().__init__(f"record {n}: {problem}")
        self.n = n
        self.problem = problem


class DigestMismatch(ChainError):
    """A `StateDigest` in the log does not match the state the log folds to at that point."""


def apply_record(state: State, record: T.Record) -> None:
    """Check a record's place in the hash chain (and a `StateDigest` against the state), then
    apply its event; `ChainError` names the first record that is not the scheduler's."""
    c = state.canonical
    expected_n = c.events_n + 1
    if record.n != expected_n:
        raise ChainError(record.n, f"expected record {expected_n} here (dropped or reordered)")
    if record.prev != c.chain:
        raise ChainError(record.n, "does not follow the previous record's hash")
    if not T.content_matches(record):  # over the event as stored (see T.Record)
        raise ChainError(record.n, "content does not match its hash (modified)")
    if isinstance(record.event, T.StateDigest):
        problem = digest_problem(state, record.event)  # as the digest's schema says
        if problem:
            raise DigestMismatch(record.n, problem)
    if state.scratch.drain_pending_t >= 0:  # a state stepped before: its holds as they were
        reserved_nodes(state)
    evolve(state, record.event)
    c.events_n = record.n
    c.chain = record.hash
    c.last_input_seq = max(c.last_input_seq, record.input_seq)


def rebuild(records: Iterable[T.Record], state: State | None = None, to_n: int | None = None) -> State:
    """The state a log folds to, every record checked (see `apply_record`)."""
    state = state or new_state()
    for record in records:
        if to_n is not None and record.n > to_n:
            break
        apply_record(state, record)
    return state


def step_guarded(
    state: State, inp: T.Input, restore: Callable[[], State]
) -> tuple[State, list[T.Record], str]:
    """`step`, except that an exception inside it does not escape: the state is restored
    (`restore()` returns the state as it was before the input, e.g. folded from the log)
    and the input is recorded as rejected with `internal_error` and the exception's words.
    Returns (state, records, the error's words or "")."""
    try:
        state, records = step(state, inp)
        return state, records, ""
    except Exception as err:  # noqa: BLE001 - one input must never halt the scheduler
        words = f"{type(err).__name__}: {err}"
        state = restore()
        return state, reject_input(state, inp, T.INTERNAL_ERROR, words), words


def run_inputs(inputs: Iterable[T.Input], state: State | None = None) -> Iterator[T.Record]:
    """Step inputs through the core from an empty state: the state and every record they
    produced."""
    state = state or new_state()
    # Kept so that an input that makes `step` raise can be undone by folding them again.
    start = snapshot_bytes(state.canonical) if state.canonical.events_n else b""
    done: list[T.Record] = []

    def restore() -> State:
        return rebuild(done, load_snapshot(start) if start else None)

    for inp in inputs:
        state, records, _ = step_guarded(state, inp, restore)
        done.extend(records)
        yield from records
