"""The quarterly review: one self-contained HTML page (charts embedded as PNG) that says
what preemption gained urgent work in a period, what it cost the rest, how fair it was,
what users think, and which parameter changes the tuner recommends, with evidence.

`xirang review [--quarter 2026Q4 | --from T --to T]` (default: the last full quarter in the
log; `deploy/systemd/xirang-review.timer` runs it at the start of each quarter). Sections:

1. **Net benefit against no preemption.** The period's jobs (every `submit` accepted in
   it) are replayed through the simulator with preemption switched off; what really
   happened to them (from the log) is scored against that run with the tuner's stated
   objective (`projections/tuner.py`): urgent GPU-hours of wait saved, minus GPU-hours of
   work lost, minus the fairness penalty. The same jobs simulated under the policy in force
   are shown beside it (how far the simulator is from the record).
2. **Per level**: mean and p99 wait as recorded and without preemption; for the urgent
   levels the speedup, for the others the cost (extra wait, work lost, preemptions).
3. **Fairness per team and user**: preempted and preempting counts, protections,
   downgrades, compensation (from the projection), Jain's index over teams.
4. **Satisfaction**: survey answers (`xirang feedback`) about the period's jobs, per team
   and level, with the latest comments.
5. **Recommendations**: the tuner's proposals for the period (replays of the same jobs,
   kept only when they beat the policy in force by the margin), each with its evidence;
   and the changes the tuner applied during the period, with theirs.
"""

from __future__ import annotations

from core.model.words import readable_number

import html

import duckdb
import matplotlib

matplotlib.use("Agg")  # no display: render to bytes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from core import types as T  # noqa: E402

from replay import whatif  # noqa: E402

from . import tuner  # noqa: E402
from core.explain import human_duration  # noqa: E402
from .projector import Projector  # noqa: E402
from .report import CHART_POINTS_MIN, png_uri  # noqa: E402
from .windows import Span  # noqa: E402

URGENT_LEVEL_MAX = tuner.URGENT_LEVEL_MAX
COMMENTS_SHOWN_MAX = 12


def gather(
    records: list[T.Record],
    span: Span,
    objective: tuner.Objective | None = None,
    tune_evals: int = 2,
    tune_params: list[str] | None = None,
    sim_options: dict | None = None,
) -> dict:
    """Every figure of the review, as plain data (the JSON the CLI prints)."""
    win = whatif.scan(records, span.from_t, span.to_t)
    if not win.outcomes:
        raise ValueError(f"no job was submitted in the {span.describe()}")
    if not win.nodes:
        raise ValueError("no node joined before the period's end: nothing to replay")
    wl, cl = whatif.workload(win), whatif.cluster(win)
    replay = tuner.Replay(wl, cl, win.policy, objective, sim_options=sim_options)
    recorded = replay.score_result(whatif.recorded_result(records, win, wl, cl))
    simulated = replay.score(win.policy)
    baseline = replay.score_result(replay.baseline[0], replay.baseline[1])
    con = _project(records)
    out = {
        "window": span.as_dict(),
        "jobs": len(wl.jobs),
        "gpus": cl.total_gpus,
        "objective": replay.objective.describe(),
        "net_benefit": {
            "recorded": recorded.as_dict(),
            "simulated_policy_in_force": simulated.as_dict(),
            "no_preemption": baseline.as_dict(),
        },
        "levels": _levels(recorded, baseline),
        "fairness": _fairness(con, span, recorded),
        "satisfaction": _satisfaction(con, span),
        "applied_changes": _applied(con, span),
    }
    proposals = tuner.propose(replay, evals_per_param=tune_evals, only=tune_params) if tune_evals else []
    out["recommendations"] = [p.as_dict() for p in proposals]
    out["replays"] = replay.runs
    return out


def _project(records: list[T.Record]) -> duckdb.DuckDBPyConnection:
    proj = Projector(duckdb.connect())
    proj.apply([(i, T.encode_record(r)) for i, r in enumerate(records, 1)])
    return proj.con


def _levels(recorded: tuner.Score, baseline: tuner.Score) -> list[dict]:
    rows = []
    for level in sorted(recorded.per_level, key=int):
        now, base = recorded.per_level[level], baseline.per_level.get(level)
        row = {
            "level": int(level),
            "jobs": now["jobs"],
            "wait_s_mean": now["wait_s_mean"],
            "wait_s_p99": now["wait_s_p99"],
            "lost_gpu_h": now["lost_gpu_h"],
            "preemptions": now["preemptions"],
            "no_preemption_wait_s_mean": base["wait_s_mean"] if base else None,
        }
        if base and int(level) <= URGENT_LEVEL_MAX:
            row["speedup"] = (
                round(base["wait_s_mean"] / now["wait_s_mean"], 3) if now["wait_s_mean"] else None
            )
        elif base:
            row["extra_wait_s_mean"] = round(now["wait_s_mean"] - base["wait_s_mean"], 1)
        rows.append(row)
    return rows


def _fairness(con, span: Span, recorded: tuner.Score) -> dict:
    w = [span.from_t, span.to_t]
    teams = con.execute(
        """
        WITH j AS (SELECT * FROM jobs WHERE submit_t BETWEEN ? AND ?),
             t AS (SELECT DISTINCT team FROM j)
        SELECT t.team,
          (SELECT count(*) FROM preemptions p WHERE p.victim_team = t.team AND p.planned_t BETWEEN ? AND ?),
          (SELECT count(*) FROM sagas s WHERE s.preemptor_team = t.team AND s.planned_t BETWEEN ? AND ?),
          (SELECT count(*) FROM team_limits l WHERE l.team = t.team AND l.kind = 'protected' AND l.t BETWEEN ? AND ?),
          (SELECT count(*) FROM team_limits l WHERE l.team = t.team AND l.kind = 'downgraded' AND l.t BETWEEN ? AND ?),
          (SELECT coalesce(sum(amount), 0) FROM ledger g WHERE g.team = t.team AND g.kind = 'fee_credit'
             AND g.t BETWEEN ? AND ?),
          (SELECT sum(lost_progress_ms * gpus) / 3600000.0 FROM j WHERE j.team = t.team),
          (SELECT avg(waited_ms) / 1000.0 FROM j WHERE j.team = t.team)
        FROM t ORDER BY t.team""",
        w * 6,
    ).fetchall()
    users = con.execute(
        """
        WITH j AS (SELECT * FROM jobs WHERE submit_t BETWEEN ? AND ?)
        SELECT j."user", any_value(j.team),
          (SELECT count(*) FROM preemptions p WHERE p.victim_user = j."user" AND p.planned_t BETWEEN ? AND ?),
          (SELECT count(*) FROM sagas s WHERE s.preemptor_user = j."user" AND s.planned_t BETWEEN ? AND ?),
          sum(j.fee_credit), count(*)
        FROM j GROUP BY j."user" ORDER BY j."user\"""",
        w * 3,
    ).fetchall()
    return {
        "teams": [
            {
                "team": r[0],
                "preempted": r[1],
                "preempting": r[2],
                "protections": r[3],
                "downgrades": r[4],
                "fee_credit": round(r[5], 3),
                # As the net benefit's total counts it (progress lost plus the preemptions'
                # saves and restores), so the teams' figures add up to that total.
                "lost_gpu_h": round(recorded.per_team.get(r[0], {}).get("lost_gpu_h", 0.0), 3),
                "wait_s_mean": round(r[7] or 0.0, 1),
            }
            for r in teams
        ],
        "users": [
            {
                "user": r[0],
                "team": r[1],
                "preempted": r[2],
                "preempting": r[3],
                "fee_credit": round(r[4] or 0.0, 3),
                "jobs": r[5],
            }
            for r in users
        ],
    }


def _satisfaction(con, span: Span) -> dict:
    """Answers about jobs submitted in the period (whenever they were given)."""
    w = [span.from_t, span.to_t]
    latest = (
        "(SELECT job, arg_max(score, seq) AS score, arg_max(comment, seq) AS comment,"
        ' arg_max("user", seq) AS answered_by, max(t) AS t FROM feedback GROUP BY job)'
    )
    rows = con.execute(
        f"""SELECT j.team, j.requested_level, count(*), avg(f.score), count(*) FILTER (f.score <= 2)
        FROM {latest} f JOIN jobs j USING (job) WHERE j.submit_t BETWEEN ? AND ? GROUP BY ALL ORDER BY ALL""",
        w,
    ).fetchall()
    comments = con.execute(
        f"""SELECT f.job, f.answered_by, f.score, f.comment FROM {latest} f JOIN jobs j USING (job)
        WHERE j.submit_t BETWEEN ? AND ? AND f.comment <> '' ORDER BY f.t DESC LIMIT {COMMENTS_SHOWN_MAX}""",
        w,
    ).fetchall()
    total = con.execute(
        f"""SELECT count(*), avg(f.score) FROM {latest} f JOIN jobs j USING (job)
        WHERE j.submit_t BETWEEN ? AND ?""",
        w,
    ).fetchone()
    return {
        "answers": total[0],
        "score_mean": None if total[1] is None else round(total[1], 3),
        "by_team_level": [
            {"team": r[0], "level": r[1], "answers": r[2], "score_mean": round(r[3], 3), "unhappy": r[4]}
            for r in rows
        ],
        "comments": [{"job": r[0], "user": r[1], "score": r[2], "comment": r[3]} for r in comments],
    }


def _applied(con, span: Span) -> list[dict]:
    rows = con.execute(
        """SELECT t, params, reason FROM policy_changes WHERE "by" = 'tuner' AND t BETWEEN ? AND ?
                          ORDER BY seq""",
        [span.from_t, span.to_t],
    ).fetchall()
    return [
        {
            "t": t,
            "params": params,
            "summary": reason.split(tuner.EVIDENCE_MARK, 1)[0],
            "evidence": tuner.evidence_of(reason),
        }
        for t, params, reason in rows
    ]


# ------------------------------------------------------------------ charts and HTML


def charts(d: dict) -> dict[str, str]:
    """The review's charts as base64 PNGs, by name."""
    out = {}
    nb = d["net_benefit"]
    parts = ["urgent_wait_saved_gpu_h", "lost_gpu_h", "fairness_penalty_gpu_h", "objective_gpu_h"]
    labels = ["urgent wait saved", "work lost", "fairness penalty", "net benefit"]
    fig, ax = plt.subplots(figsize=(7.5, 3))
    x = np.arange(len(parts))
    for i, (key, name) in enumerate(
        (("recorded", "as recorded"), ("simulated_policy_in_force", "simulated"))
    ):
        ax.bar(x + (i - 0.5) * 0.38, [nb[key][p] for p in parts], width=0.38, label=name)
    ax.axhline(0, color="#555", linewidth=0.8)
    ax.set_xticks(x, labels)
    ax.set(title="Preemption against no preemption (GPU-hours)", ylabel="GPU-hours")
    ax.legend()
    out["net_benefit"] = png_uri(fig)
    levels = [r["level"] for r in d["levels"]]
    teams = d["fairness"]["teams"]
    sat: dict[str, list] = {}
    for row in d["satisfaction"]["by_team_level"]:
        sat.setdefault(row["team"], []).extend([row["score_mean"]] * row["answers"])
    if len(levels) >= CHART_POINTS_MIN:
        out["levels"] = _levels_chart(d, levels)
    if len(teams) >= CHART_POINTS_MIN and any(t["preempted"] or t["preempting"] for t in teams):
        out["fairness"] = _teams_chart(teams)
    if len(sat) >= CHART_POINTS_MIN:
        out["satisfaction"] = _satisfaction_chart(sat)
    return out


def _levels_chart(d: dict, levels: list[int]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 3))
    ax.bar(
        [lv - 0.2 for lv in levels],
        [r["wait_s_mean"] / 3600 for r in d["levels"]],
        width=0.4,
        label="recorded",
    )
    ax.bar(
        [lv + 0.2 for lv in levels],
        [(r["no_preemption_wait_s_mean"] or 0) / 3600 for r in d["levels"]],
        width=0.4,
        label="no preemption",
    )
    ax.set(title="Mean queue wait per level", xlabel="level", ylabel="hours")
    ax.legend()
    return png_uri(fig)


def _teams_chart(teams: list[dict]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 3))
    x = np.arange(len(teams))
    ax.bar(x - 0.2, [t["preempted"] for t in teams], width=0.4, label="preempted")
    ax.bar(x + 0.2, [t["preempting"] for t in teams], width=0.4, label="preempting")
    ax.set_xticks(x, [t["team"] for t in teams])
    ax.set(title="Preemptions per team", ylabel="count")
    ax.legend()
    return png_uri(fig)


def _satisfaction_chart(sat: dict[str, list]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 3))
    names = sorted(sat)
    ax.bar(names, [float(np.mean(sat[n])) for n in names], color="#6a1b9a")
    ax.set_ylim(0, 5)
    ax.set(title="Satisfaction per team (mean score, 1..5)", ylabel="score")
    return png_uri(fig)


def _table(headers: list[str], rows: list[list], table_id: str = "") -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    ident = f" id='{table_id}'" if table_id else ""
    return f"<table{ident}><tr>{head}</tr>{body}</table>"


def _cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return readable_number(value)
    return str(value)


def render(d: dict) -> str:
    """The quarterly review as one self-contained HTML page."""
    c = charts(d)
    nb = d["net_benefit"]
    rec = nb["recorded"]
    w = d["window"]
    title = f"xirang review {w['from']} – {w['to']}"
    net_rows = [
        [
            name,
            nb[key]["objective_gpu_h"],
            nb[key]["urgent_wait_saved_gpu_h"],
            nb[key]["lost_gpu_h"],
            nb[key]["fairness_penalty_gpu_h"],
            nb[key]["jain_teams_share"],
        ]
        for key, name in (
            ("recorded", "as recorded"),
            ("simulated_policy_in_force", "simulated, policy in force"),
            ("no_preemption", "no preemption (what-if)"),
        )
    ]
    level_rows = [
        [
            r["level"],
            r["jobs"],
            human_duration(r["wait_s_mean"] * 1000),
            "–"
            if r["no_preemption_wait_s_mean"] is None
            else human_duration(r["no_preemption_wait_s_mean"] * 1000),
            f"{readable_number(r['speedup'])}x faster"
            if r.get("speedup")
            else (
                f"+{human_duration(r['extra_wait_s_mean'] * 1000)} wait"
                if r.get("extra_wait_s_mean", 0) > 0
                else "–"
            ),
            r["lost_gpu_h"],
            r["preemptions"],
        ]
        for r in d["levels"]
    ]
    f = d["fairness"]
    team_rows = [
        [
            t["team"],
            t["preempted"],
            t["preempting"],
            t["protections"],
            t["downgrades"],
            t["fee_credit"],
            t["lost_gpu_h"],
            human_duration(t["wait_s_mean"] * 1000),
        ]
        for t in f["teams"]
    ]
    user_rows = [
        [u["user"], u["team"], u["jobs"], u["preempted"], u["preempting"], u["fee_credit"]]
        for u in f["users"]
    ]
    s = d["satisfaction"]
    sat_rows = [
        [r["team"], r["level"], r["answers"], r["score_mean"], r["unhappy"]] for r in s["by_team_level"]
    ]
    comment_rows = [[x["job"], x["user"], x["score"], x["comment"]] for x in s["comments"]]
    recs = (
        "".join(_recommendation(p) for p in d["recommendations"])
        or "<p id='no-recommendation'>No change beat the policy in force by the margin on this period's replay.</p>"
    )
    applied = (
        "".join(f"<li>{html.escape(a['summary'])}</li>" for a in d["applied_changes"]) or "<li>none</li>"
    )

    def img(key: str) -> str:
        if key in c:
            return f'<figure><img alt="{key}" src="{c[key]}"></figure>'
        return (
            f"<p class='no-chart' data-chart='{key}'>No chart: fewer than {CHART_POINTS_MIN}"
            " points in this period.</p>"
        )

    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:24px;max-width:980px}"
        "table{border-collapse:collapse;margin:8px 0 16px}th,td{padding:3px 10px;border-bottom:1px solid #ddd;"
        "text-align:right}th:first-child,td:first-child{text-align:left}figure{margin:12px 0}"
        ".rec{border-left:4px solid #2e7d32;padding:4px 12px;margin:10px 0;background:#f5faf5}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(w['chosen'])}; {d['jobs']} jobs on {d['gpus']} GPUs."
        f" Objective: {html.escape(d['objective'])}.</p>"
        f"<h2>Net benefit of preemption</h2><p>As recorded, against a no-preemption what-if of the same jobs:"
        f" <b id='net-benefit'>{rec['objective_gpu_h']:+.2f}</b> GPU-hours.</p>"
        + _table(
            [
                "run",
                "net benefit GPU-h",
                "urgent wait saved GPU-h",
                "work lost GPU-h",
                "fairness penalty GPU-h",
                "Jain (teams' fair share)",
            ],
            net_rows,
            "net-benefit-table",
        )
        + img("net_benefit")
        + "<h2>Per level: urgent speedup and the cost to lower levels</h2>"
        + _table(
            [
                "level",
                "jobs",
                "wait (mean)",
                "wait without preemption",
                "effect",
                "work lost GPU-h",
                "preemptions",
            ],
            level_rows,
            "levels",
        )
        + img("levels")
        + "<h2>Fairness</h2>"
        + _table(
            [
                "team",
                "preempted",
                "preempting",
                "protections",
                "downgrades",
                "fee credit",
                "work lost GPU-h",
                "wait (mean)",
            ],
            team_rows,
            "fairness-teams",
        )
        + img("fairness")
        + "<details><summary>per user</summary>"
        + _table(
            ["user", "team", "jobs", "preempted", "preempting", "fee credit"], user_rows, "fairness-users"
        )
        + "</details>"
        + f"<h2>Satisfaction</h2><p>{s['answers']} answers, mean score"
        f" <b id='satisfaction'>{_cell(s['score_mean'])}</b> of 5.</p>"
        + _table(["team", "level", "answers", "mean score", "unhappy (1-2)"], sat_rows, "satisfaction-table")
        + img("satisfaction")
        + (_table(["job", "by", "score", "comment"], comment_rows) if comment_rows else "")
        + "<h2>Recommended changes</h2>"
        + recs
        + f"<h3>Changes the tuner applied in the period</h3><ul>{applied}</ul>"
        + "</body></html>"
    )


def _recommendation(p: dict) -> str:
    ev = p["evidence"]
    b, a = ev["before"], ev["after"]
    rows = [
        [k, b[k], a[k]]
        for k in (
            "objective_gpu_h",
            "urgent_wait_saved_gpu_h",
            "lost_gpu_h",
            "fairness_penalty_gpu_h",
            "jain_teams_share",
        )
    ]
    levels = [
        [
            lv,
            b["per_level"][lv]["wait_s_mean"],
            a["per_level"][lv]["wait_s_mean"],
            b["per_level"][lv]["lost_gpu_h"],
            a["per_level"][lv]["lost_gpu_h"],
        ]
        for lv in a["per_level"]
        if lv in b["per_level"]
    ]
    teams = [
        [
            tm,
            b["per_team"][tm]["wait_s_mean"],
            a["per_team"][tm]["wait_s_mean"],
            b["per_team"][tm]["lost_gpu_h"],
            a["per_team"][tm]["lost_gpu_h"],
        ]
        for tm in a["per_team"]
        if tm in b["per_team"]
    ]
    changes = ", ".join(f"{k}: {p['before'][k]} → {p['params'][k]}" for k in sorted(p["params"]))
    return (
        f"<div class='rec'><p><b>{html.escape(p['group'])}</b>: {html.escape(changes)}</p>"
        + _table(["figure", "now", "with the change"], rows)
        + _table(["level", "wait s now", "wait s after", "lost GPU-h now", "lost GPU-h after"], levels)
        + _table(["team", "wait s now", "wait s after", "lost GPU-h now", "lost GPU-h after"], teams)
        + f"<p>Apply: <code>xirang tune --apply</code> (a set_policy with this evidence), or set"
        f" <code>{html.escape(changes)}</code> in the policy file.</p></div>"
    )
