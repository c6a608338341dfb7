"""The policy in force at a point of the projected log: defaults plus every PolicyChanged
up to it, in order (what the core folded)."""

from __future__ import annotations

import msgspec

from core.model.policy import Policy, PolicyError, with_params


def policy_at(con, t: int | None = None) -> Policy:
    """The policy in force at log time `t` (default: the end of the projection)."""
    policy = Policy()
    sql = "SELECT params FROM policy_changes" + (" WHERE t <= ?" if t is not None else "") + " ORDER BY seq"
    for (params,) in con.execute(sql, [] if t is None else [t]).fetchall():
        try:
            policy = with_params(policy, msgspec.json.decode(params))
        except PolicyError:
            continue  # the core accepted it under its rules; keep the rest comparable
    return policy


def current_policy(con) -> Policy:
    """The policy in force at the projection's end."""
    return policy_at(con)
