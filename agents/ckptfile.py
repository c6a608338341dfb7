"""The checkpoint file format: data that cannot run code, sealed per job.

- No pickle. A checkpoint is a numpy `.npz` archive read with `allow_pickle=False`: every
  numpy array of the training state is one member; everything else (numbers, strings,
  lists, tuples, dicts with string keys, RNG states) is a JSON manifest stored as one
  more member. Loading it can build arrays and plain values, nothing else.
- Sealed per job. The host agent gives each job its own key (`XR_CKPT_KEY`, derived from
  the hosts' shared secret and the job id, `job_key`), and the archive is encrypted and
  authenticated with AES-256-GCM under it. NATS already keeps each job to its own
  checkpoint subjects (its own short-lived credentials, trust/natsauth.py); the seal is the
  second wall: one job can neither read another's checkpoint nor make one that the other
  would accept, even with the other's subjects in reach.
- The job's checkpoint index (step, digest) is sealed the same way, so the fallbacks a
  restore may try are only checkpoints this job itself saved and reported, i.e. those the
  log recorded; the first one tried is always the digest the signed resume order names.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

SEALED_MAGIC = b"XRC1"
NONCE_BYTES = 12
AAD = b"xirang-ckpt-v1"
MANIFEST = "__manifest__"
KEY_ENV = "XR_CKPT_KEY"


class CheckpointError(ValueError):
    """A checkpoint that must not be restored: tampered, sealed for another job, or not
    in this format."""


def job_key(secret: bytes, job: str) -> bytes:
    """The key of one job's checkpoints, from the hosts' shared secret."""
    return hmac.new(secret, b"xirang-ckpt-key\0" + job.encode(), hashlib.sha256).digest()


def key_from_env() -> bytes | None:
    """The job's checkpoint key from $XR_CKPT_KEY (hex), or None when checkpoints are not
    sealed."""
    value = os.environ.get(KEY_ENV, "")
    return bytes.fromhex(value) if value else None


# ---------------------------------------------------------------- values <-> arrays + JSON


def _flatten(value: Any, arrays: dict[str, np.ndarray]) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise CheckpointError("object arrays cannot be checkpointed (they would need pickle)")
        name = f"a{len(arrays)}"
        arrays[name] = value
        return {"__ndarray__": name}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise CheckpointError("checkpointed dicts need string keys")
        return {"__dict__": {k: _flatten(v, arrays) for k, v in value.items()}}
    if isinstance(value, tuple):
        return {"__tuple__": [_flatten(v, arrays) for v in value]}
    if isinstance(value, list):
        return [_flatten(v, arrays) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise CheckpointError(
        f"cannot checkpoint a {type(value).__name__}: use arrays, numbers, strings, lists, tuples and dicts"
    )


def _unflatten(value: Any, arrays) -> Any:
    if isinstance(value, list):
        return [_unflatten(v, arrays) for v in value]
    if isinstance(value, dict):
        if "__ndarray__" in value:
            return arrays[value["__ndarray__"]]
        if "__tuple__" in value:
            return tuple(_unflatten(v, arrays) for v in value["__tuple__"])
        return {k: _unflatten(v, arrays) for k, v in value["__dict__"].items()}
    return value


def encode(payload: Any, key: bytes | None) -> bytes:
    """The bytes stored for `payload`: an npz archive, sealed under `key` if given."""
    arrays: dict[str, np.ndarray] = {}
    manifest = json.dumps(_flatten(payload, arrays)).encode()
    buffer = io.BytesIO()
    np.savez(buffer, **arrays, **{MANIFEST: np.frombuffer(manifest, dtype=np.uint8)})
    return seal(buffer.getvalue(), key)


def decode(data: bytes, key: bytes | None) -> Any:
    """The payload of stored bytes; raises CheckpointError for anything not to be trusted."""
    plain = unseal(data, key)
    try:
        with np.load(io.BytesIO(plain), allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files if name != MANIFEST}
            manifest = json.loads(archive[MANIFEST].tobytes())
    except (ValueError, KeyError, OSError) as err:  # includes "Object arrays cannot be loaded"
        raise CheckpointError(f"not a xirang checkpoint archive: {err}") from err
    return _unflatten(manifest, arrays)


def seal(plain: bytes, key: bytes | None) -> bytes:
    """Encrypt and authenticate checkpoint bytes with the job's key (AES-GCM); unchanged when
    there is no key."""
    if key is None:
        return plain
    nonce = os.urandom(NONCE_BYTES)
    return SEALED_MAGIC + nonce + AESGCM(key).encrypt(nonce, plain, AAD)


def unseal(data: bytes, key: bytes | None) -> bytes:
    """The plain checkpoint bytes; `CheckpointError` when they are sealed for another key, or
    not sealed though a key is given."""
    if not data.startswith(SEALED_MAGIC):
        if key is not None:
            raise CheckpointError("checkpoint is not sealed for this job")
        return data
    if key is None:
        raise CheckpointError("checkpoint is sealed but this job has no key (XR_CKPT_KEY)")
    nonce = data[len(SEALED_MAGIC) : len(SEALED_MAGIC) + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, data[len(SEALED_MAGIC) + NONCE_BYTES :], AAD)
    except InvalidTag as err:
        raise CheckpointError("checkpoint was sealed for another job or altered") from err
