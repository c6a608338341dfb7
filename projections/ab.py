"""A/B report: per-variant outcomes with seeded bootstrap confidence intervals.

Variants are assigned in the core by a deterministic hash (`core.policy.assign_variant`,
by team or by job, from the policy's `ab_variants`) and recorded on `JobSubmitted.variant`;
the projection keeps them on `jobs.variant`. Here each metric is a per-job value, its mean
is reported with a percentile bootstrap interval (resampling jobs, seeded, so the same
projection always gives the same report), and each variant's difference from the first
variant (the control, in name order) gets its own interval: an interval that excludes 0
is a difference the data support.

Jobs of one team share a variant when the split is by team, and they are not independent;
resampling jobs then understates the spread. Prefer `ab_split_by = "job"` for experiments
that need tight intervals.
"""

from __future__ import annotations

import numpy as np

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95

# metric name -> (SQL expression per job, description)
METRICS = {
    "wait_s": ("waited_ms / 1000.0", "time queued before each start, summed, seconds"),
    "jct_s": ("(end_t - submit_t) / 1000.0", "submit to end, seconds (ended jobs)"),
    "slowdown": ("(end_t - submit_t) / nullif(run_ms, 0)", "JCT over training time (ended jobs)"),
    "preempted": ("CAST(preempt_count > 0 AS DOUBLE)", "share of jobs preempted at least once"),
    "lost_gpu_h": ("lost_progress_ms * gpus / 3600000.0", "progress lost, GPU-hours"),
}


def job_values(con, since_t: int | None = None, until_t: int | None = None) -> dict[str, dict[str, np.ndarray]]:
    """variant -> metric -> per-job values (None-free)."""
    where = ["variant <> ''"]
    params: list = []
    if since_t is not None:
        where.append("submit_t >= ?")
        params.append(since_t)
    if until_t is not None:
        where.append("submit_t <= ?")
        params.append(until_t)
    cols = ", ".join(f"{expr} AS {name}" for name, (expr, _) in METRICS.items())
    rows = con.execute(f"SELECT variant, {cols} FROM jobs WHERE {' AND '.join(where)} ORDER BY job",
                       params).fetchall()
    out: dict[str, dict[str, list]] = {}
    for variant, *values in rows:
        per = out.setdefault(variant, {name: [] for name in METRICS})
        for name, value in zip(METRICS, values):
            if value is not None:
                per[name].append(float(value))
    return {v: {m: np.asarray(xs, dtype=float) for m, xs in per.items()} for v, per in sorted(out.items())}


def bootstrap_mean(values: np.ndarray, rng: np.random.Generator, samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float]:
    if len(values) == 0:
        return (float("nan"), float("nan"))
    idx = rng.integers(0, len(values), size=(samples, len(values)))
    means = values[idx].mean(axis=1)
    alpha = (1 - CONFIDENCE) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def bootstrap_diff(a: np.ndarray, b: np.ndarray, rng: np.random.Generator,
                   samples: int = BOOTSTRAP_SAMPLES) -> tuple[float, float]:
    """Interval for mean(b) - mean(a), resampling each group on its own."""
    if len(a) == 0 or len(b) == 0:
        return (float("nan"), float("nan"))
    ma = a[rng.integers(0, len(a), size=(samples, len(a)))].mean(axis=1)
    mb = b[rng.integers(0, len(b), size=(samples, len(b)))].mean(axis=1)
    alpha = (1 - CONFIDENCE) / 2
    diff = mb - ma
    return float(np.quantile(diff, alpha)), float(np.quantile(diff, 1 - alpha))


def report(con, seed: int = 0, since_t: int | None = None, until_t: int | None = None) -> dict:
    data = job_values(con, since_t, until_t)
    rng = np.random.default_rng(seed)
    variants = list(data)
    out = {"seed": seed, "confidence": CONFIDENCE, "bootstrap_samples": BOOTSTRAP_SAMPLES,
           "metrics": {m: d for m, (_, d) in METRICS.items()}, "variants": {}}
    control = variants[0] if variants else None
    for variant in variants:
        entry = {"jobs": int(max(len(v) for v in data[variant].values()))}
        for metric, values in data[variant].items():
            lo, hi = bootstrap_mean(values, rng)
            cell = {"n": int(len(values)), "mean": float(values.mean()) if len(values) else None,
                    "ci": [lo, hi]}
            if variant != control:
                dlo, dhi = bootstrap_diff(data[control][metric], values, rng)
                cell["diff_vs_control"] = (float(values.mean() - data[control][metric].mean())
                                           if len(values) and len(data[control][metric]) else None)
                cell["diff_ci"] = [dlo, dhi]
                cell["significant"] = bool(dlo > 0 or dhi < 0)
            entry[metric] = cell
        out["variants"][variant] = entry
    out["control"] = control
    return out


def render(rep: dict) -> str:
    if not rep["variants"]:
        return ("no A/B experiment in this projection: set `ab_variants` in the policy (a"
                " set_policy input) so that jobs get a variant")
    lines = [f"A/B report: {int(rep['confidence'] * 100)}% bootstrap intervals ({rep['bootstrap_samples']}"
             f" resamples, seed {rep['seed']}); control = {rep['control']}"]
    head = f"{'metric':<11}" + "".join(f"{v + ' (' + str(e['jobs']) + ' jobs)':>38}" for v, e in rep["variants"].items())
    lines += [head, "-" * len(head)]
    for metric in rep["metrics"]:
        row = f"{metric:<11}"
        for variant, entry in rep["variants"].items():
            cell = entry[metric]
            if cell["mean"] is None:
                row += f"{'–':>38}"
                continue
            text = f"{cell['mean']:.4g} [{cell['ci'][0]:.4g}, {cell['ci'][1]:.4g}]"
            if "diff_ci" in cell:
                text += " *" if cell["significant"] else "  "
            row += f"{text:>38}"
        lines.append(row)
    lines.append("* the difference from the control excludes 0 at this confidence")
    return "\n".join(lines)
