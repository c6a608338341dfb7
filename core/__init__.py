"""xirang's pure, deterministic scheduling core.

One entry point, `step(state, input) -> (state, records)`, used live, in replay and in the
simulator. Imports only the standard library and msgspec; time, ids and randomness arrive
in inputs.
"""

from .machine import new_state, next_due_t, step
from .model.policy import Policy, PolicyError, load_policy_toml, with_params
from .replay import ChainError, DigestMismatch, apply_record, rebuild, run_inputs
from .model.state import State, load_snapshot, snapshot_bytes, state_digest
from .model import types
from .model.types import Record, decode_record, encode, parse_input

__all__ = [
    "ChainError",
    "DigestMismatch",
    "Policy",
    "PolicyError",
    "Record",
    "State",
    "apply_record",
    "decode_record",
    "encode",
    "load_policy_toml",
    "load_snapshot",
    "new_state",
    "next_due_t",
    "parse_input",
    "rebuild",
    "run_inputs",
    "snapshot_bytes",
    "state_digest",
    "step",
    "types",
    "with_params",
]
