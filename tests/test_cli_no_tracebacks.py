"""Every command ends a missing cluster, a stale `.xirang/nats.url` or a bad argument with
one line that says what to do, never a traceback. The table below must name every command
the parser knows, so a new command cannot be added without being tried here."""

from __future__ import annotations

import socket

import pytest

from xirang.cli import build_parser, main

pytestmark = pytest.mark.timeout(120)

# Per command: argument lists tried with no cluster (a stale .xirang/nats.url in the current
# directory), then with bad arguments. Servers (up, scheduler, agent, demo) start their own
# NATS when none is named, so only their bad arguments are tried.
NO_CLUSTER = {
    "submit": [
        ["submit", "j", "--team", "t", "--level", "5", "--gpus", "1"],
        ["submit", "j", "--team", "t", "--level", "5", "--gpus", "1", "--dry-run"],
    ],
    "cancel": [["cancel", "j"]],
    "jobs": [["jobs"], ["jobs", "--json"]],
    "queue": [["queue"]],
    "history": [["history"], ["history", "--node", "h1"]],
    "prio": [["prio", "j"]],
    "logs": [["logs", "j"]],
    "nodes": [["nodes"]],
    "node": [["node", "cordon", "h1", "--reason", "disk"], ["node", "uncordon", "h1"]],
    "shares": [["shares"]],
    "hold": [["hold", "j"]],
    "release": [["release", "j", "--operator"]],
    "requeue": [["requeue", "j"]],
    "set-level": [["set-level", "j", "6"]],
    "project": [["project"]],
    "audit": [["audit"], ["audit", "--to-seq", "3"], ["audit", "--to-time", "2026-01-01T00:00:00"]],
    "dashboard": [["dashboard", "--port", "0"]],
    "tune": [["tune", "--nats", "STALE", "--apply"]],
    "whatif": [["whatif", "--policy", "alt.toml"]],
    "sql": [["sql", "SELECT * FROM jobs"]],
    "alerts": [["alerts"]],
    "export": [["export", "--parquet", "out"]],
    "ab": [["ab", "report"]],
    "report": [["report", "--from", "0", "--to", "1", "--out", "r.html"]],
    "feedback": [["feedback", "j", "--score", "4"]],
    "notices": [["notices"], ["notices", "--follow"], ["notices", "--publish"]],
    "review": [["review", "--out", "r.html"]],
    "job": [["job", "checkpoint-saved", "--step", "3", "--path", "ckpt"], ["job", "released"]],
}
BAD_ARGUMENTS = {
    "replay": [["replay", "run", "missing.jsonl"], ["replay"]],
    "bench": [["bench", "nope"]],
    "up": [["up", "--hosts", "-1"], ["up", "--simulate", "8xNOPE,x"]],
    "scheduler": [["scheduler", "--policy", "missing.toml"]],
    "agent": [["agent", "--node", "x", "--simulate", "lots"]],
    "demo": [["demo", "--bogus"]],
    "chaos": [["chaos", "--duration", "-1"], ["chaos", "--seed", "x"]],
    "submit": [
        ["submit", "j", "--team", "t", "--level", "five", "--gpus", "1"],
        ["submit", "j", "--team", "t", "--level", "5", "--gpus", "1", "--command", "'unclosed"],
    ],
    "cancel": [["cancel"]],
    "jobs": [["jobs", "--level", "9"], ["jobs", "--watch", "-1"]],
    "queue": [["queue", "--watch", "0"]],
    "history": [["history", "--since", "yesterday-ish"]],
    "logs": [["logs"]],
    "nodes": [["nodes", "--frobnicate"]],
    "node": [["node"], ["node", "cordon"], ["node", "drain", "h1"]],
    "shares": [["shares", "extra"]],
    "hold": [["hold"]],
    "release": [["release", "j", "--bogus"]],
    "requeue": [["requeue", "a", "b"]],
    "set-level": [["set-level", "j", "urgent"]],
    "sim": [["sim", "--out", "o", "--trace", "missing.csv"], ["sim", "--out", "o", "--gpus", "-5"]],
    "sweep": [
        ["sweep", "--out", "o", "--trace", "missing.csv"],
        ["sweep", "--out", "o", "--gpus", "-8"],
        ["sweep", "--out", "o", "--windows", "x"],
        ["sweep", "--bogus"],
    ],
    "panel": [
        ["panel", "--out", "o", "--pools", "missing.csv@8"],
        ["panel", "--out", "o", "--pools", "philly@-8"],
        ["panel", "--out", "o", "--pools", "alibaba:gpu-v1999@40"],
        ["panel", "--out", "o", "--seeds", "x"],
        ["panel", "--out", "o", "--jobs", "0"],
    ],
    "project": [["project", "--log", "missing.jsonl"], ["project", "--batch", "0", "--log", "x"]],
    "sql": [["sql", "SELEKT nonsense"]],
    "export": [["export"]],
    "audit": [["audit", "--log", "missing.jsonl"], ["audit", "--to-time", "half past three"]],
    "dashboard": [["dashboard", "--log", "missing.jsonl"]],
    "alerts": [["alerts", "--at", "noon-ish"]],
    "ab": [["ab", "report", "--from", "never"]],
    "tune": [["tune", "--apply"]],
    "whatif": [["whatif", "--policy", "missing.toml", "--log", "missing.jsonl"]],
    "report": [["report", "--from", "x", "--to", "y"]],
    "feedback": [["feedback", "j", "--score", "9"], ["feedback", "j"]],
    "notices": [["notices", "--log", "missing.jsonl"]],
    "review": [
        ["review", "--quarter", "2026Q9"],
        ["review", "--to", "5"],
        ["review", "--tune-param", "nope"],
    ],
    "key": [
        ["key", "show", "--dir", "missing"],
        ["key", "rotate", "--dir", "missing"],
        ["key"],
        ["key", "adopt", "--dir", "missing", "--log", "missing.jsonl"],
    ],
    "nats": [
        ["nats", "add-user", "client", "only-a-team", "--dir", "nd"],
        ["nats", "add-user", "wizard"],
        ["nats", "add-user", "job", "--dir", "nd"],
        ["nats", "revoke", "nobody", "--dir", "nd"],
    ],
    "tls": [["tls", "init", "--dir", "td"], ["tls", "init", "--server", "no-equals-sign"]],
    "job": [
        ["job"],
        ["job", "checkpoint-saved", "--step", "many"],
        ["job", "checkpoint-saved", "--step", "-1"],
    ],
}


def stale_url() -> str:
    """A local port nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def stale_cwd(tmp_path, monkeypatch):
    url = stale_url()
    (tmp_path / ".xirang").mkdir()
    (tmp_path / ".xirang" / "nats.url").write_text(url + "\n")
    (tmp_path / "alt.toml").write_text("net_benefit_min = 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XIRANG_NATS", raising=False)
    monkeypatch.delenv("XIRANG_DEBUG", raising=False)
    return url


def run_one(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as done:  # argparse's usage errors
        code = done.code
    out, err = capsys.readouterr()
    return code, out + err


def test_every_command_is_tried():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    missing = sorted(set(sub.choices) - set(NO_CLUSTER) - set(BAD_ARGUMENTS))
    assert not missing, f"add these commands to the tables above: {missing}"


@pytest.mark.parametrize("name", sorted(NO_CLUSTER))
def test_without_a_cluster_each_command_says_what_to_do_in_one_line(name, stale_cwd, capsys):
    for argv in NO_CLUSTER[name]:
        argv = [stale_cwd if word == "STALE" else word for word in argv]
        code, text = run_one(argv, capsys)
        assert "Traceback" not in text and "a bug in xirang" not in text, (argv, text)
        if code != 0:
            assert text.strip(), argv
            last = text.strip().splitlines()[-1]
            assert last.startswith("xirang"), (argv, text)


@pytest.mark.parametrize("name", sorted(BAD_ARGUMENTS))
def test_a_bad_argument_is_refused_in_one_line(name, stale_cwd, capsys):
    for argv in BAD_ARGUMENTS[name]:
        code, text = run_one(argv, capsys)
        assert code != 0, (argv, text)
        assert "Traceback" not in text and "a bug in xirang" not in text, (argv, text)
        assert text.strip().splitlines()[-1].startswith("xirang"), (argv, text)
        if code == 2 and "--help" in text:  # the parser's own refusal: one line
            assert len(text.strip().splitlines()) == 1, (argv, text)


def test_a_stale_url_message_names_the_server_and_the_fix(stale_cwd, capsys):
    code, text = run_one(["jobs"], capsys)
    assert code != 0
    assert stale_cwd in text and "xirang up" in text and len(text.strip().splitlines()) == 1
