"""A node's release forecast kept across time: when `need` GPUs of one node will be free
at once as its jobs end as forecast, worked out once and then read off a line until
something changes, instead of working the node's releases out again at every step (the
scheduling pass asks for the whole pool's fits at nearly every step while the pool is
full). Exactly what `core.forecast.waits._first_fit_time` over `core.forecast.waits.node_releases`
gives at that time; the reasoning is in `NodeFit`'s docstring, and
tests/test_core_forecast_over_time.py checks it against working it out again.
"""

from __future__ import annotations

from .release import LINDY_FLOOR_FRACTION, holder_specs, release_spec
from ..model.state import State
from ..model.entities import node_free_count


def earliest_single_fit(state: State, nodes, need: int) -> tuple[int, list[str]] | None:
    """The soonest (wait, node) among the nodes a gang of `need` GPUs fits on alone."""
    t = state.canonical.t
    fits = state.scratch.node_fits
    est_gen = state.scratch.estimates_gen
    best_wait = -1
    best_name = ""
    # Nodes whose kept line a learned runtime's change left stale: (a bound below their
    # fit, name, node), made again only if that bound could still win (`NodeFit.drift_ms`).
    stale = []
    for node in nodes:
        if node.gpus < need:
            continue
        name = node.name
        # node_fit_ms, inlined: this loop runs over the whole pool for every reservation.
        fit = fits.get(name)
        if fit is None or fit.t0 > t or fit.moved or (line := fit.lines.get(need)) is None or t >= line[2]:
            wait = node_fit_ms(state, node, need)
        elif fit.estimates_gen == est_gen:
            wait = line[0] + line[1] * t if line[1] is not None else None
        elif line[1] is None:
            continue  # never fits: the holders' GPUs, not their forecasts, say so
        else:
            # fit.drift_ms(state), its memo read inline (no job moved: see the first test).
            drift_at = fit.drift_at
            drift = drift_at[1] if drift_at[0] == est_gen else fit.drift_ms(state)
            if drift is None:
                wait = node_fit_ms(state, node, need)
            elif drift == 0:  # no job's forecast changed: its pieces are those of now
                fit.estimates_gen = est_gen
                wait = line[0] + line[1] * t
            else:
                stale.append((line[0] + line[1] * t - drift, name, node))
                continue
        if wait is not None and (
            best_wait < 0 or wait < best_wait or (wait == best_wait and name < best_name)
        ):
            best_wait, best_name = wait, name
    # The soonest is the least (wait, name) whatever the order the nodes are weighed in.
    stale.sort()
    for bound, name, node in stale:
        if best_wait >= 0 and (bound > best_wait or (bound == best_wait and name > best_name)):
            break  # neither this node nor any after it can be the soonest
        wait = node_fit_ms(state, node, need)
        if wait is not None and (
            best_wait < 0 or wait < best_wait or (wait == best_wait and name < best_name)
        ):
            best_wait, best_name = wait, name
    return None if best_wait < 0 else (best_wait, [best_name])


def node_fit_ms(state: State, node, need: int) -> int | None:
    """When `need` GPUs of the node will be free at once as its jobs end as forecast (0:
    now; None: never), as `_first_fit_time` over `node_releases` computes it, but kept
    across time (`NodeFit`)."""
    t = state.canonical.t
    fits = state.scratch.node_fits
    fit = fits.get(node.name)
    if fit is None or fit.t0 > t or not fit.refreshed(state, t):
        fit = fits[node.name] = NodeFit(state, node, t)
    line = fit.lines.get(need)
    if line is None:
        line = fit.lines[need] = fit.line(need)
    if t >= line[2]:  # the line no longer tells: start again from now
        fit = fits[node.name] = NodeFit(state, node, t)
        line = fit.lines[need] = fit.line(need)
    return line[0] + line[1] * t if line[1] is not None else None


class NodeFit:
    """A node's releases as functions of the time, from `t0` on. Each holding job's time to
    release (`remaining_at`) is piecewise linear in the time: constant when fixed, falling
    while a running job is within its expected runtime, then the Lindy floor, then growing
    with the overrun. When `need` GPUs fit is the release of the job where, soonest first,
    the GPUs add up to it (the k-th): that stays the k-th job's line while its piece (and
    those of the jobs before it) lasts and no other job's line crosses it (the jobs before
    it may swap among themselves, those after it too). `lines[need]` = (intercept, slope,
    end): the fit is `intercept + slope * t` for `t0 <= t < end` (slope None: never fits;
    (0, 0, ...): fits now). Kept in the scratch until the node's jobs, their forecasts or
    its free GPUs change (`Scratch.node_fits`)."""

    __slots__ = (
        "t0",
        "free",
        "jobs",
        "specs",
        "pieces",
        "order",
        "lines",
        "estimates_gen",
        "moved",
        "pieces_end",
        "drift_at",
    )

    def __init__(self, state: State, node, t0: int) -> None:
        self.t0 = t0
        self.free = node_free_count(node)
        self.lines: dict[int, tuple] = {}
        specs = holder_specs(state, node)
        # The holding jobs, in the node's holder order, and the release specs used for them.
        self.jobs = [job_id for job_id, _ in state.scratch.node_holders[node.name]]
        self.specs = [spec for spec, _ in specs]
        self.estimates_gen = state.scratch.estimates_gen
        self.moved: list[str] = []  # jobs an event changed the forecast of since
        self.drift_at: tuple[int, int | None] = (-1, None)  # (estimates_gen, `drift_ms`)
        fraction = LINDY_FLOOR_FRACTION
        # One piece per holding job, in the same order (`refreshed` replaces some).
        self.pieces = [(*_release_piece(spec, t0, fraction), gpus) for spec, gpus in specs]
        self._sort()

    def _sort(self) -> None:
        t0 = self.t0
        # The order just after t0: by the value at t0, ties by slope (who is smaller next).
        self.order = sorted(self.pieces, key=lambda p: (p[0] + p[1] * t0, p[1]))
        # Until when every job's release is still on its piece (`releases_at`).
        self.pieces_end = min((p[2] for p in self.pieces), default=NEVER)

    def refreshed(self, state: State, t: int) -> bool:
        """Whether its lines (made again if need be) tell the node's fits at `t`. After a
        learned runtime changed or an event changed one of its jobs' forecasts (`moved`),
        only the pieces of the jobs whose release specs changed are made again, from `t0`
        as before: each piece is a function of the job's spec and `t0` alone, so they are
        exactly the pieces a forecast made from scratch at `t0` would have, and the lines
        made from them say themselves until when they hold (a line whose k-th job another
        one crossed before `t` ends before `t`). False when a piece has ended by `t` (a
        fresh forecast is needed)."""
        sx = state.scratch
        moved = self.moved
        if self.estimates_gen == sx.estimates_gen:
            if not moved:
                return True
            jobs_moved = [i for i, job_id in enumerate(self.jobs) if job_id in moved]
        else:
            estimates = state.canonical.estimates
            jobs_moved = [
                i
                for i, spec in enumerate(self.specs)
                if estimates.get(spec[4]) is not spec[5] or (moved and self.jobs[i] in moved)
            ]
        if jobs_moved and not self._remade(state, t, jobs_moved):
            return False
        self.estimates_gen = sx.estimates_gen
        self.moved = []
        return True

    def drift_ms(self, state: State) -> int | None:
        """How far, at most, the node's fits moved since its pieces were made, when only
        learned runtimes changed since (no job `moved`): each job's time to release moves
        by no more than its expected runtime did (`remaining_at` changes by at most as much
        as its `total`), so each fit, a sum of releases' order, by no more than the largest
        of those. None when that is not known: a job moved, or a team and kind's learned
        runtime started (or stopped) being the one used."""
        if self.moved:
            return None
        gen = state.scratch.estimates_gen
        if self.drift_at[0] != gen:  # (kept until the next change of a learned runtime)
            self.drift_at = (gen, self._drift(state))
        return self.drift_at[1]

    def _drift(self, state: State) -> int | None:
        estimates = state.canonical.estimates
        samples_min = state.canonical.policy.estimate_samples_min
        drift = 0
        for spec in self.specs:
            used = spec[5]
            now = estimates.get(spec[4])
            if now is used:
                continue
            used_learned = used is not None and used.samples >= samples_min
            if used_learned != (now is not None and now.samples >= samples_min):
                return None
            if used_learned and now is not None and used is not None:
                # (else both are the submitter's estimate: no change)
                drift = max(drift, abs(int(now.mean_ms) - int(used.mean_ms)))
        return drift

    def _remade(self, state: State, t: int, jobs_moved: list[int]) -> bool:
        """Make the pieces of these jobs (by place) again from their release specs now;
        False when a piece has ended by `t`."""
        sx = state.scratch
        estimates = state.canonical.estimates
        memo = sx.remaining_memo
        jobs = state.canonical.jobs
        specs = list(self.specs)
        pieces = list(self.pieces)
        changed = False
        for i in jobs_moved:
            job_id = self.jobs[i]
            spec = memo.get(job_id)
            if spec is None or estimates.get(spec[4]) is not spec[5]:
                spec = memo[job_id] = release_spec(state, jobs[job_id])
            used = specs[i]
            specs[i] = spec
            if spec[:4] != used[:4]:
                pieces[i] = (*_release_piece(spec, self.t0, LINDY_FLOOR_FRACTION), pieces[i][4])
                changed = True
        if changed:
            if t >= min(p[2] for p in pieces):
                return False
            self.pieces = pieces
            self.lines = {}
            self._sort()
        self.specs = specs
        return True

    def releases_at(self, state: State, t: int) -> list[tuple[int, int]] | None:
        """(ms until release, GPUs) of the node's jobs at time `t`, soonest first, as
        `core.forecast.waits.node_releases` works them out; None when its pieces no longer tell
        (before `t0`, past a piece's end, or a learned runtime changed them)."""
        if not self.t0 <= t < self.pieces_end or not self.refreshed(state, t):
            return None
        releases = [(c + s * t, gpus) for c, s, _, _, gpus in self.order]
        releases.sort()
        return releases

    def line(self, need: int) -> tuple:
        """(intercept, slope, end) of when `need` GPUs fit (see the class)."""
        if self.free >= need:
            return (0, 0, NEVER)
        total = self.free
        order = self.order
        end = NEVER
        k = 0
        while True:  # the k-th job, soonest first, where the GPUs add up to `need`
            if k == len(order):
                return (0, None, NEVER)
            end = min(end, order[k][2])
            total += order[k][4]
            if total >= need:
                break
            k += 1
        c, s = order[k][0], order[k][1]
        t0 = self.t0
        for j in range(k + 1, len(order)):
            if order[j][3] < end:
                end = order[j][3]
        for cj, sj, _, _, _ in order:
            if sj != s:
                # c + s t = cj + sj t: valid through the crossing's integer floor.
                cross = (cj - c) // (s - sj)
                if cross >= t0 and cross + 1 < end:
                    end = cross + 1
        return (c, s, end)


NEVER = 1 << 62


def _release_piece(spec: tuple, t0: int, floor_fraction: int) -> tuple[int, int, int, int]:
    """(intercept, slope, end, end_above): `core.forecast.waits.remaining_at(spec, t) ==
    intercept + slope * t` for `t0 <= t < end` (it mirrors that formula: change both, the
    test compares them); `end_above`: when a line below this one may pass it without
    crossing this piece (NEVER: the next piece starts where this one ends and grows at
    least as fast)."""
    fixed, total, done, since = spec[:4]
    if fixed >= 0:
        return (fixed, 0, NEVER, NEVER)
    floor = max(total // floor_fraction, 1)
    if t0 < since:  # not progressing yet; then it may fall
        return (max(total - done, done - total, floor), 0, since, since)
    ends = since + total - done  # when the job reaches its expected runtime
    if t0 < ends - floor:
        return (ends, -1, ends - floor, NEVER)  # falling, until the floor
    if t0 < ends + floor:
        return (floor, 0, ends + floor, NEVER)  # the floor around its estimate
    return (-ends, 1, NEVER, NEVER)  # overrunning: as long again as it has overrun
