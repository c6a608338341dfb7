"""Who may do what on NATS: the roster of users, their NKEY credentials, and the
accounts.conf that gives each role only what it needs.

Why NKEYs in a config file (not passwords, not decentralised JWTs): the server's config
holds only public keys, so it is no secret; each user's seed stays in their own
credentials file and proves itself by signing the server's nonce; the permissions are
plain per-user subject lists a reviewer can read in one file. JWTs would add an operator
and a resolver for what is, here, one account. The price: adding a user means
regenerating the file and reloading the server (`nats-server --signal reload`), which
`xirang nats add-user` does in one command (the reload is yours).

Roles (the identity an input carries is the subject the server let it publish on, see
core/identity.py):
- scheduler: the only user that manages streams (all of `$JS.API`), appends to the log
  (`xr.ev.>`), holds the lease and writes snapshots;
- host `<node>`: publishes its node's facts (`xr.in.host.<node>.>`) and heartbeat, reads
  only its own decisions through its durable consumer `host-<node>`;
- job: what an SDK job needs, the checkpoint bucket and its metrics; no input at all: a
  job's facts go through its run's outbox, which its host agent delivers after checking
  they are that job's own (agents/outbox.py). One shared user, distinct from the hosts':
  the server cannot tell one job from another here, so checkpoints are sealed per job
  (agents/ckptfile.py) and one job can neither read nor forge another's;
- client `<team>` `<user>`: submits and cancels as itself (`xr.in.client.<team>.<user>.>`)
  and reads the log through its own consumers;
- op `<user>`: an operator, who may send any input (`xr.in.op.<user>.>`), e.g. set_policy,
  node changes, cancels of others' jobs.
Nobody else may create, update, purge or delete a stream or publish on `xr.ev.>`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import nkeys

from core.identity import subject_token

ROSTER_FILE = "roster.json"
ACCOUNTS_FILE = "accounts.conf"
CREDS_DIR = "creds"
CREDS_ENV = "XIRANG_CREDS"
ROLES = {"scheduler": 0, "host": 1, "job": 0, "client": 2, "op": 1}
ACCOUNT = "XIRANG"

# Read-only stream facts every client library asks for before it uses a stream.
STREAM_INFO = [
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.INFO.XR_IN",
    "$JS.API.STREAM.INFO.XR_EV",
    "$JS.API.STREAM.INFO.OBJ_XR_SNAP",
    "$JS.API.STREAM.INFO.OBJ_XR_CKPT",
    "$JS.API.STREAM.INFO.KV_XR_LEASE",
]
# Reading the log and the newest snapshot through one's own consumers.
# (An unnamed CREATE makes an ephemeral consumer only: the server refuses a durable name.)
LOG_READER = [
    "$JS.API.CONSUMER.CREATE.XR_EV",
    "$JS.API.CONSUMER.CREATE.XR_EV.*.xr.ev.log.>",
    "$JS.API.CONSUMER.MSG.NEXT.XR_EV.*",
    "$JS.API.CONSUMER.INFO.XR_EV.*",
    "$JS.API.CONSUMER.DELETE.XR_EV.*",
    "$JS.FC.XR_EV.>",
    "$JS.API.CONSUMER.CREATE.OBJ_XR_SNAP.>",
    "$JS.API.CONSUMER.DELETE.OBJ_XR_SNAP.>",
    "$JS.API.STREAM.MSG.GET.OBJ_XR_SNAP",
    "$JS.API.DIRECT.GET.OBJ_XR_SNAP.>",
    "$JS.FC.OBJ_XR_SNAP.>",
]
CHECKPOINTS = [
    "$O.XR_CKPT.>",
    "$JS.API.CONSUMER.CREATE.OBJ_XR_CKPT",
    "$JS.API.CONSUMER.CREATE.OBJ_XR_CKPT.>",
    "$JS.API.CONSUMER.DELETE.OBJ_XR_CKPT.>",
    "$JS.API.STREAM.MSG.GET.OBJ_XR_CKPT",
    "$JS.API.DIRECT.GET.OBJ_XR_CKPT.>",
    "$JS.API.STREAM.PURGE.OBJ_XR_CKPT",
    "$JS.FC.OBJ_XR_CKPT.>",
]


def bus_node_token(name: str) -> str:
    """The token the bus puts a node's name in (its decisions' subjects, its durable
    consumer, its heartbeat): transport.bus.node_token, which this layer cannot import
    (tests/test_security_checkpoints.py checks that the two agree)."""
    if name and all(ch.isascii() and (ch.isalnum() or ch in "_-") for ch in name):
        return name
    return "x" + name.encode().hex()


class RosterError(ValueError):
    """A user that cannot be added as asked, with what to do instead."""


def user_name(role: str, names: list[str]) -> str:
    """The NATS user name of a role and its names (`host-node1`, `client-team-user`)."""
    return "-".join([role, *(subject_token(n) for n in names)]) if names else role


def identity(role: str, names: list[str]) -> str:
    """The sender its inputs carry (core/identity.py); '' where the process names itself."""
    return ":".join([role, *names]) if role in ("host", "client", "op") else ""


def inbox(name: str) -> str:
    """The reply-subject prefix reserved for one user."""
    return f"_INBOX.{name}"


def load_roster(directory: Path) -> list[dict]:
    """The roster of NATS users in `directory` ([] when there is none yet)."""
    path = directory / ROSTER_FILE
    return json.loads(path.read_text()) if path.exists() else []


def add_user(directory: str | os.PathLike, role: str, names: list[str]) -> tuple[dict, Path]:
    """Add a user to the roster in `directory`, write its credentials file (mode 0600) to
    `directory/creds/<name>.json`, and regenerate `directory/accounts.conf`."""
    directory = Path(directory)
    if role not in ROLES:
        raise RosterError(f"role {role!r}: choose one of {', '.join(ROLES)}")
    if len(names) != ROLES[role]:
        raise RosterError(
            f"a {role} user needs {ROLES[role]} name(s) "
            f"({'team and user' if role == 'client' else 'node' if role == 'host' else 'user'})"
        )
    if any(not n or ":" in n for n in names):
        raise RosterError("names must be non-empty and without ':'")
    roster = load_roster(directory)
    name = user_name(role, names)
    if any(entry["name"] == name for entry in roster):
        raise RosterError(f"user {name} exists already in {directory / ROSTER_FILE}")
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    entry = {"name": name, "role": role, "names": names, "nkey": public}
    creds = {"user": name, "seed": seed.decode(), "identity": identity(role, names), "inbox": inbox(name)}
    creds_path = directory / CREDS_DIR / f"{name}.json"
    creds_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(creds_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(creds, fh)
    roster.append(entry)
    (directory / ROSTER_FILE).write_text(json.dumps(roster, indent=1) + "\n")
    write_accounts(directory, roster)
    return entry, creds_path


def write_accounts(directory: Path, roster: list[dict]) -> Path:
    """Write the NATS accounts file for the roster into `directory`; returns its path."""
    path = directory / ACCOUNTS_FILE
    path.write_text(render_accounts(roster))
    return path


def permissions(entry: dict, roster: list[dict]) -> dict:
    """What one roster entry may publish and subscribe to, by its role: least privilege per
    role, the reasons in this module's docstring."""
    role, names, name = entry["role"], entry["names"], entry["name"]
    box = inbox(name)
    if role == "scheduler":
        return {
            "publish": {
                "allow": [
                    "$JS.API.>",
                    "$JS.ACK.>",
                    "$JS.FC.>",
                    "$KV.XR_LEASE.>",
                    "$O.XR_SNAP.>",
                    "xr.ev.>",
                    "xr.in.sched.>",
                    "xr.alert.>",
                ]
            },
            "subscribe": {"allow": ["xr.hb.*", f"{box}.>"]},
        }
    if role == "host":
        node, sender = bus_node_token(names[0]), subject_token(names[0])
        durable = f"host-{node}"
        return {
            "publish": {
                "allow": [
                    *STREAM_INFO,
                    f"$JS.API.CONSUMER.INFO.XR_EV.{durable}",
                    f"$JS.API.CONSUMER.CREATE.XR_EV.{durable}.xr.ev.host.{node}.>",
                    f"$JS.API.CONSUMER.MSG.NEXT.XR_EV.{durable}",
                    f"$JS.ACK.XR_EV.{durable}.>",
                    f"xr.in.host.{sender}.>",
                    f"xr.hb.{node}",
                ]
            },
            # Its own heartbeat subject too: an agent listens there for a second agent of its node.
            "subscribe": {"allow": [f"{box}.>", f"xr.hb.{node}"]},
        }
    if role == "job":
        return {
            "publish": {"allow": [*STREAM_INFO, *CHECKPOINTS, "xr.job.*.metrics"]},
            "subscribe": {"allow": [f"{box}.>"]},
        }
    own = (
        f"xr.in.client.{subject_token(names[0])}.{subject_token(names[1])}.>"
        if role == "client"
        else f"xr.in.op.{subject_token(names[0])}.>"
    )
    # Hosts' durable consumers are theirs alone: no one else may pull, inspect or remove them.
    hosts = [f"host-{bus_node_token(e['names'][0])}" for e in roster if e["role"] == "host"]
    deny = [
        f"$JS.API.CONSUMER.{op}.XR_EV.{durable}" for durable in hosts for op in ("MSG.NEXT", "INFO", "DELETE")
    ]
    deny += [f"$JS.API.CONSUMER.CREATE.XR_EV.{durable}.>" for durable in hosts]
    subscribe = [f"{box}.>", "xr.job.*.metrics"] if role == "op" else [f"{box}.>"]
    return {
        "publish": {"allow": [*STREAM_INFO, *LOG_READER, own], **({"deny": deny} if deny else {})},
        "subscribe": {"allow": subscribe},
    }


def render_accounts(roster: list[dict]) -> str:
    """The text of the NATS accounts file: every roster user with its NKEY and permissions."""
    lines = [
        "# Generated by `xirang nats add-user` from roster.json: edit the roster through that",
        "# command, not this file. Users authenticate with NKEYs (public keys here, seeds in",
        "# each user's credentials file); trust/natsauth.py says what each role may do and why.",
        "accounts {",
        f"  {ACCOUNT} {{",
        "    jetstream: enabled",
        "    users: [",
    ]
    for entry in roster:
        perms = json.dumps(permissions(entry, roster))
        lines.append(f"      # {entry['name']} ({entry['role']})")
        lines.append(f"      {{ nkey: {entry['nkey']}, permissions: {perms} }}")
    lines += ["    ]", "  }", "  SYS { }", "}", "system_account: SYS", ""]
    return "\n".join(lines)


def read_creds(path: str | os.PathLike) -> dict:
    """A credentials file made by `xirang nats add-user`, as a dict; `RosterError` says what is
    wrong with it."""
    try:
        creds = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise RosterError(f"cannot read NATS credentials {path}: {err}") from err
    if not isinstance(creds, dict) or "seed" not in creds:
        raise RosterError(f"{path} is not a xirang credentials file (made by `xirang nats add-user`)")
    return creds
