"""Policy defaults, versioned per log: a release may change a default without changing what
any log already written means.

A log names the table of defaults it was decided under: its first record is a
`PolicyChanged` that sets `defaults_version` (and every parameter in which the policy it
starts under differs from that table), sealed before anything else (core/log/seal.py). From
then on the policy in force at any point of the log is that version's table with the
parameters the log has set on top (`log_policy(Canonical.policy_params)`): the same whichever
release folds it. A log whose first record sets no `defaults_version` (every log written
before versions existed) folds with version 1, the defaults frozen as they were until then
(core/log/evolve.py). An operator moves a running log to newer defaults with a `set_policy`
of `defaults_version`, recorded like any other change (docs/OPERATOR-GUIDE.md).

A release that changes a default adds a version to `DEFAULTS_BY_VERSION` naming the new
value, gives every older version the value it had (tests/test_core_policy_defaults.py checks
that each version lists the same fields, and that `Policy()` is the newest version), and
never edits an older version.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .policy import Policy, PolicyError, check_experiment, read_policy_toml, with_params

# The defaults of logs that name no version: everything written before 2026-12-04.
LEGACY_DEFAULTS_VERSION = 1

# Per version, the value of every parameter whose default has ever changed; a parameter not
# listed has had one default since versions began (the `Policy` field's).
DEFAULTS_BY_VERSION: dict[int, dict[str, Any]] = {
    1: {
        "fair_share_half_life_s": 0.0,
        "notice_covers_save_in_progress": False,
        "late_release_counts_as_preemption": False,
        "compensation_when_exceeded": False,
        "release_curve_grid_ms": 0,
        "host_copies_job_checkpoints": False,
    },
    # 2026-12-04: fair share weighs a week's decayed usage; a notice covers a checkpoint
    # write in progress; a victim letting go after its deadline counts as preempted;
    # compensation from the preemption that takes the count past the threshold.
    2: {
        "fair_share_half_life_s": 7 * 24 * 3600.0,
        "notice_covers_save_in_progress": True,
        "late_release_counts_as_preemption": True,
        "compensation_when_exceeded": True,
        "release_curve_grid_ms": 0,
        "host_copies_job_checkpoints": False,
    },
    # 2026-12-04: a preemption plan's release curve reads every running job's release as at
    # the start of a one-minute grid step, kept across steps (docs/SCALE.md): a decision at
    # 100,000 GPUs costs its candidates, not every running job.
    3: {
        "fair_share_half_life_s": 7 * 24 * 3600.0,
        "notice_covers_save_in_progress": True,
        "late_release_counts_as_preemption": True,
        "compensation_when_exceeded": True,
        "release_curve_grid_ms": 60_000,
        "host_copies_job_checkpoints": True,
    },
}
NEWEST_DEFAULTS_VERSION = max(DEFAULTS_BY_VERSION)

DEFAULTS_VERSION_KEY = "defaults_version"


def defaults_of(version: int) -> Policy:
    """The default policy of a defaults version; PolicyError for one this release does not know."""
    table = DEFAULTS_BY_VERSION.get(version) if isinstance(version, int) else None
    if table is None:
        raise PolicyError(
            f"defaults_version {version!r} is not one this release knows (1..{NEWEST_DEFAULTS_VERSION}):"
            " a log that names a newer one was written by a newer xirang; fold it with that release"
            " or a newer one"
        )
    return with_params(Policy(), {**table, DEFAULTS_VERSION_KEY: version})


def log_policy(params: dict[str, Any]) -> Policy:
    """The policy in force in a log that has set `params` (merged, as recorded): the table of
    the version it names (version 1 if none) with its parameters on top."""
    version = params.get(DEFAULTS_VERSION_KEY, LEGACY_DEFAULTS_VERSION)
    return with_params(defaults_of(version), params)


def set_policy_problem(log_params: dict[str, Any], params: dict[str, Any]) -> str:
    """Why a `set_policy` of `params` cannot be applied to a log that has set `log_params`
    ("" if it can): the policy it would put in force, that of the log's defaults version (or
    the one it names) with everything set on top, must be valid, and a new experiment must
    name its control and change only what a variant can."""
    try:
        new = log_policy({**log_params, **params})
        if "ab_variants" in params or "ab_split_by" in params:
            check_experiment(new)
    except PolicyError as err:
        return str(err)
    return ""


def pin_params(policy: Policy) -> dict[str, Any]:
    """What a log's first record sets so that it folds back to `policy`: its defaults version
    and every parameter in which it differs from that version's table."""
    mine = msgspec.structs.asdict(policy)
    table = msgspec.structs.asdict(defaults_of(policy.defaults_version))
    differences = {name: mine[name] for name in sorted(mine) if mine[name] != table[name]}
    return {DEFAULTS_VERSION_KEY: policy.defaults_version, **differences}


def older_defaults_note(log_params: dict[str, Any], wanted: dict[str, Any] | None = None) -> str:
    """For a log running under an older defaults version than this release's (and not moving
    to it with `wanted`, the params about to be set): what this release's would change of
    what the log has not set, and how to adopt it ("" when there is nothing to say)."""
    params = {**log_params, **(wanted or {})}
    version = params.get(DEFAULTS_VERSION_KEY, LEGACY_DEFAULTS_VERSION)
    mine = Policy().defaults_version
    if not isinstance(version, int) or version >= mine or version not in DEFAULTS_BY_VERSION:
        return ""
    old, new = DEFAULTS_BY_VERSION[version], DEFAULTS_BY_VERSION[mine]
    changes = [f"{name} {old[name]!r} -> {new[name]!r}" for name in sorted(new)
               if name not in params and old[name] != new[name]]  # fmt: skip
    return (
        f"this log runs under policy defaults version {version}; this release's are version"
        f" {mine} ({'; '.join(changes) or 'nothing the log has not set'}):"
        f" set defaults_version = {mine} in the policy to adopt them"
    )


def is_pin(params: dict[str, Any]) -> bool:
    """Whether a `PolicyChanged` with these params names a defaults version."""
    return DEFAULTS_VERSION_KEY in params


def load_policy_toml(path: str) -> Policy:
    """The policy a TOML file describes: the defaults of the version it names (this release's
    if none) with the file's keys."""
    params = read_policy_toml(path)
    return with_params(defaults_of(params.get(DEFAULTS_VERSION_KEY, Policy().defaults_version)), params)
