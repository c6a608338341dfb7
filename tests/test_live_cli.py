"""The live CLI's edges: GPU discovery that degrades to a clear message, inventory
parsing, and the bus benchmark's small run (its numbers are reported, not asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agents.gpus import NoGpus, discover, parse_simulate
from agents.jobuser import JOB_UID_RANGE_ENV, JOB_USER_ENV
from agents.local_cluster import REPO

pytestmark = pytest.mark.timeout(120)


def xirang(*args: str, timeout: float = 100, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xirang.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )


def test_agent_without_an_nvidia_driver_says_to_simulate():
    try:
        inventory = discover()
    except NoGpus:
        done = xirang("agent", "--node", "n1", "--nats", "nats://127.0.0.1:9")
        assert done.returncode == 2
        assert "pass --simulate 8xH100" in done.stderr and "Traceback" not in done.stderr
    else:  # on a GPU machine discovery must find model, memory and UUIDs
        assert inventory.gpus and all(g.uuid and g.memory_mib > 0 for g in inventory.gpus)


def test_simulated_inventory_is_parsed_or_refused_with_the_format():
    inventory = parse_simulate("8xH100")
    assert inventory.model == "H100" and len(inventory.gpus) == 8 and inventory.simulated
    with pytest.raises(ValueError, match="COUNTxMODEL"):
        parse_simulate("8H100")
    done = xirang("agent", "--node", "n1", "--simulate", "0xA100")
    assert done.returncode == 2 and "COUNTxMODEL" in done.stderr


def test_bus_bench_quick_run_reports_both_rates_and_the_preemption_latency():
    # As a user would run it: no job user chosen (the test suite's own choice removed), so
    # as root - in a container - its hosts must pick the job user the way `xirang up` does.
    env = {k: v for k, v in os.environ.items() if k not in (JOB_USER_ENV, JOB_UID_RANGE_ENV)}
    done = xirang("bench", "bus", "--quick", "--json", env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["end_to_end"]["median_per_s"] > 0 and result["raw_pipelined_publish"]["median_per_s"] > 0
    assert result["end_to_end_vs_raw"] == pytest.approx(
        result["end_to_end"]["median_per_s"] / result["raw_pipelined_publish"]["median_per_s"], rel=0.01
    )
    latency = result["preemption_latency"]
    assert len(latency["submit_to_start_ms"]) == latency["rounds"] == 1
    assert 0 <= latency["median_less_checkpoint_ms"] <= latency["median_ms"]


def test_a_failed_local_cluster_keeps_the_folder_its_message_names(tmp_path, capsys):
    from agents.local_cluster import scratch_folder

    with pytest.raises(AssertionError, match="logs in"):
        with scratch_folder("xirang-test-") as root:
            kept = root
            raise AssertionError(f"host not up; logs in {root / 'logs'}")
    assert kept.is_dir() and str(kept) in capsys.readouterr().err
    with scratch_folder("xirang-test-") as root:
        removed = root
    assert not removed.exists()
    import shutil

    shutil.rmtree(kept)
