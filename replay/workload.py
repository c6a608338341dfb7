"""Workloads for the simulator: the canonical trace CSV, the Philly trace, and the seeded
defaults for what a trace does not say.

Canonical CSV: a header line, then one job a row with the columns
`job,submit_s,duration_s,gpus` and optionally `gpu_model,team,user,level,ckpt_interval_s,
ckpt_cost_s,restore_cost_s,est_runtime_s`. Columns may come in any order; an empty cell
counts as missing.

Philly (`replay/traces/philly.csv.gz`, part of the project: see replay/traces/SOURCE.md for
where it comes from and its licence; columns `timestamp,duration,num_gpus,gpu_time,cluster`): rows are sorted by timestamp (ties by file order), t=0 is the first
submit, `cluster` (the Philly virtual cluster) is the team, jobs are named `ph-<row>`.

Alibaba GPU v2023 (`replay/traces/alibaba-gpu-v2023.csv.gz`, `alibaba` or
`alibaba:gpu-v2023`; converted by scripts/convert_alibaba_gpu_v2023.py, source and licence
in replay/traces/SOURCE.md): a canonical CSV (`job,submit_s,duration_s,gpus`) with the
pod's Kubernetes-style QoS class in `qos`. The class sets a band of levels
(ALIBABA_QOS_LEVELS: Guaranteed 0-1, LS 0-4, Burstable 3-5, BE 5-7) and the seed draws the
level inside the band with DEFAULT_LEVEL_WEIGHTS restricted to it, so each class keeps its
rank against the others and the whole keeps about the default mix. Team and user are
seeded defaults (the trace names neither).

Missing columns get these seeded defaults (one `random.Random(seed)` stream per column,
drawn in job order, so the same seed gives the same workload, and adding a column to a
trace does not shift the draws of the others):

- level: 0..7 with probabilities DEFAULT_LEVEL_WEIGHTS (1%, 4%, 10%, 20%, 25%, 20%, 12%, 8%):
  emergency fixes are rare, most work is mid-priority, a tail is batch exploration.
- team: one of `team0`..`team7`, uniformly.
- user: `<team>-u<k>`, k Zipf-like over 1..USERS_PER_TEAM (a few users submit most jobs).
- gpu_model: any model of the cluster (the job names none).
- ckpt_interval_s: 0 (the job never checkpoints) with 10%, else 600, 1200, 1800 or 3600 s
  with 20%, 30%, 30%, 20% of the rest.
- ckpt_cost_s: uniform 10..60 s times (1 + log2(gpus)/4): bigger jobs write bigger
  checkpoints.
- restore_cost_s: the checkpoint cost times uniform 1.0..2.0 (reading plus warm-up).
- est_runtime_s (what the user asks for, like a Slurm time limit): the true duration times
  uniform 1.0..3.0 (users over-estimate), at least 60 s.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import math
import random
from dataclasses import dataclass, field

DEFAULT_LEVEL_WEIGHTS = (0.01, 0.04, 0.10, 0.20, 0.25, 0.20, 0.12, 0.08)
DEFAULT_TEAMS = 8
USERS_PER_TEAM = 12
CKPT_INTERVALS_S = (600.0, 1200.0, 1800.0, 3600.0)
CKPT_INTERVAL_WEIGHTS = (0.2, 0.3, 0.3, 0.2)
NO_CHECKPOINT_FRACTION = 0.10
PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "cluster")
# Kubernetes-style QoS class of an Alibaba pod -> the levels it may be drawn at. Guaranteed
# pods have their resources reserved (the most protected class); LS pods are latency-
# sensitive services with an SLO, the upper half of the ladder; Burstable pods are the
# ordinary middle; BE (best effort) pods are the ones a cluster throttles or evicts first,
# xirang's preemptible bottom.
ALIBABA_QOS_LEVELS: dict[str, tuple[int, ...]] = {
    "Guaranteed": (0, 1),
    "LS": (0, 1, 2, 3, 4),
    "Burstable": (3, 4, 5),
    "BE": (5, 6, 7),
}
ALIBABA_TRACES = {"gpu-v2023": "alibaba-gpu-v2023.csv.gz"}
ALIBABA_COLUMNS = ("job", "submit_s", "duration_s", "gpus", "qos")
CANONICAL_REQUIRED = ("job", "submit_s", "duration_s", "gpus")
CANONICAL_OPTIONAL = (
    "gpu_model",
    "team",
    "user",
    "level",
    "ckpt_interval_s",
    "ckpt_cost_s",
    "restore_cost_s",
    "est_runtime_s",
)


class TraceError(ValueError):
    """A trace file that cannot be used; the message says what to fix."""


@dataclass(slots=True)
class TraceJob:
    """One job of a workload; times in milliseconds from the start of the trace."""

    id: str
    submit_ms: int
    duration_ms: int  # compute needed when never interrupted
    gpus: int
    team: str
    user: str
    level: int
    gpu_models: list[str]
    ckpt_interval_ms: int  # 0: never checkpoints
    ckpt_cost_ms: int
    restore_cost_ms: int
    est_runtime_ms: int
    fails: bool = False  # its process exits with an error at its end (`finished` ok=false)


@dataclass
class Workload:
    """The jobs of a trace, in arrival order, and which columns got seeded defaults."""

    name: str
    jobs: list[TraceJob]  # sorted by (submit_ms, order in the file)
    seed: int
    defaulted: list[str] = field(default_factory=list)  # columns that got seeded defaults

    def limit(self, n: int | None) -> "Workload":
        """The first `n` jobs (all when n is None)."""
        if n is None:
            return self
        return Workload(self.name, self.jobs[:n], self.seed, self.defaulted)


# ---------------------------------------------------------------- loaders


def load_philly(path: str, seed: int = 0, limit: int | None = None) -> Workload:
    """The Philly trace as a workload (see the module docstring for its columns and defaults)."""
    rows = _read_rows(path)
    if not rows:
        raise TraceError(f"{path}: no jobs")
    missing = [c for c in PHILLY_COLUMNS if c not in rows[0][1]]
    if missing:
        raise TraceError(f"{path}: not a Philly trace, missing columns {', '.join(missing)}")
    parsed = []
    for line_no, row in rows:
        try:
            submit = dt.datetime.fromisoformat(row["timestamp"]).replace(tzinfo=dt.timezone.utc)
            parsed.append(
                (
                    submit.timestamp(),
                    line_no,
                    float(row["duration"]),
                    int(float(row["num_gpus"])),
                    row["cluster"],
                )
            )
        except ValueError as err:
            raise TraceError(f"{path}:{line_no}: {err}") from err
    parsed.sort(key=lambda r: (r[0], r[1]))
    if limit is not None:
        parsed = parsed[:limit]
    t0 = parsed[0][0]
    raw = [
        dict(
            job=f"ph-{line_no - 1:06d}",
            submit_s=submit - t0,
            duration_s=duration,
            gpus=gpus,
            team=team or None,
        )
        for submit, line_no, duration, gpus, team in parsed
    ]
    return _complete("philly", raw, seed, path)


def load_canonical(path: str, seed: int = 0, limit: int | None = None) -> Workload:
    """A canonical trace CSV as a workload; `TraceError` names the file and line of what is
    wrong."""
    rows = _read_rows(path)
    if not rows:
        raise TraceError(f"{path}: no jobs")
    header = rows[0][1].keys()
    missing = [c for c in CANONICAL_REQUIRED if c not in header]
    if missing:
        raise TraceError(
            f"{path}: missing required columns {', '.join(missing)} (need {','.join(CANONICAL_REQUIRED)})"
        )
    raw = []
    for line_no, row in rows:
        try:
            raw.append(_canonical_row(row))
        except (ValueError, TypeError) as err:
            raise TraceError(f"{path}:{line_no}: {err}") from err
    order = sorted(range(len(raw)), key=lambda i: (raw[i]["submit_s"], i))
    raw = [raw[i] for i in order]
    if limit is not None:
        raw = raw[:limit]
    seen: set[str] = set()
    for item in raw:
        if item["job"] in seen:
            raise TraceError(f"{path}: job id {item['job']!r} appears twice")
        seen.add(item["job"])
    t0 = raw[0]["submit_s"] if raw else 0.0
    for item in raw:
        item["submit_s"] -= t0
    return _complete(path, raw, seed, path)


def load_alibaba(path: str, seed: int = 0, limit: int | None = None, name: str = "alibaba") -> Workload:
    """The converted Alibaba GPU trace as a workload: a canonical CSV whose `qos` column sets
    each job's band of levels (ALIBABA_QOS_LEVELS); the level inside the band is drawn from
    the seed (see the module docstring)."""
    rows = _read_rows(path)
    if not rows:
        raise TraceError(f"{path}: no jobs")
    missing = [c for c in ALIBABA_COLUMNS if c not in rows[0][1]]
    if missing:
        raise TraceError(f"{path}: not a converted Alibaba trace, missing columns {', '.join(missing)}")
    raw = []
    for line_no, row in rows:
        qos = row["qos"]
        if qos not in ALIBABA_QOS_LEVELS:
            raise TraceError(
                f"{path}:{line_no}: qos must be one of {', '.join(ALIBABA_QOS_LEVELS)}, got {qos!r}"
            )
        try:
            item = _canonical_row(row)
        except (ValueError, TypeError) as err:
            raise TraceError(f"{path}:{line_no}: {err}") from err
        item["qos"] = qos
        raw.append(item)
    order = sorted(range(len(raw)), key=lambda i: (raw[i]["submit_s"], i))
    raw = [raw[i] for i in order]
    if limit is not None:
        raw = raw[:limit]
    # Drawn in job order from one stream of its own, so a limit keeps the first jobs' levels.
    draw = random.Random(f"{seed}/alibaba-qos-level")
    for item in raw:
        band = ALIBABA_QOS_LEVELS[item.pop("qos")]
        if item.get("level") is None:
            item["level"] = draw.choices(band, [DEFAULT_LEVEL_WEIGHTS[lv] for lv in band])[0]
    t0 = raw[0]["submit_s"] if raw else 0.0
    for item in raw:
        item["submit_s"] -= t0
    return _complete(name, raw, seed, path)


def alibaba_path(spec: str) -> str:
    """The project's copy of the Alibaba trace that `spec` (`alibaba` or `alibaba:<name>`)
    names."""
    import os

    which = spec.partition(":")[2] or "gpu-v2023"
    if which not in ALIBABA_TRACES:
        raise TraceError(f"{spec}: unknown Alibaba trace {which!r}; known: {', '.join(ALIBABA_TRACES)}")
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces", ALIBABA_TRACES[which])
    if not os.path.exists(path):
        raise TraceError(f"the project's Alibaba trace is missing ({path}); restore it from git")
    return path


def load_trace(
    spec: str, seed: int = 0, limit: int | None = None, philly_path: str | None = None
) -> Workload:
    """`philly` (the project's copy of the Philly trace), `alibaba` or `alibaba:gpu-v2023`
    (the project's copy of Alibaba's GPU trace of 2023), `bursts:<gpus>[:<load>]`
    (generated: urgent bursts over an overloaded background, see replay/generate.py) or the
    path of a canonical CSV."""
    if spec == "philly":
        return load_philly(philly_path or default_philly_path(), seed, limit)
    if spec == "alibaba" or spec.startswith("alibaba:"):
        return load_alibaba(alibaba_path(spec), seed, limit, name=spec)
    if spec.startswith("bursts:"):
        from .generate import bursts_rows, parse_bursts_spec

        try:
            gpus, load = parse_bursts_spec(spec)
        except ValueError as err:
            raise TraceError(str(err)) from None
        name, raw = bursts_rows(seed, gpus, load)
        return _complete(name, raw, seed, name).limit(limit)
    return load_canonical(spec, seed, limit)


def default_philly_path() -> str:
    """The Philly trace that ships with the project (gzip-compressed CSV)."""
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "traces", "philly.csv.gz")
    if not os.path.exists(path):
        raise TraceError(f"the project's Philly trace is missing ({path}); restore it from git")
    return path


def _read_rows(path: str) -> list[tuple[int, dict[str, str]]]:
    try:
        with _open_text(path) as fh:
            reader = csv.DictReader(fh)
            if reader.fieldnames is None:
                raise TraceError(f"{path}: empty file, expected a header line")
            return [
                (i + 2, {k.strip(): (v or "").strip() for k, v in row.items() if k})
                for i, row in enumerate(reader)
                if any((v or "").strip() for v in row.values())
            ]
    except OSError as err:
        raise TraceError(f"cannot read {path}: {err.strerror}") from err
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err})") from err
    except (gzip.BadGzipFile, EOFError) as err:
        raise TraceError(f"{path}: not a readable gzip file ({err})") from err


def _open_text(path: str):
    """A CSV file for reading; a name ending `.gz` is read through gzip."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", newline="", encoding="utf-8")
    return open(path, newline="", encoding="utf-8")


_KIND = {int: "a whole number", float: "a number", str: "text"}


def _cell(row: dict[str, str], name: str, cast):
    value = row.get(name, "")
    try:
        return cast(value)
    except ValueError:
        raise ValueError(f"{name} must be {_KIND[cast]}, got {value!r}") from None


def _canonical_row(row: dict[str, str]) -> dict:
    def opt(name, cast):
        return _cell(row, name, cast) if row.get(name, "") != "" else None

    item = dict(
        job=row["job"],
        submit_s=_cell(row, "submit_s", float),
        duration_s=_cell(row, "duration_s", float),
        gpus=_cell(row, "gpus", int),
    )
    if not item["job"]:
        raise ValueError("job must be named")
    item.update(
        gpu_model=opt("gpu_model", str),
        team=opt("team", str),
        user=opt("user", str),
        level=opt("level", int),
        ckpt_interval_s=opt("ckpt_interval_s", float),
        ckpt_cost_s=opt("ckpt_cost_s", float),
        restore_cost_s=opt("restore_cost_s", float),
        est_runtime_s=opt("est_runtime_s", float),
    )
    return item


# ---------------------------------------------------------------- seeded defaults


def _complete(name: str, raw: list[dict], seed: int, path: str) -> Workload:
    # One seeded stream per optional column (gpu_model has no drawn default), so that a
    # column's defaults do not change when another column is given.
    streams = {col: random.Random(f"{seed}/{col}") for col in CANONICAL_OPTIONAL if col != "gpu_model"}
    defaulted: set[str] = set()
    jobs = []
    for item in raw:
        jobs.append(_job(item, streams, defaulted, path))
    return Workload(name=name, jobs=jobs, seed=seed, defaulted=sorted(defaulted))


def _job(item: dict, rng: dict[str, random.Random], defaulted: set[str], path: str) -> TraceJob:
    job_id = item["job"]
    duration_s = item["duration_s"]
    gpus = item["gpus"]
    if not (duration_s > 0 and math.isfinite(duration_s)):
        raise TraceError(f"{path}: job {job_id}: duration must be positive, got {duration_s}")
    if gpus <= 0:
        raise TraceError(f"{path}: job {job_id}: gpus must be positive, got {gpus}")
    if item["submit_s"] < 0 or not math.isfinite(item["submit_s"]):
        raise TraceError(f"{path}: job {job_id}: submit_s must be a finite time")

    def take(col, draw):
        value = item.get(col)
        if value is None:
            defaulted.add(col)
            return draw(rng[col])
        return value

    team = take("team", lambda r: f"team{r.randrange(DEFAULT_TEAMS)}")
    user = take("user", lambda r: f"{team}-u{_zipf(r, USERS_PER_TEAM)}")
    level = take("level", lambda r: r.choices(range(8), DEFAULT_LEVEL_WEIGHTS)[0])
    if not 0 <= level <= 7:
        raise TraceError(f"{path}: job {job_id}: level must be 0..7, got {level}")
    interval = take("ckpt_interval_s", _draw_interval)
    cost = take("ckpt_cost_s", lambda r: r.uniform(10.0, 60.0) * (1 + math.log2(gpus) / 4))
    restore = take("restore_cost_s", lambda r: cost * r.uniform(1.0, 2.0))
    est = take("est_runtime_s", lambda r: max(60.0, duration_s * r.uniform(1.0, 3.0)))
    for label, value in (
        ("ckpt_interval_s", interval),
        ("ckpt_cost_s", cost),
        ("restore_cost_s", restore),
        ("est_runtime_s", est),
    ):
        if value < 0 or not math.isfinite(value):
            raise TraceError(f"{path}: job {job_id}: {label} must be a non-negative number")
    if item.get("gpu_model") is None:
        defaulted.add("gpu_model")
    models = [item["gpu_model"]] if item.get("gpu_model") else []
    return TraceJob(
        id=job_id,
        submit_ms=int(round(item["submit_s"] * 1000)),
        duration_ms=max(1, int(round(duration_s * 1000))),
        gpus=gpus,
        team=team,
        user=user,
        level=level,
        gpu_models=models,
        ckpt_interval_ms=int(round(interval * 1000)),
        ckpt_cost_ms=int(round(cost * 1000)),
        restore_cost_ms=int(round(restore * 1000)),
        est_runtime_ms=max(1000, int(round(est * 1000))),
    )


def _draw_interval(r: random.Random) -> float:
    if r.random() < NO_CHECKPOINT_FRACTION:
        return 0.0
    return r.choices(CKPT_INTERVALS_S, CKPT_INTERVAL_WEIGHTS)[0]


def _zipf(r: random.Random, n: int) -> int:
    weights = [1.0 / k for k in range(1, n + 1)]
    return r.choices(range(1, n + 1), weights)[0]


DEFAULTS_HELP = """\
missing trace columns get seeded defaults (the same --seed gives the same workload):
  level            0..7 with 1%, 4%, 10%, 20%, 25%, 20%, 12%, 8%
  team             team0..team7 uniformly (Philly: the virtual cluster)
  user             <team>-u1..u12, Zipf-like
  gpu_model        any model of the cluster
  ckpt_interval_s  none (10%), else 600/1200/1800/3600 s with 20/30/30/20%
  ckpt_cost_s      uniform 10..60 s x (1 + log2(gpus)/4)
  restore_cost_s   ckpt_cost_s x uniform 1.0..2.0
  est_runtime_s    duration x uniform 1.0..3.0 (a user's time limit), at least 60 s
"""
