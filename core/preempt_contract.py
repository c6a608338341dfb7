"""A job's own preemption contract (Slurm's `--signal`): the signal its processes get at a
preemption notice and the grace time they have from then to exit, checked at submit."""

from __future__ import annotations

from .model import types as T

GRACE_S_MAX = 3600.0
# The signals a job may ask for at a preemption notice, by their names.
PREEMPT_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def signal_name(name: str) -> str:
    """A signal's canonical name ('usr1', 'USR1', 'SIGUSR1' -> 'SIGUSR1'; '' stays '')."""
    name = name.strip().upper()
    return name if not name or name.startswith("SIG") else "SIG" + name


def preempt_contract_problem(inp: T.Submit) -> tuple[str, str] | None:
    """Why a job's own preemption signal or grace time cannot be used; None when they can."""
    if inp.preempt_signal and signal_name(inp.preempt_signal) not in PREEMPT_SIGNALS:
        return "preempt_signal_unknown", (
            f"got {inp.preempt_signal!r}; use one of {', '.join(s[3:] for s in PREEMPT_SIGNALS)}"
        )
    if inp.grace_s is not None and not (0 < inp.grace_s <= GRACE_S_MAX):  # also refuses nan
        return "grace_s_out_of_range", f"got {inp.grace_s}; give 0 < grace_s <= {GRACE_S_MAX:.0f}"
    return None
