"""NATS decentralised-auth tokens, made and read in Python: operator, account and user
JWTs signed with NKEYs (Ed25519), and the `.creds` files NATS clients read.

The format is the one nats-server checks (nats-io/jwt v2): `header.claims.signature`, each
part base64url without padding; the header is {"typ":"JWT","alg":"ed25519-nkey"}; the
claims carry `jti` (a hash of the claims), `iat`, `iss` (the signer's public NKEY), `sub`
(the subject's public NKEY), optional `exp`, `name`, and the NATS part under `nats`
(`type`, `version: 2`, permissions, tags, signing keys ...). The signature is the issuer's
Ed25519 signature of `header.claims`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from pathlib import Path

import nkeys

from .durable import PRIVATE_MODE, write_durably

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
NO_LIMIT = -1


class JwtError(ValueError):
    """A token or credentials file that cannot be used, and why."""


def new_seed(kind: str) -> str:
    """A fresh NKEY seed for an operator, account (also signing keys) or user."""
    return nkeys.encode_seed(os.urandom(32), PREFIXES[kind]).decode()


def public_key(seed: str) -> str:
    """The public NKEY of a seed."""
    return nkeys.from_seed(bytearray(seed.encode())).public_key.decode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict, signer_seed: str, now_s: int | None = None) -> str:
    """Sign `claims` (sub, name, exp, nats ...) with `signer_seed`; sets iss, iat and jti."""
    signer = nkeys.from_seed(bytearray(signer_seed.encode()))
    body = {
        **claims,
        "iss": signer.public_key.decode(),
        "iat": int(now_s if now_s is not None else time.time()),
    }
    body.pop("jti", None)
    digest = hashlib.new("sha512_256", json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = signer.sign(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{_b64(signature)}"


def decode(token: str, verify: bool = True) -> dict:
    """The claims of a token; with `verify`, only if its issuer's signature holds."""
    try:
        head, payload, signature = token.strip().split(".")
        claims = json.loads(_unb64(payload))
        header = json.loads(_unb64(head))
    except ValueError as err:
        raise JwtError(f"not a NATS JWT: {err}") from err
    if header.get("alg") != HEADER["alg"]:
        raise JwtError(f"unexpected JWT algorithm {header.get('alg')!r}")
    if verify:
        try:
            issuer = nkeys.from_public_key(claims["iss"].encode())
            issuer.verify(f"{head}.{payload}".encode(), _unb64(signature))
        except Exception as err:  # noqa: BLE001 - any failure means: not signed by its issuer
            raise JwtError("JWT signature does not verify") from err
    return claims


# ---------------------------------------------------------------- claims


def operator_claims(name: str, operator_public: str, system_account: str) -> dict:
    """The operator the servers trust (self-signed), naming the system account."""
    return {
        "sub": operator_public,
        "name": name,
        "nats": {"system_account": system_account, "type": "operator", "version": 2},
    }


def account_claims(
    name: str, account_public: str, scopes: list[dict] | None = None, jetstream: bool = False
) -> dict:
    """An account; `scopes` are its scoped signing keys (see `user_scope`)."""
    limits = {
        "subs": NO_LIMIT,
        "data": NO_LIMIT,
        "payload": NO_LIMIT,
        "imports": NO_LIMIT,
        "exports": NO_LIMIT,
        "wildcards": True,
        "conn": NO_LIMIT,
        "leaf": NO_LIMIT,
    }
    if jetstream:
        limits.update(
            {"mem_storage": NO_LIMIT, "disk_storage": NO_LIMIT, "streams": NO_LIMIT, "consumer": NO_LIMIT}
        )
    nats = {"limits": limits, "type": "account", "version": 2}
    if scopes:
        nats["signing_keys"] = sorted(scopes, key=lambda s: s["key"])
    return {"sub": account_public, "name": name, "nats": nats}


def permissions(
    publish: list[str], subscribe: list[str], publish_deny: list[str] | None = None, responses: bool = False
) -> dict:
    """Publish and subscribe permissions in JWT form. `responses`: the user may also publish
    one reply to the reply subject of each request it receives, within a minute (NATS's
    allow_responses), whatever its publish permissions."""
    pub: dict = {"allow": publish}
    if publish_deny:
        pub["deny"] = publish_deny
    perms: dict = {"pub": pub, "sub": {"allow": subscribe}}
    if responses:
        perms["resp"] = {"max": 1, "ttl": 60 * 1_000_000_000}
    return perms


def user_scope(signing_public: str, role: str, perms: dict) -> dict:
    """A scoped signing key: every user it signs gets exactly `perms` (templates such as
    `{{tag(job)}}` filled from the user's tags by the server), never more."""
    return {
        "kind": "user_scope",
        "key": signing_public,
        "role": role,
        "template": {**perms, "subs": NO_LIMIT, "data": NO_LIMIT, "payload": NO_LIMIT},
        "description": f"xirang {role}",
    }


def user_claims(
    name: str, user_public: str, account_public: str, tags: list[str], expires_s: int | None = None
) -> dict:
    """A user signed by a scoped signing key: no permissions of its own (the server
    refuses a scoped user that has any), only tags that the scope's template reads."""
    claims = {
        "sub": user_public,
        "name": name,
        "nats": {"issuer_account": account_public, "tags": tags, "type": "user", "version": 2},
    }
    if expires_s is not None:
        claims["exp"] = int(expires_s)
    return claims


# ---------------------------------------------------------------- creds files


def creds_text(token: str, user_seed: str, extra: dict[str, str] | None = None) -> str:
    """A `.creds` file as NATS clients read it; `extra` blocks (name -> text) follow."""
    parts = [
        "-----BEGIN NATS USER JWT-----",
        token,
        "------END NATS USER JWT------",
        "",
        "************************* IMPORTANT *************************",
        "NKEY Seed printed below can be used to sign and prove identity.",
        "NKEYs are sensitive and should be treated as secrets.",
        "",
        "-----BEGIN USER NKEY SEED-----",
        user_seed,
        "------END USER NKEY SEED------",
        "",
    ]
    for name, text in (extra or {}).items():
        parts += [f"-----BEGIN {name}-----", text, f"------END {name}------", ""]
    return "\n".join(parts)


def read_blocks(text: str) -> dict[str, str]:
    """The decorated blocks of a creds file: {'NATS USER JWT': ..., 'USER NKEY SEED': ...}."""
    blocks, name, lines = {}, None, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-----BEGIN ") and stripped.endswith("-----"):
            name, lines = stripped[len("-----BEGIN ") : -5], []
        elif stripped.startswith("------END ") and name is not None:
            blocks[name] = "\n".join(lines).strip()
            name = None
        elif name is not None:
            lines.append(stripped)
    return blocks


def write_private(
    path: Path, text: str, owner: tuple[int, int] | None = None, exclusive: bool = False
) -> Path:
    """Write a secret file atomically and durably, readable by its owner only (mode 0600 from
    its first moment); `owner` (uid, gid) hands it to another user before it takes its place;
    `exclusive`: only where there is none (FileExistsError otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_durably(path, text.encode(), mode=PRIVATE_MODE, owner=owner, exclusive=exclusive)
