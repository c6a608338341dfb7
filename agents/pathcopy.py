"""The second copy of a checkpoint a job writes itself (`xirang job checkpoint-saved --path`):
made by its host, on another storage than the first, read back and checked against the
reported digest before it counts, and read from on a resume when the first is lost or spoilt.

Where the second copy lies (the first is the path the job wrote):

- with a second checkpoint root (`xirang agent --ckpt-root A --ckpt-root B`), in the job's
  folder of the root after the one holding the path: `<next root>/<job>/.xr-copies/<hex>/<name>`;
- otherwise on the host's own disk, in a folder of the agent's that jobs cannot write:
  `<agent state>/<node>/ckpt-paths/<job>/<hex>/<name>`, served to the job's later runs on
  other hosts by this host's agent (agents/ckptcopy.py's subject, `{"copy": <hex>, ...}`).

`<hex>` is the digest's hexadecimal part, `<name>` the checkpoint's own file or folder name.

Safety, whatever the job planted in its folders: every file and folder is opened one path
component at a time relative to an open folder, never through a link (O_NOFOLLOW), so a link
or a folder swapped for one mid-copy fails the copy rather than leading out of the job's
folder. A checkpoint that holds a link, a special file or a file with more than one name (a
hard link, possibly to another user's file) is not copied: it keeps its one copy and the
host says why. The same rules hold for what the agent serves, and a copy that would leave
its filesystem with less free space than the host's floor is refused before it begins.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

from trust.natsauth import job_token

from .ckptpath import sha256_fd

COPIES_SUBDIR = ".xr-copies"  # in a job's folder of a checkpoint root
HOST_PATHS_DIR = "ckpt-paths"  # in the agent's state folder
HEX = re.compile(r"[0-9a-f]{64}")
# A job's copies kept per folder: the scheduler's resume points (its last three checkpoints
# by default, `checkpoints_kept`) and the one being reported.
COPIES_KEPT = 4
CHUNK_BYTES = 1 << 20
# One reply's data over the bus: below its default 1 MB payload limit.
SERVE_CHUNK_BYTES = 512 * 1024
LISTING_BYTES_MAX = 768 * 1024
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Non-blocking: a FIFO planted in place of a file opens at once (and is then refused)
# rather than holding the reader until someone writes to it.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class CopyRefused(Exception):
    """A second copy that is not made (or not served): the message says why."""


def digest_hex(digest: str) -> str:
    """The hexadecimal part of a `sha256:` or `sha256-tree:` digest ('' for any other)."""
    kind, _, hexpart = digest.partition(":")
    return hexpart if kind in ("sha256", "sha256-tree") and HEX.fullmatch(hexpart) else ""


def host_job_folder(state_dir: str | os.PathLike, job: str) -> Path:
    """The job's folder of second copies on this host's own disk."""
    return Path(state_dir) / HOST_PATHS_DIR / job_token(job)


def root_copy(job_root: Path, digest: str, name: str) -> Path:
    """Where a second copy lies in a job's folder of a checkpoint root."""
    return job_root / COPIES_SUBDIR / digest_hex(digest) / name


# ------------------------------------------------------------------ walking without links


def open_under(folder: Path, rel: str) -> int:
    """A descriptor of `folder`/`rel` reached one component at a time, never through a link
    (`folder` itself is trusted: a root the agent was given, or a folder of its own).
    OSError (ELOOP, ENOTDIR, ENOENT) when a component is a link or missing."""
    parts = [p for p in Path(rel).parts if p not in ("", ".")]
    if any(p in ("..", "/") or "\0" in p for p in parts):
        raise CopyRefused(f"{rel!r} is not a path inside the folder")
    fd = os.open(folder, _DIR)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except NotADirectoryError:
                if i != len(parts) - 1:
                    raise
                _plain(os.stat(part, dir_fd=fd, follow_symlinks=False), rel)  # opens no device
                nxt = os.open(part, _FILE, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _plain(info: os.stat_result, what: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise CopyRefused(f"{what} is a link")
    if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
        raise CopyRefused(f"{what} is not a plain file or folder")
    if stat.S_ISREG(info.st_mode) and info.st_nlink != 1:
        raise CopyRefused(f"{what} has more than one name (a hard link)")


def scan(fd: int, rel: str = "") -> list[tuple[str, int]]:
    """The plain files under an open folder (`rel` path, size), in the order the digest's
    manifest lists them (agents/ckptpath.py); CopyRefused at a link or special file."""
    files, dirs = [], []
    for name in sorted(os.listdir(fd)):
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        path = f"{rel}/{name}" if rel else name
        _plain(info, path)
        (dirs if stat.S_ISDIR(info.st_mode) else files).append((name, path, info.st_size))
    found = [(path, size) for _, path, size in files]
    for name, path, _ in dirs:
        sub = os.open(name, _DIR, dir_fd=fd)
        try:
            found += scan(sub, path)
        finally:
            os.close(sub)
    return found


def digest_at(folder: Path, rel: str) -> str:
    """The digest (as agents/ckptpath.py computes it) of the file or folder `folder`/`rel`,
    read without following any link; CopyRefused or OSError when it cannot be."""
    fd = open_under(folder, rel)
    try:
        info = os.fstat(fd)
        _plain(info, rel)
        if stat.S_ISREG(info.st_mode):
            return "sha256:" + sha256_fd(fd)[0]
        manifest = hashlib.sha256()
        for path, _ in scan(fd):
            sub = open_under_fd(fd, path)
            try:
                _plain(os.fstat(sub), path)
                hexdigest, size = sha256_fd(sub)
            finally:
                os.close(sub)
            manifest.update(f"F {path} {size} {hexdigest}\n".encode())
        return "sha256-tree:" + manifest.hexdigest()
    finally:
        os.close(fd)


def open_under_fd(fd: int, rel: str) -> int:
    """As `open_under`, from an open folder."""
    parts = rel.split("/")
    cur = os.dup(fd)
    try:
        for i, part in enumerate(parts):
            if part in ("", ".", "..") or "\0" in part:
                raise CopyRefused(f"{rel!r} is not a path inside the folder")
            if i == len(parts) - 1:
                _plain(os.stat(part, dir_fd=cur, follow_symlinks=False), rel)  # opens no device
            nxt = os.open(part, _FILE if i == len(parts) - 1 else _DIR, dir_fd=cur)
            os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        os.close(cur)
        raise


# ------------------------------------------------------------------ making a copy


def _make_dirs(top: Path, rel: str, owner: tuple[int, int] | None) -> int:
    """A descriptor of `top`/`rel`, each missing folder made (never through a link)."""
    fd = os.open(top, _DIR)
    try:
        return _make_dirs_fd(fd, rel, owner)
    finally:
        os.close(fd)


def _create(dest_dir: int, name: str) -> int:
    """A new file `name` in `dest_dir` (never an existing one, never through a link)."""
    return os.open(
        name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dest_dir
    )


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _seal(fd: int, owner: tuple[int, int] | None) -> None:
    """On disk for good, and handed to `owner`."""
    os.fsync(fd)
    if owner is not None:
        os.fchown(fd, *owner)


def _write_file(dest_dir: int, name: str, chunks, owner: tuple[int, int] | None) -> None:
    fd = _create(dest_dir, name)
    try:
        for chunk in chunks:
            _write_all(fd, chunk)
        _seal(fd, owner)
    finally:
        os.close(fd)


def _read_chunks(fd: int):
    while block := os.read(fd, CHUNK_BYTES):
        yield block


def source_of(job_roots: list[Path], path: str) -> tuple[Path, str]:
    """(the job's folder holding `path`, `path` relative to it, links resolved): CopyRefused
    when it lies in none (agents/ckptpath.py refused such a report already)."""
    real = Path(os.path.realpath(path))
    if real in job_roots:
        raise CopyRefused(
            "the job's whole checkpoint folder is not copied (it holds the copies): report a file or folder in it"
        )
    for root in job_roots:
        if root in real.parents:
            return root, real.relative_to(root).as_posix()
    raise CopyRefused(f"{path} lies outside the job's checkpoint folders")


def copy_verified(
    src_folder: Path,
    src_rel: str,
    dest_top: Path,
    dest_rel: str,
    digest: str,
    floor_bytes: int,
    owner: tuple[int, int] | None = None,
) -> int:
    """Copy the file or folder `src_folder`/`src_rel` to `dest_top`/`dest_rel` (a temporary
    name, every file fsynced, then renamed into place), read the copy back and check it
    against `digest`; returns the bytes copied. CopyRefused (with why) when it is not made;
    a copy already there that matches is kept as it is."""
    if not digest_hex(digest):
        raise CopyRefused(f"{digest!r} is not a digest a copy can be checked against")
    dest_parent, _, name = dest_rel.rpartition("/")
    try:
        if digest_at(dest_top, dest_rel) == digest:
            return 0
    except (OSError, CopyRefused):
        pass
    try:
        src = open_under(src_folder, src_rel)
    except OSError as err:
        raise CopyRefused(f"cannot open it without following a link ({err.strerror})") from err
    try:
        info = os.fstat(src)
        _plain(info, src_rel)
        is_file = stat.S_ISREG(info.st_mode)
        if is_file != digest.startswith("sha256:"):
            raise CopyRefused("it is no longer what was reported (a file for a folder, or back)")
        listing = [("", info.st_size)] if is_file else scan(src)
        total = sum(size for _, size in listing)
        Path(dest_top).mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(dest_top).free
        if free - total < floor_bytes:
            raise CopyRefused(
                f"a copy of {total // 2**20} MiB would leave {max(0, free - total) // 2**20} MiB free under"
                f" {dest_top}, below the host's floor of {floor_bytes // 2**20} MiB"
            )
        parent = _make_dirs(dest_top, dest_parent, owner)
        temp = f".{name}.partial-{os.getpid()}"
        try:
            shutil.rmtree(temp, ignore_errors=True, dir_fd=parent)
            if is_file:
                _write_file(parent, temp, _read_chunks(src), owner)
            else:
                _copy_tree(src, parent, temp, listing, owner)
            _put_in_place(parent, temp, name, lambda: _matches(dest_top, dest_rel, digest))
            os.fsync(parent)
        finally:
            shutil.rmtree(temp, ignore_errors=True, dir_fd=parent)
            os.close(parent)
    except OSError as err:
        raise CopyRefused(f"cannot write the copy under {dest_top} ({err})") from err
    finally:
        os.close(src)
    back = digest_at(dest_top, dest_rel)
    if back != digest:
        raise CopyRefused(f"the copy reads back as {back}, not {digest} (the job changed it meanwhile?)")
    return total


def _matches(top: Path, rel: str, digest: str) -> bool:
    try:
        return digest_at(top, rel) == digest
    except (OSError, CopyRefused):
        return False


def _put_in_place(parent: int, temp: str, name: str, already_good) -> None:
    """Rename the finished copy `temp` to `name` in the open folder `parent`. Where `name`
    is taken, a copy there that is whole and good (another host's part of the same run
    fetched it at the same time, into a shared root) is kept and ours dropped; anything
    else there (a spoilt copy, a link the job planted) is removed first, never followed."""
    try:
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
        return
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.EISDIR, errno.ENOTDIR):
            raise
    if already_good():
        return
    try:
        shutil.rmtree(name, dir_fd=parent)
    except NotADirectoryError:
        os.unlink(name, dir_fd=parent)
    except OSError:
        os.unlink(name, dir_fd=parent)  # a link: rmtree refuses it; unlinking removes only it
    os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)


def _copy_tree(src: int, parent: int, temp: str, listing: list[tuple[str, int]], owner) -> None:
    os.mkdir(temp, 0o755, dir_fd=parent)
    top = os.open(temp, _DIR, dir_fd=parent)
    try:
        if owner is not None:
            os.fchown(top, *owner)
        for rel, _ in listing:
            folder, _, base = rel.rpartition("/")
            dest = _make_dirs_fd(top, folder, owner)
            try:
                sfd = open_under_fd(src, rel)
                try:
                    _plain(os.fstat(sfd), rel)
                    _write_file(dest, base, _read_chunks(sfd), owner)
                finally:
                    os.close(sfd)
            finally:
                os.close(dest)
        for _dirpath, _, _, dfd in os.fwalk(dir_fd=top):
            os.fsync(dfd)
    finally:
        os.close(top)


def _make_dirs_fd(top: int, rel: str, owner) -> int:
    """As `_make_dirs`, from an open folder (left open)."""
    fd = os.dup(top)
    try:
        for part in [p for p in rel.split("/") if p]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(part, *owner, dir_fd=fd, follow_symlinks=False)
            except FileExistsError:
                pass
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def copy_entry(top: Path, digest: str) -> str:
    """The one entry (the copy's own name) in a copy's folder `top`/<hex> ('' : none)."""
    try:
        fd = open_under(top, digest_hex(digest))
    except (OSError, CopyRefused):
        return ""
    try:
        names = [n for n in os.listdir(fd) if not n.startswith(".")]
    finally:
        os.close(fd)
    return names[0] if len(names) == 1 else ""


def keep_newest(folder: Path, newest_hex: str, kept: int = COPIES_KEPT) -> list[str]:
    """Remove all but the `kept` newest copies in a job's folder of copies (`newest_hex`, just
    made, marked newest): the scheduler resumes only from a job's last few checkpoints, and
    a job must not fill its host's disk with copies of old ones. Returns those removed."""
    try:
        fd = os.open(folder, _DIR)
    except OSError:
        return []
    try:
        os.utime(newest_hex, dir_fd=fd, follow_symlinks=False)
        aged = []
        for name in os.listdir(fd):
            if HEX.fullmatch(name):
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                aged.append((name == newest_hex, info.st_mtime_ns, name))
        gone = [name for _, _, name in sorted(aged, reverse=True)[kept:]]
        for name in gone:
            try:
                shutil.rmtree(name, dir_fd=fd)
            except OSError:
                os.unlink(name, dir_fd=fd)  # a link planted in its place: removed, not followed
        return gone
    except OSError:
        return []
    finally:
        os.close(fd)


# ------------------------------------------------------------------ serving and fetching


def reply_for(paths_root: str | os.PathLike, job_tok: str, asked: dict) -> bytes:
    """The agent's answer to a request for a job's second copy of a checkpoint it wrote:
    `{"copy": <hex>, "list": true}` -> `{"name", "files": [[path, size], ...]}` (path '' :
    the copy is one file); `{"copy": <hex>, "file": <path>, "offset": N}` -> `{"size"}`
    and at most SERVE_CHUNK_BYTES of that file from N."""
    hexpart = str(asked.get("copy", ""))
    if not HEX.fullmatch(hexpart):
        return _error("a copy is named by its digest's 64 hexadecimal digits")
    top = Path(paths_root) / job_tok
    try:
        name = copy_entry(top, "sha256:" + hexpart)
        if not name:
            return _error("missing")
        rel = f"{hexpart}/{name}"
        if asked.get("list"):
            fd = open_under(top, rel)
            try:
                info = os.fstat(fd)
                _plain(info, name)
                files = [["", info.st_size]] if stat.S_ISREG(info.st_mode) else [list(e) for e in scan(fd)]
            finally:
                os.close(fd)
            body = json.dumps({"name": name, "files": files}).encode()
            if len(body) > LISTING_BYTES_MAX:
                return _error("the copy holds too many files to list in one reply")
            return body + b"\n"
        inner = str(asked.get("file", ""))
        offset = max(0, int(asked.get("offset", 0)))
        fd = open_under(top, f"{rel}/{inner}" if inner else rel)
        try:
            info = os.fstat(fd)
            _plain(info, inner or name)
            if not stat.S_ISREG(info.st_mode):
                return _error("not a file")
            os.lseek(fd, offset, os.SEEK_SET)
            data = os.read(fd, SERVE_CHUNK_BYTES)
        finally:
            os.close(fd)
        return json.dumps({"size": info.st_size}).encode() + b"\n" + data
    except (CopyRefused, OSError, ValueError, TypeError) as err:
        if isinstance(err, OSError) and err.errno in (errno.ELOOP, errno.ENOTDIR):
            return _error("what was asked for is a link, or lies behind one: not served")
        return _error(str(err) if isinstance(err, CopyRefused) else f"unreadable ({type(err).__name__})")


def _error(why: str) -> bytes:
    return json.dumps({"error": why}).encode() + b"\n"


async def fetch(nc, subject: str, digest: str, dest_top: Path, owner=None, timeout_s: float = 10.0) -> str:
    """Fetch the second copy named by `digest` from the agent answering on `subject` into
    `dest_top`/.xr-copies/<hex>/<its name> (a temporary name first) and check it; returns
    its path relative to `dest_top`. CopyRefused (with why) when it cannot be had."""
    import asyncio

    hexpart = digest_hex(digest)

    async def ask(body: dict) -> tuple[dict, bytes]:
        try:
            reply = await nc.request(
                subject, json.dumps({"copy": hexpart, **body}).encode(), timeout=timeout_s
            )
        except Exception as err:  # noqa: BLE001 - no agent there (restarting, its node lost), a timeout
            raise CopyRefused(f"no agent answers ({type(err).__name__})") from err
        head, _, data = bytes(reply.data).partition(b"\n")
        try:
            header = json.loads(head)
        except ValueError as err:
            raise CopyRefused("an unreadable answer") from err
        if "error" in header:
            raise CopyRefused(str(header["error"]))
        return header, data

    listing, _ = await ask({"list": True})
    name = str(listing.get("name", ""))
    files = listing.get("files", [])
    if not name or name.startswith(".") or "/" in name or not isinstance(files, list):
        raise CopyRefused("an unreadable listing")
    is_file = len(files) == 1 and isinstance(files[0], list) and files[0][:1] == [""]
    for entry in files:
        rel = str(entry[0]) if isinstance(entry, list) and entry else "/"
        if not is_file and any(part in ("", ".", "..") or "\0" in part for part in rel.split("/")):
            raise CopyRefused(f"it lists {rel!r}, not a path inside the copy")
    temp = f".{name}.fetching-{os.getpid()}"
    try:
        parent = await asyncio.to_thread(_make_dirs, dest_top, f"{COPIES_SUBDIR}/{hexpart}", owner)
    except OSError as err:
        raise CopyRefused(f"cannot make its folder under {dest_top} ({err})") from err
    try:
        await asyncio.to_thread(shutil.rmtree, temp, True, None, dir_fd=parent)
        if not is_file:
            os.mkdir(temp, 0o755, dir_fd=parent)
        for entry in files:
            rel = str(entry[0])
            folder, _, base = f"{temp}/{rel}".rstrip("/").rpartition("/") if rel else ("", "", temp)
            dest = await asyncio.to_thread(_make_dirs_fd, parent, folder, owner)
            try:
                # Written as it comes, never held whole: a framework's shard may be gigabytes.
                fd = await asyncio.to_thread(_create, dest, base)
                try:
                    got, size = 0, None
                    while size is None or got < size:
                        header, data = await ask({"file": rel, "offset": got})
                        size = int(header["size"])
                        if not data and got < size:
                            raise CopyRefused(f"{rel or name} shrank while read")
                        await asyncio.to_thread(_write_all, fd, data)
                        got += len(data)
                    await asyncio.to_thread(_seal, fd, owner)
                finally:
                    os.close(fd)
            finally:
                os.close(dest)
        rel = f"{COPIES_SUBDIR}/{hexpart}/{name}"
        await asyncio.to_thread(_put_in_place, parent, temp, name, lambda: _matches(dest_top, rel, digest))
    except OSError as err:
        raise CopyRefused(f"cannot write it under {dest_top} ({err})") from err
    finally:
        await asyncio.to_thread(shutil.rmtree, temp, True, None, dir_fd=parent)
        os.close(parent)
    rel = f"{COPIES_SUBDIR}/{hexpart}/{name}"
    back = await asyncio.to_thread(digest_at, dest_top, rel)
    if back != digest:
        raise CopyRefused(f"what it served reads back as {back}, not {digest}")
    return rel
