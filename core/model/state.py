"""The scheduler's state: `State` holds the canonical entities (core/model/entities.py:
what a snapshot stores and a `StateDigest` covers) plus an `Index` of derived lookups
(queues per level and team, free GPUs per model, jobs per node), its upkeep as events
change the entities, and the running hash sums the state digest reads
(core/model/digests.py). The index is rebuilt from the entities on load,
so it never needs to be stored. Only `evolve` changes a State; decisions read it.
"""

from __future__ import annotations

import bisect
from typing import Any, Callable

import msgspec

from .entities import (
    HOLDING,
    QUEUED,
    RUNNING,
    Canonical,
    Job,
    Node,
    node_free_count,
    queue_key,
)
from .bands import requeue_boost
from .cordon import takes_work
from .digests import DIGEST_MODULUS as DIGEST_MODULUS  # re-exported (X as X), as the rest below
from .digests import DIGEST_SCHEMA as DIGEST_SCHEMA
from .digests import job_hash as job_hash
from .digests import jobs_hash_sum as jobs_hash_sum
from .digests import jobs_hash_total as jobs_hash_total
from .digests import live_digest as live_digest
from .digests import node_hash
from .digests import state_digest as state_digest
from .policy import Policy
from .policy_defaults import DEFAULTS_VERSION_KEY, LEGACY_DEFAULTS_VERSION
from .scratch import PASS_MEMORY, Scratch, forget_releases
from .types import LEVELS


class Index:
    """Derived lookups, rebuilt from the canonical entities."""

    def __init__(self) -> None:
        # level -> team -> sorted [(base level, submit_t, job id)] of queued jobs at that eff level
        self.queues: list[dict[str, list[tuple[int, int, str]]]] = [{} for _ in range(LEVELS)]
        self.queued_count: list[int] = [0] * LEVELS
        self.queued_gpus: list[int] = [0] * LEVELS  # GPUs asked for by queued jobs, per eff level
        # level -> sorted [(level_since_t, job id)] of jobs that may still age, for aging
        self.aging: list[list[tuple[int, str]]] = [[] for _ in range(LEVELS)]
        # base level -> sorted [(submit_t, job id)] of queued jobs: the oldest first (the
        # urgent levels' preemption candidates, the starving jobs' reservations)
        self.waiting_by_level: list[list[tuple[int, str]]] = [[] for _ in range(LEVELS)]
        # team -> sorted [(submit_t, job id)] of its queued jobs: each team's oldest
        self.waiting_by_team: dict[str, list[tuple[int, str]]] = {}
        # base level -> team -> sorted [(base level, submit_t, job id)] of its queued jobs,
        # wherever aging queues them: who may preempt first, in the level's own queue policy
        self.waiting_by_level_team: list[dict[str, list[tuple[int, int, str]]]] = [{} for _ in range(LEVELS)]
        self.free_by_model: dict[str, int] = {}
        # model -> [nodes, GPUs] of every node the pool has known, up or down: the largest
        # gang of that model it could ever hold (what a submit is checked against).
        self.known_by_model: dict[str, list[int]] = {}
        self.capacity_by_model: dict[str, int] = {}
        self.node_size_max_by_model: dict[str, int] = {}
        # model -> node size -> how many up nodes of that size (the largest node of a model,
        # kept as nodes go down without looking at the others)
        self.node_sizes_by_model: dict[str, dict[int, int]] = {}
        # model -> sorted names of its nodes that take work (up, not cordoned): what
        # reservations and plans weigh
        # (`core.model.up_nodes.UpNodes`), not the whole pool listed and filtered
        self.up_nodes_by_model: dict[str, list[str]] = {}
        # team/kind -> {job id: None} of the jobs holding GPUs whose forecasts a learned
        # runtime of that team and kind moves
        self.holders_by_kind: dict[str, dict[str, None]] = {}
        # model -> free count -> sorted [node name]: a placement takes the first name not held
        self.free_buckets: dict[str, dict[int, list[str]]] = {}
        self.jobs_by_node: dict[str, dict[str, None]] = {}
        self.team_gpus: dict[str, int] = {}
        self.team_queued_gpus: dict[str, int] = {}  # GPUs asked for by each team's queued jobs
        self.level_gpus: list[int] = [0] * LEVELS
        # level -> team -> GPUs its jobs of that (base) level hold: fair share inside a level
        self.level_team_gpus: list[dict[str, int]] = [{} for _ in range(LEVELS)]
        # GPUs asked for by queued jobs, per base level (what aging does not change)
        self.queued_gpus_base: list[int] = [0] * LEVELS
        # gang size -> GPUs asked for by queued jobs of that size (who could use n GPUs)
        self.queued_gpus_by_size: dict[int, int] = {}
        # eff level -> gang size -> GPUs asked for by queued jobs of that size at that level
        # (who would take the releases a job of that size or larger could start on)
        self.queued_gpus_by_level_size: list[dict[int, int]] = [{} for _ in range(LEVELS)]
        # Queued jobs that entered below their requested level (a team downgrade)
        self.downgraded_queued: dict[str, None] = {}
        # level -> {job id: None} of jobs holding GPUs, to find preemption victims by level
        self.holding_by_level: list[dict[str, None]] = [{} for _ in range(LEVELS)]
        # The running jobs as victims: GPU model -> victim class (`victim_class`) -> sorted
        # [(anchor, job id)], and each one's (model, class, anchor). Within a class a
        # victim's price is a function of its anchor that never grows with it, so the
        # cheapest victims of a class are at its end (core/passes/bounded.py).
        self.victims_by_class: dict[str, dict[tuple, list[tuple[int, str]]]] = {}
        self.victim_keys: dict[str, tuple[str, tuple, int]] = {}
        self.victims_stale: dict[str, None] = {}  # touched since: keyed by `victim_classes`
        self.total_gpus = 0
        # While evolve keeps decayed usage (a fair-share half-life is set): each change of the
        # GPUs a team holds at a level, as (level, team, GPUs held before); None otherwise.
        self.hold_changes: list[tuple[int, str, int]] | None = None
        self.job_hashes: dict[str, int] = {}
        self.jobs_sum = 0  # of `job_hashes`; jobs in `hashes_stale` are not in it yet
        # Jobs touched since their hash was last taken: hashed when a digest needs the sum
        # (`jobs_hash_total`), so a job touched many times between digests is hashed once.
        self.hashes_stale: dict[str, None] = {}
        # The same for nodes: each node's hash, their sum, and the nodes changed since
        # (`core.model.digests.nodes_hash_total`).
        self.node_hashes: dict[str, int] = {}
        self.nodes_sum = 0
        self.nodes_stale: dict[str, None] = {}


class State:
    """The scheduler state: `canonical` (the entities a snapshot stores and a digest
    covers) and `index` (lookups derived from them, rebuilt on load, kept by `evolve`);
    beside it, `scratch` (caches and the passes' memory, not state: core/model/scratch.py)."""

    __slots__ = ("canonical", "index", "scratch")

    def __init__(self, canonical: Canonical | None = None) -> None:
        self.canonical = canonical or Canonical()
        self.scratch = Scratch()
        self.index = rebuild_index(self.canonical, self.scratch)

    @property
    def policy(self) -> Policy:
        """The policy in force."""
        return self.canonical.policy

    @property
    def t(self) -> int:
        """The recorded clock (the time of the last event)."""
        return self.canonical.t


def rebuild_index(c: Canonical, sx: Scratch) -> Index:
    """The derived lookups of a canonical state, built from nothing (on load and after a
    snapshot); `sx` learns that a pass is due."""
    ix = Index()
    for name in sorted(c.nodes):
        node = c.nodes[name]
        node_known(ix, node, 1)
        ix.node_hashes[name] = node_hash(node)
        if takes_work(node):
            _index_node_capacity(ix, sx, node)
    for job_id in sorted(c.jobs):
        job = c.jobs[job_id]
        if job.state == QUEUED:
            queue_add(ix, sx, job, c.policy.aging_levels_max)
        if job.state in HOLDING:
            hold_add(ix, job)
        for slot in job.placement:
            if job.state in HOLDING:
                ix.jobs_by_node.setdefault(slot.node, {})[job.id] = None
        ix.job_hashes[job_id] = job_hash(job)
        victim_index(ix, c, job)
    ix.jobs_sum = sum(ix.job_hashes.values()) % DIGEST_MODULUS
    ix.nodes_sum = sum(ix.node_hashes.values()) % DIGEST_MODULUS
    return ix


def _index_node_capacity(ix: Index, sx: Scratch, node: Node) -> None:
    sx.placement_dirty = True
    sx.releases_gen += 1
    model = node.gpu_model
    ix.capacity_by_model[model] = ix.capacity_by_model.get(model, 0) + node.gpus
    ix.node_size_max_by_model[model] = max(ix.node_size_max_by_model.get(model, 0), node.gpus)
    sizes = ix.node_sizes_by_model.setdefault(model, {})
    sizes[node.gpus] = sizes.get(node.gpus, 0) + 1
    bisect.insort(ix.up_nodes_by_model.setdefault(model, []), node.name)
    ix.total_gpus += node.gpus
    free = sum(1 for holder in node.holder if holder == "")
    ix.free_by_model[model] = ix.free_by_model.get(model, 0) + free
    bisect.insort(ix.free_buckets.setdefault(model, {}).setdefault(free, []), node.name)


def unindex_node_capacity(ix: Index, node: Node) -> None:
    """Take an up node out of the capacity indexes (it went down): `_index_node_capacity`'s
    inverse, over what the node holds now."""
    model = node.gpu_model
    free = node_free_count(node)
    ix.capacity_by_model[model] -= node.gpus
    ix.total_gpus -= node.gpus
    ix.free_by_model[model] -= free
    bucket = ix.free_buckets[model][free]
    _remove_sorted(bucket, node.name)
    if not bucket:
        del ix.free_buckets[model][free]
    sizes = ix.node_sizes_by_model[model]
    sizes[node.gpus] -= 1
    if not sizes[node.gpus]:
        del sizes[node.gpus]
    ix.node_size_max_by_model[model] = max(sizes, default=0)
    up = ix.up_nodes_by_model[model]
    _remove_sorted(up, node.name)
    if not up:
        del ix.up_nodes_by_model[model]


def node_known(ix: Index, node: Node, sign: int) -> None:
    """Count a node the pool knows (`sign` 1) or forget it (-1: the inventory it is replaced
    by is counted instead) in `known_by_model`."""
    counts = ix.known_by_model.setdefault(node.gpu_model, [0, 0])
    counts[0] += sign
    counts[1] += sign * node.gpus
    if counts[0] == 0:
        del ix.known_by_model[node.gpu_model]


def teams_with_demand(ix: Index) -> list[str]:
    """The teams that hold GPUs or have queued jobs, sorted."""
    return sorted(dict.fromkeys([*ix.team_gpus, *ix.team_queued_gpus]))


# ---------------------------------------------------------------- index upkeep


def queue_add(ix: Index, sx: Scratch, job: Job, aging_levels_max: int) -> None:
    """Index a queued job: its level's queue by team, aging, who may preempt first, its team's
    oldest."""
    sx.placement_dirty = True
    ix.queued_count[job.eff_level] += 1
    ix.queued_gpus[job.eff_level] += job.gpus
    ix.queued_gpus_base[job.level] += job.gpus
    ix.queued_gpus_by_size[job.gpus] = ix.queued_gpus_by_size.get(job.gpus, 0) + job.gpus
    by_size = ix.queued_gpus_by_level_size[job.eff_level]
    by_size[job.gpus] = by_size.get(job.gpus, 0) + job.gpus
    if job.level > job.requested_level:
        ix.downgraded_queued[job.id] = None
    ix.team_queued_gpus[job.team] = ix.team_queued_gpus.get(job.team, 0) + job.gpus
    bisect.insort(ix.queues[job.eff_level].setdefault(job.team, []), queue_key(job))
    if job.eff_level > 0 and job.level - job.eff_level < aging_levels_max:
        bisect.insort(ix.aging[job.eff_level], (job.level_since_t, job.id))
    bisect.insort(ix.waiting_by_level[job.level], (job.submit_t, job.id))
    bisect.insort(ix.waiting_by_team.setdefault(job.team, []), (job.submit_t, job.id))
    bisect.insort(ix.waiting_by_level_team[job.level].setdefault(job.team, []), queue_key(job))


def queue_remove(ix: Index, sx: Scratch, job: Job) -> None:
    """Drop a job from every queue index (it started, left or changed level)."""
    sx.placement_dirty = True
    ix.queued_count[job.eff_level] -= 1
    ix.queued_gpus[job.eff_level] -= job.gpus
    ix.queued_gpus_base[job.level] -= job.gpus
    ix.queued_gpus_by_size[job.gpus] -= job.gpus
    if not ix.queued_gpus_by_size[job.gpus]:
        del ix.queued_gpus_by_size[job.gpus]
    by_size = ix.queued_gpus_by_level_size[job.eff_level]
    by_size[job.gpus] -= job.gpus
    if not by_size[job.gpus]:
        del by_size[job.gpus]
    ix.downgraded_queued.pop(job.id, None)
    ix.team_queued_gpus[job.team] -= job.gpus
    if ix.team_queued_gpus[job.team] == 0:
        del ix.team_queued_gpus[job.team]
    team_queue = ix.queues[job.eff_level].get(job.team, [])
    _remove_sorted(team_queue, queue_key(job))
    if not team_queue:
        ix.queues[job.eff_level].pop(job.team, None)
    _remove_sorted(ix.aging[job.eff_level], (job.level_since_t, job.id))
    _remove_sorted(ix.waiting_by_level[job.level], (job.submit_t, job.id))
    team_waiting = ix.waiting_by_team.get(job.team, [])
    _remove_sorted(team_waiting, (job.submit_t, job.id))
    if not team_waiting:
        ix.waiting_by_team.pop(job.team, None)
    level_team = ix.waiting_by_level_team[job.level].get(job.team, [])
    _remove_sorted(level_team, queue_key(job))
    if not level_team:
        ix.waiting_by_level_team[job.level].pop(job.team, None)


def _remove_sorted(items: list, key: Any) -> None:
    i = bisect.bisect_left(items, key)
    if i < len(items) and items[i] == key:
        del items[i]


def hold_add(ix: Index, job: Job) -> None:
    """Index a job that holds GPUs: its team's and level's GPUs, the victims by level."""
    ix.team_gpus[job.team] = ix.team_gpus.get(job.team, 0) + job.gpus
    ix.level_gpus[job.level] += job.gpus
    by_team = ix.level_team_gpus[job.level]
    if ix.hold_changes is not None:
        ix.hold_changes.append((job.level, job.team, by_team.get(job.team, 0)))
    by_team[job.team] = by_team.get(job.team, 0) + job.gpus
    ix.holding_by_level[job.level][job.id] = None
    ix.holders_by_kind.setdefault(f"{job.team}/{job.kind}", {})[job.id] = None


def hold_remove(ix: Index, job: Job) -> None:
    """Drop a job that let go of its GPUs from the holding indexes."""
    del ix.holding_by_level[job.level][job.id]
    kind = f"{job.team}/{job.kind}"
    holders = ix.holders_by_kind[kind]
    del holders[job.id]
    if not holders:
        del ix.holders_by_kind[kind]
    ix.team_gpus[job.team] = ix.team_gpus.get(job.team, 0) - job.gpus
    if ix.team_gpus[job.team] == 0:
        del ix.team_gpus[job.team]
    ix.level_gpus[job.level] -= job.gpus
    by_team = ix.level_team_gpus[job.level]
    if ix.hold_changes is not None:
        ix.hold_changes.append((job.level, job.team, by_team[job.team]))
    by_team[job.team] -= job.gpus
    if by_team[job.team] == 0:
        del by_team[job.team]


def set_holder(c: Canonical, ix: Index, sx: Scratch, node_name: str, gpu: int, job_id: str) -> None:
    """Change who holds one GPU, keeping the free counts in step."""
    node = c.nodes[node_name]
    before = node.holder[gpu]
    if before == job_id:
        return
    sx.releases_gen += 1
    sx.node_fits.pop(node_name, None)
    sx.fit_dirty[node_name] = None
    sx.release_dirty[node_name] = None
    ix.nodes_stale[node_name] = None
    # Only the free GPUs of nodes that take work are indexed (a cordoned node's are not).
    indexed = takes_work(node)
    if indexed:
        free_before = node_free_count(node)
    node.holder[gpu] = job_id
    if not indexed:
        return
    delta = (1 if job_id == "" else 0) - (1 if before == "" else 0)
    if delta:
        if delta > 0:
            sx.placement_dirty = True
        model = node.gpu_model
        ix.free_by_model[model] += delta
        buckets = ix.free_buckets[model]
        bucket = buckets[free_before]
        _remove_sorted(bucket, node_name)
        if not bucket:
            del buckets[free_before]
        bisect.insort(buckets.setdefault(free_before + delta, []), node_name)


def recovery_boost(p: Policy, count: int, waited_total_ms: int) -> int:
    """Levels a requeued job rises: more for each preemption and for the wait it has borne."""
    by_wait = waited_total_ms // p.requeue_boost_wait_ms if p.requeue_boost_wait_ms else 0
    return min(p.requeue_boost_max, p.requeue_boost_per_preemption * count + by_wait)


def requeue_level_under(p: Policy, victim: Job) -> int:
    """The queue level a victim returns to under policy `p`: its base level raised by the
    recovery boost."""
    boost, _ = requeue_boost(
        p, victim.level, recovery_boost(p, victim.preempt_count + 1, victim.waited_total_ms)
    )
    return victim.level - boost


def victim_class(job: Job, p: Policy) -> tuple[tuple, int]:
    """A running job's victim class and anchor. The class holds everything its price as a
    victim reads but the time and the progress it would lose (level, GPUs, checkpoint and
    restore costs, a checkpoint under way, safe-point interval, recovery boost); the anchor
    says the progress: it loses `t - anchor` while it runs on from its last checkpoint
    (`anchored`), else `-anchor` (its progress frozen). Its requeue level is the
    policy's (the index is rebuilt when the policy changes); its restart protection is
    left out: a victim's price is bounded below over both weights
    (core/rules/pricing.py `victim_cost_floor`)."""
    last = job.checkpoints[-1].progress_ms if job.checkpoints else 0
    anchored = job.frozen_t == 0 and job.run_started_t != 0
    if anchored:
        anchor = job.run_started_t - job.progress_ms + last
    else:
        anchor = last - job.progress_ms - max(0, job.frozen_t - job.run_started_t)
    key = (
        job.level,
        requeue_level_under(p, job),
        job.gpus,
        anchored,
        job.ckpt_interval_ms > 0,
        job.ckpt_cost_ms,
        job.restore_cost_ms,
        bool(job.checkpoints),
        job.ckpt_started_t,
        job.safe_point_interval_ms,
        job.boost,
    )
    return key, anchor


def victim_index(ix: Index, c: Canonical, job: Job | None, job_id: str = "") -> None:
    """Keep a job's place in `victims_by_class` (running: indexed by its class and anchor;
    else not at all) after events touched it."""
    job_id = job.id if job is not None else job_id
    old = ix.victim_keys.pop(job_id, None)
    if old is not None:
        model, key, anchor = old
        members = ix.victims_by_class[model][key]
        _remove_sorted(members, (anchor, job_id))
        if not members:
            del ix.victims_by_class[model][key]
            if not ix.victims_by_class[model]:
                del ix.victims_by_class[model]
    if job is None or job.state != RUNNING or not job.placement:
        return
    node = c.nodes.get(job.placement[0].node)
    model = node.gpu_model if node is not None else ""
    key, anchor = victim_class(job, c.policy)
    ix.victim_keys[job_id] = (model, key, anchor)
    bisect.insort(ix.victims_by_class.setdefault(model, {}).setdefault(key, []), (anchor, job_id))


def reindex_victims(ix: Index, c: Canonical) -> None:
    """Every running job's victim class again (the policy changed its requeue level), when
    the classes are next read."""
    ix.victims_stale.update(dict.fromkeys(ix.victim_keys))


def victim_classes(state: "State") -> dict[str, dict[tuple, list[tuple[int, str]]]]:
    """`Index.victims_by_class`, the jobs touched since it was last read keyed again first:
    a job is keyed when a decision reads the classes, not at every event that touches it
    (a running job's checkpoints touch it many times between two decisions)."""
    ix, c = state.index, state.canonical
    for job_id in ix.victims_stale:
        victim_index(ix, c, c.jobs.get(job_id), job_id)
    ix.victims_stale.clear()
    return ix.victims_by_class


def queue_depth(ix: Index, level: int) -> int:
    """Jobs queued at a level (its aging threshold shrinks as it deepens)."""
    return ix.queued_count[level]


def touch_job(state: "State", job_id: str, release_spec: Callable | None = None) -> None:
    """Keep the index in step after an event changed (or removed) a job: its hash is taken
    again when a digest needs it; its release forecast is forgotten. With `release_spec`
    (`core.forecast.waits.release_spec`), a forecast that was memoised is taken again at once.
    The forecasts of its nodes kept across time (`Scratch.node_fits`) stay: when the job's
    forecast did not change (a checkpoint began, a notice was withdrawn...) as they are,
    else with the job marked moved, so that they make its piece again when next read."""
    sx = state.scratch
    old = sx.remaining_memo.pop(job_id, None)
    state.index.hashes_stale[job_id] = None
    state.index.victims_stale[job_id] = None
    job = state.canonical.jobs.get(job_id)
    if job is None:
        return
    unchanged = False
    if old is not None and release_spec is not None:
        new = sx.remaining_memo[job_id] = release_spec(state, job)
        unchanged = new[:4] == old[:4]
    forget_releases(sx, job.placement, keep_fits=True)
    if not unchanged:
        # Its nodes' kept forecasts make its piece again (`NodeFit.refreshed`): its
        # holders and their GPUs are the same (a change of those drops them, `set_holder`).
        fits = sx.node_fits
        for slot in job.placement:
            sx.fit_dirty[slot.node] = None
            sx.release_dirty[slot.node] = None
            fit = fits.get(slot.node)
            if fit is not None:
                fit.moved.append(job_id)


def snapshot_bytes(c: Canonical) -> bytes:
    """The canonical state, encoded for a snapshot."""
    return msgspec.json.encode(c, order="sorted")


def load_snapshot(data: bytes) -> State:
    """A State from snapshot bytes, its index rebuilt."""
    canonical = msgspec.json.decode(data, type=Canonical)
    if canonical.events_n and DEFAULTS_VERSION_KEY not in canonical.policy_params:
        # A log that names no defaults version runs under the legacy table; a snapshot from
        # before versions existed has the table's values but not its number.
        canonical.policy.defaults_version = LEGACY_DEFAULTS_VERSION
    return State(canonical)


def copy_state(state: State) -> State:
    """An independent copy that decides as `state` would (a dry run): the canonical state
    through its snapshot encoding, the placement passes' memory copied along."""
    copy = load_snapshot(snapshot_bytes(state.canonical))
    for name in PASS_MEMORY:
        value = getattr(state.scratch, name)
        setattr(copy.scratch, name, dict(value) if isinstance(value, dict) else value)
    return copy


def nodes_by_name(state: "State") -> list[tuple[str, Node]]:
    """`sorted(state.canonical.nodes.items())`, kept in the scratch until a node joins (a
    node that goes down or is cordoned stays in it: callers filter on `cordon.takes_work`)."""
    sx = state.scratch
    if sx.nodes_sorted is None:
        sx.nodes_sorted = sorted(state.canonical.nodes.items())
    return sx.nodes_sorted
