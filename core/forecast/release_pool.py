"""The releases of a pool of nodes read on a coarse time grid (`Policy.release_curve_grid_ms`),
kept across steps: what a preemption plan's release curve (`core.forecast.waits.ReleaseCurve`)
reads, at the cost of the nodes whose releases changed, not of every running job.

Why a grid: the curve's turnover, the sum over running jobs of GPUs / time to release, moves
with the time for every job at once, so no update keeps it exactly; read at each new time it
costs every running job of the pool. On the grid every running job's time to release is
taken as at the start of the current grid step (`t` rounded down to a multiple of the
step): between two grid points only events move the pool (a job starts, ends, checkpoints,
a node joins or leaves), and each moves the nodes it touches, entered again at the next
query. Each release time is then off by less than one grid step (a remaining time moves
at most 1 ms per ms: slope -1, 0 or +1), so the time by which `g` GPUs have been freed is
too, and the turnover lies between the sums with every remaining time one step longer and
one step shorter. The curve is a function of the state and the time alone (kept, not
remembered): a pool made afresh gives the same answers (tests/test_core_release_pool.py).

The pooled releases are kept sorted in blocks with their GPUs summed, so that the time by
which `g` GPUs are freed and the median release are read by walking the blocks' sums, and
the turnover as an integer sum (GPUs scaled by 2**64 over ms: exact under additions and
removals in any order, so the result never depends on the order events came in).
"""

from __future__ import annotations

import bisect

from ..model.cordon import takes_work
from ..model.state import State
from .release import LINDY_FLOOR_FRACTION, holder_specs

TURNOVER_SCALE_BITS = 64
BLOCK_SIZE = 256  # releases per block before it splits in two

# A release: (ms until release at the grid point, GPUs, node, job) - unique per job and node.
Release = tuple[int, int, str, str]


def grid_time(t: int, grid_ms: int) -> int:
    """The start of the grid step that holds `t`."""
    return t - t % grid_ms


def node_releases_at(state: State, node, t: int) -> list[Release]:
    """The releases of the jobs holding GPUs on `node`, their times to release as at `t`,
    sorted."""
    specs = holder_specs(state, node)
    holders = state.scratch.node_holders[node.name]
    name = node.name
    releases = []
    for (spec, gpus), (job_id, _) in zip(specs, holders):
        fixed, total, done, since = spec[:4]
        if fixed < 0:  # remaining_at(spec, t), inline: a pool is made of every running job
            done += max(0, t - since)
            fixed = max(total - done, done - total, total // LINDY_FLOOR_FRACTION, 1)
        releases.append((fixed, gpus, name, job_id))
    releases.sort()
    return releases


def turnover_part(releases: list[Release]) -> int:
    """The releases' GPUs / ms to release, summed, scaled by 2**TURNOVER_SCALE_BITS."""
    return sum((gpus << TURNOVER_SCALE_BITS) // max(at, 1) for at, gpus, _, _ in releases)


class ReleasePool:
    """The up nodes of some GPU models with their releases as at one grid point (`grid_t`):
    each node's free GPUs and releases (`entry`), the releases pooled and sorted in blocks,
    and the sums the curve reads."""

    __slots__ = ("models", "grid_t", "entry", "free", "turnover", "count", "blocks", "tops", "block_gpus")

    def __init__(self, models: tuple[str, ...], grid_t: int) -> None:
        self.models = models
        self.grid_t = grid_t
        # node -> (free GPUs, its releases sorted, its turnover part)
        self.entry: dict[str, tuple[int, list[Release], int]] = {}
        self.free = 0
        self.turnover = 0
        self.count = 0
        self.blocks: list[list[Release]] = []
        self.tops: list[Release] = []  # the last release of each block
        self.block_gpus: list[int] = []

    # ------------------------------------------------------------ upkeep

    def put(self, state: State, node) -> None:
        """Enter the node as it is now, its releases as at the grid point."""
        for release in self._entered(state, node):
            self._insert(release)

    def put_all(self, state: State, nodes) -> None:
        """Enter every one of `nodes` into an empty pool: the releases sorted once."""
        pooled: list[Release] = []
        for node in nodes:
            pooled += self._entered(state, node)
        pooled.sort()
        self.count = len(pooled)
        self.blocks = [pooled[i : i + BLOCK_SIZE] for i in range(0, len(pooled), BLOCK_SIZE)]
        self.tops = [block[-1] for block in self.blocks]
        self.block_gpus = [sum(release[1] for release in block) for block in self.blocks]

    def _entered(self, state: State, node) -> list[Release]:
        # The node's entry and sums; its releases, for the caller to place.
        releases = node_releases_at(state, node, self.grid_t)
        part = turnover_part(releases)
        free = node.holder.count("")  # node_free_count
        self.entry[node.name] = (free, releases, part)
        self.free += free
        self.turnover += part
        return releases

    def drop(self, name: str) -> None:
        """Take the node out (it changed, or it no longer belongs)."""
        entry = self.entry.pop(name, None)
        if entry is None:
            return
        free, releases, part = entry
        self.free -= free
        self.turnover -= part
        for release in releases:
            self._remove(release)

    def belongs(self, node) -> bool:
        """Whether the node is one of the pool's: up, taking work, of one of its models."""
        return node is not None and takes_work(node) and node.gpu_model in self.models

    def _insert(self, release: Release) -> None:
        self.count += 1
        if not self.blocks:
            self.blocks.append([release])
            self.tops.append(release)
            self.block_gpus.append(release[1])
            return
        i = min(bisect.bisect_left(self.tops, release), len(self.blocks) - 1)
        block = self.blocks[i]
        bisect.insort(block, release)
        self.tops[i] = block[-1]
        self.block_gpus[i] += release[1]
        if len(block) > 2 * BLOCK_SIZE:
            rest = block[BLOCK_SIZE:]
            del block[BLOCK_SIZE:]
            self.blocks.insert(i + 1, rest)
            self.tops[i] = block[-1]
            self.tops.insert(i + 1, rest[-1])
            moved = sum(r[1] for r in rest)
            self.block_gpus[i] -= moved
            self.block_gpus.insert(i + 1, moved)

    def _remove(self, release: Release) -> None:
        i = bisect.bisect_left(self.tops, release)
        block = self.blocks[i]
        j = bisect.bisect_left(block, release)
        del block[j]
        self.count -= 1
        if not block:
            del self.blocks[i], self.tops[i], self.block_gpus[i]
            return
        self.tops[i] = block[-1]
        self.block_gpus[i] -= release[1]

    # ------------------------------------------------------------ reading

    def walk(self, skipped: list[Release], gpus: int = 0, rank: int = -1) -> tuple[Release, int] | None:
        """The first release (sorted, less the `skipped` ones, themselves sorted) by which
        `gpus` GPUs have been freed, or (`rank` >= 0) the release of that rank; with the
        GPUs freed up to it. None when there is none."""
        freed = 0
        counted = 0
        p = 0
        n_skipped = len(skipped)
        for b, block in enumerate(self.blocks):
            top = self.tops[b]
            q = p
            skipped_gpus = 0
            while q < n_skipped and skipped[q] <= top:
                skipped_gpus += skipped[q][1]
                q += 1
            block_gpus = self.block_gpus[b] - skipped_gpus
            block_count = len(block) - (q - p)
            inside = freed + block_gpus >= gpus if rank < 0 else counted + block_count > rank
            if not inside:
                freed += block_gpus
                counted += block_count
                p = q
                continue
            for release in block:
                if p < q and skipped[p] == release:
                    p += 1
                    continue
                freed += release[1]
                if (rank < 0 and freed >= gpus) or counted == rank:
                    return release, freed
                counted += 1
        return None

    def last(self, skipped: list[Release]) -> Release | None:
        """The latest release not skipped."""
        skipped_set = dict.fromkeys(skipped)
        for block in reversed(self.blocks):
            for release in reversed(block):
                if release not in skipped_set:
                    return release
        return None


def fresh_pool(state: State, nodes, grid_t: int) -> ReleasePool:
    """A pool of `nodes` (any iterable of nodes) made afresh at the grid point `grid_t`, not
    kept: for a list of nodes (an explanation's), and what a kept pool must equal."""
    pool = ReleasePool((), grid_t)
    pool.put_all(state, nodes)
    return pool


def kept_pool(state: State, models: tuple[str, ...], grid_ms: int) -> ReleasePool:
    """The kept pool of the up nodes of `models` at the current grid point, brought up to
    date: pools of another grid point are dropped (made again when asked), the nodes an event
    changed since the last query (`Scratch.release_dirty`) entered again."""
    sx = state.scratch
    grid_t = grid_time(state.canonical.t, grid_ms)
    pools = sx.release_pools
    if sx.release_pools_grid != (grid_t, grid_ms):
        pools.clear()
        sx.release_pools_grid = (grid_t, grid_ms)
        sx.release_dirty.clear()
    dirty = sx.release_dirty
    if dirty:
        nodes = state.canonical.nodes
        names = sorted(dirty)
        for pool in pools.values():
            for name in names:
                pool.drop(name)
                node = nodes.get(name)
                if pool.belongs(node):
                    pool.put(state, node)
        dirty.clear()
    pool = pools.get(models)
    if pool is None:
        pool = pools[models] = ReleasePool(models, grid_t)
        nodes = state.canonical.nodes
        up = state.index.up_nodes_by_model
        pool.put_all(state, [nodes[name] for model in models for name in up.get(model, ())])
    return pool
