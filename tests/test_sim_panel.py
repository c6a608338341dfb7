"""The panel (replay/panel.py, `xirang panel`): pools x seeds with none, k8s-style and
xirang's default policy, each acceptance check per pool and seed, the misses marked."""

import json
from pathlib import Path

import pytest

from replay.panel import Pool, judge, panel_cases, panel_short_table, panel_table, parse_pools, run_panel
from xirang.cli import main

pytestmark = pytest.mark.timeout(120)


def _trace(tmp_path) -> str:
    rows = ["job,submit_s,duration_s,gpus,team,level"]
    for i in range(30):
        rows.append(f"j{i},{i * 60},{1800 + 300 * (i % 5)},{1 + i % 4},t{i % 3},{i % 8}")
    path = tmp_path / "tiny.csv"
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_tiny_panel_runs_every_pool_and_seed_and_writes_its_table_and_json(tmp_path):
    trace = _trace(tmp_path)
    pools = [Pool(trace, 8), Pool(trace, 16, (5, 20))]
    cases = panel_cases(pools, seeds=(0, 1))
    log = (tmp_path / "progress.txt").open("w")
    entries = run_panel(cases, str(tmp_path / "out"), str(tmp_path / "cache"), workers=2, log=log)
    log.close()
    assert [e["label"] for e in entries] == [c.label for c in cases]
    assert [(e["case"]["gpus"], e["case"]["seed"]) for e in entries] == [(8, 0), (8, 1), (16, 0), (16, 1)]
    assert entries[2]["row"]["jobs"] == 20
    # the peers were kept for reuse, xirang (the code under test) never
    kept = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert len(kept) == 8 and all(name.endswith(("_none.pickle", "_k8s.pickle")) for name in kept)
    progress = (tmp_path / "progress.txt").read_text()
    assert "running 4 cases, 2 at a time" in progress and "[4/4]" in progress
    data = json.loads((tmp_path / "out" / "panel.json").read_text())
    assert data["summary"]["cases"] == 4 and data["summary"]["complete"] is True
    checks = data["cases"][0]["panel"]["checks"]
    assert {"L0-1 p99 / k8s", "lost GPU-h / k8s", "every job started"} <= set(checks)
    assert all(f"L{lv} mean wait / none" in checks for lv in (3, 4, 5, 6, 7))
    short = (tmp_path / "out" / "panel-short.md").read_text().splitlines()
    assert short[0].startswith("| pool |") and len([line for line in short if line.startswith("| ")]) == 5
    table = (tmp_path / "out" / "panel.md").read_text()
    assert table.splitlines()[0].startswith("| pool | GPUs | seed | jobs |")
    assert len([line for line in table.splitlines() if line.startswith("| ")]) == 5
    met = sum(1 for e in data["cases"] for c in e["panel"]["checks"].values() if c["ok"])
    total = sum(len(e["panel"]["checks"]) for e in data["cases"])
    assert f"{met} of {total} checks met" in table


def test_a_miss_is_marked_with_its_pool_level_and_figure(tmp_path):
    trace = _trace(tmp_path)
    [entry] = run_panel(
        panel_cases([Pool(trace, 8)], (0,)), str(tmp_path / "out"), log=open("/dev/null", "w")
    )
    card = entry["card"]["policies"]
    none_l6 = card["none"]["levels"]["6"]["wait_s"]["mean"]
    card["xirang"]["levels"]["6"]["wait_s"]["mean"] = none_l6 * 1.5 + 600  # over 1.25x none's
    card["xirang"]["level_team_jain"]["4"] = card["none"]["level_team_jain"]["4"] - 0.1
    card["xirang"]["unstarted"] = 2
    entry["panel"] = judge(entry)
    misses = entry["panel"]["misses"]
    assert {"L6 mean wait / none", "L4 Jain - none", "every job started"} <= set(misses)
    assert entry["panel"]["checks"]["L6 mean wait / none"]["value"] > 1.25
    assert entry["panel"]["checks"]["L4 Jain - none"]["value"] == pytest.approx(-0.1, abs=1e-3)
    table = panel_table([entry])
    row = table.splitlines()[2]
    assert row.count(" !") >= 3 and "-0.100 !" in row and "| no ! |" in row
    assert (
        f"{Path(trace).name} at 8 GPUs, seed 0: L6 mean wait / none " in table and "(target <= 1.25)" in table
    )
    # the short form names the worst level of each kind, its miss marked
    checks = entry["panel"]["checks"]
    worst = max((c["value"], n) for n, c in checks.items() if n.endswith("mean wait / none"))
    lowest = min((c["value"], n) for n, c in checks.items() if n.endswith("Jain - none"))
    short = panel_short_table([entry]).splitlines()[2]
    assert f"{worst[0]:.2f} ! ({worst[1].split()[0]})" in short
    assert f"{lowest[0]:+.3f} ! ({lowest[1].split()[0]})" in short and "| no ! |" in short


def test_pools_are_read_from_trace_gpus_and_window_and_bad_ones_say_what_to_fix():
    assert parse_pools("bursts@32, philly@128/0:5000,alibaba:gpu-v2023@40") == [
        Pool("bursts", 32),
        Pool("philly", 128, (0, 5000)),
        Pool("alibaba:gpu-v2023", 40),
    ]
    for bad, words in (
        ("philly", "TRACE@GPUS"),
        ("philly@12", "multiple of 8"),
        ("philly@x", "whole numbers"),
        ("philly@64/5", "whole numbers"),
        ("philly@64/0:0", "COUNT > 0"),
        ("", "at least one pool"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_pools(bad)


def test_the_panel_command_prints_the_table_and_tells_a_bad_pool_in_one_line(tmp_path, capsys):
    trace = _trace(tmp_path)
    out = tmp_path / "out"
    code = main(["panel", "--pools", f"{trace}@8", "--seeds", "3", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "| pool | GPUs | seed |" in captured.out and "checks met" in captured.out
    assert "[1/1]" in captured.err
    assert (out / "panel.md").read_text().strip() == captured.out.strip()
    assert any((out / "cache").iterdir())  # the peers' cache defaults to OUT/cache
    assert main(["panel", "--pools", "missing.csv@8", "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert "missing.csv" in err and "Traceback" not in err
    assert main(["panel", "--pools", "philly@12", "--out", str(out)]) != 0
    assert "--pools" in capsys.readouterr().err
