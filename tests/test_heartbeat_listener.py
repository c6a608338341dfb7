"""The heartbeat listener's lines (agents/heartbeats.py): what the scheduler is told of the
beats heard between two lines, and what a flooding or lying host can and cannot do to it."""

from __future__ import annotations

import json

from agents.heartbeats import HEARTBEAT_BYTES_MAX, HeartbeatListener, health_note
from transport import bus


def beat(node: str, **fields) -> tuple[str, bytes]:
    return f"{bus.HB_PREFIX}.{bus.node_token(node)}", json.dumps({"node": node, **fields}).encode()


def test_a_line_names_each_node_heard_once_with_its_newest_beats_health_and_starts_afresh():
    listener = HeartbeatListener()
    listener.hear(*beat("h1", healthy=True))
    listener.hear(*beat("h2", healthy=False, problem="disk full"))
    listener.hear(*beat("h1", healthy=False, problem="first"))
    listener.hear(*beat("h1", healthy=True, facts_dropped={"j1": 3}))  # the newest counts
    line = listener.report()
    assert sorted(line["heard"]) == ["h1", "h2"]
    assert line["health"] == {
        "h1": {"healthy": True, "problem": "", "facts_dropped": {"j1": 3}},
        "h2": {"healthy": False, "problem": "disk full", "facts_dropped": {}},
    }
    assert "lossy" not in line and "odd" not in line and "loud" not in line
    assert listener.report() == {"heard": []}  # nothing heard since


def test_a_beat_naming_another_node_or_too_large_to_be_a_hosts_is_not_counted():
    listener = HeartbeatListener()
    listener.hear(f"{bus.HB_PREFIX}.h2", json.dumps({"node": "h1"}).encode())
    listener.hear(f"{bus.HB_PREFIX}.h3", b"x" * (HEARTBEAT_BYTES_MAX + 1))
    listener.hear(f"{bus.HB_PREFIX}.h4", b"not json")  # names nobody: its subject's node
    line = listener.report()
    assert line["heard"] == ["h4"]
    assert sorted(line["odd"]) == [f"{bus.HB_PREFIX}.h2", f"{bus.HB_PREFIX}.h3"]


def test_a_flooding_host_is_one_entry_named_loud_and_never_pushes_another_host_out():
    listener = HeartbeatListener(kept_bytes_max=4096)
    listener.hear(*beat("good"))
    for _ in range(10_000):
        listener.hear(*beat("hostile"))
    line = listener.report()
    assert sorted(line["heard"]) == ["good", "hostile"] and "lossy" not in line
    assert line["loud"] == {f"{bus.HB_PREFIX}.hostile": 10_000}


def test_more_subjects_than_the_bytes_kept_allow_make_the_line_say_beats_were_lost():
    listener = HeartbeatListener(kept_bytes_max=4096)
    for i in range(200):
        listener.hear(*beat(f"ghost-{i}"))
    line = listener.report()
    assert 0 < len(line["heard"]) < 200 and line["lossy"] == 200 - len(line["heard"])
    assert "lossy" not in listener.report()  # said for that line only


def test_health_notes_are_bounded_and_ignore_what_is_not_a_count():
    assert health_note({"healthy": True}) is None and health_note("x") is None
    note = health_note(
        {"healthy": False, "problem": "p" * 10_000, "facts_dropped": {"a": "x", "b": 2, "c": True}}
    )
    assert note == {"healthy": False, "problem": "p" * 500, "facts_dropped": {"b": 2}}
