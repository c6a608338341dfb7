"""Re-making a log's decisions (`xirang audit --redecide`): every input the log accepted is
stepped again through this release's core, and the events it decides are compared with the
recorded ones, up to the first that differs.

This is a second question, after the audit proper. The audit folds the recorded events and
verifies them (hash chain, signatures, state digests); it never re-decides, so a log written
under other decision rules still verifies. Re-deciding tells whether *this* release would
have decided the same: for a log this release wrote, it must (a difference is a determinism
bug, or a forged log re-hashed to fit its digests); for a log of an older release, a
difference only says that the rules changed since, and where they first made a difference.

What the log does not pin is taken from the release that re-decides, and said: the decision
code, and the policy defaults for what the log's `set_policy` inputs did not set (for a log
whose state digests matched a known older release, that release's defaults; see
core/log/digest.py). State digests are not compared (a release writes its own digest schema),
nor are rejected inputs re-run (the log keeps only their reason): their records are folded.
"""

from __future__ import annotations

from typing import Any

import msgspec

from core import new_state, step
from core import types as T
from core.log.digest import LEGACY_RELEASES
from core.log.evolve import evolve
from core.model.policy import Policy, with_params
from core.model.policy_defaults import DEFAULTS_VERSION_KEY, LEGACY_DEFAULTS_VERSION, defaults_of, is_pin

UNNAMED = f"version {LEGACY_DEFAULTS_VERSION} (the log names none)"


def legacy_policy(release_name: str) -> Policy:
    """The default policy of a schema-1 release (core/log/digest.py), for the fields it had;
    fields added since keep the legacy defaults version's (core/model/policy_defaults.py)."""
    release = next(r for r in LEGACY_RELEASES if r.name == release_name)
    known = set(Policy.__struct_fields__)
    return with_params(
        defaults_of(LEGACY_DEFAULTS_VERSION),
        {k: v for k, v in release.policy_defaults.items() if k in known and k in release.fields["Policy"]},
    )


class Redecide:
    """Feed a log's records in order (`feed`), then `finish()`; `summary()` says whether this
    release decides every accepted input as recorded, or where it first does not."""

    def __init__(self, policy: Policy | None = None, policy_from: str = UNNAMED) -> None:
        # A log that names no defaults version was decided under the legacy ones; one that
        # names its version says so in its first record, folded before the first decision.
        self.state = new_state(policy or defaults_of(LEGACY_DEFAULTS_VERSION))
        self.policy_from = policy_from
        self.batch: list[T.Record] = []
        self.inputs = 0
        self.difference: dict[str, Any] | None = None

    def feed(self, pos: int, payload: bytes) -> bool:
        """One stored record; False once a difference is found (nothing more to learn)."""
        if self.difference is not None:
            return False
        record = T.decode_record(payload)
        if isinstance(record.event, (T.InputAccepted, T.InputRejected)) and self.batch:
            self._redecide(self.batch)
            self.batch = []
        self.batch.append(record)
        return self.difference is None

    def finish(self) -> None:
        """After the last record: re-decide the batch still open."""
        if self.batch and self.difference is None:
            self._redecide(self.batch)
        self.batch = []

    def _redecide(self, batch: list[T.Record]) -> None:
        first = batch[0].event
        if not isinstance(first, T.InputAccepted):
            for record in batch:  # a rejection changes nothing a decision reads but the clock
                self._fold(record)
            return
        self.inputs += 1
        opens_log = self.state.canonical.events_n == 0
        self.state, records = step(self.state, first.input)
        recorded = [r for r in batch if not isinstance(r.event, T.StateDigest)]
        decided = [r.event for r in records if not isinstance(r.event, T.StateDigest)]
        if opens_log:
            decided = decided[1:]  # the policy it starts under, which a log that names none lacks
        for i, record in enumerate(recorded):
            mine = decided[i] if i < len(decided) else None
            if mine != record.event:
                self.difference = _difference(record, mine)
                return
        if len(decided) > len(recorded):
            extra = decided[len(recorded)]
            self.difference = {
                "record": batch[-1].n + 1,
                "recorded": "nothing more for this input",
                "this_release": f"{T.type_name(extra)} {_short(extra)}",
            }

    def _fold(self, record: T.Record) -> None:
        c = self.state.canonical
        if c.events_n == 0 and isinstance(record.event, T.PolicyChanged) and is_pin(record.event.params):
            self.policy_from = f"version {record.event.params[DEFAULTS_VERSION_KEY]} (named by the log)"
        evolve(self.state, record.event)
        c.events_n, c.chain = record.n, record.hash

    def summary(self) -> dict[str, Any]:
        """Inputs re-decided, whether all were decided as recorded, the first difference."""
        out: dict[str, Any] = {
            "inputs_redecided": self.inputs,
            "same": self.difference is None,
            "policy_defaults": self.policy_from,
        }
        if self.difference is not None:
            out["first_difference"] = self.difference
        return out

    def words(self) -> str:
        """The summary as one sentence for people."""
        rules = f"this release's decision rules and the policy defaults of {self.policy_from}"
        if self.difference is None:
            return f"re-decided with {rules}: all {self.inputs} accepted inputs decided as recorded"
        d = self.difference
        return (
            f"re-decided with {rules}: decisions differ from record {d['record']} on (recorded "
            f"{d['recorded']}; this release: {d['this_release']}). The log itself verified: it was "
            "decided under other rules (an older release, or other defaults); if this release "
            "wrote it, that is a determinism bug or a log forged to fit its digests"
        )


def _difference(record: T.Record, mine: T.Event | None) -> dict[str, Any]:
    recorded = record.event
    if mine is None:
        return {
            "record": record.n,
            "recorded": f"{T.type_name(recorded)} {_short(recorded)}",
            "this_release": "nothing",
        }
    if type(mine) is not type(recorded):
        return {
            "record": record.n,
            "recorded": f"{T.type_name(recorded)} {_short(recorded)}",
            "this_release": f"{T.type_name(mine)} {_short(mine)}",
        }
    a, b = msgspec.structs.asdict(recorded), msgspec.structs.asdict(mine)
    changed = [name for name in a if a[name] != b[name]]
    return {
        "record": record.n,
        "event": T.type_name(recorded),
        "fields": changed,
        "recorded": f"{T.type_name(recorded)} " + ", ".join(f"{k}={a[k]!r}" for k in changed),
        "this_release": ", ".join(f"{k}={b[k]!r}" for k in changed),
    }


def _short(ev: T.Event) -> str:
    job = getattr(ev, "job", "") or getattr(ev, "saga", "")
    return f"({job})" if job else ""
