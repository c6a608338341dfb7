"""The state digest a `StateDigest` record carries, computed as the current schema says
(`DIGEST_SCHEMA`; core/log/digest.py says what each schema covers and how older ones are
checked): SHA-256 of the canonical state with sorted keys and every field at its default
left out, jobs and nodes entering as sums of their own hashes (multiset hashes the index
keeps up to date as events touch them: `jobs_hash_total`, `nodes_hash_total`), terminal
jobs through their rolling hash. So a digest costs what changed since the last one, not
how many jobs wait, ever ran, or how many nodes the pool has. Tamper evidence comes from
the hash chain; the digest's job is to catch a replay that diverges.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Protocol

import msgspec

from .entities import Canonical, Job, Node


class State(Protocol):
    """What the digest reads of core.model.state.State (which imports this module, so it is
    named here by its shape: the canonical entities and the index's running sums)."""

    canonical: Canonical
    index: Any


DIGEST_MODULUS = 1 << 256
# How `state_digest` computes (StateDigest.schema); core/log/digest.py says what each schema
# covers and how digests of older ones are checked.
DIGEST_SCHEMA = 3


_RUN_FIELD = re.compile(rb',"run":\d+')


def job_hash(job: Job) -> int:
    """A job's contribution to the state digest: its fields but those at their default
    (Job omits them) and `run`."""
    data = msgspec.json.encode(job, order="sorted")
    # `run` stays out of the digest (see Job.run). Inside a string a quote is escaped, so
    # this pattern matches only the field itself.
    data = _RUN_FIELD.sub(b"", data, count=1)
    return int.from_bytes(hashlib.sha256(data).digest(), "big")


def node_hash(node: Node) -> int:
    """A node's contribution to the state digest (schema 3): its fields but those at their
    default (Node omits them)."""
    return int.from_bytes(hashlib.sha256(msgspec.json.encode(node, order="sorted")).digest(), "big")


def jobs_hash_sum(c: Canonical) -> int:
    """The sum of every job's hash, the jobs' part of the digest."""
    return sum(job_hash(c.jobs[job_id]) for job_id in sorted(c.jobs)) % DIGEST_MODULUS


def nodes_hash_sum(c: Canonical) -> int:
    """The sum of every node's hash, the nodes' part of the digest (schema 3)."""
    return sum(node_hash(c.nodes[name]) for name in sorted(c.nodes)) % DIGEST_MODULUS


# Left out of the Canonical part of a digest: jobs and nodes enter through their hash sums,
# terminal jobs through `done_hash`, the policy through `policy_params`.
_DIGEST_LEFT_OUT = ("jobs", "done", "policy", "nodes")
_DIGEST_LEFT_OUT_SCHEMA_2 = ("jobs", "done", "policy")


def state_digest(c: Canonical, jobs_sum: int | None = None, nodes_sum: int | None = None) -> str:
    """The state digest of schema `DIGEST_SCHEMA` (see the module); the sums are computed
    from scratch when not given."""
    if jobs_sum is None:
        jobs_sum = jobs_hash_sum(c)
    if nodes_sum is None:
        nodes_sum = nodes_hash_sum(c)
    data = (
        _encoded_view(c, _DIGEST_LEFT_OUT)
        + b"|jobs:"
        + f"{jobs_sum:064x}".encode()
        + b"|nodes:"
        + f"{nodes_sum:064x}".encode()
    )
    return hashlib.sha256(data).hexdigest()


def state_digest_schema_2(c: Canonical, jobs_sum: int | None = None) -> str:
    """The state digest as schema 2 computed it (every node encoded in it): what checks the
    digests of logs written before schema 3."""
    if jobs_sum is None:
        jobs_sum = jobs_hash_sum(c)
    data = _encoded_view(c, _DIGEST_LEFT_OUT_SCHEMA_2) + b"|jobs:" + f"{jobs_sum:064x}".encode()
    return hashlib.sha256(data).hexdigest()


def _encoded_view(c: Canonical, left_out: tuple[str, ...]) -> bytes:
    view = {
        name: getattr(c, name)
        for name in c.__struct_fields__
        if name not in left_out and getattr(c, name) != _CANONICAL_DEFAULTS[name]
    }
    return msgspec.json.encode(view, order="sorted")


_CANONICAL_DEFAULTS = msgspec.structs.asdict(Canonical())


def live_digest(state: "State") -> str:
    """The digest of the live state, from the index's running sums of job and node hashes."""
    return state_digest(state.canonical, jobs_hash_total(state), nodes_hash_total(state))


def jobs_hash_total(state: "State") -> int:
    """The sum of the hashes of the jobs in the state (what `jobs_hash_sum` computes from
    scratch), from the index's running sum, hashing again only the jobs touched since."""
    ix = state.index
    if ix.hashes_stale:
        ix.jobs_sum = _refreshed_sum(
            ix.jobs_sum, ix.hashes_stale, ix.job_hashes, state.canonical.jobs, job_hash
        )
    return ix.jobs_sum


def nodes_hash_total(state: "State") -> int:
    """The sum of the hashes of the nodes (what `nodes_hash_sum` computes from scratch),
    from the index's running sum, hashing again only the nodes changed since."""
    ix = state.index
    if ix.nodes_stale:
        ix.nodes_sum = _refreshed_sum(
            ix.nodes_sum, ix.nodes_stale, ix.node_hashes, state.canonical.nodes, node_hash
        )
    return ix.nodes_sum


def _refreshed_sum(total: int, stale: dict, hashes: dict, live: dict, hash_of) -> int:
    """A running sum of hashes with the `stale` entries hashed again from `live` (an entry
    gone from it leaves the sum); `hashes` and `stale` are updated in place."""
    for key in stale:
        old = hashes.pop(key, 0)
        entity = live.get(key)
        new = hash_of(entity) if entity is not None else 0
        if new:
            hashes[key] = new
        total += new - old
    stale.clear()
    return total % DIGEST_MODULUS
