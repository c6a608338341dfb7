"""Bounded inputs: every field has a bound checked before anything changes, the bytes are
bounded in size and nesting before they are decoded, and no input, however malformed,
makes the scheduler's input path raise (decode, stamp, guarded step)."""

from __future__ import annotations

import json
import random

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.scheduler import stamped_input
from core import inputs, new_state, rebuild, state_digest, step
from core.model import bounds
from core import types as T
from core.model.policy import Policy
from core.replay import step_guarded

from scenario import check_invariants

T0 = 1_700_000_000_000


def submit_json(**fields) -> bytes:
    body = {"type": "submit", "job": "j1", "team": "t", "user": "u", "level": 3, "gpus": 1}
    body.update(fields)
    return json.dumps(body).encode()


def fed(state, raw: bytes, seq: int, t: int = T0) -> list[T.Record]:
    """The scheduler's input path, in process: decode and stamp, then a guarded step."""
    inp = stamped_input(raw, seq, t, state.canonical.t)
    _, records, _ = step_guarded(state, inp, lambda: None)
    return records


def rejection(records) -> tuple[str, str]:
    assert len(records) == 1 and isinstance(records[0].event, T.InputRejected), records
    return records[0].event.reason, records[0].event.detail


def pool() -> object:
    state = new_state()
    step(state, T.NodeUp(t=T0, node="n1", gpu_model="H100", gpus=8, seq=1))
    return state


# ---------------------------------------------------------------- the inputs that halted the cluster


def test_an_estimate_of_1e308_seconds_is_refused_and_the_next_job_starts():
    state = pool()
    reason, detail = rejection(fed(state, submit_json(est_runtime_s=1e308), 2))
    assert reason == "est_runtime_s_too_large" and "a year" in detail
    records = fed(state, submit_json(job="j2", est_runtime_s=600), 3)
    assert any(isinstance(r.event, T.JobStartRequested) and r.event.job == "j2" for r in records)


def test_a_submit_nested_5000_levels_deep_is_refused_before_decoding():
    state = pool()
    raw = submit_json(command=["x"])[:-1] + b', "gpu_models": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    reason, detail = rejection(fed(state, raw, 2))
    assert reason == "input_nested_too_deep" and str(bounds.JSON_DEPTH_MAX) in detail


def test_a_submit_just_under_the_payload_limit_is_refused_as_too_large():
    state = pool()
    raw = submit_json(command=["echo", "x" * (8 * 1024 * 1024 - 4096)])
    reason, detail = rejection(fed(state, raw, 2))
    assert reason == "input_too_large" and str(bounds.INPUT_BYTES_MAX) in detail


def test_every_record_of_an_input_at_the_size_limit_fits_the_bus():
    state = pool()
    command = ["echo"] + ["y" * 100] * 250  # 25,000 characters: within the command bound
    records = fed(state, submit_json(command=command), 2)
    assert any(isinstance(r.event, T.JobStartRequested) for r in records)
    assert max(len(T.encode(r)) for r in records) < 8 * 1024 * 1024 // 16


def test_gpus_beyond_any_pool_are_refused_with_the_cap():
    reason, detail = rejection(fed(pool(), submit_json(gpus=10**9), 2))
    assert reason == "gpus_too_many" and str(bounds.JOB_GPUS_MAX) in detail


def test_integers_beyond_64_bits_and_nan_are_refused_not_raised():
    state = pool()
    assert rejection(fed(state, submit_json(gpus=2**70), 2))[0] == "gpus_too_many"
    assert rejection(fed(state, submit_json(level=2**70), 3))[0] == "level_out_of_range"
    assert rejection(fed(state, submit_json(ckpt_cost_s=float("nan")), 4))[0] == "malformed_input"
    assert rejection(fed(state, b'{"type":"cancel","job":"\\ud800"}', 5))[0] == "malformed_input"
    assert rejection(step(state, T.Cancel(job="\ud800", t=T0, seq=6))[1])[0] == "job_not_valid_text"
    assert rejection(fed(state, submit_json(team="t" * 5000), 7))[0] == "team_too_long"


def test_a_node_with_more_gpus_than_a_node_can_hold_is_refused():
    state = new_state()
    raw = json.dumps({"type": "node_up", "node": "n", "gpu_model": "H100", "gpus": 10**6}).encode()
    pin, *refused = fed(state, raw, 1)  # a log's first record names its policy, refused input or not
    assert isinstance(pin.event, T.PolicyChanged) and "defaults_version" in pin.event.params
    assert rejection(refused)[0] == "gpus_too_many"


def test_a_checkpoint_larger_than_a_pebibyte_is_refused():
    state = pool()
    fed(state, submit_json(), 2)
    fed(state, b'{"type":"started","job":"j1"}', 3)
    raw = json.dumps(
        {"type": "checkpoint_saved", "job": "j1", "step": 1, "digest": "sha256:ab", "bytes": 2**60}
    ).encode()
    assert rejection(fed(state, raw, 4))[0] == "bytes_out_of_range"


def test_json_depth_counts_brackets_outside_strings_only():
    assert bounds.json_depth(b'{"a": "[[[[[[", "b": [1, {"c": "\\"]]]"}]}', 100) == 3


# ---------------------------------------------------------------- an exception inside step


def test_an_input_that_makes_step_raise_is_rejected_and_the_state_is_as_before(monkeypatch):
    state = pool()
    fed(state, submit_json(job="ok1"), 2)
    records_so_far = []

    def explode(ctx, inp):
        ctx.state.canonical.t += 12345  # half a change, then a crash
        ctx.state.canonical.jobs.clear()
        raise ZeroDivisionError("division by zero in a handler")

    monkeypatch.setitem(inputs.HANDLERS, T.Cancel, explode)
    log = [*step(new_state(), T.NodeUp(t=T0, node="n1", gpu_model="H100", gpus=8, seq=1))[1]]
    state = rebuild(log)
    _, more = step(state, stamped_input(submit_json(job="ok1"), 2, T0, state.canonical.t))
    log += more
    before = state_digest(state.canonical)
    records_so_far = list(log)
    state, records, words = step_guarded(
        state,
        stamped_input(b'{"type":"cancel","job":"ok1"}', 3, T0 + 5, state.canonical.t),
        lambda: rebuild(records_so_far),
    )
    assert "ZeroDivisionError" in words
    assert rejection(records)[0] == T.INTERNAL_ERROR and "division by zero" in records[0].event.detail
    log += records
    assert state.canonical.jobs["ok1"].state != "" and state.canonical.last_input_seq == 3
    assert state_digest(rebuild(log).canonical) == state_digest(state.canonical)
    assert before != state_digest(state.canonical)  # only the rejection was added
    assert state_digest(rebuild(log[:-1]).canonical) == before
    monkeypatch.undo()
    _, later = step(state, stamped_input(submit_json(job="ok2"), 4, T0 + 10, state.canonical.t))
    assert any(isinstance(r.event, T.JobStartRequested) and r.event.job == "ok2" for r in later)


# ---------------------------------------------------------------- 10,000 random and malformed inputs

INT_EDGES = [0, 1, -1, 7, 8, 2**31, 2**53, 2**53 + 1, 2**63 - 1, -(2**63), 2**64, 10**30]
FLOAT_EDGES = [0.0, -0.0, 1e-300, 5e-324, 1.5, 1e15, 1e308, -1e308, float("inf"), float("-inf"), float("nan")]
NAMES = [
    "j1",
    "j2",
    "j3",
    "n1",
    "n2",
    "H100",
    "A100",
    "t",
    "u",
    "",
    "sha256:ab",
    "\ud800",
    "ü",
    "x" * 199,
    "x" * 201,
    "x" * 2001,
    "x" * 70_000,
    "a.b*>",
    "\x00",
]
TYPES = [
    "node_up",
    "node_down",
    "submit",
    "cancel",
    "started",
    "checkpoint_started",
    "checkpoint_saved",
    "checkpoint_failed",
    "safe_point",
    "released",
    "finished",
    "tick",
    "set_policy",
    "malformed",
    "bogus",
]
FIELDS = [
    "job",
    "team",
    "user",
    "level",
    "gpus",
    "gpu_models",
    "est_runtime_s",
    "ckpt_interval_s",
    "ckpt_cost_s",
    "restore_cost_s",
    "preemptible",
    "command",
    "kind",
    "node",
    "gpu_model",
    "reason",
    "ok",
    "step",
    "digest",
    "bytes",
    "params",
    "t",
    "v",
    "id",
    "seq",
    "unknown_field",
]
INPUT_TYPES = {cls.__struct_config__.tag: cls for cls in T.Input.__args__}
GOOD = {
    "job": ["j1", "j2", "j3"],
    "team": ["t", "s"],
    "user": ["u"],
    "level": list(range(8)),
    "gpus": [1, 2, 4, 8, 12],
    "node": ["n1", "n2"],
    "gpu_model": ["H100"],
    "ok": [True, False],
    "step": [0, 5, 100],
    "digest": ["sha256:ab"],
    "bytes": [0, 100],
    "reason": ["r"],
    "gpu_models": [["H100"], []],
    "params": [{"scan_jobs_max": 64}, {"level_weight": [1] * 8}],
}


def nasty(rng, depth: int = 0):
    """A value of any JSON kind, biased toward limits: numbers at float and int limits, NaN,
    huge and invalid strings, containers (rarely deep)."""
    pick = rng.randrange(10 if depth < 3 else 7)
    if pick == 0:
        return rng.choice(INT_EDGES)
    if pick == 1:
        return rng.randint(-(2**70), 2**70)
    if pick == 2:
        return rng.choice(FLOAT_EDGES)
    if pick == 3:
        return rng.uniform(-1e20, 1e20)
    if pick == 4:
        return rng.choice(NAMES)
    if pick == 5:
        return rng.choice([True, False, None])
    if pick == 6:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(12)))
    if pick in (7, 8):
        return [nasty(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(NAMES + FIELDS): nasty(rng, depth + 1) for _ in range(rng.randrange(4))}


def nasty_input(rng) -> bytes:
    kind = rng.randrange(12)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
    if kind == 1:
        return rng.choice([b"[", b'{"a":', b'{"type":"submit","gpu_models":[']) * rng.choice([17, 100, 5000])
    if kind == 2:
        return json.dumps(nasty(rng)).encode("utf-8", "surrogatepass")
    body: dict = {"type": rng.choice(TYPES)}
    struct = INPUT_TYPES.get(body["type"])
    for name in struct.__struct_fields__ if struct else ():
        if name in GOOD:  # a valid input of its type to start from
            body[name] = rng.choice(GOOD[name])
    if rng.random() < 0.3:
        body["est_runtime_s"] = rng.choice([5, 60, 600])
    for name in rng.sample(FIELDS, rng.choice([0, 0, 1, 1, 2, 3])):
        body[name] = nasty(rng)  # then a few fields out of shape
    if body["type"] == "set_policy" and rng.random() < 0.5:  # a real parameter, any value
        name = rng.choice(Policy.__struct_fields__)
        value = getattr(Policy(), name)
        body["params"] = {
            name: [nasty(rng) for _ in value]
            if isinstance(value, list) and rng.random() < 0.5
            else nasty(rng)
        }
    if rng.random() < 0.1:  # NaN and Infinity as Python writes them: not JSON
        return json.dumps(body).encode("utf-8", "surrogatepass")
    try:
        return msgspec.json.encode(body)
    except (TypeError, OverflowError, UnicodeEncodeError, msgspec.EncodeError):
        return json.dumps(body, default=str).encode("utf-8", "surrogatepass")


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32))
def test_10000_random_and_malformed_inputs_never_escape_the_input_path(seed):
    """50 seeds of 200 inputs each: 10,000 inputs through decode + stamp + guarded step,
    the invariants checked after each, and replay of the log equal to the live state."""
    rng = random.Random(seed)
    state = new_state()
    log: list[T.Record] = []
    for inp in (T.NodeUp(node="n1", gpu_model="H100", gpus=8), T.NodeUp(node="n2", gpu_model="A100", gpus=4)):
        log += step(state, stamped_input(T.encode(inp), len(log) + 1, T0, state.canonical.t))[1]
    t = T0
    for seq in range(10, 210):
        raw = nasty_input(rng)
        t += rng.choice([0, 1, 500, 60_000])
        inp = stamped_input(raw, seq, t, state.canonical.t)
        state, records, words = step_guarded(state, inp, lambda: rebuild(log))
        assert not words, f"step raised on {raw[:300]!r}: {words}"
        # As the log keeps them: encoded, then decoded by whoever reads.
        log += [T.decode_record(T.encode(record)) for record in records]
        check_invariants(state)
        for record in records:
            assert len(T.encode(record)) < bounds.INPUT_BYTES_MAX + 16 * 1024
    assert state_digest(rebuild(log).canonical) == state_digest(state.canonical)


def test_a_policy_number_that_would_overflow_later_steps_is_refused():
    state = pool()
    raw = json.dumps({"type": "set_policy", "params": {"safe_point_ms": 10**300}}).encode()
    reason, detail = rejection(fed(state, raw, 2))
    assert reason == "policy_value_out_of_range" and "safe_point_ms" in detail


def test_a_scan_too_large_to_record_in_one_batch_is_refused_and_jobs_still_start():
    state = pool()
    raw = json.dumps({"type": "set_policy", "params": {"scan_jobs_max": 100_000}}).encode()
    reason, detail = rejection(fed(state, raw, 2))
    assert "scan_jobs_max must be 1..256" in detail, (reason, detail)
    records = fed(state, submit_json(), 3, T0 + 1000)
    assert any(isinstance(r.event, T.JobStartRequested) for r in records), records
