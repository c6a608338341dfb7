"""Security commands: `xirang key create | rotate | show` (the scheduler's log-signing key)."""

from __future__ import annotations

import json

from xirang.errors import UserError


def register(sub) -> None:
    key = sub.add_parser("key", help="the scheduler's Ed25519 log-signing key: create, rotate, show")
    key_sub = key.add_subparsers(dest="key_command", metavar="ACTION")
    key_sub.required = True
    for name, what in (("create", "make the first key pair"),
                       ("rotate", "a new key pair; the old public key stays trusted for older records"),
                       ("show", "the key ids in the public keyring")):
        p = key_sub.add_parser(name, help=what)
        p.add_argument("--dir", default=".xirang/keys",
                       help="where scheduler.key (private, mode 0600) and scheduler.pub (public "
                            "keyring) live (default .xirang/keys)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=cmd_key)


def cmd_key(args) -> int:
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
        print(f"key {key_id}: private key {private} (keep it on the scheduler machines only, "
              f"--signing-key or XIRANG_SIGNING_KEY); public keyring {public} (give it to auditors "
              f"and host agents, --public-key or XIRANG_PUBLIC_KEY)")
        if args.key_command == "rotate":
            print("restart the schedulers with the new private key; the keyring still trusts the old "
                  "key for the records it signed")
    return 0
