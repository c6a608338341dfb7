"""The scorecard: what each policy did to the same workload, side by side.

    from replay.scorecard import scorecard, render_table, write_outputs
    card = scorecard(results)            # results: list[replay.sim.SimResult], same workload
    print(render_table(card))
    write_outputs(card, results, "out/")  # scorecard.json, scorecard.duckdb, *.png

Definitions (times in seconds unless named otherwise):
- queueing delay: submit to the first `started` (a job never started has none: it is
  counted in `unstarted` and its level's longest wait is reported as null/"never");
- all waits (`wait_s_levels_0_1_all`): every span a job of levels 0-1 spent without GPUs
  between its submit and its finish (or the run's end), so the wait again after a
  preemption counts too. The first-start delay alone flatters a policy that starts urgent
  jobs at once and preempts them again (k8s-style's level-1 gangs under level-0 bursts);
  reported beside the checked p99, not one of the checks;
- JCT: submit to finish;
- per level: mean, p50, p99 (numpy's linear interpolation) and max of both; the level is
  the job's submitted level, whatever aging did;
- preemptions: times a running job was stopped for another (notices that were withdrawn
  do not count); `jobs_preempted`: jobs stopped at least once;
- lost GPU-hours: GPUs x (progress thrown away + checkpoints written because of a notice +
  time frozen at a safe point + restores after a preemption); periodic checkpoints are
  reported apart (`periodic_ckpt_gpu_h`), since every policy pays them alike;
- utilisation: GPU-time held by job processes over GPUs x the run's end time;
  `useful_util`: GPU-time of the work the trace asks for over the same;
- Jain's fairness across teams, J = (sum x)^2 / (n sum x^2) (1 is perfectly even, 1/n is
  one team getting everything), over two yardsticks x:
  - `jain_teams`: the teams' service fractions x = sum(gpus x duration) / sum(gpus x JCT)
    of their finished jobs (the share of a team's job-time spent being served; 1 = nobody
    waited). Short jobs weigh heavily: a 10-second job that waited a day is a team's 0.
  - `jain_teams_share`: the GPU-time a team held over the GPU-time its max-min fair share
    entitled it to, integrated over the run. At each moment a team's demand is the GPUs
    of its jobs submitted and not finished; the pool is water-filled over the demands
    (no team gets more than it asks for, the rest is split evenly); x = held / entitled.
    1 for every team means each got its fair share whenever it wanted GPUs. This is Jain's
    own form (Jain, Chiu and Hawe, 1984: x = allocation over the fair allocation).
- acceptance (when xirang, k8s and none ran): xirang's targets for xirang's row (docs/SIMULATOR.md). The
  target "Jain's fairness across teams >= 0.9" is checked on `jain_teams_share`, the
  index's own normalisation (allocation over fair allocation). `jain_teams` is reported
  beside it without a target: a service fraction is not an allocation, and it cannot reach
  1 for a team that asks for more than its fair share of a loaded pool under any fair
  scheduler (its jobs must wait), nor for a team of short jobs that wait at all.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import numpy as np

from core.explain import human_duration
from core.rules.shares import max_min_shares

from .sim import SimResult

HOUR_MS = 3_600_000
LEVELS = range(8)
FAIR_SHARE_LEVELS = (3, 4, 5)  # team fair share decides inside these levels
# Each less urgent level's mean wait may be at most this many times no preemption's.
LEVEL_MEAN_WAIT_VS_NONE_MAX = 1.25
CHECKED_LEVELS = (3, 4, 5, 6, 7)


def _stats(values: np.ndarray) -> dict:
    if values.size == 0:
        return {"n": 0, "mean": None, "p50": None, "p99": None, "max": None}
    return {
        "n": int(values.size),
        "mean": round(float(values.mean()), 3),
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
        "max": round(float(values.max()), 3),
    }


def jain(values: list[float]) -> float | None:
    """Jain's fairness index of the values (1: all equal), None when there are none."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    total = sum(values)
    squares = sum(v * v for v in values)
    return round(total * total / (len(values) * squares), 4) if squares else None


def policy_card(result: SimResult) -> dict:
    """One policy's scorecard: waits, JCT, preemptions, lost GPU-hours, utilisation and
    fairness, overall and per level."""
    jobs = result.jobs
    level = np.array([j.level for j in jobs])
    gpus = np.array([j.gpus for j in jobs], dtype=float)
    submit = np.array([j.submit_ms for j in jobs], dtype=float)
    start = np.array([j.first_start_ms for j in jobs], dtype=float)
    finish = np.array([j.finish_ms for j in jobs], dtype=float)
    duration = np.array([j.duration_ms for j in jobs], dtype=float)
    started = start >= 0
    done = finish >= 0
    wait_s = (start - submit) / 1000
    jct_s = (finish - submit) / 1000
    levels = {}
    for lv in LEVELS:
        mask = level == lv
        entry = {
            "jobs": int(mask.sum()),
            "unstarted": int((mask & ~started).sum()),
            "wait_s": _stats(wait_s[mask & started]),
            "jct_s": _stats(jct_s[mask & done]),
        }
        if entry["unstarted"]:
            entry["wait_s"]["max"] = None  # never started: the longest wait is unbounded
        levels[str(lv)] = entry
    urgent = (level <= 1) & started
    downgraded = set(result.extra.get("downgraded", ()))
    was_downgraded = np.array([j.id in downgraded for j in jobs], dtype=bool)
    lost_ms = sum(j.gpus * j.lost_progress_ms for j in jobs)
    overhead_ms = sum(j.gpus * j.overhead_ms for j in jobs)
    end = max(result.end_ms, 1)
    held = sum(j.gpus * j.held_ms for j in jobs)
    all_waits_s = np.array([_all_waits_ms(j, result.end_ms) / 1000 for j in jobs], dtype=float)
    teams = _teams(jobs, result.total_gpus)
    longest = int(np.argmax(np.where(started, wait_s, -1))) if started.any() else None
    return {
        "policy": result.policy,
        "jobs": len(jobs),
        "unstarted": int((~started).sum()),
        "unfinished": int((~done).sum()),
        "wait_s": _stats(wait_s[started]),
        "jct_s": _stats(jct_s[done]),
        "wait_s_levels_0_1": _stats(wait_s[urgent]),
        "wait_s_levels_0_1_all": _stats(all_waits_s[urgent]),
        "wait_s_levels_0_1_downgraded": _stats(wait_s[urgent & was_downgraded]),
        "wait_s_levels_0_1_not_downgraded": _stats(wait_s[urgent & ~was_downgraded]),
        "level_team_jain": {
            str(lv): jain(list(_level_share_of_time(jobs, lv).values())) for lv in FAIR_SHARE_LEVELS
        },
        "levels": levels,
        "preemptions": int(sum(j.preemptions for j in jobs)),
        "jobs_preempted": int(sum(1 for j in jobs if j.preemptions)),
        "lost_gpu_h": round((lost_ms + overhead_ms) / HOUR_MS, 3),
        "lost_progress_gpu_h": round(lost_ms / HOUR_MS, 3),
        "preemption_overhead_gpu_h": round(overhead_ms / HOUR_MS, 3),
        "periodic_ckpt_gpu_h": round(sum(j.gpus * j.periodic_ckpt_ms for j in jobs) / HOUR_MS, 3),
        "util": round(held / (result.total_gpus * end), 4),
        "useful_util": round(float((gpus * duration)[done].sum()) / (result.total_gpus * end), 4),
        "jain_teams": jain([t["service_fraction"] for t in teams.values()]),
        "jain_teams_share": jain([t["share_of_fair"] for t in teams.values()]),
        "teams": teams,
        "longest_wait": None
        if longest is None
        else {
            "job": jobs[longest].id,
            "level": jobs[longest].level,
            "wait_s": round(float(wait_s[longest]), 3),
        },
        "end_s": round(result.end_ms / 1000, 3),
        "sim_wall_s": round(result.wall_s, 3),
        "steps": result.steps,
        "sim_events": result.events,
        "extra": result.extra,
    }


def _all_waits_ms(job, end_ms: int) -> int:
    """Milliseconds a started job spent without GPUs from its submit to its finish (or
    `end_ms` when it never finished): its first wait and every wait after a release."""
    until = job.finish_ms if job.finish_ms >= 0 else max(end_ms, job.submit_ms)
    return max(0, until - job.submit_ms - job.held_ms)


def _fair_share_of_time(jobs, total_gpus: int) -> dict[str, float]:
    """Per team: GPU-ms held / GPU-ms its max-min fair share entitled it to (see the module
    docstring); teams that never asked for GPUs are left out."""
    return _share_of_time(jobs, total_gpus)


def _level_share_of_time(jobs, level: int) -> dict[str, float]:
    """Per team, inside one level: GPU-ms its jobs of that level held over the GPU-ms its
    max-min fair share of what the level held entitled it to (team fair share works inside
    a level: who gets the level's next GPUs). Quotas weigh all teams alike here."""
    return _share_of_time([j for j in jobs if j.level == level], None)


def _share_of_time(jobs, capacity: int | None) -> dict[str, float]:
    """Per team: GPU-ms held / GPU-ms its max-min fair share of `capacity` entitled it to,
    the shares re-drawn whenever demand changes; capacity None: whatever the jobs held at
    the time (so the shares are re-drawn on every change)."""
    changes: list[tuple[int, str, int, int]] = []  # (t, team, demand change, held change)
    for j in jobs:
        changes.append((j.submit_ms, j.team, j.gpus, 0))
        if j.finish_ms >= 0:
            changes.append((j.finish_ms, j.team, -j.gpus, 0))
        for start, end in j.held_spans:
            changes.append((start, j.team, 0, j.gpus))
            changes.append((end, j.team, 0, -j.gpus))
    changes.sort(key=lambda c: c[0])
    demand: dict[str, int] = {}
    held: dict[str, int] = {}
    entitled: dict[str, float] = {}
    got: dict[str, float] = {}
    shares: dict[str, float] = {}
    last_t = changes[0][0] if changes else 0
    changed = False
    for t, team, d_demand, d_held in changes:
        if t > last_t:
            if changed:
                shares = _max_min(demand, sum(held.values()) if capacity is None else capacity)
                changed = False
            span = t - last_t
            for name, share in shares.items():
                entitled[name] = entitled.get(name, 0.0) + share * span
                got[name] = got.get(name, 0.0) + held.get(name, 0) * span
            last_t = t
        demand[team] = demand.get(team, 0) + d_demand
        held[team] = held.get(team, 0) + d_held
        changed = changed or bool(d_demand) or capacity is None
    return {name: got[name] / entitled[name] for name in sorted(entitled) if entitled[name] > 0}


def _max_min(demand: dict[str, int], capacity: float) -> dict[str, float]:
    """Water-filling among the teams asking for GPUs, evenly weighted (`core.rules.shares`)."""
    return max_min_shares({name: gpus for name, gpus in demand.items() if gpus > 0}, capacity)


def _teams(jobs, total_gpus: int) -> dict:
    share = _fair_share_of_time(jobs, total_gpus)
    served: dict[str, float] = {}
    spent: dict[str, float] = {}
    count: dict[str, int] = {}
    waits: dict[str, float] = {}
    for j in jobs:
        count[j.team] = count.get(j.team, 0) + 1
        if j.finish_ms < 0:
            continue
        served[j.team] = served.get(j.team, 0.0) + j.gpus * j.duration_ms
        spent[j.team] = spent.get(j.team, 0.0) + j.gpus * max(1, j.finish_ms - j.submit_ms)
        waits[j.team] = waits.get(j.team, 0.0) + (j.first_start_ms - j.submit_ms) / 1000
    return {
        team: {
            "jobs": count[team],
            "service_fraction": round(served[team] / spent[team], 4) if team in spent else None,
            "share_of_fair": round(share[team], 4) if team in share else None,
            "wait_s_mean": round(waits[team] / count[team], 3) if team in waits else None,
        }
        for team in sorted(count)
    }


def scorecard(results: list[SimResult], cards: dict[str, dict] | None = None) -> dict:
    """Every result's card side by side (same workload), with xirang's acceptance checks when
    the peers are there. `cards`: policy -> its `policy_card`, already worked out (e.g. by
    the process that ran it, while the others still ran); the rest are worked out here."""
    if not results:
        raise ValueError("no results to score")
    ready = cards or {}
    cards = {r.policy: ready[r.policy] if r.policy in ready else policy_card(r) for r in results}
    first = results[0]
    card = {
        "workload": first.workload,
        "jobs": len(first.jobs),
        "gpus": first.total_gpus,
        "seed": first.seed,
        "policies": cards,
    }
    if "none" in cards:
        for c in cards.values():
            c["levels_vs_none"] = _levels_vs_none(c, cards["none"])
    if all(name in cards for name in ("xirang", "k8s", "none")):
        card["acceptance"] = acceptance(cards)
    return card


def _levels_vs_none(c: dict, none: dict) -> dict:
    """Per level, the mean and p99 wait over no preemption's (what preemption costs, or
    saves, each level)."""
    out = {}
    for lv in c["levels"]:
        mine, base = c["levels"][lv]["wait_s"], none["levels"][lv]["wait_s"]
        out[lv] = {stat: _ratio_of(mine[stat], base[stat]) for stat in ("mean", "p99")}
    return out


def _ratio_of(a, b):
    if a is None or b is None:
        return None
    return round(a / b, 4) if b > 0 else (1.0 if a == 0 else math.inf)


def acceptance(cards: dict) -> dict:
    """xirang's targets against the peers' cards: urgent wait against k8s and none, lost
    GPU-hours, longest waits, mean wait per level, fairness."""
    x, k, n = cards["xirang"], cards["k8s"], cards["none"]
    xp = x["wait_s_levels_0_1"]["p99"]
    kp = k["wait_s_levels_0_1"]["p99"]
    np_ = n["wait_s_levels_0_1"]["p99"]

    def ratio(a, b):
        if a is None or b is None:
            return None
        return round(a / b, 4) if b > 0 else (0.0 if a == 0 else math.inf)

    vs_k8s = ratio(xp, kp)
    none_over_x = ratio(np_, xp)
    lost_ratio = ratio(x["lost_gpu_h"], k["lost_gpu_h"])
    longest = {lv: x["levels"][lv]["wait_s"]["max"] for lv in x["levels"]}
    mean_ratio = ratio(x["wait_s"]["mean"], n["wait_s"]["mean"])
    level_ratios = [
        (ratio(x["levels"][str(lv)]["wait_s"]["mean"], n["levels"][str(lv)]["wait_s"]["mean"]), lv)
        for lv in CHECKED_LEVELS
        if x["levels"][str(lv)]["jobs"]
    ]
    level_ratios = [r for r in level_ratios if r[0] is not None]
    worst_level = max(level_ratios) if level_ratios else (None, None)
    gaps = [
        (round(x["level_team_jain"][str(lv)] - n["level_team_jain"][str(lv)], 4), lv)
        for lv in FAIR_SHARE_LEVELS
        if x["level_team_jain"].get(str(lv)) is not None and n["level_team_jain"].get(str(lv)) is not None
    ]
    fair_gap = min(gaps) if gaps else (None, None)
    checks = {
        "p99_wait_l01_vs_k8s": {
            "value": vs_k8s,
            "target": "<= 1.5",
            "ok": vs_k8s is not None and vs_k8s <= 1.5,
        },
        "p99_wait_l01_none_over_xirang": {
            "value": none_over_x,
            "target": ">= 10",
            "ok": none_over_x is not None and none_over_x >= 10,
        },
        "lost_gpu_h_vs_k8s": {
            "value": lost_ratio,
            "target": "<= 0.333",
            "ok": lost_ratio is not None and lost_ratio <= 1 / 3,
        },
        "every_job_started": {
            "value": x["unstarted"] == 0,
            "target": "true",
            "ok": x["unstarted"] == 0,
            "longest_wait_s_by_level": longest,
        },
        "mean_wait_vs_none": {
            "value": mean_ratio,
            "target": "<= 1.0",
            "ok": mean_ratio is not None and mean_ratio <= 1.0,
        },
        "level_mean_wait_vs_none_max": {
            "value": worst_level[0],
            "target": f"<= {LEVEL_MEAN_WAIT_VS_NONE_MAX}",
            "level": worst_level[1],
            "ok": worst_level[0] is not None and worst_level[0] <= LEVEL_MEAN_WAIT_VS_NONE_MAX,
        },
        "level_team_fairness_vs_none": {
            "value": fair_gap[0],
            "target": ">= 0 (each of levels 3-5 at least none's Jain)",
            "level": fair_gap[1],
            "ok": fair_gap[0] is not None
            and fair_gap[0] >= 0,  # no tolerance: a level under none's is a miss
        },
    }
    # Reported beside the checks, not one of them: see the module doc.
    all_waits_vs_k8s = ratio(
        x.get("wait_s_levels_0_1_all", {}).get("p99"), k.get("wait_s_levels_0_1_all", {}).get("p99")
    )
    reported = {
        "p99_all_waits_l01_vs_k8s": {
            "value": all_waits_vs_k8s,
            "what": "levels 0-1 p99 of all waits (again after a preemption too) over k8s-style's",
        },
        "jain_teams": {"value": x["jain_teams"], "what": "Jain over the teams' service fractions"},
        "jain_teams_share": {
            "value": x["jain_teams_share"],
            "what": "Jain over the teams' held / cross-pool fair share",
        },
    }
    return {
        "xirang_p99_wait_l01_s": xp,
        "k8s_p99_wait_l01_s": kp,
        "none_p99_wait_l01_s": np_,
        "checks": checks,
        "reported": reported,
        "all_ok": all(c["ok"] for c in checks.values()),
    }


# ---------------------------------------------------------------- terminal table


def _h(seconds) -> str:
    return "never" if seconds is None else human_duration(seconds * 1000)


def _ratio(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def render_table(card: dict) -> str:
    """The scorecard as text tables for the terminal."""
    cards = card["policies"]
    lines = [f"workload {card['workload']}: {card['jobs']} jobs on {card['gpus']} GPUs, seed {card['seed']}"]
    head = (
        "policy",
        "wait mean",
        "p50",
        "p99",
        "max",
        "JCT mean",
        "JCT p99",
        "preempt",
        "lost GPU-h",
        "util",
        "Jain",
        "Jain share",
        "unstarted",
        "sim s",
    )
    rows = [head]
    for name, c in cards.items():
        w, j = c["wait_s"], c["jct_s"]
        rows.append(
            (
                name,
                _h(w["mean"]),
                _h(w["p50"]),
                _h(w["p99"]),
                _h(w["max"]),
                _h(j["mean"]),
                _h(j["p99"]),
                str(c["preemptions"]),
                f"{c['lost_gpu_h']:.1f}",
                f"{c['util']:.3f}",
                _ratio(c["jain_teams"]),
                _ratio(c["jain_teams_share"]),
                str(c["unstarted"]),
                f"{c['sim_wall_s']:.0f}",
            )
        )
    lines += _grid(rows)
    for title, metric in (
        ("queueing delay p99 by level", "p99"),
        ("mean queueing delay by level", "mean"),
        ("longest wait by level", "max"),
    ):
        lines.append("")
        lines.append(title + ":")
        rows = [("policy",) + tuple(f"L{lv}" for lv in LEVELS)]
        for name, c in cards.items():
            rows.append(
                (name,)
                + tuple(
                    "-" if c["levels"][str(lv)]["jobs"] == 0 else _h(c["levels"][str(lv)]["wait_s"][metric])
                    for lv in LEVELS
                )
            )
        lines += _grid(rows)
    if any("levels_vs_none" in c for c in cards.values()):
        for title, metric in (("mean wait by level / none's", "mean"), ("p99 wait by level / none's", "p99")):
            lines.append("")
            lines.append(title + ":")
            rows = [("policy",) + tuple(f"L{lv}" for lv in LEVELS)]
            for name, c in cards.items():
                rows.append((name,) + tuple(_ratio(c["levels_vs_none"][str(lv)][metric]) for lv in LEVELS))
            lines += _grid(rows)
    lines.append("")
    lines.append("team fairness inside a level (Jain, held / max-min share of the level):")
    rows = [("policy",) + tuple(f"L{lv}" for lv in FAIR_SHARE_LEVELS) + ("L0-1 p99 downgraded", "not")]
    for name, c in cards.items():
        rows.append(
            (name,)
            + tuple(_ratio(c["level_team_jain"][str(lv)]) for lv in FAIR_SHARE_LEVELS)
            + (
                _h(c["wait_s_levels_0_1_downgraded"]["p99"])
                if c["wait_s_levels_0_1_downgraded"]["n"]
                else "-",
                _h(c["wait_s_levels_0_1_not_downgraded"]["p99"]),
            )
        )
    lines += _grid(rows)
    if "acceptance" in card:
        lines.append("")
        lines.append("acceptance (xirang):")
        for name, check in card["acceptance"]["checks"].items():
            lines.append(
                f"  {'PASS' if check['ok'] else 'MISS'}  {name}: {check['value']} (target {check['target']})"
            )
        for name, item in card["acceptance"].get("reported", {}).items():
            lines.append(f"  info  {name}: {item['value']} ({item['what']}; no target)")
    return "\n".join(lines)


def _grid(rows) -> list[str]:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            str(cell).rjust(widths[i]) if i else str(cell).ljust(widths[i]) for i, cell in enumerate(row)
        )
        for row in rows
    ]


# ---------------------------------------------------------------- files


def write_outputs(card: dict, results: list[SimResult], out_dir: str) -> list[str]:
    """Write scorecard.json, scorecard.duckdb and the charts into `out_dir`; their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [
        write_json(card, os.path.join(out_dir, "scorecard.json")),
        write_duckdb(card, results, os.path.join(out_dir, "scorecard.duckdb")),
    ]
    paths += write_charts(card, results, out_dir)
    return paths


def write_json(card: dict, path: str) -> str:
    """Write the scorecard as sorted, indented JSON; the path."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(card, fh, indent=2, sort_keys=True, default=_json_default)
        fh.write("\n")
    return path


def _json_default(value):
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    raise TypeError(f"not JSON: {value!r}")


def write_duckdb(card: dict, results: list[SimResult], path: str) -> str:
    """Tables: policies (one row each), levels, teams, jobs (every job under every policy)."""
    import duckdb

    if os.path.exists(path):
        os.remove(path)
    con = duckdb.connect(path)
    try:
        con.execute("""CREATE TABLE policies (policy VARCHAR, jobs INTEGER, unstarted INTEGER,
            wait_mean_s DOUBLE, wait_p50_s DOUBLE, wait_p99_s DOUBLE, wait_max_s DOUBLE,
            jct_mean_s DOUBLE, jct_p99_s DOUBLE, wait_p99_l01_s DOUBLE, preemptions INTEGER,
            jobs_preempted INTEGER, lost_gpu_h DOUBLE, lost_progress_gpu_h DOUBLE,
            preemption_overhead_gpu_h DOUBLE, periodic_ckpt_gpu_h DOUBLE, util DOUBLE,
            useful_util DOUBLE, jain_teams DOUBLE, jain_teams_share DOUBLE, end_s DOUBLE,
            sim_wall_s DOUBLE, steps BIGINT, workload VARCHAR, gpus INTEGER, seed BIGINT)""")
        con.execute("""CREATE TABLE levels (policy VARCHAR, level INTEGER, jobs INTEGER,
            unstarted INTEGER, wait_mean_s DOUBLE, wait_p50_s DOUBLE, wait_p99_s DOUBLE,
            wait_max_s DOUBLE, jct_mean_s DOUBLE, jct_p50_s DOUBLE, jct_p99_s DOUBLE, jct_max_s DOUBLE)""")
        con.execute("""CREATE TABLE teams (policy VARCHAR, team VARCHAR, jobs INTEGER,
            service_fraction DOUBLE, share_of_fair DOUBLE, wait_mean_s DOUBLE)""")
        for name, c in card["policies"].items():
            w, j = c["wait_s"], c["jct_s"]
            con.execute(
                "INSERT INTO policies VALUES (" + ",".join("?" * 26) + ")",
                [
                    name,
                    c["jobs"],
                    c["unstarted"],
                    w["mean"],
                    w["p50"],
                    w["p99"],
                    w["max"],
                    j["mean"],
                    j["p99"],
                    c["wait_s_levels_0_1"]["p99"],
                    c["preemptions"],
                    c["jobs_preempted"],
                    c["lost_gpu_h"],
                    c["lost_progress_gpu_h"],
                    c["preemption_overhead_gpu_h"],
                    c["periodic_ckpt_gpu_h"],
                    c["util"],
                    c["useful_util"],
                    c["jain_teams"],
                    c["jain_teams_share"],
                    c["end_s"],
                    c["sim_wall_s"],
                    c["steps"],
                    card["workload"],
                    card["gpus"],
                    card["seed"],
                ],
            )
            con.executemany(
                "INSERT INTO levels VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    [
                        name,
                        int(lv),
                        e["jobs"],
                        e["unstarted"],
                        e["wait_s"]["mean"],
                        e["wait_s"]["p50"],
                        e["wait_s"]["p99"],
                        e["wait_s"]["max"],
                        e["jct_s"]["mean"],
                        e["jct_s"]["p50"],
                        e["jct_s"]["p99"],
                        e["jct_s"]["max"],
                    ]
                    for lv, e in c["levels"].items()
                ],
            )
            con.executemany(
                "INSERT INTO teams VALUES (?,?,?,?,?,?)",
                [
                    [name, team, t["jobs"], t["service_fraction"], t["share_of_fair"], t["wait_s_mean"]]
                    for team, t in c["teams"].items()
                ],
            )
        _write_jobs_table(con, results)
    finally:
        con.close()
    return path


def _write_jobs_table(con, results: list[SimResult]) -> None:
    # A CSV read by DuckDB is far faster than row inserts for 10^5 rows.
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, encoding="utf-8") as fh:
        fh.write(
            "policy,job,team,user,level,gpus,submit_s,duration_s,wait_s,jct_s,preemptions,"
            "lost_progress_s,overhead_s,periodic_ckpt_s,held_s\n"
        )
        for r in results:
            for j in r.jobs:
                wait = "" if j.first_start_ms < 0 else (j.first_start_ms - j.submit_ms) / 1000
                jct = "" if j.finish_ms < 0 else (j.finish_ms - j.submit_ms) / 1000
                fh.write(
                    f"{r.policy},{j.id},{j.team},{j.user},{j.level},{j.gpus},{j.submit_ms / 1000},"
                    f"{j.duration_ms / 1000},{wait},{jct},{j.preemptions},{j.lost_progress_ms / 1000},"
                    f"{j.overhead_ms / 1000},{j.periodic_ckpt_ms / 1000},{j.held_ms / 1000}\n"
                )
        tmp = fh.name
    try:
        con.execute(f"""CREATE TABLE jobs AS SELECT * FROM read_csv('{tmp}', header=true, columns={{
            'policy':'VARCHAR','job':'VARCHAR','team':'VARCHAR','user':'VARCHAR','level':'INTEGER',
            'gpus':'INTEGER','submit_s':'DOUBLE','duration_s':'DOUBLE','wait_s':'DOUBLE',
            'jct_s':'DOUBLE','preemptions':'INTEGER','lost_progress_s':'DOUBLE',
            'overhead_s':'DOUBLE','periodic_ckpt_s':'DOUBLE','held_s':'DOUBLE'}})""")
    finally:
        os.remove(tmp)


def write_charts(card: dict, results: list[SimResult], out_dir: str) -> list[str]:
    """Draw the wait-by-level, urgent-wait CDF and overview charts as PNGs in `out_dir`; their
    paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cards = card["policies"]
    names = list(cards)
    paths = []

    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        values = [(cards[name]["levels"][str(lv)]["wait_s"]["p99"] or 0) / 3600 for lv in LEVELS]
        ax.bar([lv + (i - (len(names) - 1) / 2) * width for lv in LEVELS], values, width, label=name)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlabel("level (0 = most urgent)")
    ax.set_ylabel("p99 queueing delay (hours)")
    ax.set_title(f"p99 queueing delay by level - {card['workload']}, {card['gpus']} GPUs")
    ax.set_xticks(list(LEVELS))
    ax.legend()
    paths.append(_save(fig, out_dir, "wait_p99_by_level.png"))

    fig, ax = plt.subplots(figsize=(10, 5))
    for r in results:
        waits = np.sort(
            np.array(
                [
                    (j.first_start_ms - j.submit_ms) / 1000
                    for j in r.jobs
                    if j.first_start_ms >= 0 and j.level <= 1
                ]
            )
        )
        if waits.size:
            ax.plot(np.maximum(waits, 1), np.arange(1, waits.size + 1) / waits.size, label=r.policy)
    ax.set_xscale("log")
    ax.set_xlabel("queueing delay (s, log; under 1 s drawn at 1 s)")
    ax.set_ylabel("fraction of level 0-1 jobs")
    ax.set_title("queueing delay CDF, levels 0-1")
    ax.legend()
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir, "wait_cdf_levels_0_1.png"))

    fig, axes = plt.subplots(1, 5, figsize=(17, 4))
    panels = (
        ("lost GPU-hours", "lost_gpu_h"),
        ("preemptions", "preemptions"),
        ("utilisation", "util"),
        ("Jain (team service fractions)", "jain_teams"),
        ("Jain (team fair-share use)", "jain_teams_share"),
    )
    for ax, (title, key) in zip(axes, panels):
        ax.bar(names, [cards[n][key] or 0 for n in names], color=[f"C{i}" for i in range(len(names))])
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{card['workload']}: {card['jobs']} jobs, {card['gpus']} GPUs, seed {card['seed']}")
    paths.append(_save(fig, out_dir, "overview.png"))
    return paths


def _save(fig, out_dir: str, name: str) -> str:
    import matplotlib.pyplot as plt

    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
