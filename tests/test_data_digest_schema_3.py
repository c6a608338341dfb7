"""Digest schema 3 (core/model/digests.py): the nodes enter the state digest as the sum of
their own hashes, kept as events change them, instead of being encoded at every digest.
A log written with it audits clean, and the digest still covers every node."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from core import new_state
from core import types as T
from core.model.digests import DIGEST_SCHEMA, state_digest, state_digest_schema_2
from core.model.state import live_digest
from core.replay import apply_record
from tests.data_helpers import xirang

GOLDEN = Path(__file__).parent / "data" / "golden-logs"
SCHEMA_3 = GOLDEN / "written-with-digest-schema-3.jsonl"


def _fold(path: Path):
    state = new_state()
    for line in path.read_bytes().splitlines():
        apply_record(state, T.decode_record(line))
    return state


def test_a_schema_3_log_audits_clean_with_every_digest_of_schema_3():
    result = xirang("audit", "--log", str(SCHEMA_3), "--json")
    summary = json.loads(result.stdout)
    assert DIGEST_SCHEMA == 3 and summary["ok"], summary.get("problem")
    digests = SCHEMA_3.read_bytes().count(b'"type":"StateDigest"')
    assert summary["state_digest_schemas"] == {"3": digests} and digests >= 25


def test_the_schema_3_digest_covers_every_node_and_its_kept_sum_follows_them():
    state = _fold(SCHEMA_3)
    c = state.canonical
    assert live_digest(state) == state_digest(c)
    name = sorted(c.nodes)[0]
    before = state_digest(c)
    changed = msgspec.structs.replace(c, nodes={**c.nodes})
    node = changed.nodes[name]
    changed.nodes[name] = msgspec.structs.replace(node, holder=["someone", *node.holder[1:]])
    assert state_digest(changed) != before
    # Schema 2 (every node encoded) is still computed for older logs, and differs from 3.
    assert state_digest_schema_2(c) != before
