"""Security commands: `xirang key create | rotate | show` (the scheduler's log-signing key),
`xirang nats init | add-user` (the NATS operator and account, users and their credentials,
accounts.conf), `xirang tls init`
(a private CA and the servers' certificates)."""

from __future__ import annotations

import json

from xirang.errors import UserError


def register(sub) -> None:
    """Add the `key`, `nats add-user` and `tls init` command(s) to the CLI's subparsers."""
    key = sub.add_parser("key", help="the scheduler's Ed25519 log-signing key: create, rotate, show, adopt")
    key_sub = key.add_subparsers(dest="key_command", metavar="ACTION")
    key_sub.required = True
    for name, what in (
        ("create", "make the first key pair"),
        ("rotate", "a new key pair; the old public key stays trusted for older records"),
        ("show", "the key ids in the public keyring"),
    ):
        p = key_sub.add_parser(name, help=what)
        p.add_argument(
            "--dir",
            default=".xirang/keys",
            help="where scheduler.key (private, mode 0600) and scheduler.pub (public "
            "keyring) live (default .xirang/keys)",
        )
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_key)
    adopt = key_sub.add_parser(
        "adopt",
        help="vouch, with the scheduler's key, for a log written before records were signed (it is "
        "audited first), so a scheduler with a key can go on with it",
    )
    adopt.add_argument(
        "--dir",
        default=".xirang/keys",
        help="where scheduler.key and scheduler.pub live (default .xirang/keys)",
    )
    from xirang.cmd_data import add_source

    add_source(adopt)
    adopt.add_argument("--json", action="store_true")
    adopt.set_defaults(func=cmd_key_adopt)

    nats_p = sub.add_parser(
        "nats", help="NATS operator, account and users (decentralised JWT auth): init, add-user, revoke"
    )
    nats_sub = nats_p.add_subparsers(dest="nats_command", metavar="ACTION")
    nats_sub.required = True
    init_p = nats_sub.add_parser(
        "init",
        help="make the operator, the system and xirang accounts and their role keys; write accounts.conf",
    )
    init_p.add_argument(
        "--dir",
        default="deploy/nats",
        help="folder of keys/, roster.json and the accounts.conf the server includes (default deploy/nats)",
    )
    init_p.add_argument("--json", action="store_true")
    init_p.set_defaults(func=cmd_nats_init)
    add = nats_sub.add_parser(
        "add-user",
        help=(
            "add a user: scheduler | host NODE | client TEAM USER | op USER | reader USER (reads the"
            " log, sends nothing: auditors, the review) (jobs: by their host)"
        ),
    )
    add.add_argument("role", choices=["scheduler", "job", "host", "client", "op", "reader"])
    add.add_argument("names", nargs="*", help="host: NODE; client: TEAM USER; op or reader: USER")
    add.add_argument(
        "--dir",
        default="deploy/nats",
        help="folder of roster.json and the accounts.conf the server includes (default deploy/nats)",
    )
    add.add_argument("--json", action="store_true")
    add.set_defaults(func=cmd_nats_add_user)
    revoke = nats_sub.add_parser(
        "revoke", help="revoke a user (e.g. client-vision-li, host-gpu-1): its credentials stop working"
    )
    revoke.add_argument("user", help="the user's name, as add-user printed it")
    revoke.add_argument(
        "--dir", default="deploy/nats", help="the folder init and add-user used (default deploy/nats)"
    )
    revoke.add_argument("--json", action="store_true")
    revoke.set_defaults(func=cmd_nats_revoke)

    tls = sub.add_parser("tls", help="a private CA and certificates for the NATS servers")
    tls_sub = tls.add_subparsers(dest="tls_command", metavar="ACTION")
    tls_sub.required = True
    init = tls_sub.add_parser("init", help="make the CA (once) and one certificate per --server")
    init.add_argument(
        "--dir", default="deploy/nats/tls", help="where the CA and certificates go (default deploy/nats/tls)"
    )
    init.add_argument(
        "--server",
        action="append",
        default=[],
        metavar="NAME=ADDR[,ADDR...]",
        help="a server and the names/IPs it is dialled at, e.g. xirang-1=nats-1,10.0.0.1 (repeatable)",
    )
    init.add_argument("--json", action="store_true")
    init.set_defaults(func=cmd_tls_init)


def cmd_key(args) -> int:
    """`xirang key`: create, rotate or show the scheduler's log-signing key."""
    from pathlib import Path

    from trust.signing import PUBLIC_FILE, KeyFileError, KeyRing, create_key

    try:
        if args.key_command == "show":
            ring = KeyRing.load(Path(args.dir) / PUBLIC_FILE)
            out = {"keyring": str(Path(args.dir) / PUBLIC_FILE), "key_ids": sorted(ring.keys)}
        else:
            private, public, key_id = create_key(args.dir, rotate=args.key_command == "rotate")
            out = {"private_key": str(private), "public_keyring": str(public), "key_id": key_id}
    except KeyFileError as err:
        raise UserError(str(err)) from err
    if args.json:
        print(json.dumps(out, sort_keys=True))
    elif args.key_command == "show":
        print(f"{out['keyring']}: " + ", ".join(out["key_ids"]))
    else:
        print(
            f"key {key_id}: private key {private} (keep it on the scheduler machines only, "
            f"--signing-key or XIRANG_SIGNING_KEY); public keyring {public} (give it to auditors "
            f"and host agents, --public-key or XIRANG_PUBLIC_KEY)"
        )
        if args.key_command == "rotate":
            print(
                "restart the schedulers with the new private key; the keyring still trusts the old "
                "key for the records it signed"
            )
    return 0


def cmd_key_adopt(args) -> int:
    """`xirang key adopt`: audit an unsigned log, then add to the keyring the scheduler key's
    signed word for its history (trust/signing.py, Adoption)."""
    from pathlib import Path

    from projections.audit import Audit
    from trust.signing import PRIVATE_FILE, PUBLIC_FILE, KeyFileError, Signer
    from xirang.cmd_data import feed_log, resolve_source

    resolve_source(args)
    audit = Audit()
    feed_log(args, audit)
    audit.finish()
    c = audit.state.canonical
    if audit.problem is not None:
        raise UserError(
            f"the log does not verify, so it cannot be adopted: {audit.problem.words('position')}"
        )
    if audit.signed_records:
        raise UserError("the log is signed already: adoption is for logs written before records were signed")
    if c.events_n == 0:
        raise UserError("the log is empty: nothing to adopt")
    try:
        signer = Signer.load(Path(args.dir) / PRIVATE_FILE)
    except KeyFileError as err:
        raise UserError(str(err)) from err
    adopted = signer.adopt(c.events_n, c.chain)
    keyring = Path(args.dir) / PUBLIC_FILE
    with open(keyring, "a") as fh:
        fh.write(f"{adopted.line()}  # records 1..{c.events_n}, audited ({audit.digests} state digests)\n")
    out = {
        "adopted_records": c.events_n,
        "head_hash": c.chain,
        "key_id": adopted.key,
        "keyring": str(keyring),
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(
            f"adopted records 1..{c.events_n} (head {c.chain[:16]}, {audit.digests} state digests verified) "
            f"under key {adopted.key}: written to {keyring}. Give this keyring to every reader (host "
            "agents, standby schedulers, auditors); the scheduler can now go on with this log."
        )
    return 0


def cmd_nats_add_user(args) -> int:
    """`xirang nats add-user`: add a NATS user of a role and write its credentials file."""
    from trust.natsauth import RosterError, add_user

    try:
        entry, creds = add_user(args.dir, args.role, args.names)
    except RosterError as err:
        raise UserError(str(err)) from err
    if args.json:
        print(
            json.dumps(
                {
                    "user": entry["name"],
                    "nkey": entry["nkey"],
                    "creds": str(creds),
                    "account_changed": entry["account_changed"],
                },
                sort_keys=True,
            )
        )
    else:
        print(
            f"user {entry['name']} ({entry['role']}) added; credentials in {creds} (give them to that user "
            f"only: XIRANG_CREDS={creds})"
            + (
                "; the account changed (this node's job signing key): copy accounts.conf to the servers "
                "and reload them (nats-server --signal reload)"
                if entry["role"] == "host"
                else "; the account changed (a role new to it): copy accounts.conf to the servers and reload them"
                if entry["account_changed"]
                else ""
            )
        )
    return 0


def cmd_nats_init(args) -> int:
    """`xirang nats init`: the operator, accounts and role keys (kept if there), accounts.conf."""
    from trust.natsauth import Authority, RosterError

    authority = Authority(args.dir)
    fresh = not authority.initialised
    try:
        accounts = authority.init()
    except RosterError as err:
        raise UserError(str(err)) from err
    out = {
        "accounts_conf": str(accounts),
        "operator": authority.public("operator", "operator"),
        "account": authority.public("account"),
        "keys": str(authority.keys),
        "created": fresh,
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(
            f"{'made' if fresh else 'kept'} operator {out['operator']} and account {out['account']}; "
            f"{accounts} written (the servers include it); keep {out['keys']} (the private keys) off the "
            f"servers. Next: xirang nats add-user ... --dir {args.dir}"
        )
    return 0


def cmd_tls_init(args) -> int:
    """`xirang tls init`: make the private CA (once) and a certificate per server."""
    from trust.pki import PkiError, init

    servers = {}
    for spec in args.server:
        name, _, addresses = spec.partition("=")
        if not name or not addresses:
            raise UserError(f"--server {spec!r}: write NAME=ADDR[,ADDR...], e.g. xirang-1=nats-1,10.0.0.1")
        servers[name] = [a for a in addresses.split(",") if a]
    if not servers:
        raise UserError("name at least one --server NAME=ADDR[,ADDR...]")
    try:
        made = init(args.dir, servers)
    except PkiError as err:
        raise UserError(str(err)) from err
    out = {
        "ca": f"{args.dir}/ca.pem",
        "servers": {n: {"cert": str(c), "key": str(k)} for n, (c, k) in made.items()},
    }
    if args.json:
        print(json.dumps(out, sort_keys=True))
    else:
        print(f"CA {out['ca']} (clients: XIRANG_TLS_CA={out['ca']}; keep ca-key.pem offline)")
        for name, files in out["servers"].items():
            print(f"  {name}: {files['cert']} {files['key']}")
    return 0


def cmd_nats_revoke(args) -> int:
    """`xirang nats revoke USER`: the account refuses the user's credentials from now on."""
    from trust.natsauth import Authority, RosterError

    try:
        entry = Authority(args.dir).revoke(args.user)
    except RosterError as err:
        raise UserError(str(err)) from err
    if args.json:
        print(json.dumps({"user": entry["name"], "nkey": entry["nkey"], "revoked_at": entry["revoked_at"]}))
    else:
        print(
            f"user {entry['name']} revoked"
            + (" (and its node's job signing key)" if entry["role"] == "host" else "")
            + f"; copy {args.dir}/accounts.conf to the servers and reload them (nats-server --signal reload)"
        )
    return 0
