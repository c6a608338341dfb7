"""The release curve on a coarse grid (`Policy.release_curve_grid_ms`,
core/forecast/release_pool.py), step after step of random worlds (nodes joining, dying and
cordoned, jobs starting, checkpointing, overrunning and ending, learned runtimes moving):

- the pool kept across steps answers exactly as one made afresh from the state (so it is a
  function of the state and the time, not of the order events came in);
- against the exact curve read at the time itself, the time by which `g` GPUs have been
  freed is off by less than one grid step, and the turnover lies between the sums with
  every remaining time one step longer and one step shorter (the bound the policy states);
- decisions are the same whether the kept pools live on or are dropped at any step.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from core import new_state, step
from core.forecast.release import holder_specs, remaining_at
from core.forecast import release_pool
from core.forecast.release_pool import grid_time
from core.forecast.waits import ReleaseCurve, _pooled_releases
from core.model.policy import Policy, with_params
from core.model.up_nodes import UpNodes
from core import types as T
from tests.random_world import World
from tests.test_core_node_cordon import CordoningWorld

GPU_ASKS = (1, 3, 8, 17, 40, 100, 1000)
BEYOND_MS = 3_600_000


def _world(seed: int, grid_ms: int) -> World:
    world = World(seed) if seed % 2 else CordoningWorld(seed)
    world.state = new_state(with_params(Policy(), {"release_curve_grid_ms": grid_ms}))
    for inp in world.boot():
        world.feed(inp)
    return world


def _scopes(state, rng: random.Random):
    """(models, excluded) pairs: each model alone and all of them, some nodes held out."""
    models = sorted(state.index.up_nodes_by_model)
    for chosen in [[m] for m in models] + ([models] if len(models) > 1 else []):
        names = [name for m in chosen for name in state.index.up_nodes_by_model[m]]
        yield chosen, sorted(name for name in names if rng.random() < 0.25)


def _listed(state, models, excluded):
    return list(UpNodes(state, models, excluded))


def test_the_pooled_releases_in_blocks_walk_as_one_sorted_list(monkeypatch):
    """Insertions and removals in any order, blocks split small: the release by which `g`
    GPUs are freed, the release of each rank and the latest, some releases skipped, are
    those of the sorted list."""
    monkeypatch.setattr(release_pool, "BLOCK_SIZE", 3)
    rng = random.Random(7)
    pool = release_pool.ReleasePool(("A100",), 0)
    kept: list = []
    for n in range(1500):
        if kept and rng.random() < 0.4:
            release = kept.pop(rng.randrange(len(kept)))
            pool._remove(release)
        else:
            release = (rng.randint(1, 50), rng.choice([1, 2, 4, 8]), f"n{rng.randint(0, 9)}", f"j{n}")
            kept.append(release)
            pool._insert(release)
        ordered = sorted(kept)
        skipped = sorted(r for r in ordered if rng.random() < 0.2)
        left = [r for r in ordered if r not in skipped]
        assert pool.count == len(ordered) and sum(pool.block_gpus) == sum(r[1] for r in ordered)
        assert pool.last(skipped) == (left[-1] if left else None)
        for gpus in (1, 5, 30, 200):
            freed, expected = 0, None
            for r in left:
                freed += r[1]
                if freed >= gpus:
                    expected = (r, freed)
                    break
            assert pool.walk(skipped, gpus=gpus) == expected
        for rank in {0, len(left) // 2, max(len(left) - 1, 0)}:
            expected = (left[rank], sum(r[1] for r in left[: rank + 1])) if left else None
            assert pool.walk(skipped, rank=rank) == expected
    assert len(pool.blocks) > 10  # the blocks split


@pytest.mark.parametrize("block_size", [release_pool.BLOCK_SIZE, 2])
def test_a_kept_release_pool_answers_as_one_made_afresh_at_every_step(monkeypatch, block_size):
    monkeypatch.setattr(release_pool, "BLOCK_SIZE", block_size)
    compared = 0
    for seed in range(8):
        rng = random.Random(seed)
        grid_ms = rng.choice([1000, 60_000, 600_000])
        world = _world(seed, grid_ms)
        for _ in range(500):
            world.feed(world.next_input())
            state = world.state
            for models, excluded in _scopes(state, rng):
                kept = ReleaseCurve(state, UpNodes(state, models, excluded), BEYOND_MS)
                fresh = ReleaseCurve(state, _listed(state, models, excluded), BEYOND_MS)
                assert (kept.free, kept.turnover, kept.beyond_ms) == (
                    fresh.free,
                    fresh.turnover,
                    fresh.beyond_ms,
                )
                assert kept._median_pace() == fresh._median_pace()
                for gpus in GPU_ASKS:
                    for turnover in (False, True):
                        assert kept.wait_for(gpus, turnover) == fresh.wait_for(gpus, turnover), (
                            seed, state.canonical.t, models, excluded, gpus, turnover,
                        )  # fmt: skip
                        compared += 1
    assert compared > 20_000, compared


def _exact_releases(state, nodes) -> list[tuple[int, int]]:
    return sorted(
        (remaining_at(spec, state.canonical.t), gpus)
        for node in nodes
        for spec, gpus in holder_specs(state, node)
    )


def _on_curve(releases: list[tuple[int, int]], need: int, beyond_ms: int) -> int:
    freed = 0
    for at, gpus in releases:
        freed += gpus
        if freed >= need:
            return at
    return (releases[-1][0] if releases else 0) + beyond_ms


def test_the_coarse_curve_is_within_one_grid_step_of_the_exact_one():
    checked = 0
    for seed in range(8):
        rng = random.Random(100 + seed)
        grid_ms = rng.choice([60_000, 600_000])
        world = _world(seed, grid_ms)
        for _ in range(500):
            world.feed(world.next_input())
            state = world.state
            t = state.canonical.t
            if t == grid_time(t, grid_ms):
                continue  # on a grid point the two agree exactly; between them is the test
            for models, excluded in _scopes(state, rng):
                nodes = _listed(state, models, excluded)
                coarse = ReleaseCurve(state, UpNodes(state, models, excluded), BEYOND_MS)
                free, _, _, _, turnover = _pooled_releases(state, nodes)  # the exact curve, read at t
                assert coarse.free == free
                releases = _exact_releases(state, nodes)
                if not releases:
                    assert coarse.turnover is None and turnover is None
                    continue
                # Each remaining time moved by at most t - grid point < one step since it was read.
                low = sum(g / (at + grid_ms) for at, g in releases)
                high = sum(g / max(at - grid_ms, 1) for at, g in releases)
                assert low <= coarse.turnover <= high, (seed, t, models, low, coarse.turnover, high)
                assert low <= turnover <= high
                for gpus in GPU_ASKS:
                    need = gpus - free
                    if need <= 0:
                        continue
                    exact_at = _on_curve(releases, need, BEYOND_MS)
                    found = coarse._pool.walk(coarse._skipped, gpus=need)
                    coarse_at = found[0][0] if found is not None else coarse.beyond_ms
                    assert abs(coarse_at - exact_at) < grid_ms, (seed, t, models, gpus, coarse_at, exact_at)
                    checked += 1
    assert checked > 3000, checked


def test_decisions_are_the_same_whether_the_kept_pools_live_on_or_are_dropped():
    planned = 0
    for seed in range(6):
        rng = random.Random(200 + seed)
        world = _world(seed, 60_000)
        twin = new_state(world.state.canonical.policy)
        for inp in world.boot():
            step(twin, inp)
        for _ in range(600):
            inp = world.next_input()
            records = world.feed(inp)
            if rng.random() < 0.3:
                twin.scratch.release_pools.clear()  # a cache dropped: nothing may change
            _, twin_records = step(twin, inp)
            assert [msgspec.json.encode(r) for r in twin_records] == [msgspec.json.encode(r) for r in records]
            planned += sum(isinstance(r.event, T.PreemptionPlanned) for r in records)
    assert planned > 5, planned
