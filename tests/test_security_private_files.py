"""Keys and credentials (the scheduler's signing key, NKEY seeds, creds files, TLS keys) are
owner-only (0600) from the first moment any file holding them exists, the temporary file
included, even under an umask of 0; a replace leaves the new content whole and no temporary
file, and a replace the file system refuses leaves the old content and no temporary file."""

from __future__ import annotations

import json
import os
import stat
import threading

import pytest

from projections.notices import ReadMarks
from trust import natsjwt, pki, signing
from trust.durable import TMP_SUFFIX, write_durably
from xirang.cli import UserError
from xirang.cmd_live import checkpoint_secret
from trust.natsauth import Authority

SECRET_MARKS = ("scheduler.key", ".nk", ".creds", "-key.pem", "checkpoint.secret")


def leftovers(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(f"*{TMP_SUFFIX}"))


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def created_modes(monkeypatch):
    """Every file created through os.open while the test runs, with its mode at creation
    (before a byte is written), under an umask of 0: nothing narrows what the code asks for."""
    created: list[tuple[str, int]] = []
    real_open = os.open

    def spying_open(path, flags, mode=0o777, *args, **kwargs):
        fd = real_open(path, flags, mode, *args, **kwargs)
        if flags & os.O_CREAT:
            created.append((os.fspath(path), stat.S_IMODE(os.fstat(fd).st_mode)))
        return fd

    monkeypatch.setattr(os, "open", spying_open)
    old_umask = os.umask(0)
    try:
        yield created
    finally:
        os.umask(old_umask)


def secrets_among(created):
    return [(path, mode) for path, mode in created if any(m in os.path.basename(path) for m in SECRET_MARKS)]


def test_every_key_and_credential_file_is_owner_only_from_its_first_moment(tmp_path, created_modes):
    # given an umask of 0, when each kind of secret is made and then replaced
    signing.create_key(tmp_path / "sign")
    signing.create_key(tmp_path / "sign", rotate=True)
    authority = Authority(tmp_path / "nats")
    authority.init()
    _, creds = authority.add_user("host", ["n1"])
    natsjwt.write_private(tmp_path / "job.creds", "old\n")
    natsjwt.write_private(tmp_path / "job.creds", "new\n")
    pki.init(tmp_path / "tls", {"s1": ["127.0.0.1"]})
    pki.issue(tmp_path / "tls", "s1", ["127.0.0.1"])  # re-issued: replaces the key
    # then every file that ever held a secret, temporary ones included, was created 0600
    seen = secrets_among(created_modes)
    assert {os.path.basename(p).lstrip(".").split(".")[0] for p, _ in seen} >= {
        "scheduler",
        "operator",
        "account",
        "job",
        "ca-key",
        "s1-key",
    }
    assert any(p.endswith(TMP_SUFFIX) for p, _ in seen)
    assert [(p, oct(m)) for p, m in seen if m != 0o600] == []
    # and the files in place are 0600 with their newest content, no temporary file left
    finals = [
        tmp_path / "sign" / signing.PRIVATE_FILE,
        creds,
        tmp_path / "job.creds",
        tmp_path / "tls" / pki.CA_KEY,
        tmp_path / "tls" / "s1-key.pem",
        *(tmp_path / "nats").rglob("*.nk"),
    ]
    assert {str(f): oct(mode_of(f)) for f in finals} == {str(f): "0o600" for f in finals}
    assert (tmp_path / "job.creds").read_text() == "new\n"
    assert leftovers(tmp_path) == []


def test_a_rotated_signing_key_is_in_the_keyring_and_signs_with_the_new_id(tmp_path):
    _, _, first = signing.create_key(tmp_path)
    _, public, second = signing.create_key(tmp_path, rotate=True)
    ring = public.read_text()
    assert first != second and first in ring and second in ring
    assert signing.ensure_key(tmp_path).key_id == second
    assert leftovers(tmp_path) == []


def test_an_old_world_readable_key_file_is_replaced_by_an_owner_only_one(tmp_path):
    # given a creds file an older version left readable by all
    path = tmp_path / "host.creds"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    # when it is written again, then it is a new file, owner-only
    natsjwt.write_private(path, "new\n")
    assert mode_of(path) == 0o600 and path.read_text() == "new\n"


def test_a_secret_replace_the_file_system_refuses_keeps_the_old_content_and_no_temporary_file(tmp_path):
    taken = tmp_path / "host.creds"
    taken.mkdir()
    (taken / "keep").write_text("x")  # a non-empty folder cannot be renamed over
    with pytest.raises(OSError):
        natsjwt.write_private(taken, "secret\n")
    assert (taken / "keep").read_text() == "x"
    assert leftovers(tmp_path) == []


def test_read_marks_are_replaced_whole_and_leave_no_temporary_file(tmp_path):
    marks = ReadMarks(str(tmp_path / ".xirang" / "notices-read.json"))
    marks.set("ana", 5)
    marks.set("bo", 7)
    marks.set("ana", 3)  # never moves back
    assert json.loads((tmp_path / ".xirang" / "notices-read.json").read_text()) == {"ana": 5, "bo": 7}
    assert marks.get("ana") == 5 and leftovers(tmp_path) == []


def test_the_checkpoint_secret_is_made_once_owner_only_and_never_replaced(tmp_path, created_modes):
    first = checkpoint_secret(None, str(tmp_path))
    assert checkpoint_secret(None, str(tmp_path)) == first and len(first) == 32
    path = tmp_path / "keys" / "checkpoint.secret"
    with pytest.raises(FileExistsError):  # made only where there is none
        write_durably(path, b"00\n", 0o600, exclusive=True)
    assert bytes.fromhex(path.read_text()) == first and mode_of(path) == 0o600
    seen = secrets_among(created_modes)
    assert seen and [(p, oct(m)) for p, m in seen if m != 0o600] == []
    assert leftovers(tmp_path) == []


def test_agents_making_the_checkpoint_secret_at_once_all_get_the_same_one(tmp_path):
    start, got = threading.Barrier(8), []

    def make():
        start.wait()
        got.append(checkpoint_secret(None, str(tmp_path)))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(got) == 8 and len(set(got)) == 1
    assert bytes.fromhex((tmp_path / "keys" / "checkpoint.secret").read_text()) == got[0]
    assert leftovers(tmp_path) == []


def test_an_empty_checkpoint_secret_is_refused_with_what_to_do(tmp_path):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "checkpoint.secret").write_text("")
    with pytest.raises(UserError, match="is empty: remove it"):
        checkpoint_secret(None, str(tmp_path))


def test_schedulers_making_the_first_signing_key_at_once_all_load_the_same_one(tmp_path):
    start, got = threading.Barrier(8), []

    def make():
        start.wait()
        got.append(signing.ensure_key(tmp_path).key_id)

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(got) == 8 and len(set(got)) == 1
    assert got[0] in (tmp_path / signing.PUBLIC_FILE).read_text()
    assert leftovers(tmp_path) == []


def test_processes_making_an_nkey_seed_at_once_all_read_the_same_one(tmp_path):
    start, got = threading.Barrier(8), []

    def make():
        start.wait()
        got.append(Authority(tmp_path).seed("operator", "operator"))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(got) == 8 and len(set(got)) == 1
    assert leftovers(tmp_path) == []


@pytest.fixture
def created_folders(monkeypatch):
    """Every folder made through os.mkdir while the test runs, with its mode at creation, under
    an umask of 0."""
    made: list[tuple[str, int]] = []
    real_mkdir = os.mkdir

    def spying_mkdir(path, mode=0o777, *args, **kwargs):
        real_mkdir(path, mode, *args, **kwargs)
        made.append((os.fspath(path), mode_of(path)))

    monkeypatch.setattr(os, "mkdir", spying_mkdir)
    old_umask = os.umask(0)
    try:
        yield made
    finally:
        os.umask(old_umask)


def test_the_keys_and_creds_folders_are_owner_only_from_their_first_moment(tmp_path, created_folders):
    authority = Authority(tmp_path / "nats")
    authority.init()
    authority.add_user("host", ["n1"])
    modes = {os.path.basename(path): oct(mode) for path, mode in created_folders}
    assert modes["keys"] == "0o700" and modes["creds"] == "0o700"
    assert oct(mode_of(tmp_path / "nats" / "keys")) == "0o700"


def test_a_creds_folder_an_older_version_left_open_is_narrowed_to_its_owner(tmp_path):
    authority = Authority(tmp_path / "nats")
    authority.init()
    (tmp_path / "nats" / "creds").mkdir(mode=0o755)
    os.chmod(tmp_path / "nats" / "creds", 0o755)
    authority.add_user("op", ["alice"])
    assert oct(mode_of(tmp_path / "nats" / "creds")) == "0o700"


def test_a_symlink_planted_where_the_keys_folder_goes_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "nats").mkdir()
    (tmp_path / "nats" / "keys").symlink_to(elsewhere)
    with pytest.raises(NotADirectoryError, match="move it away"):
        Authority(tmp_path / "nats").init()
    assert list(elsewhere.iterdir()) == []
