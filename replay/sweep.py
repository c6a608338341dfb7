"""The scorecard over many operating points: pool sizes, trace windows and seeds, one table.

    from replay.sweep import Case, run_case, sweep_table
    rows = [run_case(Case("philly", 256, seed=0, window=(0, 20_000)), ["none", "k8s", "xirang"])]
    print(sweep_table(rows))

A case is a trace (`philly`, `bursts`, or a canonical CSV), a window of its jobs (the
`count` jobs from index `start`, submit times rebased to the first), a pool size and a
seed. Each case runs every policy on the same jobs and cluster and keeps the scorecard's
acceptance checks for xirang (replay/scorecard.py), so a rule's effect can be read at
every size at once, overloaded pools included. `bursts` is generated for the case's pool
(`bursts:<gpus>`, see replay/generate.py).
"""

from __future__ import annotations

import os
import pickle
import time
from dataclasses import asdict, dataclass

from .scorecard import scorecard
from .sim import Cluster, simulate
from .workload import Workload, load_trace


@dataclass(frozen=True)
class Case:
    """One operating point of a sweep: a trace, a window of its jobs, a pool size and a seed."""

    trace: str
    gpus: int
    seed: int = 0
    window: tuple[int, int] | None = None  # (first job index, job count); None: all
    node_gpus: int = 8

    @property
    def label(self) -> str:
        """The case in words, for the table."""
        window = "" if self.window is None else f"[{self.window[0]}:+{self.window[1]}]"
        return f"{self.trace}{window} {self.gpus} GPUs seed {self.seed}"

    def trace_spec(self) -> str:
        """The trace as `load_trace` takes it (`bursts` is generated for the case's pool)."""
        return f"bursts:{self.gpus}" if self.trace == "bursts" else self.trace


def case_workload(case: Case) -> Workload:
    """The case's jobs: the trace's window, submit times starting at 0."""
    workload = load_trace(case.trace_spec(), case.seed)
    if case.window is None:
        return workload
    start, count = case.window
    jobs = workload.jobs[start : start + count]
    if not jobs:
        raise ValueError(f"{case.label}: the window holds no jobs (the trace has {len(workload.jobs)})")
    t0 = jobs[0].submit_ms
    for job in jobs:
        job.submit_ms -= t0
    return Workload(f"{workload.name}[{start}:+{count}]", jobs, workload.seed, workload.defaulted)


def run_case(
    case: Case, policies: list[str], xirang_config: dict | None = None, cache_dir: str | None = None
) -> dict:
    """Every policy on the case; the scorecard and a summary row. With `cache_dir`, the
    peers' results (every policy but xirang, which is the code under test) are kept there
    and reused: they do not change when xirang's rules do."""
    cluster = Cluster.uniform(case.gpus, case.node_gpus)
    results = []
    began = time.perf_counter()
    for name in policies:
        cached = _cache_path(cache_dir, case, name) if cache_dir and name != "xirang" else None
        if cached and os.path.exists(cached):
            with open(cached, "rb") as fh:
                results.append(pickle.load(fh))
            continue
        workload = case_workload(case)  # fresh: the simulator owns its jobs
        too_big = [j.id for j in workload.jobs if j.gpus > case.gpus]
        if too_big:
            workload = Workload(
                workload.name,
                [j for j in workload.jobs if j.gpus <= case.gpus],
                workload.seed,
                workload.defaulted,
            )
        config = dict(xirang_config or {}) if name == "xirang" else {}
        cpu_began = time.process_time()
        results.append(simulate(workload, cluster, name, config, case.seed))
        # CPU seconds beside the wall clock: on a shared machine the wall clock says little.
        results[-1].extra["cpu_s"] = round(time.process_time() - cpu_began, 1)
        if cached:
            os.makedirs(cache_dir, exist_ok=True)
            with open(cached, "wb") as fh:
                pickle.dump(results[-1], fh)
    card = scorecard(results)
    return {
        "case": asdict(case),
        "label": case.label,
        "wall_s": round(time.perf_counter() - began, 1),
        "dropped_too_big": len([j for j in case_workload(case).jobs if j.gpus > case.gpus]),
        "row": summary_row(card),
        "card": card,
    }


def _cache_path(cache_dir: str, case: Case, policy: str) -> str:
    window = "all" if case.window is None else f"{case.window[0]}-{case.window[1]}"
    trace = "".join(ch if ch.isalnum() else "_" for ch in case.trace)
    return os.path.join(
        cache_dir, f"{trace}_{window}_{case.gpus}_{case.node_gpus}_{case.seed}_{policy}.pickle"
    )


def summary_row(card: dict) -> dict:
    """What the sweep table shows of one scorecard: per policy the mean wait, the level 0-1
    p99, lost GPU-hours, and xirang's acceptance checks with their values."""
    row: dict = {"jobs": card["jobs"], "policies": {}}
    for name, c in card["policies"].items():
        row["policies"][name] = {
            "wait_mean_s": c["wait_s"]["mean"],
            "l01_p99_s": c["wait_s_levels_0_1"]["p99"],
            "l01_all_waits_p99_s": c.get("wait_s_levels_0_1_all", {}).get("p99"),
            "lost_gpu_h": c["lost_gpu_h"],
            "unstarted": c["unstarted"],
            "level_mean_s": {lv: c["levels"][lv]["wait_s"]["mean"] for lv in c["levels"]},
            "level_team_jain": c.get("level_team_jain", {}),
            "sim_wall_s": c["sim_wall_s"],
            "cpu_s": c["extra"].get("cpu_s"),
        }
    if "acceptance" in card:
        row["checks"] = {
            name: {"value": check["value"], "ok": check["ok"]}
            for name, check in card["acceptance"]["checks"].items()
        }
    return row


CHECK_COLUMNS = (
    ("p99_wait_l01_vs_k8s", "L01 p99/k8s"),
    ("p99_wait_l01_none_over_xirang", "none/L01 p99"),
    ("lost_gpu_h_vs_k8s", "lost/k8s"),
    ("mean_wait_vs_none", "mean/none"),
    ("level_mean_wait_vs_none_max", "L3-7 mean/none max"),
    ("level_team_fairness_vs_none", "L3-5 Jain-none min"),
    ("every_job_started", "all started"),
)


def sweep_table(rows: list[dict]) -> str:
    """A markdown table: one line per case, xirang's checks (a value with `!` missed)."""
    head = ["case", "jobs", "L01 p99 x/k8s/none s", "mean wait x/none h", "lost GPU-h x/k8s"]
    head += [title for _, title in CHECK_COLUMNS]
    head.append("L01 all-waits p99 x/k8s s")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for entry in rows:
        row = entry["row"]
        pol = row["policies"]
        x, k, n = pol.get("xirang", {}), pol.get("k8s", {}), pol.get("none", {})
        cells = [
            entry["label"],
            str(row["jobs"]),
            "/".join(_num(p.get("l01_p99_s")) for p in (x, k, n)),
            "/".join(
                _num(None if p.get("wait_mean_s") is None else p["wait_mean_s"] / 3600, 2) for p in (x, n)
            ),
            "/".join(_num(p.get("lost_gpu_h"), 0) for p in (x, k)),
        ]
        checks = row.get("checks", {})
        for name, _ in CHECK_COLUMNS:
            check = checks.get(name)
            cells.append("-" if check is None else _num(check["value"], 3) + ("" if check["ok"] else " !"))
        cells.append("/".join(_num(p.get("l01_all_waits_p99_s")) for p in (x, k)))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    return f"{value:.{digits}f}"
