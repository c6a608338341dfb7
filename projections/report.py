"""The periodic review: `xirang report --from T --to T` writes one self-contained HTML page
(charts embedded as PNG) about a window of log time.

Sections, all from the projection:
- net benefit of preemption: benefit minus cost (the core's own weighted GPU-seconds) of
  the preemptions committed in the window, beside what they actually cost: victims'
  progress lost (GPU-hours) and their recovery time;
- fairness: Jain's index across teams of GPU-hours served (by finished jobs in the
  window) and of mean queue wait, and the same across users;
- victims' slowdown: job completion time over training time for jobs that were preempted,
  against jobs that were not;
- queue wait per level.
"""

from __future__ import annotations

import base64
import html
import io

import matplotlib

matplotlib.use("Agg")  # no display: render to bytes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from core.explain import human_duration  # noqa: E402

from .audit import fmt_t  # noqa: E402


def jain(values) -> float | None:
    """Jain's fairness index of the values (None when there are none or all are 0)."""
    xs = np.asarray([v for v in values if v is not None], dtype=float)
    if xs.size == 0 or not np.any(xs):
        return None
    return float(xs.sum() ** 2 / (xs.size * (xs**2).sum()))


def gather(con, from_t: int, to_t: int) -> dict:
    """Every figure of the period report from the projection, as plain data."""
    q = lambda sql, *p: con.execute(sql, list(p)).fetchall()  # noqa: E731
    sagas = q(
        """SELECT planned_t, benefit, cost, outcome, wait_ms FROM sagas
                 WHERE planned_t BETWEEN ? AND ? ORDER BY planned_t""",
        from_t,
        to_t,
    )
    victims = q(
        """SELECT coalesce(requeue_lost_ms, 0) * victim_gpus / 3600000.0, recovery_ms
                   FROM preemptions WHERE planned_t BETWEEN ? AND ?""",
        from_t,
        to_t,
    )
    ended = q(
        """SELECT team, "user", gpus * run_ms / 3600000.0, (end_t - submit_t) / nullif(run_ms, 0),
                        preempt_count, waited_ms FROM jobs
                 WHERE end_t BETWEEN ? AND ? AND state = 'finished'""",
        from_t,
        to_t,
    )
    waits = q(
        """SELECT level, avg(waited_ms), quantile_cont(waited_ms, 0.95), count(*) FROM queue_wait
                 WHERE t BETWEEN ? AND ? GROUP BY level ORDER BY level""",
        from_t,
        to_t,
    )
    committed = [s for s in sagas if s[3] == "committed"]
    team_gpu_h: dict[str, float] = {}
    team_wait: dict[str, list] = {}
    user_gpu_h: dict[str, float] = {}
    for team, user, gpu_h, _, _, waited in ended:
        team_gpu_h[team] = team_gpu_h.get(team, 0.0) + (gpu_h or 0.0)
        user_gpu_h[user] = user_gpu_h.get(user, 0.0) + (gpu_h or 0.0)
        team_wait.setdefault(team, []).append(waited or 0)
    slow_victims = [s for _, _, _, s, n, _ in ended if n and s is not None]
    slow_others = [s for _, _, _, s, n, _ in ended if not n and s is not None]
    return {
        "from_t": from_t,
        "to_t": to_t,
        "sagas": sagas,
        "preemptions": len(sagas),
        "committed": len(committed),
        "rolled_back": sum(1 for s in sagas if s[3] == "rolled_back"),
        "net_benefit": float(sum(b - c for _, b, c, _, _ in committed)),
        "benefit": float(sum(b for _, b, _, _, _ in committed)),
        "cost": float(sum(c for _, _, c, _, _ in committed)),
        "victims": len(victims),
        "lost_gpu_h": float(sum(v[0] for v in victims)),
        "recovery_ms_mean": float(np.mean([v[1] for v in victims if v[1] is not None]))
        if any(v[1] is not None for v in victims)
        else None,
        "jobs_finished": len(ended),
        "team_gpu_h": dict(sorted(team_gpu_h.items())),
        "team_wait_ms_mean": {t: float(np.mean(w)) for t, w in sorted(team_wait.items())},
        "jain_teams_gpu_h": jain(team_gpu_h.values()),
        "jain_teams_wait": jain([np.mean(w) for w in team_wait.values()]),
        "jain_users_gpu_h": jain(user_gpu_h.values()),
        "slowdown_victims": slow_victims,
        "slowdown_others": slow_others,
        "waits": waits,
    }


def png_uri(fig) -> str:
    """The figure as a data: URI of a PNG, to inline in HTML (the figure is closed)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# A chart needs at least this many points: with fewer it is an empty frame or one dot, and
# the page says so in words instead.
CHART_POINTS_MIN = 2


def charts(d: dict) -> dict[str, str]:
    """The report's charts as base64 PNGs, by name; a chart with too few points to show
    anything is left out (`missing_charts` names it)."""
    out = {}
    committed = [s for s in d["sagas"] if s[3] == "committed"]
    if len(committed) >= CHART_POINTS_MIN:
        fig, ax = plt.subplots(figsize=(7, 3))
        hours = [(s[0] - d["from_t"]) / 3.6e6 for s in committed]
        ax.step(hours, np.cumsum([s[1] - s[2] for s in committed]), where="post", color="#2e7d32")
        ax.set(
            title="Cumulative net benefit of committed preemptions",
            xlabel="hours into window",
            ylabel="benefit - cost",
        )
        out["net_benefit"] = png_uri(fig)
    teams = list(d["team_gpu_h"])
    if len(teams) >= CHART_POINTS_MIN:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.bar(teams, [d["team_gpu_h"][t] for t in teams], color="#1565c0")
        ax.set(title="GPU-hours served per team (finished jobs)", ylabel="GPU-hours")
        out["fairness"] = png_uri(fig)
    groups = [
        (name, xs)
        for name, xs in (("not preempted", d["slowdown_others"]), ("preempted", d["slowdown_victims"]))
        if xs
    ]
    if sum(len(xs) for _, xs in groups) >= CHART_POINTS_MIN:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.boxplot([xs for _, xs in groups], showfliers=False)
        ax.set_xticks(range(1, len(groups) + 1), [name for name, _ in groups])
        ax.set(title="Slowdown (JCT / training time)", ylabel="slowdown")
        out["slowdown"] = png_uri(fig)
    levels = [w[0] for w in d["waits"]]
    if len(levels) >= CHART_POINTS_MIN:
        fig, ax = plt.subplots(figsize=(7, 3))
        ax.bar([level - 0.2 for level in levels], [w[1] / 60000 for w in d["waits"]], width=0.4, label="mean")
        ax.bar([level + 0.2 for level in levels], [w[2] / 60000 for w in d["waits"]], width=0.4, label="p95")
        ax.set(title="Queue wait per level", xlabel="level", ylabel="minutes")
        ax.legend()
        out["waits"] = png_uri(fig)
    return out


CHART_NAMES = {
    "net_benefit": "net benefit over time",
    "fairness": "GPU-hours per team",
    "slowdown": "slowdown",
    "waits": "queue wait per level",
}


def missing_charts(shown: dict[str, str]) -> str:
    """A sentence naming the charts left out for want of data ('' when none was)."""
    missing = [CHART_NAMES[k] for k in CHART_NAMES if k not in shown]
    if not missing:
        return ""
    return (
        f"<p class='no-chart'>Not charted, fewer than {CHART_POINTS_MIN} points in this window:"
        f" {html.escape(', '.join(missing))}.</p>"
    )


def _f(value, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def render(d: dict) -> str:
    """The period report as one self-contained HTML page."""
    c = charts(d)
    median = lambda xs: float(np.median(xs)) if xs else None  # noqa: E731
    rows = [
        (
            "Preemptions planned / committed / rolled back",
            f"{d['preemptions']} / {d['committed']} / {d['rolled_back']}",
        ),
        (
            "Net benefit of committed preemptions (benefit − cost)",
            f"<b id='net-benefit'>{d['net_benefit']:.0f}</b> = {d['benefit']:.0f} − {d['cost']:.0f}",
        ),
        ("Victims / progress lost (GPU-hours)", f"{d['victims']} / {d['lost_gpu_h']:.3f}"),
        (
            "Victims' mean recovery (notice to running again)",
            "–" if d["recovery_ms_mean"] is None else human_duration(d["recovery_ms_mean"]),
        ),
        ("Jobs finished", str(d["jobs_finished"])),
        ("Jain's index, teams, GPU-hours served", f"<b id='jain-teams'>{_f(d['jain_teams_gpu_h'])}</b>"),
        ("Jain's index, teams, mean queue wait", _f(d["jain_teams_wait"])),
        ("Jain's index, users, GPU-hours served", _f(d["jain_users_gpu_h"])),
        (
            "Median slowdown, preempted vs not",
            f"<b id='slowdown'>{_f(median(d['slowdown_victims']))}</b> vs {_f(median(d['slowdown_others']))}",
        ),
    ]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    imgs = "".join(f'<figure><img alt="{k}" src="{v}"></figure>' for k, v in c.items()) + missing_charts(c)
    title = f"xirang review {fmt_t(d['from_t'])} – {fmt_t(d['to_t'])}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:24px;max-width:900px}"
        "th{text-align:left;font-weight:500;padding:3px 16px 3px 0}td{text-align:right}"
        "figure{margin:16px 0}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table>{table}</table>{imgs}"
        "<p>Benefit and cost are the core's weighted GPU-seconds, recorded with each decision;"
        " fairness counts finished jobs in the window.</p></body></html>"
    )
