"""The bounds every input must keep, checked before anything changes.

Two layers:

- `raw_problem(data)`: on the bytes, before decoding. The whole input is at most
  `INPUT_BYTES_MAX` (far below the bus's 8 MB payload limit, so every record an input
  produces, which copies at most the input, fits) and nests at most `JSON_DEPTH_MAX`
  levels (a decoder recursing 5,000 levels deep runs out of stack).
- `input_problem(inp)`: on the decoded input, field by field: every string has a length
  bound and must be encodable, every integer and float a range, every list a length.
  Times and estimates are at most a year; GPU counts at most what a node or the pool could
  ever hold, under a hard cap.

- `id_problem(kind, value)`: a new name (a submitted job's id, team and user, a node joining for
  the first time) is letters, digits and `._-`, starting with a letter or a digit: ids become
  NATS subject tokens, file names and command-line arguments, where a space, `*`, `>` or a
  leading `-` or `.` mean something else. Only new names are checked, so a log written before
  the rule folds as it did and its jobs and nodes may still be acted on by name.

Each answer is `(reason, detail)` for an `InputRejected`, or None when the input is
within bounds. Limits are named constants, units last, and listed in the README.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import msgspec

# ---------------------------------------------------------------- limits

# A whole input on the wire. Records copy at most the input (plus a few hundred bytes of
# envelope), so this keeps every record far below the 8 MB payload limit.
INPUT_BYTES_MAX = 64 * 1024
# Nesting of arrays and objects; a submit needs 2, a set_policy with A/B variants 4.
JSON_DEPTH_MAX = 16

# Names: job, team, user, node, kind, GPU model, client id, digest.
NAME_CHARS_MAX = 200
# Free text: reasons, policy authors.
TEXT_CHARS_MAX = 2000
# A job's command line.
COMMAND_ARGS_MAX = 256
COMMAND_CHARS_MAX = 32 * 1024
# Acceptable GPU models of one job.
GPU_MODELS_MAX = 32

# Times (ms since the epoch) stay exact in a float and far from any overflow.
T_MS_MAX = 2**53
# Estimates and costs in seconds: at most a year.
DURATION_S_MAX = 365 * 24 * 3600.0
# GPUs on one node, nodes in a pool, and the hard cap on one job (no pool of
# NODES_MAX nodes of NODE_GPUS_MAX GPUs is smaller than it). A node's loss requeues at
# most NODE_GPUS_MAX jobs, and the records of that one input, with the placements of the
# pass after it (at most 2 x scan_jobs_max), must fit one atomic batch (1,000 messages).
NODE_GPUS_MAX = 256
NODES_MAX = 100_000
JOB_GPUS_MAX = 65_536
# Checkpoint step numbers and sizes.
CKPT_STEP_MAX = 2**53
CKPT_BYTES_MAX = 2**50  # a pebibyte
# Copies of one checkpoint: the bus's store and the writing host's disk.
CKPT_COPIES_MAX = 2
# Any number in a set_policy (ms thresholds, weights, shares): 1e15 ms is 31,000 years.
POLICY_NUMBER_MAX = 1e15
# Sequence numbers and other counters.
COUNTER_MAX = 2**63 - 1

# A new job, team, user or node name.
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
ID_CHARS_DOC = "letters, digits and . _ -, starting with a letter or a digit"

# Field name -> limit, for the fields whose bound is not their kind's default.
_DURATION_FIELDS = ("est_runtime_s", "ckpt_interval_s", "ckpt_cost_s", "restore_cost_s")
_TEXT_FIELDS = ("reason", "by", "error", "raw", "comment")
_INT_RANGES = {
    "t": (0, T_MS_MAX),
    "seq": (0, COUNTER_MAX),
    "v": (0, COUNTER_MAX),
    "gpus": (-COUNTER_MAX, COUNTER_MAX),  # the sign is the handlers' business; size is ours
    "level": (-COUNTER_MAX, COUNTER_MAX),
    "step": (-COUNTER_MAX, CKPT_STEP_MAX),
    "bytes": (-COUNTER_MAX, CKPT_BYTES_MAX),
    "attempt": (0, COUNTER_MAX),
    "restored_copy": (0, CKPT_COPIES_MAX),
}

_INT_RANGE_DEFAULT = (-COUNTER_MAX, COUNTER_MAX)

_JSON_STRUCTURE = re.compile(rb'["\\\[\]{}]')


# ---------------------------------------------------------------- names


def id_problem(kind: str, value: str) -> tuple[str, str] | None:
    """(reason, detail) when `value` may not name a new `kind` (job, team, user, node)."""
    if ID_PATTERN.fullmatch(value):
        return None
    return f"{kind}_id_invalid", f"{kind} id {value!r}: use only {ID_CHARS_DOC}"


# ---------------------------------------------------------------- before decoding


def raw_problem(data: bytes | str) -> tuple[str, str] | None:
    """Size and nesting of an input's bytes, checked before they are decoded."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data)
    if len(raw) > INPUT_BYTES_MAX:
        return (
            "input_too_large",
            f"{len(raw)} bytes; an input may have at most {INPUT_BYTES_MAX} bytes"
            " (shorten the command, or pass large data by reference)",
        )
    depth = json_depth(raw, JSON_DEPTH_MAX)
    if depth > JSON_DEPTH_MAX:
        return (
            "input_nested_too_deep",
            f"arrays and objects nest more than {JSON_DEPTH_MAX} levels; an input needs at most a few",
        )
    return None


def json_depth(raw: bytes, stop_above: int) -> int:
    """Deepest nesting of [ and { outside strings; stops counting once above `stop_above`."""
    depth = deepest = 0
    in_string = False
    skip = -1  # the byte after a backslash inside a string is escaped
    for match in _JSON_STRUCTURE.finditer(raw):
        pos = match.start()
        if pos == skip:
            continue
        char = raw[pos]
        if in_string:
            if char == 0x5C:  # backslash
                skip = pos + 1
            elif char == 0x22:  # quote
                in_string = False
            continue
        if char == 0x22:
            in_string = True
        elif char in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > stop_above:
                    return deepest
        elif char in (0x5D, 0x7D):  # ] }
            depth -= 1
    return deepest


# ---------------------------------------------------------------- after decoding


def input_problem(inp: Any) -> tuple[str, str] | None:
    """The first field of a decoded input outside its bounds, as (reason, detail)."""
    cls = type(inp)
    fields = _FAST_BOUNDS.get(cls)
    if fields is None:
        fields = _FAST_BOUNDS[cls] = _fast_bounds(inp.__struct_fields__)
    for (name, low, high), value in zip(fields, msgspec.structs.astuple(inp)):
        # Most fields are short ASCII names and plain integers well inside their range:
        # passed here without the full check (the same answer, every input pays for it).
        kind = type(value)
        if kind is str:
            if len(value) <= NAME_CHARS_MAX and value.isascii():
                continue
        elif kind is int:
            if low <= value <= high:
                continue
        problem = _field_problem(name, value)
        if problem:
            return problem
    return None


# Input type -> (field name, low, high) per field: the integers `_int_problem` passes.
_FAST_BOUNDS: dict[type, tuple[tuple[str, int, int], ...]] = {}


def _fast_bounds(names: tuple[str, ...]) -> tuple[tuple[str, int, int], ...]:
    bounds = []
    for name in names:
        low, high = _INT_RANGES.get(name, _INT_RANGE_DEFAULT)
        bounds.append((name, low, min(high, JOB_GPUS_MAX) if name == "gpus" else high))
    return tuple(bounds)


def _field_problem(name: str, value: Any) -> tuple[str, str] | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return _text_problem(name, value, TEXT_CHARS_MAX if name in _TEXT_FIELDS else NAME_CHARS_MAX)
    if isinstance(value, int):
        return _int_problem(name, value)
    if isinstance(value, float):
        return _float_problem(name, value)
    if isinstance(value, list):
        return _list_problem(name, value)
    if isinstance(value, dict):
        return _dict_problem(name, value)
    return None


def _text_problem(name: str, value: str, chars_max: int) -> tuple[str, str] | None:
    if len(value) > chars_max:
        return f"{name}_too_long", f"{len(value)} characters; at most {chars_max}"
    if not _encodable(value):
        return f"{name}_not_valid_text", "contains characters that are not valid Unicode (a lone surrogate)"
    return None


def _int_problem(name: str, value: int) -> tuple[str, str] | None:
    low, high = _INT_RANGES.get(name, _INT_RANGE_DEFAULT)
    if name == "gpus" and value > JOB_GPUS_MAX:
        return (
            "gpus_too_many",
            f"{value} GPUs; no pool could hold that many (at most {JOB_GPUS_MAX} for a job,"
            f" {NODE_GPUS_MAX} on a node)",
        )
    if not low <= value <= high:
        return f"{name}_out_of_range", f"{name}={value}; it must be {low}..{high}"
    return None


def _float_problem(name: str, value: float) -> tuple[str, str] | None:
    if math.isnan(value) or math.isinf(value):
        return f"{name}_must_be_a_number", f"{name}={value}; give a finite number or leave it out"
    if name in _DURATION_FIELDS and value > DURATION_S_MAX:
        return (f"{name}_too_large", f"{name}={value:g} s; at most {DURATION_S_MAX:g} s (a year)")
    if abs(value) > 2.0**63:
        return f"{name}_out_of_range", f"{name}={value:g}"
    return None


def _list_problem(name: str, value: list) -> tuple[str, str] | None:
    if name == "command":
        if len(value) > COMMAND_ARGS_MAX:
            return "command_too_long", f"{len(value)} arguments; at most {COMMAND_ARGS_MAX}"
        chars = 0
        for arg in value:
            if not isinstance(arg, str) or not _encodable(arg):
                return "command_not_valid_text", "every argument must be valid text"
            chars += len(arg)
        if chars > COMMAND_CHARS_MAX:
            return "command_too_long", f"{chars} characters; at most {COMMAND_CHARS_MAX}"
        return None
    if name == "gpu_models" and len(value) > GPU_MODELS_MAX:
        return "gpu_models_too_many", f"{len(value)} models; at most {GPU_MODELS_MAX}"
    for item in value:
        problem = _field_problem(name, item)
        if problem:
            return problem
    return None


def _dict_problem(name: str, value: dict) -> tuple[str, str] | None:
    # set_policy params: the policy judges its values; here only their kind and size, so
    # that no accepted policy makes every later step overflow.
    for key in value:
        if not isinstance(key, str) or not _encodable(key) or len(key) > NAME_CHARS_MAX:
            return f"{name}_key_not_valid", "keys must be names of at most 200 characters"
        problem = _param_problem(f"{name}.{key}", value[key])
        if problem:
            return problem
    return None


def _param_problem(path: str, value: Any) -> tuple[str, str] | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or abs(value) > POLICY_NUMBER_MAX:
            return (
                "policy_value_out_of_range",
                f"{path}={value}; numbers must be finite, at most {POLICY_NUMBER_MAX:g}",
            )
        return None
    if isinstance(value, str):
        return _text_problem("params", value, NAME_CHARS_MAX)
    if isinstance(value, list):
        items: Iterable[tuple[Any, Any]] = enumerate(value)
    elif isinstance(value, dict):
        items = value.items()
    else:
        return None
    for key, item in items:
        problem = _param_problem(f"{path}.{key}", item)
        if problem:
            return problem
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def limits() -> dict[str, int | float]:
    """The limits, by name (for documentation and `xirang` help)."""
    return {
        name: value
        for name, value in sorted(globals().items())
        if name.isupper() and not name.startswith("_") and isinstance(value, (int, float))
    }
