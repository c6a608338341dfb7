"""How a process connects to NATS securely: which servers, which credentials, which CA.

- URLs: one URL or several separated by commas; a server after the first may omit the
  scheme (`tls://nats-1:4222,nats-2:4222,nats-3:4222`). A URL with a password may come
  from the environment, never from a command line (`xirang` refuses one in `--nats`).
- Credentials: `$XIRANG_CREDS` (or the `creds` argument), a NATS `.creds` file made by
  `xirang nats add-user` (or, for a job, by its host agent): the user's JWT (its role's
  permissions, the sender identity its inputs carry, its name, hence its private inbox)
  and its NKEY seed, which signs the server's nonce. The file is read again at every
  (re)connect, so credentials renewed in place are picked up.
- TLS: `tls://` URLs, or `$XIRANG_TLS_CA` set: the server's certificate must chain to that
  CA (made by `xirang tls init`); `$XIRANG_TLS_CERT`/`$XIRANG_TLS_KEY` add a client
  certificate where the server asks for one.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from urllib.parse import urlparse

from .natsauth import CREDS_ENV, read_creds

TLS_CA_ENV = "XIRANG_TLS_CA"
TLS_CERT_ENV = "XIRANG_TLS_CERT"
TLS_KEY_ENV = "XIRANG_TLS_KEY"


class CredentialsRefused(ConnectionError):
    """The NATS server answered and refused the credentials (expired, revoked, or not
    signed by a key of the operator it trusts)."""


class TlsRequired(ConnectionError):
    """A plain `nats://` URL names a server that requires TLS (the client would otherwise
    wait without a word)."""


# How long a plain URL's server is given to say, in its INFO line, whether it needs TLS.
TLS_PROBE_TIMEOUT_S = 2.0


def tls_required_problem(urls: list[str], timeout_s: float = TLS_PROBE_TIMEOUT_S) -> str | None:
    """What to do when plain (`nats://`) URLs name a server that requires TLS: its first
    line (INFO) says so before any client speaks. None when none of them does, or none
    answers (the connection's own errors say that)."""
    for url in urls:
        parsed = urlparse(url if "://" in url else f"nats://{url}")
        if parsed.scheme != "nats" or not parsed.hostname:
            continue
        try:
            with socket.create_connection((parsed.hostname, parsed.port or 4222), timeout=timeout_s) as sock:
                sock.settimeout(timeout_s)
                first = b""
                while b"\n" not in first and len(first) < 65536:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    first += chunk
        except OSError:
            continue
        if not first.startswith(b"INFO "):
            continue
        try:
            info = json.loads(first[5:].split(b"\r\n")[0])
        except ValueError:
            continue
        if info.get("tls_required"):
            tls_url = f"tls://{parsed.hostname}:{parsed.port or 4222}"
            return (
                f"the NATS server at {parsed.hostname}:{parsed.port or 4222} requires TLS: use"
                f" {tls_url} (and ${TLS_CA_ENV} for its CA, from `xirang tls init`)"
            )
    return None


def credentials_refused(creds: str | None = None) -> str:
    """What to say when the server refuses the credentials, naming the file."""
    path = creds or os.environ.get(CREDS_ENV) or "(none: $XIRANG_CREDS is not set)"
    return (
        f"the NATS server refused the credentials {path}: they are expired (a job's run credentials "
        f"live --job-creds-ttl-s), not for this cluster's operator, or missing; get a creds file from "
        f"`xirang nats add-user` and set XIRANG_CREDS"
    )


class UrlError(ValueError):
    """A NATS URL that cannot be used, with what to write instead."""


def server_urls(url: str) -> list[str]:
    """The comma-separated NATS URLs as a list, each with a scheme (the first one's, else
    nats://); an empty URL is an error."""
    parts = [p.strip() for p in url.split(",") if p.strip()]
    if not parts:
        raise UrlError("empty NATS URL: give nats://HOST:PORT (or several, comma separated)")
    scheme = parts[0].split("://", 1)[0] if "://" in parts[0] else "nats"
    out = []
    for part in parts:
        if "://" not in part:
            part = f"{scheme}://{part}"
        out.append(part)
    return out


def tls_context(urls: list[str]) -> ssl.SSLContext | None:
    """The TLS context for these URLs ($XIRANG_TLS_CA, client certificate from the environment),
    or None when neither a CA nor a tls:// URL asks for TLS."""
    ca = os.environ.get(TLS_CA_ENV)
    if not ca and not any(u.startswith("tls://") for u in urls):
        return None
    context = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    cert, key = os.environ.get(TLS_CERT_ENV), os.environ.get(TLS_KEY_ENV)
    if cert:
        context.load_cert_chain(cert, key)
    return context


def connect_options(url: str, creds: str | None = None) -> tuple[dict, str]:
    """(keyword arguments for nats.connect, the sender identity the credentials carry)."""
    urls = server_urls(url)
    options: dict = {"servers": urls}
    context = tls_context(urls)
    if context is not None:
        options["tls"] = context
    else:
        problem = tls_required_problem(urls)
        if problem:
            raise TlsRequired(problem)
    identity = ""
    path = creds or os.environ.get(CREDS_ENV)
    if path:
        data = read_creds(path)
        options["user_credentials"] = str(path)
        options["inbox_prefix"] = data["inbox"]
        identity = data["identity"]
    return options, identity


def refuse_password_argument(argv: list[str]) -> str | None:
    """Why this command line must not run: a NATS URL with a password in it shows in every
    process list. None when there is none."""
    for i, word in enumerate(argv):
        value = (
            argv[i + 1]
            if word == "--nats" and i + 1 < len(argv)
            else (word.split("=", 1)[1] if word.startswith("--nats=") else "")
        )
        if "@" in value:
            return (
                f"--nats {value.split('@')[0].split('://')[0]}://…@…: no password on a command line "
                f"(others see it in the process list); use a credentials file from `xirang nats "
                f"add-user` in ${CREDS_ENV}, or put the URL in $XIRANG_NATS"
            )
    return None
