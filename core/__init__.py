"""xirang's pure, deterministic scheduling core.

One entry point, `step(state, input) -> (state, records)`, used live, in replay and in the
simulator. Imports only the standard library and msgspec; time, ids and randomness arrive
in inputs.

Its sub-packages, lowest first (each imports only those below it: tests/test_layers.py):

- `model`: the inputs and events (`types`), the policy, the state's entities, the state
  and its index, the scratch beside it (caches, the passes' memory), where a gang fits,
  each team's decayed use of a level (`usage`);
- `forecast`: when running jobs release their GPUs, when a gang fits, a job's natural wait;
- `log`: `evolve` (the only code that changes a state), the seal, the state digests;
- `rules`: each rule of the decision model in a module named after it (`rights`,
  `shields`, `guarantees`, `fairness`, `shares`, `pricing`, `benefit`, `holds`,
  `substitutes`, `notices`, `compensation`; `eligibility` combines them per victim; `decision` is one decision's
  context), each a pure function giving "" or the name of the rule that refuses, and the
  module's own sentence for it; each has tests/test_<module>.py with its table of cases;
- `passes`: aging, placement, the preemption plan and its victim search, the saga.

At the top: `machine` (`step`), `inputs` (each input's handler), `identity` (who may send
what), `explain` (why a job waits: it asks the plan which rule blocks, `diagnose=True`),
`replay`.
"""

from .machine import new_state, next_due_t, step
from .model.policy import Policy, PolicyError, with_params
from .model.policy_defaults import load_policy_toml
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
