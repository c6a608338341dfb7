"""examples/train_torch_ddp.py under unchanged `torchrun` on a live 2-host cluster: the gang
rendezvouses with xirang's variables, checkpoints with `xirang job checkpoint-saved`, is
preempted (SIGTERM, which torchrun forwards to its workers), resumes from XR_RESUME_PATH and
ends with the parameters of an uninterrupted run. Needs torch: `make test-torch`."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agents.local_cluster import REPO, Cluster, matching, sleep_command
from agents.runfolders import run_folders
from core import types as T

pytestmark = pytest.mark.timeout(600)

EXAMPLE = str(REPO / "examples" / "train_torch_ddp.py")
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
STEPS = 240


def test_a_torchrun_gang_preempted_and_resumed_ends_as_an_uninterrupted_run(tmp_path):
    final = tmp_path / "final.pt"
    script = (
        f"exec {TORCHRUN} --nnodes $NNODES --node-rank $NODE_RANK --nproc-per-node $LOCAL_WORLD_SIZE"
        f" --master-addr $MASTER_ADDR --master-port $MASTER_PORT {EXAMPLE}"
        f" --steps {STEPS} --step-ms 40 --checkpoint-every 40 --out {final}"
    )
    with Cluster(tmp_path / "c") as cluster:
        cluster.scheduler()
        cluster.agent("h1", "2xH100", grace_s=5)
        cluster.agent("h2", "2xH100", grace_s=5)
        cluster.wait_for(T.NodeJoined, count=2)
        cluster.send(
            T.Submit(
                job="tddp",
                team="research",
                user="ana",
                level=6,
                gpus=4,
                gpu_models=["H100"],
                est_runtime_s=600,
                ckpt_interval_s=2,
                ckpt_cost_s=1,
                restore_cost_s=5,
                grace_s=60,
                command=["sh", "-c", script],
            )
        )
        cluster.wait_for(T.CheckpointRecorded, job="tddp", timeout_s=180)
        cluster.send(
            T.Submit(
                job="fix",
                team="ops",
                user="kim",
                level=0,
                gpus=2,
                gpu_models=["H100"],
                est_runtime_s=5,
                command=sleep_command(2),
            )
        )
        records = cluster.wait_for(T.VictimReleased, job="tddp", timeout_s=120)
        records = cluster.wait_for(T.JobFinished, job="tddp", timeout_s=400)
        resume = matching(records, T.JobResumeRequested, job="tddp")[0]
        saved = matching(records, T.CheckpointRecorded, job="tddp")
        assert resume.event.resume_points[0].path == [r.event.path for r in saved if r.n < resume.n][-1]
        primary = resume.event.placement[0].node
        text = (
            run_folders(tmp_path / "c" / "hosts" / primary / "runs", "tddp", resume.n)[-1] / "output.log"
        ).read_text()
        assert f"resumed from {resume.event.resume_points[0].path} at step {resume.event.ckpt_step}" in text
        assert not matching(records, T.JobFailed, job="tddp")
    reference = tmp_path / "reference.pt"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("XR_")}
    subprocess.run(
        [
            TORCHRUN,
            "--nnodes",
            "1",
            "--nproc-per-node",
            "4",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            EXAMPLE,
            "--steps",
            str(STEPS),
            "--out",
            str(reference),
        ],
        env=env,
        check=True,
        timeout=300,
    )
    got, want = torch.load(final), torch.load(reference)
    assert got.keys() == want.keys()
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-6), name
