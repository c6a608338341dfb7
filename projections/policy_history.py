"""The policy in force at a point of the projected log: the defaults version the log names
(the legacy one if none) plus every PolicyChanged up to it, in order (what the core folded:
core/model/policy_defaults.py)."""

from __future__ import annotations

import msgspec

from core.model.policy import Policy, PolicyError
from core.model.policy_defaults import log_policy


def policy_at(con, t: int | None = None) -> Policy:
    """The policy in force at log time `t` (default: the end of the projection)."""
    log_params: dict = {}
    policy = log_policy(log_params)
    sql = "SELECT params FROM policy_changes" + (" WHERE t <= ?" if t is not None else "") + " ORDER BY seq"
    for (params,) in con.execute(sql, [] if t is None else [t]).fetchall():
        try:
            changed = {**log_params, **msgspec.json.decode(params)}
            policy, log_params = log_policy(changed), changed
        except PolicyError:
            continue  # the core accepted it under its rules; keep the rest comparable
    return policy


def current_policy(con) -> Policy:
    """The policy in force at the projection's end."""
    return policy_at(con)
