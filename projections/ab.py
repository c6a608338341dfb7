"""A/B report: per-variant outcomes against the named control, with seeded bootstrap
confidence intervals and a significance verdict.

Variants are assigned in the core by a deterministic hash of an assignment unit (a team, a
user, a job group or a job: `core.model.policy.assign_variant`, `ab_split_by`) and recorded on
`JobSubmitted.variant`; the projection keeps them on `jobs.variant`. The control is the
variant named "control" (a `set_policy` without one is refused; a log from before that
rule falls back to the first variant by name, and the report says so).

Jobs of one unit share a variant and are not independent, so the bootstrap resamples
**units**, not jobs (a cluster bootstrap): each resample draws the variant's units with
replacement and takes every job of each drawn unit. Jain's index is a statistic of the
teams, so its resamples draw **teams** (each with its mean slowdown) and its interval is a
BCa interval (bias-corrected and accelerated, `jain_interval`): resampling units would only
add noise to the team means, and noise always makes teams look less alike, so every such
resample of an index near 1 fell below the index itself. For each metric the report gives
the variant's value with its interval and, against the control, the difference with its
interval and a two-sided bootstrap p-value; a difference is *significant* when its
interval excludes 0. Metrics:

- `urgent_wait_s`: queue wait of jobs submitted at the urgent levels (0-2), and the
  **urgent speedup**: the control's mean urgent wait over the variant's (above 1: faster);
- `wait_s`, `jct_s`: every job's queue wait and completion time;
- `lost_gpu_h`: progress lost to preemptions and checkpoint fallbacks, GPU-hours per job;
- `preempted`: share of jobs preempted at least once;
- `fairness_jain`: Jain's index over the variant's teams of their mean slowdown (JCT over
  training time; 1 = every team served alike);
- `satisfaction`: mean survey score (1..5) of the variant's jobs (`xirang feedback`).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from core.model.policy import AB_CONTROL, Policy, assignment_unit

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95
URGENT_LEVEL_MAX = 2
NORMAL = NormalDist()
TEAMS_FEW = 20  # below it a team bootstrap's interval covers well under its confidence

# per-job metric -> (SQL expression, description)
JOB_METRICS = {
    "urgent_wait_s": (
        f"CASE WHEN level <= {URGENT_LEVEL_MAX} THEN waited_ms / 1000.0 END",
        f"queue wait of jobs of levels 0-{URGENT_LEVEL_MAX}, seconds",
    ),
    "wait_s": ("waited_ms / 1000.0", "time queued before each start, summed, seconds"),
    "jct_s": ("(end_t - submit_t) / 1000.0", "submit to end, seconds (ended jobs)"),
    "lost_gpu_h": ("lost_progress_ms * gpus / 3600000.0", "progress lost, GPU-hours per job"),
    "preempted": ("CAST(preempt_count > 0 AS DOUBLE)", "share of jobs preempted at least once"),
    "satisfaction": ("score", "survey score 1..5 (xirang feedback), mean over answered jobs"),
}
SLOWDOWN = "(end_t - submit_t) / nullif(run_ms, 0)"
DESCRIPTIONS = {
    **{m: d for m, (_, d) in JOB_METRICS.items()},
    "fairness_jain": "Jain's index over teams of mean slowdown (1 = even)",
    "urgent_speedup": "control's mean urgent wait / this variant's (above 1: faster)",
}


def _rows(con, since_t: int | None, until_t: int | None) -> list[tuple]:
    where, params = ["variant <> ''"], []
    if since_t is not None:
        where.append("submit_t >= ?")
        params.append(since_t)
    if until_t is not None:
        where.append("submit_t <= ?")
        params.append(until_t)
    cols = ", ".join(f"{expr} AS {name}" for name, (expr, _) in JOB_METRICS.items())
    feedback = _feedback_table(con)
    return con.execute(
        f'SELECT variant, team, "user", job, {SLOWDOWN}, {cols} FROM jobs'
        f" LEFT JOIN {feedback} USING (job) WHERE {' AND '.join(where)} ORDER BY job",
        params,
    ).fetchall()


def _feedback_table(con) -> str:
    """Each job's latest survey score, or an empty relation on projections without one."""
    has = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'feedback'"
    ).fetchone()[0]
    if has:
        return "(SELECT job, arg_max(score, seq) AS score FROM feedback GROUP BY job)"
    return "(SELECT NULL::VARCHAR AS job, NULL::DOUBLE AS score WHERE false)"


class Units:
    """One variant's jobs grouped by assignment unit, summed per unit (and per unit and
    team, for Jain's index), so that a resample of units is a few array sums."""

    def __init__(self, rows: list[tuple], split_by: str) -> None:
        by_unit: dict[str, list[tuple]] = {}
        for _variant, team, user, job, slowdown, *values in rows:
            by_unit.setdefault(assignment_unit(split_by, team, user, job), []).append(
                (team, slowdown, values)
            )
        self.names = sorted(by_unit)
        teams = sorted({team for jobs in by_unit.values() for team, _, _ in jobs})
        n, m = len(self.names), len(JOB_METRICS)
        self.sums, self.counts = np.zeros((n, m)), np.zeros((n, m))
        self.team_sums, self.team_counts = np.zeros((n, len(teams))), np.zeros((n, len(teams)))
        self.jobs = 0
        for i, unit in enumerate(self.names):
            for team, slowdown, values in by_unit[unit]:
                self.jobs += 1
                for k, value in enumerate(values):
                    if value is not None:
                        self.sums[i, k] += float(value)
                        self.counts[i, k] += 1
                if slowdown is not None:
                    self.team_sums[i, teams.index(team)] += float(slowdown)
                    self.team_counts[i, teams.index(team)] += 1

    def __len__(self) -> int:
        return len(self.names)

    def metric(self, picks: np.ndarray, index: int) -> np.ndarray:
        """The metric's mean over each row of unit picks (NaN where no job has a value)."""
        sums, counts = self.sums[picks, index].sum(axis=-1), self.counts[picks, index].sum(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)

    def team_means(self) -> np.ndarray:
        """Each team's mean slowdown over all of the units' jobs (teams without one left out)."""
        sums, counts = self.team_sums.sum(axis=0), self.team_counts.sum(axis=0)
        return sums[counts > 0] / counts[counts > 0]

    def jobs_count(self) -> int:
        """How many jobs the units hold."""
        return self.jobs


def jain(means: np.ndarray) -> np.ndarray:
    """Jain's index of the values along the last axis: (sum x)^2 / (k sum x^2); 1 when all are
    alike, 1/k when one holds everything (NaN where all are 0)."""
    k = means.shape[-1]
    total, squares = means.sum(axis=-1), (means**2).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((k > 0) & (squares > 0), total**2 / (max(k, 1) * squares), np.nan)


def _stats(units: Units, name: str, picks: np.ndarray) -> np.ndarray:
    return units.metric(picks, list(JOB_METRICS).index(name))


def _stat(units: Units, name: str) -> float | None:
    """The metric over all of the variant's units."""
    if name == "fairness_jain":
        value = float(jain(units.team_means()))
    else:
        value = float(_stats(units, name, np.arange(len(units))[None, :])[0]) if len(units) else float("nan")
    return None if np.isnan(value) else value


def _draws(n: int, rng: np.random.Generator, samples: int) -> np.ndarray:
    return rng.integers(0, n, size=(samples, n)) if n else np.zeros((samples, 0), dtype=int)


def _interval(values: list[float]) -> list[float | None]:
    xs = [v for v in values if v is not None and np.isfinite(v)]
    if not xs:
        return [None, None]
    alpha = (1 - CONFIDENCE) / 2
    return [float(np.quantile(xs, alpha)), float(np.quantile(xs, 1 - alpha))]


def jain_resamples(means: np.ndarray, rng: np.random.Generator, samples: int) -> np.ndarray:
    """Jain's index of `samples` resamples of the teams (drawn with replacement; a team drawn
    twice counts twice)."""
    return jain(means[_draws(len(means), rng, samples)])


def jain_interval(means: np.ndarray, resamples: np.ndarray) -> list[float | None]:
    """The BCa interval of Jain's index over teams with these mean slowdowns, from its team
    resamples: the percentile interval moved by the resamples' bias (z0: the share of them
    below the index) and skew (a: from the jackknife, each team left out in turn), so that it
    need not be widened by hand to hold the index when the index sits near its bound 1."""
    value = float(jain(means)) if len(means) else float("nan")
    xs = resamples[np.isfinite(resamples)]
    if np.isnan(value) or not xs.size:
        return [None, None]
    tie = np.isclose(xs, value, rtol=1e-12, atol=1e-15)
    below = ((xs < value) & ~tie).sum() + 0.5 * tie.sum()
    half = 0.5 / xs.size  # keeps z0 finite when every resample falls on one side
    z0 = NORMAL.inv_cdf(min(max(below / xs.size, half), 1 - half))
    a = _acceleration(means)
    alpha = (1 - CONFIDENCE) / 2
    ends = []
    for z in (NORMAL.inv_cdf(alpha), NORMAL.inv_cdf(1 - alpha)):
        shifted = z0 + z
        ends.append(NORMAL.cdf(z0 + shifted / (1 - a * shifted)))
    lo, hi = np.quantile(xs, ends)
    return [float(lo), float(hi)]


def _acceleration(means: np.ndarray) -> float:
    """BCa's acceleration: the skew of the jackknife values of Jain's index (each team left
    out in turn); 0 with fewer than three teams."""
    k = len(means)
    if k < 3:
        return 0.0
    left_out = jain(np.array([np.delete(means, i) for i in range(k)]))
    spread = left_out.mean() - left_out
    denominator = 6.0 * float((spread**2).sum()) ** 1.5
    return float((spread**3).sum()) / denominator if denominator > 0 else 0.0


def _p_value(diffs: list[float]) -> float | None:
    xs = np.asarray([d for d in diffs if d is not None and np.isfinite(d)], dtype=float)
    if xs.size == 0:
        return None
    below, above = float((xs <= 0).mean()), float((xs >= 0).mean())
    return min(1.0, 2 * min(below, above))


def report(
    con, seed: int = 0, since_t: int | None = None, until_t: int | None = None, policy: Policy | None = None
) -> dict:
    """Every variant's metrics with intervals; against the control, differences, intervals,
    p-values and significance. `policy` says how jobs were split (default: the policy in
    force at the end of the projection)."""
    if policy is None:
        from .policy_history import current_policy

        policy = current_policy(con)
    rows = _rows(con, since_t, until_t)
    names = sorted({r[0] for r in rows})
    out = {
        "seed": seed,
        "confidence": CONFIDENCE,
        "bootstrap_samples": BOOTSTRAP_SAMPLES,
        "split_by": policy.ab_split_by,
        "metrics": DESCRIPTIONS,
        "variants": {},
        "control": None,
    }
    if not names:
        return out
    control = AB_CONTROL if AB_CONTROL in names else names[0]
    out["control"] = control
    if control != AB_CONTROL:
        out["control_note"] = (
            f"no variant is named {AB_CONTROL!r} (a log from before the rule):"
            f" {control!r}, the first by name, stands in"
        )
    rng = np.random.default_rng(seed)
    units = {v: Units([r for r in rows if r[0] == v], policy.ab_split_by) for v in names}
    draws = {v: _draws(len(units[v]), rng, BOOTSTRAP_SAMPLES) for v in names}
    metrics = [*JOB_METRICS, "fairness_jain"]
    boot = {v: {m: _listed(_stats(units[v], m, draws[v])) for m in JOB_METRICS} for v in names}
    for v in names:
        boot[v]["fairness_jain"] = _listed(jain_resamples(units[v].team_means(), rng, BOOTSTRAP_SAMPLES))
    for variant in [control] + [v for v in names if v != control]:
        entry: dict = {
            "jobs": units[variant].jobs_count(),
            "units": len(units[variant]),
            "teams": len(units[variant].team_means()),
        }
        for metric in metrics:
            value = _stat(units[variant], metric)
            cell = {"value": value, "ci": _value_interval(units[variant], metric, boot[variant][metric])}
            if variant != control:
                base = _stat(units[control], metric)
                diffs = [
                    None if a is None or b is None else b - a
                    for a, b in zip(boot[control][metric], boot[variant][metric])
                ]
                cell["diff_vs_control"] = None if value is None or base is None else value - base
                cell["diff_ci"] = _interval(diffs)
                cell["p_value"] = _p_value(diffs)
                lo, hi = cell["diff_ci"]
                cell["significant"] = lo is not None and (lo > 0 or hi < 0)
            entry[metric] = cell
        entry["urgent_speedup"] = _speedup(boot, control, variant, units)
        out["variants"][variant] = entry
    return out


def _listed(values: np.ndarray) -> list[float | None]:
    return [None if np.isnan(x) else float(x) for x in values]


def _value_interval(units: Units, metric: str, resamples: list[float | None]) -> list[float | None]:
    if metric == "fairness_jain":
        xs = np.array([np.nan if x is None else x for x in resamples], dtype=float)
        return jain_interval(units.team_means(), xs)
    return _interval(resamples)


def _speedup(boot: dict, control: str, variant: str, units: dict) -> dict:
    base = _stat(units[control], "urgent_wait_s")
    mine = _stat(units[variant], "urgent_wait_s")
    value = base / mine if base is not None and mine else None
    ratios = [
        a / b if a is not None and b else None
        for a, b in zip(boot[control]["urgent_wait_s"], boot[variant]["urgent_wait_s"])
    ]
    cell = {"value": value, "ci": _interval(ratios)}
    if variant != control:
        lo, hi = cell["ci"]
        cell["significant"] = lo is not None and (lo > 1 or hi < 1)
    return cell


def _fmt(cell: dict) -> str:
    if cell.get("value") is None:
        return "–"
    lo, hi = cell["ci"]
    text = f"{cell['value']:.4g}" + ("" if lo is None else f" [{lo:.4g}, {hi:.4g}]")
    if "significant" in cell:
        text += " *" if cell["significant"] else "  "
    return text


def render(rep: dict) -> str:
    """The A/B report as text (or how to start an experiment when there is none)."""
    if not rep["variants"]:
        return (
            "no A/B experiment in this projection: set `ab_variants` (with a 'control' variant)"
            " in the policy, a set_policy input, so that jobs get a variant"
        )
    lines = [
        f"A/B report: control = {rep['control']}; split by {rep['split_by']};"
        f" {int(rep['confidence'] * 100)}% cluster-bootstrap intervals ({rep['bootstrap_samples']}"
        f" resamples of the assignment units, of the teams for fairness_jain (BCa), seed {rep['seed']})"
    ]
    if "control_note" in rep:
        lines.append(f"note: {rep['control_note']}")
    if "window" in rep:
        lines.append(rep["window"]["text"])
    width = 34
    head = f"{'metric':<15}" + "".join(
        f"{v + ' (' + str(e['jobs']) + ' jobs, ' + str(e['units']) + ' units)':>{width}}"
        for v, e in rep["variants"].items()
    )
    lines += [head, "-" * len(head)]
    for metric in [*JOB_METRICS, "fairness_jain", "urgent_speedup"]:
        lines.append(
            f"{metric:<15}" + "".join(f"{_fmt(e[metric]):>{width}}" for e in rep["variants"].values())
        )
    lines.append(
        "* differs from the control: the interval of the difference (of the ratio, for"
        " urgent_speedup: excludes 1) excludes 0 at this confidence"
    )
    few = sorted(v for v, e in rep["variants"].items() if e.get("teams", TEAMS_FEW) < TEAMS_FEW)
    if few:
        lines.append(
            f"fairness_jain of {', '.join(few)}: fewer than {TEAMS_FEW} teams, too few for its"
            " interval to be trusted (it holds the true index less often than it says)"
        )
    for variant, entry in rep["variants"].items():
        significant = [m for m in [*JOB_METRICS, "fairness_jain"] if entry[m].get("significant")]
        if variant != rep["control"] and significant:
            lines.append(
                f"{variant}: significant against {rep['control']} on {', '.join(significant)}"
                + "".join(f"; {m} p={entry[m]['p_value']:.3g}" for m in significant)
            )
    return "\n".join(lines)
