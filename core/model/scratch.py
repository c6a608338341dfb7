"""What the scheduler keeps beside its state, and is not state: the caches of the forecasts
and of the decision (each dropped whenever an event changes what it was worked out from, so
dropping any of them at any time changes no decision), and what the placement passes carry
from one step to the next without an event (`PASS_MEMORY`: the nodes held for blocked
jobs, whether a pass is due, the urgent head's drain hold still to work out). A state
folded from the log starts with a fresh `Scratch`; `SchedulerStarted` and a policy change
start one too, so the log's re-decision forgets at the same points.
"""

from __future__ import annotations

from typing import Any

from .entities import Node
from .types import LEVELS

# What placement passes keep between steps that no event records: a state folded from
# the log has a fresh scratch's values of them.
PASS_MEMORY = ("reserved_nodes", "placement_dirty", "drain_pending_t")


class Scratch:
    """The caches and the passes' memory of one scheduler (see the module's docstring)."""

    def __init__(self) -> None:
        self.variant_policies: dict[str, Any] = {}
        # Set by anything that could let a queued job start (a queue changed, a GPU freed,
        # capacity or policy changed); a pass that finds it clear has nothing new to place.
        self.placement_dirty = True
        # Nodes the last pass held for blocked jobs -> (when the job is expected to start
        # there, the job's id).
        self.reserved_nodes: dict[str, tuple[int, str]] = {}
        # The time of a step whose urgent head's drain hold (core/passes/placement.py) is not
        # worked out yet (-1: none): made at the next step's start from the state as that
        # step left it, unless that step makes it afresh first (read it through
        # `core.passes.placement.reserved_nodes`).
        self.drain_pending_t = -1
        # Which schema-1 release's digests this log's last one matched (core/log/digest.py):
        # tried first at the next one.
        self.legacy_digest_release = 0
        # Per holding job, how long until it releases its GPUs as a function of the time
        # (`core.forecast.waits.release_spec`, which names the learned estimate it used): dropped
        # whenever an event touches the job, all of them when the policy changes.
        self.remaining_memo: dict[str, tuple] = {}
        # Per node, [(job id, GPUs there)] of the jobs holding GPUs on it: dropped when a job
        # joins or leaves the node or an event touches one of its jobs.
        self.node_holders: dict[str, list[tuple[str, int]]] = {}
        # Per node, (ms until release, GPUs) of the jobs holding GPUs there, soonest first,
        # at time `node_releases_t`: dropped with the node's holders, all of them whenever
        # the time moves or `remaining_memo` is cleared.
        self.node_releases: dict[str, list[tuple[int, int]]] = {}
        self.node_releases_t = -1
        # Per node, its releases as functions of the time (`core.forecast.node_fit.NodeFit`): kept
        # across time, dropped with the node's release list and whenever its free GPUs change.
        self.node_fits: dict[str, Any] = {}
        # Bumped when a learned runtime changes: a node's kept forecast then checks the
        # estimates its jobs used.
        self.estimates_gen = 0
        # Bumped whenever a node's releases or free GPUs may have changed: forecasts over
        # several nodes (pooled releases, earliest fits) are kept in `fits_memo` while it
        # stays the same (the jobs weighed in one pass mostly look at the same nodes).
        self.releases_gen = 0
        self.fits_memo: dict[tuple, Any] = {}
        # The nodes (up or not) in name order, as (name, node): what every reservation and
        # preemption plan walks (`nodes_by_name`); dropped when a node joins.
        self.nodes_sorted: list[tuple[str, Node]] | None = None
        # Per level, (policy, level wait, queue depth, aging threshold) last worked out
        # (`core.passes.queues.aging_threshold_ms`).
        self.aging_memo: list[tuple | None] = [None] * LEVELS
        self.fits_memo_gen = -1
        # Per (model, gang size), its up nodes by when that gang fits there alone
        # (`core.forecast.fit_order.FitOrder`), made when first asked for; the nodes whose
        # forecasts changed since the last query (`fit_dirty`, handed to every order then,
        # each entering them again when it is read); and the time of that query (one at an
        # earlier time reads every node instead).
        self.fit_orders: dict[tuple[str, int], Any] = {}
        self.fit_dirty: dict[str, None] = {}
        self.fit_order_t = -1
        # Per tuple of GPU models, their up nodes' releases as at the start of the current
        # grid step (`core.forecast.release_pool.ReleasePool`, with a release curve grid
        # set), made when first asked for and dropped when the grid point moves; (grid
        # point, step) they were made at; the nodes whose releases or free GPUs changed
        # since the last query (entered again then, as `fit_dirty`'s are).
        self.release_pools: dict[tuple[str, ...], Any] = {}
        self.release_pools_grid: tuple[int, int] = (-1, 0)
        self.release_dirty: dict[str, None] = {}


def forget_pass_memory(sx: Scratch) -> None:
    """Back to what a state folded from the log has of what placement passes keep between
    steps without an event (no node held, a pass due): a scheduler that starts leading
    from a folded state records it (`SchedulerStarted`), and so does the restore after an
    internal error, so the log's re-decision forgets at the same points."""
    fresh = Scratch()
    for name in PASS_MEMORY:
        setattr(sx, name, getattr(fresh, name))


def forget_releases(sx: Scratch, placement, keep_fits: bool = False) -> None:
    """Drop the memoised holders and release lists of the nodes a placement covers (and
    their forecasts kept across time, unless `keep_fits`: the nodes' holders and their GPUs
    are the same, and a job whose forecast changed is marked moved on them instead)."""
    for slot in placement:
        sx.node_releases.pop(slot.node, None)
        sx.node_holders.pop(slot.node, None)
        if not keep_fits:
            sx.node_fits.pop(slot.node, None)
            sx.fit_dirty[slot.node] = None
            sx.release_dirty[slot.node] = None
    if placement:
        sx.releases_gen += 1


def forget_node(sx: Scratch, node_name: str) -> None:
    """Drop what is memoised about a node's releases (its jobs or GPUs changed)."""
    sx.node_releases.pop(node_name, None)
    sx.node_holders.pop(node_name, None)
    sx.node_fits.pop(node_name, None)
    sx.fit_dirty[node_name] = None
    sx.release_dirty[node_name] = None
    sx.releases_gen += 1


def forget_release_lists(sx: Scratch, nodes=()) -> None:
    """Drop every memoised release list (a learned runtime changed; the jobs' release specs
    check their estimate themselves); `nodes`: those holding the jobs whose forecasts it
    moves."""
    sx.node_releases.clear()
    sx.estimates_gen += 1
    sx.releases_gen += 1
    for name in nodes:
        sx.fit_dirty[name] = None
        sx.release_dirty[name] = None


def forget_remaining(sx: Scratch) -> None:
    """Drop every memoised release forecast (estimates or policy changed)."""
    sx.remaining_memo.clear()
    sx.node_releases.clear()
    sx.node_fits.clear()
    sx.fit_orders.clear()
    sx.fit_dirty.clear()
    sx.release_pools.clear()
    sx.release_dirty.clear()
    sx.releases_gen += 1
