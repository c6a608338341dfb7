"""Errors the command line reports without a traceback.

`UserError` is a mistake the user can fix, raised by the commands themselves. Failures
that come from outside (a NATS server that is gone, a projection another process holds)
are turned into one line that says what to do by `explain_failure`, so that no command
ends in a traceback; `XIRANG_DEBUG=1` shows the traceback for a bug report."""

from __future__ import annotations

import asyncio
import os


class UserError(Exception):
    """A mistake the user can fix; printed as one line, exit status 2."""


NATS_HINT = (
    "start a cluster with `xirang up` (in another terminal), or pass --nats URL /"
    " set XIRANG_NATS to a running server (from another folder than `xirang up`'s:"
    " --data-dir THAT_FOLDER/.xirang)"
)


def explain_failure(err: BaseException, url: str | None = None) -> str:
    """One line for a failure the user did not cause by a typo: what went wrong and what to
    do. Unknown failures say they are a bug and how to see the traceback."""
    where = f" at {url}" if url else ""
    module = type(err).__module__ or ""
    name = type(err).__name__
    if name in ("CredentialsRefused", "PermanentBusError", "TlsRequired"):  # each says what to fix
        return str(err)
    if module.startswith("nats"):
        return _nats_failure(err, name, where)
    if isinstance(err, (ConnectionError, asyncio.TimeoutError, TimeoutError)):
        return f"cannot reach NATS{where} ({_words(err)}): {NATS_HINT}"
    if module.startswith("duckdb"):
        return _duckdb_failure(err, name)
    if isinstance(err, OSError):
        path = f" {err.filename}" if err.filename else ""
        return f"{err.strerror or _words(err)}{path}: check the path and its permissions"
    return (
        f"unexpected {name}: {_words(err)} (a bug in xirang: rerun with XIRANG_DEBUG=1"
        " for the traceback and report it)"
    )


def _nats_failure(err: BaseException, name: str, where: str) -> str:
    if name in (
        "NoServersError",
        "ConnectionClosedError",
        "StaleConnectionError",
        "UnexpectedEOF",
        "OutboundBufferLimitError",
        "SecureConnRequiredError",
    ):
        return f"no NATS server answers{where}: {NATS_HINT}"
    if name in ("AuthorizationError", "PermissionsViolation") or "authorization" in str(err).lower():
        return f"NATS{where} refused the credentials or subject ({_words(err)}): check --nats URL's user and password"
    if name in ("NotFoundError", "ServiceUnavailableError", "NoRespondersError"):
        return (
            f"NATS{where} has no xirang streams or JetStream is off ({name}): start the"
            " scheduler there (`xirang up` or `xirang scheduler`)"
        )
    if name == "TimeoutError":
        return f"NATS{where} did not answer in time: is the server overloaded or gone? {NATS_HINT}"
    return f"NATS{where} failed ({name}: {_words(err)}): {NATS_HINT}"


def _duckdb_failure(err: BaseException, name: str) -> str:
    text = _words(err)
    if "lock" in text.lower():
        return (
            f"the projection database is held by another process ({text}): stop it, or use"
            " --db with another file"
        )
    if name == "CatalogException":
        return f"{text} (no projection yet? run `xirang project` first)"
    return f"DuckDB: {text}"


def _words(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text[:300] if text else type(err).__name__


def debugging() -> bool:
    """Whether XIRANG_DEBUG asks for tracebacks."""
    return os.environ.get("XIRANG_DEBUG", "") not in ("", "0")
