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
import sys
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


# ---------------------------------------------------------------- format 2: safetensors
#
# A checkpoint of format 2 is a manifest (JSON, sealed like everything else) plus one object
# per tensor: the tensor alone in safetensors, sealed. The manifest holds the training state
# with each tensor replaced by a reference, and for each tensor its content digest and where
# its object lies; its own digest is the checkpoint's. A tensor whose content did not change
# since a checkpoint still kept is not stored again: the manifest points at the object
# already there. Loading an object checks its content against the manifest's digest, so a
# manifest that verifies vouches for every tensor. numpy arrays need only numpy; torch
# tensors (any dtype safetensors knows, bfloat16 too) are handled when torch is installed.

FORMAT_2 = "xr-ckpt-2"
NUMPY, TORCH = "numpy", "torch"


def _is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def split_tensors(payload: Any) -> tuple[Any, dict[str, tuple[str, Any]]]:
    """The payload as JSON-ready data with each tensor replaced by `{"__tensor__": name}`, and
    the tensors by name: (kind, a private copy). Copying here is what lets training go on
    while the copy is written."""
    tensors: dict[str, tuple[str, Any]] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, np.ndarray) or _is_torch_tensor(value):
            if isinstance(value, np.ndarray) and value.dtype.hasobject:
                raise CheckpointError("object arrays cannot be checkpointed (they would need pickle)")
            name = f"t{len(tensors)}"
            if isinstance(value, np.ndarray):
                tensors[name] = (NUMPY, np.array(value, copy=True, order="C"))
            else:
                tensors[name] = (TORCH, value.detach().to("cpu", copy=True).contiguous())
            return {"__tensor__": name}
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise CheckpointError("checkpointed dicts need string keys")
            return {"__dict__": {k: walk(v) for k, v in value.items()}}
        if isinstance(value, tuple):
            return {"__tuple__": [walk(v) for v in value]}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise CheckpointError(
            f"cannot checkpoint a {type(value).__name__}: use arrays or tensors, numbers, strings,"
            " lists, tuples and dicts"
        )

    return walk(payload), tensors


def join_tensors(tree: Any, tensors: dict[str, Any]) -> Any:
    """The payload back from `split_tensors`' tree and the loaded tensors."""
    if isinstance(tree, list):
        return [join_tensors(v, tensors) for v in tree]
    if isinstance(tree, dict):
        if "__tensor__" in tree:
            return tensors[tree["__tensor__"]]
        if "__tuple__" in tree:
            return tuple(join_tensors(v, tensors) for v in tree["__tuple__"])
        return {k: join_tensors(v, tensors) for k, v in tree["__dict__"].items()}
    return tree


def tensor_digest(kind: str, tensor: Any) -> str:
    """The content digest of a tensor: its kind, dtype, shape and bytes."""
    if kind == TORCH:
        raw = tensor.view(-1).view(_torch_int_view(tensor)).numpy() if tensor.numel() else np.zeros(0)
        header = f"{kind}|{tensor.dtype}|{tuple(tensor.shape)}|"
    else:
        raw, header = tensor, f"{kind}|{tensor.dtype.str}|{tensor.shape}|"
    sha = hashlib.sha256(header.encode())
    sha.update(np.ascontiguousarray(raw).view(np.uint8).reshape(-1).data)
    return "sha256:" + sha.hexdigest()


def _torch_int_view(tensor: Any) -> Any:
    """An integer dtype of the tensor's element size (so any dtype, bfloat16 too, reads as bytes)."""
    import torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()]


def tensor_bytes(kind: str, tensor: Any) -> bytes:
    """The tensor alone as safetensors bytes."""
    if kind == TORCH:
        from safetensors.torch import save as save_torch

        return save_torch({"t": tensor})
    from safetensors.numpy import save as save_numpy

    return save_numpy({"t": tensor})


def load_tensor(kind: str, data: bytes) -> Any:
    """A tensor from its safetensors bytes (torch tensors need torch: CheckpointError otherwise)."""
    try:
        if kind == TORCH:
            try:
                from safetensors.torch import load as load_torch
            except ImportError as err:
                raise CheckpointError(
                    "this checkpoint holds torch tensors: install torch to restore it"
                ) from err
            return load_torch(data)["t"]
        from safetensors.numpy import load as load_numpy

        return load_numpy(data)["t"]
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - safetensors' own errors: not a tensor we wrote
        raise CheckpointError(f"not a safetensors tensor: {err}") from err


def is_format_2(plain: bytes) -> bool:
    """Whether unsealed checkpoint bytes are a format-2 manifest (else the npz format)."""
    return plain[:1] == b"{" and FORMAT_2.encode() in plain[:200]


def read_manifest(data: bytes, key: bytes | None) -> dict:
    """The manifest of stored format-2 checkpoint bytes (its step, plain values, and where its
    tensors lie); CheckpointError for anything else or anything not to be trusted."""
    plain = unseal(data, key)
    if not is_format_2(plain):
        raise CheckpointError("not a format-2 checkpoint manifest")
    try:
        manifest = json.loads(plain)
    except ValueError as err:
        raise CheckpointError(f"unreadable checkpoint manifest: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_2:
        raise CheckpointError("not a format-2 checkpoint manifest")
    return manifest
