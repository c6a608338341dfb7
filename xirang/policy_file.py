"""Policy files as every command reads them: checked (core.model.policy.read_policy_toml raises a
PolicyError naming the file and key to fix), with one note on stderr per deprecated
parameter (core.model.policy_deprecated.DEPRECATED_PARAMS), so the scheduler, `up`, `replay run`, `sim`,
`sweep` and `whatif` all say the same when a file sets one."""

from __future__ import annotations

import sys

from core.model.policy import Policy, read_policy_toml, with_params
from core.model.policy_deprecated import deprecation_notes
from core.model.policy_defaults import DEFAULTS_VERSION_KEY, defaults_of


def read_policy_file(path: str) -> dict:
    """The file's keys as `set_policy` params (OSError, PolicyError as read_policy_toml), after
    printing `note: PATH: ...` on stderr for each deprecated parameter it sets."""
    params = read_policy_toml(path)
    for note in deprecation_notes(params):
        print(f"note: {path}: {note}", file=sys.stderr)
    return params


def load_policy_file(path: str) -> Policy:
    """The policy the file describes (the defaults of the version it names, this release's if
    none, with its keys), notes printed as above."""
    params = read_policy_file(path)
    return with_params(defaults_of(params.get(DEFAULTS_VERSION_KEY, Policy().defaults_version)), params)
