"""Policy parameters that no longer change anything: still accepted (older logs and policy
files set them), and the scheduler and `xirang replay` say so when given one."""

from __future__ import annotations

from typing import Any

DEPRECATED_PARAMS = {
    "team_downgrade_ms": "no effect: a team's downgrade lasts until its preemption quota recovers "
    "(team_preempting_max in fairness_window_ms)",
}


def deprecation_notes(params: dict[str, Any]) -> list[str]:
    """One line per deprecated parameter in `params`, saying that it is ignored and why."""
    return [f"policy parameter {key!r} is deprecated, {DEPRECATED_PARAMS[key]}" for key in sorted(params)
            if key in DEPRECATED_PARAMS]  # fmt: skip
