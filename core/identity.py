"""Who may send which input: the authenticated sender (`origin`) against what the input
claims.

The bus authenticates senders and lets each publish only on its own XR_IN subjects
(deploy/nats); the scheduler stamps the sender from the subject into `origin`. This file
decides, purely, whether that sender may send this input:

- `client:<team>:<user>`: submits as that team and user only; cancels, holds, releases,
  requeues, lowers the level of (core/inputs.py: raising one takes an operator) and answers
  for only that user's own jobs; never node or policy changes;
- `host:<node>`: its own node's `node_up`/`node_down`/`node_health` (a host cordons and
  uncordons only itself: core/node_inputs.py), and job facts of jobs placed on it;
- `job:<job>`: its own job's facts only;
- `op:<user>` (operators) and `sched:<instance>` (the scheduler): anything (`cordon`,
  `uncordon` and `set_policy` only they may send).

A claimed identity that does not match is `identity_mismatch`; an input type the role may
not send is `not_permitted_for_role`. On a bus that authenticates its users, the scheduler
stamps an input whose subject names no sender (`origin_of_subject` found none) as
`unknown:<subject>`, and such an input is refused `unknown_sender`: a sender is established
by the server, never guessed. A host's or job's fact about a job that has a run must name
that run (`attempt`); without one it is refused `run_not_named`, so a fact cannot dodge
the run fence by leaving it out. An input with no origin (an open embedded bus, an offline
scenario file, a simulation, a log written before origins existed) is not checked, so old
logs replay.
"""

from __future__ import annotations

from .model import types as T
from .model.state import State

CLIENT_INPUTS = ("submit", "cancel", "feedback", "hold", "release", "requeue", "set_level")
JOB_FACTS = (
    "started",
    "checkpoint_started",
    "checkpoint_saved",
    "checkpoint_failed",
    "safe_point",
    "released",
    "finished",
)
HOST_INPUTS = ("node_up", "node_down", "node_health", *JOB_FACTS)
ANY_INPUT_ROLES = ("op", "sched")
# The role the scheduler stamps on an input from an authenticated bus whose subject names
# no sender it can read (for example one token too many after the sender's name).
UNKNOWN_SENDER_ROLE = "unknown"


def identity_problem(state: State, inp: T.Input) -> tuple[str, str] | None:
    """(reason, detail) when `inp.origin` may not send `inp`; None when it may."""
    if not inp.origin or isinstance(inp, T.Malformed):
        return None
    role, _, who = inp.origin.partition(":")
    kind = T.type_name(inp)
    if role in ANY_INPUT_ROLES:
        return None
    if role == UNKNOWN_SENDER_ROLE:
        return "unknown_sender", (
            f"the subject {who!r} names no sender the bus authenticated; publish on"
            f" xr.in.<role>.<name>.<input type> (what `xirang` does with your credentials)"
        )
    allowed = {"client": CLIENT_INPUTS, "host": HOST_INPUTS, "job": JOB_FACTS}.get(role)
    if allowed is None:
        return "not_permitted_for_role", f"unknown sender role {role!r} ({inp.origin})"
    if kind not in allowed:
        return "not_permitted_for_role", (
            f"{kind} may not be sent by a {role} ({inp.origin}); ask an operator"
        )
    return {"client": _client_problem, "host": _host_problem, "job": _job_problem}[role](state, inp, who)


def _client_problem(state: State, inp: T.Input, who: str) -> tuple[str, str] | None:
    team, _, user = who.partition(":")
    if isinstance(inp, T.Submit):
        if (inp.team, inp.user) != (team, user):
            return "identity_mismatch", (
                f"submitted as team {inp.team!r} user {inp.user!r} by {team}:{user}; submit as yourself"
            )
        return None
    job = state.canonical.jobs.get(T.input_job(inp))
    if job is not None and (job.team, job.user) != (team, user):
        return "identity_mismatch", (
            f"job {job.id} belongs to {job.team}:{job.user}, not {team}:{user}; "
            f"only its owner or an operator may do that"
        )
    claimed_team = getattr(inp, "team", None)
    if claimed_team is not None and job is None and claimed_team != team:
        return "identity_mismatch", f"team {claimed_team!r} claimed by {team}:{user}"
    for field in ("user", "by"):  # feedback's user, a job request's `by`
        claimed = getattr(inp, field, "")
        if claimed and claimed != user:
            return "identity_mismatch", f"{field} {claimed!r} claimed by {team}:{user}; speak as yourself"
    return None


def _host_problem(state: State, inp: T.Input, node: str) -> tuple[str, str] | None:
    if isinstance(inp, (T.NodeUp, T.NodeDown, T.NodeHealth)):
        if inp.node != node:
            return "identity_mismatch", f"host {node} reported on node {inp.node}; a host speaks for itself"
        return None
    job = state.canonical.jobs.get(T.input_job(inp))
    if job is not None and job.placement and all(slot.node != node for slot in job.placement):
        return "identity_mismatch", f"job {job.id} does not run on host {node}"
    return _run_not_named(state, inp)


def _job_problem(state: State, inp: T.Input, job: str) -> tuple[str, str] | None:
    if T.input_job(inp) != job:
        return "identity_mismatch", f"job {job} reported for job {T.input_job(inp)}; a job speaks for itself"
    return _run_not_named(state, inp)


def _run_not_named(state: State, inp: T.Input) -> tuple[str, str] | None:
    """A run fact from a host or job that leaves out its run (`attempt` 0) while the job has
    one: refused, since an unnamed run would pass the stale-run fence of every run."""
    job = state.canonical.jobs.get(T.input_job(inp))
    if job is None or not job.run or getattr(inp, "attempt", None) != 0:
        return None
    return "run_not_named", (
        f"{T.type_name(inp)} for {job.id} names no run; its current run is {job.run}"
        f" (report facts with the run's attempt, as the host agent and the SDK do)"
    )


# ---------------------------------------------------------------- senders on the bus
# An input's XR_IN subject names its sender: xr.in.<role>.<name tokens>.<type>, e.g.
# xr.in.client.vision.li.submit, xr.in.host.gpu-7.finished, xr.in.op.alice.set_policy.
# The server lets each user publish only on its own prefix; the scheduler reads the
# sender back from the subject.

ROLE_NAME_TOKENS = {"client": 2, "host": 1, "job": 1, "op": 1, "sched": 1}
_SAFE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
ENCODED_MARK = "~"


def subject_token(name: str) -> str:
    """A name as one subject token: as it is when plain, else `~` + its UTF-8 in hex."""
    if name and all(ch in _SAFE for ch in name):
        return name
    return ENCODED_MARK + name.encode().hex()


def name_of_token(token: str) -> str:
    """The name a subject token stands for (the inverse of `subject_token`); a token that does
    not decode is returned as it is."""
    if token.startswith(ENCODED_MARK):
        try:
            return bytes.fromhex(token[1:]).decode()
        except ValueError:
            return token
    return token


def sender_tokens(origin: str) -> list[str]:
    """`client:vision:li` -> ['client', 'vision', 'li'] as subject tokens."""
    role, *names = origin.split(":")
    return [role, *(subject_token(n) for n in names)]


def origin_of_subject(subject: str, prefix: str = "xr.in", senders_required: bool = False) -> str:
    """The sender an XR_IN subject names: `<role>:<names>` for a subject of exactly the shape
    `<prefix>.<role>.<name tokens>.<type>`. For any other subject, '' on an open bus (nobody
    is authenticated there, so nothing is checked), and `unknown:<subject>` when
    `senders_required` (an authenticated bus), which the core refuses as `unknown_sender`."""
    tokens = subject[len(prefix) + 1 :].split(".") if subject.startswith(prefix + ".") else []
    role = tokens[0] if tokens else ""
    count = ROLE_NAME_TOKENS.get(role)
    if count is not None and len(tokens) == count + 2 and all(tokens):
        return ":".join([role, *(name_of_token(t) for t in tokens[1 : 1 + count])])
    return f"{UNKNOWN_SENDER_ROLE}:{subject}" if senders_required else ""
