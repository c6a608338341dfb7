"""The scheduler's signature on the log: only the holder of its private key can write a
record that readers accept.

The hash chain alone proves order and integrity, not authorship: anyone who may append
can recompute it. So the scheduler signs records with an Ed25519 key, and every reader
verifies with the public key (all an auditor needs):

- The signature covers `n`, `input_seq` and the record's chain `hash`, which covers its
  event and, through `prev`, every record before it. So a signed record vouches for the
  whole log up to itself. All of it is checked as stored: the hash over the event's bytes
  as written (`core.model.types.content_matches`), never re-encoded, so a record written before
  its event type gained a field still verifies.
- The scheduler signs the last record of each input's records (an atomic batch always
  ends on one) and every record addressed to hosts (a host agent sees only those, so
  each must carry its own signature). The records between two signatures are those of one
  input; they carry that input's `input_seq`, which the next signature covers.
- A reader (`LogVerifier`) accepts a record once a valid signature by a trusted key covers
  it: a forged record with a recomputed hash chain is refused and named, whether it has
  no signature, a bad one, or one by a key the reader does not trust.
- Rotation: `xirang key rotate` makes a new key; the public keyring keeps every public key
  (one a line), so records signed before the rotation still verify.
- Adoption: a log written before records were signed (releases before 2026-12-01 01:40)
  carries no signature. `xirang key adopt` audits it (hash chain and state digests) and
  adds to the keyring one line signed by the scheduler's key, `adopted <n> <hash> ...`:
  the key vouches for that history up to record n. A reader then holds the unsigned
  records up to n and trusts them all once record n has exactly that hash (the chain links
  every one before it), so a scheduler with a key can go on with an older release's log.

Files: the private key is PKCS#8 PEM (mode 0600); the keyring is text, one
`ed25519 <base64 public key> <key id>` a line. The key id is the first 16 hex digits of
the SHA-256 of the raw public key.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import os
from pathlib import Path

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from core import ChainError
from core import types as T

from .durable import PRIVATE_MODE, make_private_folder, sync_folder, write_durably

KEY_DIR = "keys"
PRIVATE_FILE = "scheduler.key"
PUBLIC_FILE = "scheduler.pub"
PRIVATE_ENV = "XIRANG_SIGNING_KEY"
PUBLIC_ENV = "XIRANG_PUBLIC_KEY"
RECORD_DOMAIN = b"xirang-record-v1"
ADOPT_DOMAIN = b"xirang-adopt-v1"
BLOB_DOMAIN = b"xirang-blob-v1"


class SignatureError(ChainError):
    """A record that no trusted signature vouches for: names the record (`n`) and where it
    was read (`pos`: stream sequence or line, when the reader said)."""

    def __init__(self, n: int, problem: str, pos: int = 0) -> None:
        super().__init__(n, problem)
        self.pos = pos


class KeyFileError(ValueError):
    """A key file that is missing or unreadable, with what to do about it."""


def key_id(public: Ed25519PublicKey) -> str:
    """A public key's short id: the first 16 hex digits of the SHA-256 of its raw bytes."""
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def record_message(record: T.Record) -> bytes:
    """The bytes a record's signature covers."""
    return b"\0".join(
        [RECORD_DOMAIN, str(record.n).encode(), str(record.input_seq).encode(), record.hash.encode()]
    )


# ---------------------------------------------------------------- signing (the scheduler)


class Signer:
    """The scheduler's private key."""

    def __init__(self, private: Ed25519PrivateKey) -> None:
        self.private = private
        self.key_id = key_id(private.public_key())

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Signer":
        """The signer whose private key is in the PEM file at `path` (`KeyFileError` says what
        to do when it cannot be read)."""
        try:
            data = Path(path).read_bytes()
            private = serialization.load_pem_private_key(data, password=None)
        except (OSError, ValueError, TypeError) as err:
            raise KeyFileError(
                f"cannot read the signing key {path}: {err}; make one with `xirang key create --dir DIR`"
            ) from err
        if not isinstance(private, Ed25519PrivateKey):
            raise KeyFileError(f"{path} is not an Ed25519 private key")
        return cls(private)

    def sign_record(self, record: T.Record) -> T.Record:
        """The record with this key's id and signature added."""
        sig = self.private.sign(record_message(record))
        return T.keep_stored_event(record, msgspec.structs.replace(record, key=self.key_id, sig=_b64(sig)))

    def sign_blob(self, data: bytes) -> dict:
        """A seal over `data` (key id and signature), e.g. for a snapshot."""
        digest = hashlib.sha256(data).digest()
        return {"key": self.key_id, "sig": _b64(self.private.sign(BLOB_DOMAIN + b"\0" + digest))}

    def adopt(self, n: int, head_hash: str) -> "Adopted":
        """Vouch for an unsigned history whose record n has hash `head_hash`."""
        sig = _b64(self.private.sign(adopt_message(n, head_hash)))
        return Adopted(n, head_hash, self.key_id, sig)

    def keyring(self) -> "KeyRing":
        """A key ring that trusts this signer's public key."""
        return KeyRing({self.key_id: self.private.public_key()})


def sign_records(records: list[T.Record], signer: Signer | None, hosts_of) -> list[T.Record]:
    """Sign the last record of one input's records and every record addressed to hosts
    (`hosts_of(event)` names them)."""
    if signer is None or not records:
        return records
    last = len(records) - 1
    return [signer.sign_record(r) if i == last or hosts_of(r.event) else r for i, r in enumerate(records)]


# ---------------------------------------------------------------- verifying (everyone else)


class Adopted(msgspec.Struct, frozen=True):
    """Unsigned history a trusted key vouches for: records 1..n, record n with this hash."""

    n: int
    hash: str
    key: str
    sig: str

    def message(self) -> bytes:
        """The bytes the adoption's signature covers."""
        return adopt_message(self.n, self.hash)

    def line(self) -> str:
        """The keyring line that records it."""
        return f"adopted {self.n} {self.hash} {self.key} {self.sig}"

    @classmethod
    def parse(cls, words: list[str], keys: dict[str, Ed25519PublicKey], where: str) -> "Adopted":
        """An `adopted <n> <hash> <key id> <signature>` keyring line, its signature checked."""
        if len(words) != 5 or not words[1].isdigit():
            raise KeyFileError(f"{where}: expected `adopted <record n> <hash> <key id> <signature>`")
        adopted = cls(int(words[1]), words[2], words[3], words[4])
        public = keys.get(adopted.key)
        if public is None:
            raise KeyFileError(f"{where}: adopted by key {adopted.key}, which is not in this keyring")
        try:
            public.verify(_unb64(adopted.sig), adopted.message())
        except (InvalidSignature, ValueError) as err:
            raise KeyFileError(f"{where}: the adoption's signature does not verify (altered?)") from err
        return adopted


def adopt_message(n: int, head_hash: str) -> bytes:
    """What an adoption signs: its domain, the head's record number and hash."""
    return b"\0".join([ADOPT_DOMAIN, str(n).encode(), head_hash.encode()])


class KeyRing:
    """The public keys a reader trusts, by key id, and any unsigned history they adopted."""

    def __init__(self, keys: dict[str, Ed25519PublicKey], adopted: "Adopted | None" = None) -> None:
        self.keys = keys
        self.adopted = adopted  # unsigned history a trusted key vouches for (`xirang key adopt`)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "KeyRing":
        """The trusted public keys in the file at `path`, one a line."""
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise KeyFileError(f"cannot read the public keyring {path}: {err}") from err
        keys = {}
        adopted_lines = []
        for i, line in enumerate(text.splitlines(), 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if words[0] == "adopted":
                adopted_lines.append((i, words))
                continue
            if len(words) < 2 or words[0] != "ed25519":
                raise KeyFileError(f"{path}:{i}: expected `ed25519 <base64 public key> [key id]`")
            try:
                public = Ed25519PublicKey.from_public_bytes(_unb64(words[1]))
            except ValueError as err:
                raise KeyFileError(f"{path}:{i}: not an Ed25519 public key: {err}") from err
            keys[key_id(public)] = public
        if not keys:
            raise KeyFileError(f"{path}: no public key in it")
        adopted = None
        for i, words in adopted_lines:
            adopted = Adopted.parse(words, keys, f"{path}:{i}")
        return cls(keys, adopted)

    def problem(self, record: T.Record) -> str | None:
        """Why this record's own signature is not good, or None."""
        public = self.keys.get(record.key)
        if public is None:
            return f"signed by key {record.key or '?'}, which is not a trusted scheduler key"
        try:
            public.verify(_unb64(record.sig), record_message(record))
        except (InvalidSignature, ValueError):
            return f"signature by key {record.key} does not verify (forged or altered)"
        return None

    def verify_blob(self, data: bytes, seal: dict) -> bool:
        """Whether `seal` is a valid signature over `data` by a trusted key."""
        public = self.keys.get(seal.get("key", ""))
        if public is None:
            return False
        digest = hashlib.sha256(data).digest()
        try:
            public.verify(_unb64(seal.get("sig", "")), BLOB_DOMAIN + b"\0" + digest)
        except (InvalidSignature, ValueError):
            return False
        return True


class LogVerifier:
    """Feed records in log order; raises `SignatureError` naming the first record that no
    trusted signature covers. Call `finish()` at the end of what was read."""

    def __init__(self, keyring: KeyRing) -> None:
        self.keyring = keyring
        self.unsigned: list[tuple[T.Record, int]] = []  # read, not yet covered by a signature
        self.adopting: list[tuple[T.Record, int]] = []  # read, up to the adopted history's head
        self.signatures = 0
        self.keys_seen: set[str] = set()

    def admit(self, record: T.Record, pos: int = 0) -> list[tuple[T.Record, int]]:
        """The records (with their positions) that a signature now covers, in order, to be
        trusted; [] while `record` waits for the signature that covers it."""
        adopted = self.keyring.adopted
        if adopted is not None and record.n <= adopted.n:
            return self._adopt(record, pos, adopted)
        if self.unsigned and record.input_seq != self.unsigned[0][0].input_seq:
            self._uncovered()
        if not record.sig:
            self.unsigned.append((record, pos))
            return []
        problem = self.keyring.problem(record)
        if problem:
            raise SignatureError(record.n, problem, pos)
        self.signatures += 1
        self.keys_seen.add(record.key)
        covered = [*self.unsigned, (record, pos)]
        self.unsigned = []
        return covered

    @property
    def held(self) -> list[tuple[T.Record, int]]:
        """Records read and not yet covered, in order."""
        return [*self.adopting, *self.unsigned]

    def _adopt(self, record: T.Record, pos: int, adopted: Adopted) -> list[tuple[T.Record, int]]:
        self.adopting.append((record, pos))
        if record.n < adopted.n:
            return []
        if record.hash != adopted.hash:
            raise SignatureError(
                record.n,
                "is not the head of the history the keyring adopted (`xirang key "
                "adopt`): the log up to it was altered",
                pos,
            )
        covered, self.adopting = self.adopting, []
        return covered

    def finish(self) -> None:
        """The log ended: raise `SignatureError` if records are left that no signature covers."""
        if self.adopting:
            first, pos = self.adopting[0]
            raise SignatureError(
                first.n,
                f"the log ends at record {self.adopting[-1][0].n}, before record "
                f"{self.keyring.adopted.n} that the keyring adopted: records were "
                "deleted",
                pos,
            )
        if self.unsigned:
            self._uncovered()

    def _uncovered(self) -> None:
        first, pos = self.unsigned[0]
        raise SignatureError(
            first.n,
            "not signed by the scheduler: no signature covers it (appended or altered by someone else)",
            pos,
        )


def verify_one(keyring: KeyRing, record: T.Record) -> str | None:
    """For a reader that sees single records (a host agent): the record must carry its own
    valid signature and its hash must match its event and `prev`."""
    if not record.sig:
        return "not signed by the scheduler"
    if not T.content_matches(record):  # over the event as stored, never re-encoded
        return "content does not match its hash (altered)"
    return keyring.problem(record)


# ---------------------------------------------------------------- key files


def key_dir(data_dir: str | os.PathLike) -> Path:
    """Where a data folder keeps the scheduler's signing keys."""
    return Path(data_dir) / KEY_DIR


def _public_line(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    created = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"ed25519 {_b64(raw)} {key_id(public)}  # created {created}\n"


def _write_private(path: Path, private: Ed25519PrivateKey, exclusive: bool) -> None:
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    write_durably(path, pem, mode=PRIVATE_MODE, exclusive=exclusive)


def create_key(directory: str | os.PathLike, rotate: bool = False) -> tuple[Path, Path, str]:
    """A new scheduler key in `directory`: (private key path, keyring path, key id).
    Refuses to replace an existing key unless `rotate`; a rotation appends the new public
    key to the keyring, so older records still verify."""
    directory = Path(directory)
    make_private_folder(directory)  # 0700: it holds the private key (and, for a data folder, more)
    private_path, public_path = directory / PRIVATE_FILE, directory / PUBLIC_FILE
    if private_path.exists() and not rotate:
        raise KeyFileError(f"{private_path} exists already: `xirang key rotate` replaces it")
    if rotate and not private_path.exists():
        raise KeyFileError(f"no key to rotate in {directory}: `xirang key create` makes the first")
    private = Ed25519PrivateKey.generate()
    with open(public_path, "a") as fh:  # the public key first: a reader must never lack it
        fh.write(_public_line(private.public_key()))
        fh.flush()
        os.fsync(fh.fileno())  # ... not even after a power cut that kept the new private key
    sync_folder(directory)
    try:  # a first key never replaces one another process made meanwhile (ensure_key's race)
        _write_private(private_path, private, exclusive=not rotate)
    except FileExistsError as err:
        raise KeyFileError(f"{private_path} exists already: `xirang key rotate` replaces it") from err
    return private_path, public_path, key_id(private.public_key())


def ensure_key(directory: str | os.PathLike) -> Signer:
    """The key in `directory`, made on first use (embedded and test clusters)."""
    path = Path(directory) / PRIVATE_FILE
    if not path.exists():
        try:
            create_key(directory)
        except KeyFileError:
            pass  # another process made it meanwhile
    return Signer.load(path)


def find_signer(explicit: str | None, data_dir: str | os.PathLike | None, create: bool) -> Signer:
    """The scheduler's key: --signing-key, else $XIRANG_SIGNING_KEY, else
    <data-dir>/keys/scheduler.key (made there on first use when `create`)."""
    path = explicit or os.environ.get(PRIVATE_ENV)
    if path:
        return Signer.load(path)
    directory = key_dir(data_dir or ".xirang")
    if create:
        return ensure_key(directory)
    return Signer.load(directory / PRIVATE_FILE)


def keyring_path(explicit: str | None, data_dir: str | os.PathLike | None) -> Path | None:
    """The public-key file a reader should trust: --public-key, else $XIRANG_PUBLIC_KEY, else
    the data folder's; None when there is none to look in."""
    path = explicit or os.environ.get(PUBLIC_ENV)
    if path:
        return Path(path)
    return key_dir(data_dir) / PUBLIC_FILE if data_dir is not None else None


def find_keyring(explicit: str | None, data_dir: str | os.PathLike | None) -> KeyRing | None:
    """The trusted public keys: --public-key, else $XIRANG_PUBLIC_KEY, else (given a data
    folder) <data-dir>/keys/scheduler.pub; None when none of them exists (an explicit path
    that does not exist is an error)."""
    path = keyring_path(explicit, data_dir)
    if path is None:
        return None
    if not path.exists():
        if explicit or os.environ.get(PUBLIC_ENV):
            raise KeyFileError(f"no public keyring at {path}")
        return None
    return KeyRing.load(path)
