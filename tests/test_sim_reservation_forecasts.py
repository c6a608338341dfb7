"""Reservations and release curves read nodes' forecasts kept across time
(core/forecast/node_fit.py, and the fit orders kept over them, core/forecast/fit_order.py): on a busy simulated pool, where one team's finishes keep moving its
running jobs' forecasts and checkpoints' pauses move single jobs', every earliest
single-node fit and every node's releases equal those worked out from scratch."""

import random

import pytest

from core.forecast import waits as F
from core.forecast import node_fit as N
from core.forecast.release import holder_specs
from replay.sim import Cluster, simulate
from sim_helpers import job, workload


def _releases_from_scratch(state, node):
    t = state.canonical.t
    return sorted((F.remaining_at(spec, t), gpus) for spec, gpus in holder_specs(state, node))


def _from_scratch(state, nodes, need):
    best = None
    for node in nodes:
        if node.gpus < need:
            continue
        wait = F._first_fit_time(F.node_free_count(node), _releases_from_scratch(state, node), need)
        if wait is not None and (best is None or (wait, node.name) < best):
            best = (wait, node.name)
    return None if best is None else (best[0], [best[1]])


def _busy_workload(count: int):
    rng = random.Random(7)
    return workload(
        *(
            job(
                f"j{i:03d}",
                submit_s=i * 20,
                duration_s=rng.randint(300, 5400),
                gpus=rng.choice((1, 1, 2, 4, 8)),
                level=rng.choice((2, 4, 4, 6)),
                team="big" if rng.random() < 0.8 else "small",
                est_runtime_s=rng.randint(300, 5400),
            )
            for i in range(count)
        )
    )


# Read exactly (grid 0) and on the default grid. The release pool kept across steps
# (core/forecast/release_pool.py) reads a node's releases only when its holders change,
# so far fewer reads than fits are checked.
@pytest.mark.parametrize("grid_ms", [0, 60_000])
def test_each_earliest_single_node_fit_equals_one_worked_out_from_scratch(monkeypatch, grid_ms):
    kept = N.earliest_single_fit
    seen = {"calls": 0, "with_moved_forecasts": 0, "with_moved_jobs": 0, "releases": 0}

    def note_moved(state, nodes):
        est_gen = state.scratch.estimates_gen
        if any(
            (fit := state.scratch.node_fits.get(node.name)) is not None and fit.estimates_gen != est_gen
            for node in nodes
        ):
            seen["with_moved_forecasts"] += 1
        if any((fit := state.scratch.node_fits.get(node.name)) is not None and fit.moved for node in nodes):
            seen["with_moved_jobs"] += 1  # a checkpoint's pause moved a job's forecast

    def checked(state, nodes, need):
        note_moved(state, nodes)
        got = kept(state, nodes, need)
        assert got == _from_scratch(state, nodes, need)
        seen["calls"] += 1
        return got

    kept_ordered = F.ordered_single_fit

    def checked_ordered(state, nodes, need):
        note_moved(state, nodes)
        answered, got = kept_ordered(state, nodes, need)
        if answered:  # the kept fit orders (core/forecast/fit_order.py) give the same fit
            assert got == _from_scratch(state, nodes, need)
            seen["calls"] += 1
        return answered, got

    kept_releases = F.node_releases

    def checked_releases(state, node):
        got = kept_releases(state, node)
        assert got == _releases_from_scratch(state, node)
        seen["releases"] += 1
        return got

    monkeypatch.setattr(F, "earliest_single_fit", checked)
    monkeypatch.setattr(F, "ordered_single_fit", checked_ordered)
    monkeypatch.setattr(F, "node_releases", checked_releases)
    simulate(
        _busy_workload(160),
        Cluster.uniform(32, 8),
        "xirang",
        {"tick_s": 60.0, "release_curve_grid_ms": grid_ms},
        seed=0,
    )
    assert seen["calls"] > 100
    assert seen["with_moved_forecasts"] > 20
    assert seen["with_moved_jobs"] > 20
    assert seen["releases"] > 40, seen
