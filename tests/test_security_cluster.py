"""The README's "On a real NATS cluster" steps, on loopback: `xirang tls init`, `xirang nats
add-user`, three servers from deploy/nats/cluster-N.conf (TLS for clients and routes), the
scheduler with its key and three replicas, a host, a client's job run to its end, and the
log verifying. A rogue server with a certificate from another CA cannot join the cluster."""

from __future__ import annotations

import subprocess
import time

import pytest

from agents.local_cluster import REPO, matching
from core import types as T
from tests.data_helpers import xirang
from tests.secure_nats import SecureNats, run_cli, running_cluster, spawn
from tests.test_live_deploy import _wait, wait_for_streams
from transport.natsd import free_port, nats_server_binary

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    with running_cluster(tmp_path, monkeypatch, nodes=3) as started:
        yield started


def _rogue(tmp_path, nats: SecureNats) -> tuple[subprocess.Popen, str]:
    """A server with its own CA's certificate that dials the cluster's route port."""
    assert (
        xirang(
            "tls", "init", "--dir", str(tmp_path / "rogue-tls"), "--server", "xirang-1=localhost"
        ).returncode
        == 0
    )
    tls = tmp_path / "rogue-tls"
    conf = tmp_path / "rogue.conf"
    conf.write_text(f"""server_name: rogue
listen: 127.0.0.1:{free_port()}
jetstream {{ store_dir: "{tmp_path / "rogue-js"}" }}
cluster {{
  name: xirang
  listen: 127.0.0.1:{free_port()}
  tls {{ cert_file: "{tls / "xirang-1.pem"}", key_file: "{tls / "xirang-1-key.pem"}", ca_file: "{tls / "ca.pem"}",
         verify: true, timeout: 2 }}
  routes: [ nats-route://localhost:{nats.route_ports[0]} ]
}}
""")
    log = tmp_path / "rogue.log"
    proc = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf), "-l", str(log)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, str(log)


def test_the_readme_cluster_steps_work_with_tls_and_a_rogue_server_cannot_join(cluster, tmp_path):
    nats, procs = cluster
    keys = tmp_path / "keys"
    assert xirang("key", "create", "--dir", str(keys)).returncode == 0
    for instance in ("s1", "s2"):  # leader and hot standby
        procs.append(
            spawn(
                tmp_path,
                nats.env("scheduler"),
                "scheduler",
                "--nats",
                nats.url,
                "--id",
                instance,
                "--signing-key",
                str(keys / "scheduler.key"),
                "--data-dir",
                str(tmp_path / instance),
                "--tick-ms",
                "200",
            )
        )
    wait_for_streams(nats)
    procs.append(
        spawn(
            tmp_path,
            nats.env("host-h1"),
            "agent",
            "--nats",
            nats.url,
            "--node",
            "h1",
            "--simulate",
            "2xH100",
            "--data-dir",
            str(tmp_path / "host"),
            "--public-key",
            str(keys / "scheduler.pub"),
        )
    )
    _wait(nats, lambda rs: matching(rs, T.NodeJoined, node="h1"), 30, "h1 joined")
    code, answer = run_cli(
        nats.env("client-vision-li"),
        "submit",
        "j1",
        "--team",
        "vision",
        "--user",
        "li",
        "--level",
        "4",
        "--gpus",
        "1",
        "--command",
        "sleep 0.5",
        "--nats",
        nats.url,
        "--json",
    )
    assert code == 0 and answer["outcome"] == "accepted", answer
    _wait(nats, lambda rs: matching(rs, T.JobFinished, job="j1"), 30, "j1 finished")

    rogue, rogue_log = _rogue(tmp_path, nats)
    procs.append(rogue)
    time.sleep(3)
    assert "Route connection created" not in open(rogue_log).read()
    assert "TLS route handshake error" in nats.log_text() or "certificate" in nats.log_text().lower()

    code, summary = run_cli(
        nats.env("op-alice"),
        "audit",
        "--nats",
        nats.url,
        "--public-key",
        str(keys / "scheduler.pub"),
        "--json",
    )
    assert code == 0 and summary["ok"] and "verified" in summary["signatures"], summary
