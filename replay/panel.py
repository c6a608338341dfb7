"""The panel: xirang's default policy beside no preemption and Kubernetes-style preemption on
a fixed set of pools (traces, windows, pool sizes) and seeds, one table with every miss
marked.

    from replay.panel import DEFAULT_POOLS, panel_cases, run_panel
    entries = run_panel(panel_cases(DEFAULT_POOLS, seeds=(0, 1)), out_dir="panel-out")

Each case runs through `replay.sweep.run_case` (so the peers' results can come from the
sweep's cache) and is judged on the panel's acceptance, per pool and seed:

- each of levels 3-7: mean wait at most 1.25x no preemption's (LEVEL_MEAN_WAIT_VS_NONE_MAX);
- each of levels 3-5: team fairness inside the level (Jain) at least no preemption's;
- levels 0-1: p99 wait at most 1.5x Kubernetes-style's;
- lost GPU-hours at most a third of Kubernetes-style's;
- every job starts.

Every check is kept apart (one per level), so a miss names its pool, seed, level and
figure. `panel_table` writes the markdown table (`!` marks a miss) and the list of misses.
"""

from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

from .scorecard import CHECKED_LEVELS, FAIR_SHARE_LEVELS, LEVEL_MEAN_WAIT_VS_NONE_MAX
from .sweep import Case, run_case

PANEL_POLICIES = ("none", "k8s", "xirang")
L01_P99_VS_K8S_MAX = 1.5
LOST_VS_K8S_MAX = 1 / 3


@dataclass(frozen=True)
class Pool:
    """One pool of the panel: a trace, a window of its jobs, a pool size."""

    trace: str
    gpus: int
    window: tuple[int, int] | None = None  # (first job index, job count); None: all

    @property
    def name(self) -> str:
        """The pool's trace and window in words."""
        return _pool_words(self.trace, self.window)

    def spec(self) -> str:
        """The pool as `parse_pools` reads it: TRACE@GPUS[/START:COUNT]."""
        window = "" if self.window is None else f"/{self.window[0]}:{self.window[1]}"
        return f"{self.trace}@{self.gpus}{window}"


# From 32 to 1,024 GPUs, each pool overloaded (no preemption's mean wait is hours): the
# generated bursts trace at its smallest sizes and at 1,024 (Philly leaves 1,024 GPUs
# nearly idle), the Alibaba GPU trace of 2023 at 40 GPUs (at 32 its backlog runs to weeks,
# at 48 it is nearly idle), and Philly's first 5,000, 10,000 and 20,000 jobs at 128, 256
# and 512 GPUs. Windows keep the heavy pools within minutes on a small machine.
DEFAULT_POOLS = (
    Pool("bursts", 32),
    Pool("alibaba", 40),
    Pool("bursts", 64),
    Pool("philly", 128, (0, 5000)),
    Pool("philly", 256, (0, 10000)),
    Pool("philly", 512, (0, 20000)),
    Pool("bursts", 1024),
)
DEFAULT_SEEDS = (0, 1)


def parse_pools(text: str) -> list[Pool]:
    """Pools from `TRACE@GPUS[/START:COUNT],...` (e.g. `bursts@64,philly@128/0:5000`); a
    ValueError says what to fix."""
    pools = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        trace, at, rest = part.partition("@")
        if not trace or not at:
            raise ValueError(f"pool {part!r}: write TRACE@GPUS[/START:COUNT], e.g. philly@128/0:5000")
        gpus_text, slash, window_text = rest.partition("/")
        try:
            gpus = int(gpus_text)
            window = None
            if slash:
                start, count = (int(x) for x in window_text.split(":"))
                window = (start, count)
        except ValueError:
            raise ValueError(f"pool {part!r}: GPUS, START and COUNT must be whole numbers") from None
        if gpus <= 0 or gpus % 8:
            raise ValueError(f"pool {part!r}: GPUS must be a positive multiple of 8 (nodes of 8 GPUs)")
        if window is not None and (window[0] < 0 or window[1] <= 0):
            raise ValueError(f"pool {part!r}: the window needs START >= 0 and COUNT > 0")
        pools.append(Pool(trace, gpus, window))
    if not pools:
        raise ValueError("give at least one pool")
    return pools


def panel_cases(pools, seeds) -> list[Case]:
    """Every pool with every seed, pool by pool."""
    return [Case(p.trace, p.gpus, seed, p.window) for p in pools for seed in seeds]


def judge(entry: dict) -> dict:
    """The panel's figures and checks for one case (a `run_case` entry with none, k8s and
    xirang): each check has its value, its target and whether it holds."""
    pol = entry["card"]["policies"]
    x, k, n = pol["xirang"], pol["k8s"], pol["none"]
    checks: dict[str, dict] = {}
    for lv in CHECKED_LEVELS:
        key = str(lv)
        if not x["levels"][key]["jobs"]:
            continue
        value = _ratio(x["levels"][key]["wait_s"]["mean"], n["levels"][key]["wait_s"]["mean"])
        checks[f"L{lv} mean wait / none"] = {
            "value": value,
            "target": f"<= {LEVEL_MEAN_WAIT_VS_NONE_MAX}",
            "ok": value is not None and value <= LEVEL_MEAN_WAIT_VS_NONE_MAX,
        }
    for lv in FAIR_SHARE_LEVELS:
        mine, base = x["level_team_jain"].get(str(lv)), n["level_team_jain"].get(str(lv))
        if mine is None or base is None:
            continue
        gap = round(mine - base, 4)
        checks[f"L{lv} Jain - none"] = {
            "value": gap,
            "target": ">= 0",
            "ok": gap >= 0,
            "xirang": mine,
            "none": base,
        }
    p99 = _ratio(x["wait_s_levels_0_1"]["p99"], k["wait_s_levels_0_1"]["p99"])
    checks["L0-1 p99 / k8s"] = {
        "value": p99,
        "target": f"<= {L01_P99_VS_K8S_MAX}",
        "ok": p99 is not None and p99 <= L01_P99_VS_K8S_MAX,
    }
    lost = _ratio(x["lost_gpu_h"], k["lost_gpu_h"])
    checks["lost GPU-h / k8s"] = {
        "value": lost,
        "target": "<= 1/3",
        "ok": lost is not None and lost <= LOST_VS_K8S_MAX,
    }
    checks["every job started"] = {
        "value": x["unstarted"] == 0,
        "target": "true",
        "ok": x["unstarted"] == 0,
        "unstarted": x["unstarted"],
    }
    return {
        "checks": checks,
        "none_wait_mean_h": None if n["wait_s"]["mean"] is None else round(n["wait_s"]["mean"] / 3600, 2),
        "xirang_wait_mean_h": None if x["wait_s"]["mean"] is None else round(x["wait_s"]["mean"] / 3600, 2),
        "l01_p99_s": {"xirang": x["wait_s_levels_0_1"]["p99"], "k8s": k["wait_s_levels_0_1"]["p99"]},
        "lost_gpu_h": {"xirang": x["lost_gpu_h"], "k8s": k["lost_gpu_h"]},
        "preemptions": {"xirang": x["preemptions"], "k8s": k["preemptions"]},
        "misses": [name for name, check in checks.items() if not check["ok"]],
    }


def _ratio(a, b):
    if a is None or b is None:
        return None
    if b > 0:
        return round(a / b, 4)
    return 0.0 if a == 0 else float("inf")


def _case_job(args: tuple) -> dict:
    """One case in a worker process (module level, so a process pool can pickle it)."""
    case, config, cache_dir = args
    began = time.perf_counter()
    entry = run_case(case, list(PANEL_POLICIES), config, cache_dir)
    entry["wall_s"] = round(time.perf_counter() - began, 1)
    return entry


def run_panel(
    cases: list[Case],
    out_dir: str,
    cache_dir: str | None = None,
    config: dict | None = None,
    workers: int = 1,
    log=None,
) -> list[dict]:
    """Run every case (none, k8s and xirang; xirang with `config`, by default the default
    policy), writing panel.json and panel.md to `out_dir` after each case ends, and saying
    on `log` what starts and ends. The entries come back in the order of `cases`."""
    log = log or sys.stderr
    os.makedirs(out_dir, exist_ok=True)
    began = time.perf_counter()
    done: dict[int, dict] = {}

    def finished(index: int, entry: dict) -> None:
        entry["panel"] = judge(entry)
        done[index] = entry
        misses = entry["panel"]["misses"]
        print(
            f"[{len(done)}/{len(cases)}] {entry['label']}: {entry['wall_s']:.0f} s, "
            f"{'every check met' if not misses else 'misses ' + ', '.join(misses)} "
            f"({time.perf_counter() - began:.0f} s in all)",
            file=log,
            flush=True,
        )
        ordered = [done[i] for i in sorted(done)]
        write_panel(ordered, out_dir, complete=len(done) == len(cases))

    jobs = [(case, config, cache_dir) for case in cases]
    if workers <= 1:
        for index, job in enumerate(jobs):
            print(f"running {job[0].label} ...", file=log, flush=True)
            finished(index, _case_job(job))
    else:
        print(f"running {len(cases)} cases, {workers} at a time ...", file=log, flush=True)
        # The biggest pools first, so the longest cases do not start last and leave one
        # process running alone at the end.
        order = sorted(range(len(jobs)), key=lambda i: (-cases[i].gpus, i))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(_case_job, jobs[index]): index for index in order}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    return [done[i] for i in range(len(cases))]


def write_panel(entries: list[dict], out_dir: str, complete: bool = True) -> None:
    """panel.json (each case's label, pool, figures, checks and the sweep's summary row) and
    panel.md (the table and its misses)."""
    slim = [
        {
            "label": e["label"],
            "case": e["case"],
            "jobs": e["row"]["jobs"],
            "dropped_too_big": e.get("dropped_too_big", 0),
            "wall_s": e["wall_s"],
            "panel": e["panel"],
            "row": e["row"],
        }
        for e in entries
    ]
    checks = [c for e in entries for c in e["panel"]["checks"].values()]
    summary = {
        "cases": len(entries),
        "complete": complete,
        "checks": len(checks),
        "checks_met": sum(1 for c in checks if c["ok"]),
        "cases_meeting_every_check": sum(1 for e in entries if not e["panel"]["misses"]),
    }
    with open(os.path.join(out_dir, "panel.json"), "w", encoding="utf-8") as fh:
        json.dump({"summary": summary, "cases": slim}, fh, indent=1, sort_keys=True, default=str)
    with open(os.path.join(out_dir, "panel.md"), "w", encoding="utf-8") as fh:
        fh.write(panel_table(entries) + "\n")
    with open(os.path.join(out_dir, "panel-short.md"), "w", encoding="utf-8") as fh:
        fh.write(panel_short_table(entries) + "\n")


def panel_table(entries: list[dict]) -> str:
    """The panel as markdown: one line per pool and seed (`!` marks a miss), then the
    number of checks met and each miss in words."""
    head = ["pool", "GPUs", "seed", "jobs", "none mean wait"]
    head += [f"L{lv} mean / none" for lv in CHECKED_LEVELS]
    head += [f"L{lv} Jain - none" for lv in FAIR_SHARE_LEVELS]
    head += ["L0-1 p99 / k8s", "lost GPU-h / k8s", "all started"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        case, checks = e["case"], e["panel"]["checks"]
        window = case.get("window")
        pool = _pool_words(case["trace"], window)
        cells = [pool, str(case["gpus"]), str(case["seed"]), f"{e['row']['jobs']:,}"]
        cells.append(_hours(e["panel"]["none_wait_mean_h"]))
        cells += [_cell(checks.get(f"L{lv} mean wait / none"), 2) for lv in CHECKED_LEVELS]
        cells += [_cell(checks.get(f"L{lv} Jain - none"), 3, signed=True) for lv in FAIR_SHARE_LEVELS]
        cells += _pool_cells(checks)
        lines.append("| " + " | ".join(cells) + " |")
    met, checks_total, whole = _tally(entries)
    lines.append("")
    lines.append(
        f"{met} of {checks_total} checks met; {whole} of {len(entries)} pool-seeds meet every check "
        "(`!`: a miss)."
    )
    misses = [
        f"- {_case_words(e['case'])}: {name} {_cell(e['panel']['checks'][name], 3, signed='Jain' in name)}"
        f" (target {e['panel']['checks'][name]['target']})"
        for e in entries
        for name in e["panel"]["misses"]
    ]
    if misses:
        lines.append("")
        lines.append("Misses:")
        lines.append("")
        lines += misses
    return "\n".join(lines)


def panel_short_table(entries: list[dict]) -> str:
    """The panel in fewer columns (for a README): per pool and seed the worst of levels 3-7's
    mean wait over none's and the lowest of levels 3-5's Jain minus none's, each naming its
    level, beside the urgent, lost-work and started checks; `!` marks a miss."""
    head = [
        "pool",
        "GPUs",
        "seed",
        "none mean wait",
        "worst L3-7 mean / none",
        "lowest L3-5 Jain - none",
        "L0-1 p99 / k8s",
        "lost GPU-h / k8s",
        "all started",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for e in entries:
        case, checks = e["case"], e["panel"]["checks"]
        window = case.get("window")
        pool = _pool_words(case["trace"], window)
        cells = [pool, str(case["gpus"]), str(case["seed"]), _hours(e["panel"]["none_wait_mean_h"])]
        for prefix, pick, digits, signed in (
            ("mean wait / none", max, 2, False),
            ("Jain - none", min, 3, True),
        ):
            named = [
                (c["value"], name)
                for name, c in checks.items()
                if name.endswith(prefix) and c["value"] is not None
            ]
            if not named:
                cells.append("-")
                continue
            _, name = pick(named)
            cells.append(f"{_cell(checks[name], digits, signed)} ({name.split()[0]})")
        cells += _pool_cells(checks)
        lines.append("| " + " | ".join(cells) + " |")
    met, checks_total, whole = _tally(entries)
    lines.append("")
    lines.append(
        f"{met} of {checks_total} checks met; {whole} of {len(entries)} pool-seeds meet every check."
    )
    return "\n".join(lines)


def _case_words(case: dict) -> str:
    """`philly, first 5,000 jobs at 128 GPUs, seed 0`."""
    return f"{_pool_words(case['trace'], case.get('window'))} at {case['gpus']:,} GPUs, seed {case['seed']}"


def _pool_words(trace: str, window) -> str:
    """`philly, first 5,000 jobs`, `philly, jobs 10,001-20,000`, or the trace alone."""
    if not window:
        return trace
    start, count = window
    if start == 0:
        return f"{trace}, first {count:,} jobs"
    return f"{trace}, jobs {start + 1:,}-{start + count:,}"


def _hours(value) -> str:
    return "-" if value is None else f"{value:.1f} h"


def _cell(check: dict | None, digits: int, signed: bool = False) -> str:
    if check is None:
        return "-"
    value = check["value"]
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif value is None:
        text = "-"
    elif value == float("inf"):
        text = "inf"
    else:
        text = f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"
    return text if check["ok"] else text + " !"


def _pool_cells(checks: dict) -> list[str]:
    """The columns every panel table ends with: urgent p99, lost work, every job started."""
    return [
        _cell(checks.get("L0-1 p99 / k8s"), 2),
        _cell(checks.get("lost GPU-h / k8s"), 3),
        _cell(checks.get("every job started"), 0),
    ]


def _tally(entries: list[dict]) -> tuple[int, int, int]:
    """(checks met, checks in all, pool-seeds meeting every check)."""
    all_checks = [c for e in entries for c in e["panel"]["checks"].values()]
    met = sum(1 for c in all_checks if c["ok"])
    return met, len(all_checks), sum(1 for e in entries if not e["panel"]["misses"])
