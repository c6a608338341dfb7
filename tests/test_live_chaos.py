"""`xirang chaos` on a short seed: faults injected into a live cluster (schedulers, agents
and nats-server killed, agents stopped and resumed), and every invariant holds."""

from __future__ import annotations

import pytest

from agents.chaos import Chaos

pytestmark = pytest.mark.timeout(300)


def test_a_short_chaos_run_injects_faults_and_every_invariant_holds(tmp_path):
    report = Chaos(tmp_path, seed=7, duration_s=10, log=lambda _line: None).run()
    assert sum(report.faults.values()) >= 2, report.as_dict()
    assert report.jobs["accepted"] >= 3 and report.jobs["finished"] >= 3, report.as_dict()
    assert report.ok, report.as_dict()


def test_under_chaos_a_spoiled_bus_copy_is_restored_from_the_hosts_copy_at_the_same_step(tmp_path):
    report = Chaos(tmp_path, seed=7, duration_s=30, log=lambda _line: None, spoil_checkpoints=True).run()
    assert sum(report.spoiled.values()) >= 1, report.as_dict()
    # a queued job's spoiled checkpoint is the one its resume names: it must come from copy 2
    assert report.jobs["restores_from_copy_2"] >= min(1, report.spoiled.get("spoiled_queued", 0))
    assert report.ok, report.as_dict()  # no checkpoint fell back, every restore at its named step
