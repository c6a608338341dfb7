"""The benchmarks of decisions at cluster scale on small pools, from the command line:
`xirang bench core --gpus` (the core stepped in process) and `xirang bench scale` (the
scheduler process fed through a real nats-server). Their numbers are reported, not
asserted; what they measured is checked (the pool they built, a preemption planned for
every urgent sample, the ratios they state)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
XIRANG = [sys.executable, "-m", "xirang.cli"]


def _run(*args, timeout=240):
    return subprocess.run(XIRANG + list(args), capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def test_bench_core_by_cluster_size_measures_each_pool_and_the_ratio_of_the_largest_to_the_smallest():
    proc = _run("bench", "core", "--gpus", "160,80", "--pending", "30", "--quick", "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    by_gpus = {size["gpus"]: size for size in result["sizes"]}
    assert sorted(by_gpus) == [80, 160]
    for gpus, size in by_gpus.items():
        nodes = gpus // 8
        assert size["nodes"] == nodes and size["running_jobs"] == nodes * 2 and size["pending"] == 30
        assert size["build"]["inputs"] == nodes + nodes * 2 * 2 + 30
        assert size["preemptions_planned"] == size["samples"] == 5  # every urgent job planned one
        assert sorted(size["per_input_median_us"]) == [
            "checkpoint_saved",
            "checkpoint_started",
            "finished",
            "submit",
        ]
        assert all(us > 0 for us in size["per_input_median_us"].values())
    ratios = result["ratios_largest_to_smallest_cluster"]["30"]
    assert ratios["gpus"] == "160/80"
    expected = by_gpus[160]["decision_median_ms"] / by_gpus[80]["decision_median_ms"]
    assert abs(ratios["decision"] - expected) <= 0.001 * expected + 0.001
    submits = [by_gpus[gpus]["per_input_median_us"]["submit"] for gpus in (160, 80)]
    assert ratios["submit"] == pytest.approx(submits[0] / submits[1], abs=0.002)
    assert "bench core: 160 GPUs, 30 pending: building the pool" in proc.stderr  # progress


def test_bench_core_refuses_sizes_that_are_not_whole_numbers_and_says_how_to_write_them():
    proc = _run("bench", "core", "--gpus", "10k,50k")
    assert proc.returncode == 2
    assert "--gpus takes whole numbers separated by commas, like 10000,50000" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _run("bench", "core", "--gpus", "4")
    assert proc.returncode == 2 and "at least one 8-GPU node" in proc.stderr


def test_bench_scale_feeds_the_scheduler_process_a_pool_through_the_bus_and_times_its_decisions_with_and_without_heartbeats():
    proc = _run(
        "bench", "scale", "--gpus", "160", "--pending", "20", "--quick", "--heartbeats", "--json", timeout=180
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    (size,) = result["sizes"]
    assert size["gpus"] == 160 and size["nodes"] == 20 and size["running_jobs"] == 40
    assert size["filling"]["inputs"] == 20 + 40 * 2 + 20
    assert size["filling"]["inputs_per_s"] > 0 and size["steady"]["inputs_per_s"] > 0
    decision = size["decision"]
    assert decision["samples"] == 3
    # Taken by the scheduler after it was published: its share of the latency is the smaller.
    assert 0 < decision["taken_to_logged_median_ms"] <= decision["submit_to_logged_median_ms"]
    # ... and stored by the server (its batch committed) after the scheduler took it.
    assert 0 <= decision["taken_to_stored_median_ms"] <= decision["taken_to_stored_max_ms"]
    assert "bench scale: 160 GPUs, 20 pending: decision 3:" in proc.stderr
    # Then again while the 20 hosts beat once a second.
    beating = size["with_heartbeats"]
    assert beating["hosts"] == 20 and beating["heartbeats_per_s"] > 0
    assert beating["decision"]["samples"] == 3 and beating["steady"]["inputs"] == 300
