"""State digests across releases: what a `StateDigest` record covers, schema by schema, and
how a reader checks one written by an older release, so that a log keeps verifying while
the state's types grow.

Every `policy.digest_every_events` records the scheduler seals a `StateDigest`: SHA-256
over the canonical state (sorted keys; jobs through the sum of their own hashes, terminal
jobs through `done_hash`). Folding the log must rebuild a state with the same digest.
`StateDigest.schema` says how the digest was computed:

- Schema 3 (`core.model.digests.DIGEST_SCHEMA`, written since 2026-12-04): as schema 2, but
  the nodes enter as the sum of their own hashes (as jobs do), not encoded in the digest:
  a digest no longer reads every node of the pool. Older logs' schema-2 digests are checked
  as schema 2 computed them (`state_digest_schema_2`).
- Schema 2 (written from 2026-12-01 to 2026-12-04): every entity with its
  fields at their default left out, and the policy as the params the log's `set_policy`
  inputs set (`Canonical.policy_params`, with the defaults version the log names), not the
  policy in force. So a field added to Job, Node, Saga, Ledger, ... with a default leaves
  every older digest as it was, and so does a changed policy default (a new defaults
  version: a log folds under the version it names, core/model/policy_defaults.py). What whoever changes the state's types must keep to:
    * add a field only with a default, and leave it at its default for everything that
      events written before it produce (evolve must not derive it for old events);
    * never change the default of a state field, never reuse a field's name for a new
      meaning (policy defaults may change: they are not digested);
    * inside an entity, give a new field a plain default (0, "", False, [], {}): msgspec
      leaves out only those; one made by a `default_factory` of your own is always
      encoded (a new field of `Canonical` itself is compared with its default, either way);
    * a change that cannot keep to this bumps DIGEST_SCHEMA, and this module gives the
      older schema its own projection, as schema 1 has below.
- Schema 1 (no `schema` key: every digest written before schema 2): every field the
  writing release had, at whatever value, and the whole policy in force, with that
  release's defaults. A reader recomputes it for each release since the digest took its
  present form (e3726a4, 2026-11-29 08:58): the field sets and policy defaults in
  core/log/digest_legacy.py, newest first (the release that matched the log's previous digest
  first). Fields added since are left out, policy fields the log never set take that
  release's defaults. Digests of releases before e3726a4, or of unreleased branches that
  added fields of their own, match none of them: the check names the digest's schema and
  says so.
- A schema newer than this release knows is not guessed at: the check asks for a newer
  xirang.

What a digest cannot survive is a change in how events fold (evolve): then the replay
really does rebuild a different state, and the mismatch says the log was written under
other folding rules. Decisions are never re-made when a log is folded, so a change of the
decision rules (or of policy defaults) alone never breaks an old log's audit.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from ..model import types as T
from .digest_legacy import LEGACY_CHANGES, LEGACY_FIELDS, LEGACY_POLICY_DEFAULTS
from ..model import entities as S
from ..model.digests import jobs_hash_total, state_digest_schema_2
from ..model.state import DIGEST_MODULUS, DIGEST_SCHEMA, State, live_digest
from ..model.entities import Canonical

LEGACY_SCHEMA = 1
NODES_ENCODED_SCHEMA = 2  # the nodes encoded in the digest, not summed
# Where the digest took its present form: schema-1 digests of releases before it are not known.
FIRST_COMMIT, FIRST_DATE = "e3726a4", "2026-11-29 08:58"


class _Release(msgspec.Struct, frozen=True):
    """One schema-1 release, as its digests saw the state."""

    name: str
    fields: dict[str, frozenset[str]]  # type name -> the fields it had
    policy_defaults: dict[str, Any]
    # Types that encode today exactly as this release encoded them: the same fields, and
    # none with a default (which schema 2 would leave out).
    native: frozenset[str] = frozenset()


def _legacy_releases() -> tuple[_Release, ...]:
    """The schema-1 releases, newest first: from the last change back through every one."""
    fields = {name: set(names) for name, names in LEGACY_FIELDS.items()}
    defaults = dict(LEGACY_POLICY_DEFAULTS)
    releases = []
    until = "digest schema 2"
    starts = [(FIRST_COMMIT, FIRST_DATE), *((commit, date) for commit, date, _, _ in LEGACY_CHANGES)]
    for (commit, date), change in zip(reversed(starts), (*reversed(LEGACY_CHANGES), None)):
        name = f"releases from {commit} ({date}) until {until}"
        releases.append(_Release(name, {k: frozenset(v) for k, v in fields.items()}, dict(defaults)))
        if change is not None:
            for type_name, names in change[2].items():
                fields[type_name] -= set(names)
            defaults.update(change[3])
        until = f"{commit}"
    return tuple(msgspec.structs.replace(r, native=_native(r)) for r in releases)


def _native(release: _Release) -> frozenset[str]:
    types = (S.Job, S.Node, S.Saga, S.Window, S.Estimate, S.LevelWait, S.Ledger, S.Checkpoint, T.Slot)
    return frozenset(
        cls.__name__
        for cls in types
        if release.fields.get(cls.__name__) == frozenset(cls.__struct_fields__)
        and all(f.required for f in msgspec.inspect.type_info(cls).fields)  # type: ignore[attr-defined]
    )


LEGACY_RELEASES = _legacy_releases()


def digest_problem(state: State, ev: T.StateDigest) -> str:
    """Why the state folded so far does not match a recorded `StateDigest` ("" if it
    does), computed the way the digest's schema says."""
    if ev.schema in (DIGEST_SCHEMA, NODES_ENCODED_SCHEMA):
        if ev.schema == DIGEST_SCHEMA:
            mine = live_digest(state)
        else:
            mine = state_digest_schema_2(state.canonical, jobs_hash_total(state))
        if mine == ev.digest:
            return ""
        return (
            f"state digest {mine[:16]} != recorded {ev.digest[:16]} (digest schema {ev.schema}): "
            "folding this log rebuilds another state than the scheduler's, so either the log was "
            "altered and re-hashed, or it was written under other folding rules (core/log/evolve.py)"
        )
    if ev.schema == LEGACY_SCHEMA:
        return _legacy_problem(state, ev)
    if ev.schema > DIGEST_SCHEMA:
        return (
            f"state digest of schema {ev.schema}, newer than this release knows (up to "
            f"{DIGEST_SCHEMA}): audit this log with the xirang release that wrote it, or a newer one"
        )
    return f"state digest of unknown schema {ev.schema}"


def _legacy_problem(state: State, ev: T.StateDigest) -> str:
    hint = state.scratch.legacy_digest_release
    order = [hint, *(i for i in range(len(LEGACY_RELEASES)) if i != hint)]
    for i in order:
        if legacy_digest(state.canonical, LEGACY_RELEASES[i]) == ev.digest:
            state.scratch.legacy_digest_release = i
            return ""
    return (
        f"state digest {ev.digest[:16]} (schema 1, written before digest schemas) matches the state "
        f"as none of the {len(LEGACY_RELEASES)} releases since 2026-11-29 08:58 saw it: either the "
        "log was altered and re-hashed, it was written by an older or unreleased version, or under "
        "other folding rules (core/log/evolve.py)"
    )


def legacy_digest(c: Canonical, release: _Release) -> str:
    """The digest `release` (schema 1) wrote for state `c`: every field it had, the policy in
    force with its defaults for what the log did not set."""
    jobs_sum = sum(_sha_int(_encode(_view(job, release))) for job in c.jobs.values()) % DIGEST_MODULUS
    top = {name: _view(getattr(c, name), release) for name in release.fields["Canonical"]}
    top.update(jobs={}, done={}, policy=_legacy_policy(c, release))
    return hashlib.sha256(_encode(top) + b"|jobs:" + f"{jobs_sum:064x}".encode()).hexdigest()


def _legacy_policy(c: Canonical, release: _Release) -> dict[str, Any]:
    policy = {}
    for name in release.fields["Policy"]:
        if name in c.policy_params or name not in release.policy_defaults:
            policy[name] = _view(getattr(c.policy, name), release)
        else:
            policy[name] = release.policy_defaults[name]
    return policy


_PLAIN = (str, int, float, bool, type(None))


def _view(value: Any, release: _Release) -> Any:
    """A value as `release` encoded it: structs with exactly the fields it knew, all of them."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, msgspec.Struct):
        name = type(value).__name__
        if name in release.native:
            return value  # encodes as the release did: same fields, none left out at a default
        known = release.fields.get(name)
        if known is None:
            raise ValueError(f"no schema-1 field set for {name}")
        return {k: _view(v, release) for k, v in msgspec.structs.asdict(value).items() if k in known}
    if isinstance(value, dict):
        return {key: _view(item, release) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        if value and isinstance(value[0], _PLAIN):
            return value  # lists in the state hold one kind of thing
        return [_view(item, release) for item in value]
    return value


def _encode(value: Any) -> bytes:
    return msgspec.json.encode(value, order="sorted")


def _sha_int(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest(), "big")
