"""Checkpoints a job writes itself: a digest names a file's or a folder's whole content, and
a job's own outbox delivers only checkpoints that lie in the job's own checkpoint folders."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from agents import ckptpath
from agents.outbox import job_fact_problem
from core import types as T


def test_a_folders_digest_changes_when_a_file_changes_is_renamed_added_or_removed(tmp_path):
    shard = tmp_path / "ckpt"
    (shard / "sub").mkdir(parents=True)
    (shard / "a.bin").write_bytes(b"a" * 10)
    (shard / "sub" / "b.bin").write_bytes(b"b" * 5)
    digest, size = ckptpath.digest_path(shard)
    assert digest.startswith("sha256-tree:") and size == 15
    assert ckptpath.digest_path(shard) == (digest, size)
    seen = {digest}
    (shard / "sub" / "b.bin").write_bytes(b"c" * 5)
    seen.add(ckptpath.digest_path(shard)[0])
    (shard / "sub" / "b.bin").rename(shard / "sub" / "c.bin")
    seen.add(ckptpath.digest_path(shard)[0])
    (shard / "d.bin").write_bytes(b"")
    seen.add(ckptpath.digest_path(shard)[0])
    (shard / "a.bin").unlink()
    seen.add(ckptpath.digest_path(shard)[0])
    assert len(seen) == 5
    assert ckptpath.digest_path(shard / "d.bin")[0].startswith("sha256:")


def test_a_fifo_a_job_plants_in_its_checkpoint_is_refused_without_waiting_for_a_writer(tmp_path):
    # A hostile job's checkpoint folder holds a FIFO no one writes to: reading it would hold
    # its host's agent (checking the checkpoint at a resume) forever.
    shard = tmp_path / "ckpt"
    shard.mkdir()
    (shard / "a.bin").write_bytes(b"a" * 10)
    os.mkfifo(shard / "b.pipe")
    outcome: list = []

    def digest() -> None:
        try:
            outcome.append(ckptpath.digest_path(shard))
        except OSError as err:
            outcome.append(err)

    reader = threading.Thread(target=digest, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "digest_path is blocked on the FIFO"
    assert isinstance(outcome[0], OSError) and "not a regular file" in str(outcome[0])
    with pytest.raises(OSError, match="not a regular file"):
        ckptpath._file_sha256(Path("/dev/null"))


def test_a_job_outbox_drops_a_checkpoint_outside_its_own_folders(tmp_path):
    roots = ckptpath.job_roots([tmp_path], "j")
    roots[0].mkdir()
    (roots[0] / "ok").write_text("x")
    fact = T.CheckpointSaved(job="j", step=1, digest="sha256:x", bytes=1, path=str(roots[0] / "ok"))
    assert job_fact_problem(fact, "j", lambda job: ckptpath.job_roots([tmp_path], job)) == ""
    other = ckptpath.job_roots([tmp_path], "k")[0]
    other.mkdir()
    stolen = T.CheckpointSaved(job="j", step=1, digest="sha256:x", bytes=1, path=str(other / "ok"))
    assert "outside" in job_fact_problem(stolen, "j", lambda job: ckptpath.job_roots([tmp_path], job))
    escape = T.CheckpointSaved(job="j", step=1, digest="sha256:x", bytes=1, path=str(roots[0] / ".." / "k"))
    assert "outside" in job_fact_problem(escape, "j", lambda job: ckptpath.job_roots([tmp_path], job))
    sdk = T.CheckpointSaved(job="j", step=1, digest="sha256:x", bytes=1, path="xr-ckpt:h1/3s0")
    assert job_fact_problem(sdk, "j", lambda job: ckptpath.job_roots([tmp_path], job)) == ""
    assert Path(roots[0]).name == "j"
