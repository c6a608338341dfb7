"""Trace loading: the Philly file, the canonical CSV, seeded defaults and clear errors."""

import gzip
import hashlib

import pytest

from replay.workload import TraceError, default_philly_path, load_canonical, load_philly

PHILLY = default_philly_path()


def test_the_project_ships_the_documented_philly_file_byte_for_byte():
    # replay/traces/SOURCE.md names the upstream file by this sha256.
    with gzip.open(PHILLY, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
    assert digest == "ebffb3dd1589bdf4e7bcd74496201c5ded1d557d498ee14f560463f37ec353da"


def test_philly_loads_every_job_sorted_from_zero_with_the_cluster_as_team():
    wl = load_philly(default_philly_path(), seed=0)
    assert len(wl.jobs) == 82_247
    submits = [j.submit_ms for j in wl.jobs]
    assert submits[0] == 0 and submits == sorted(submits)
    assert len({j.team for j in wl.jobs}) == 15
    assert sum(1 for j in wl.jobs if j.team == "6214e9") == 41_226
    assert {j.gpus for j in wl.jobs} == {1, 2, 4, 8, 12, 16, 24, 32, 64, 128}
    # 2017-09-04 10:30:41 to 2017-12-22 08:02:11
    assert submits[-1] == ((108 * 24 + 21) * 3600 + 31 * 60 + 30) * 1000
    assert "level" in wl.defaulted and "team" not in wl.defaulted


def test_philly_defaults_follow_the_seed():
    a = load_philly(PHILLY, seed=7, limit=2000)
    b = load_philly(PHILLY, seed=7, limit=2000)
    c = load_philly(PHILLY, seed=8, limit=2000)
    assert a.jobs == b.jobs
    assert [j.level for j in a.jobs] != [j.level for j in c.jobs]
    assert [j.duration_ms for j in a.jobs] == [j.duration_ms for j in c.jobs]
    levels = [j.level for j in a.jobs]
    assert set(levels) == set(range(8))
    assert 0.15 < levels.count(4) / len(levels) < 0.35  # 25% by the documented weights


def _write(tmp_path, text):
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return str(path)


def test_canonical_csv_keeps_given_columns_and_fills_the_rest(tmp_path):
    path = _write(
        tmp_path,
        "job,submit_s,duration_s,gpus,level,team,gpu_model\nb,20,100,2,1,red,A100\na,10,50,1,,blue,\n",
    )
    wl = load_canonical(path, seed=3)
    assert [j.id for j in wl.jobs] == ["a", "b"]
    a, b = wl.jobs
    assert a.submit_ms == 0 and b.submit_ms == 10_000
    assert b.level == 1 and b.team == "red" and b.gpu_models == ["A100"]
    assert 0 <= a.level <= 7 and a.gpu_models == []
    assert b.est_runtime_ms >= b.duration_ms
    assert load_canonical(path, seed=3).jobs == wl.jobs


@pytest.mark.parametrize(
    "text,words",
    [
        ("job,submit_s,gpus\na,0,1\n", "missing required columns duration_s"),
        ("job,submit_s,duration_s,gpus\na,0,-5,1\n", "duration must be positive"),
        ("job,submit_s,duration_s,gpus\na,0,5,0\n", "gpus must be positive"),
        ("job,submit_s,duration_s,gpus\na,zero,5,1\n", "trace.csv:2: submit_s must be a number, got 'zero'"),
        ("job,submit_s,duration_s,gpus\na,0,5,two\n", "gpus must be a whole number, got 'two'"),
        ("job,submit_s,duration_s,gpus,level\na,0,5,1,high\n", "level must be a whole number"),
        ("job,submit_s,duration_s,gpus,level\na,0,5,1,9\n", "level must be 0..7"),
        ("job,submit_s,duration_s,gpus\na,0,5,1\na,1,5,1\n", "appears twice"),
        ("", "empty file"),
    ],
)
def test_bad_canonical_csv_says_what_to_fix(tmp_path, text, words):
    with pytest.raises(TraceError, match=words):
        load_canonical(_write(tmp_path, text))


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        load_canonical(str(tmp_path / "nope.csv"))


def test_the_alibaba_trace_loads_by_name_with_levels_inside_each_qos_band():
    from replay.workload import ALIBABA_QOS_LEVELS, alibaba_path, load_trace

    # replay/traces/SOURCE.md names the converted file by this sha256 (decompressed).
    with gzip.open(alibaba_path("alibaba"), "rb") as fh:
        rows = fh.read()
    assert (
        hashlib.sha256(rows).hexdigest() == "087cc0209fcd110db3089bb5842705a7acf321a37774c68bf3c960f677023f1a"
    )
    qos = {line.split(",")[0]: line.split(",")[4] for line in rows.decode().splitlines()[1:]}
    wl = load_trace("alibaba", seed=0)
    assert wl.name == "alibaba" and len(wl.jobs) == 6203
    assert [j.id for j in load_trace("alibaba:gpu-v2023", seed=0, limit=50).jobs] == [
        j.id for j in wl.jobs[:50]
    ]
    submits = [j.submit_ms for j in wl.jobs]
    assert submits[0] == 0 and submits == sorted(submits)
    assert all(j.duration_ms >= 1000 and j.gpus in (1, 2, 4, 8) for j in wl.jobs)
    assert all(j.level in ALIBABA_QOS_LEVELS[qos[j.id]] for j in wl.jobs)
    levels = [j.level for j in wl.jobs]
    assert set(levels) == set(range(8))
    assert 0.15 < levels.count(4) / len(levels) < 0.35  # about the default mix
    assert "level" not in wl.defaulted and "team" in wl.defaulted
    other = load_trace("alibaba", seed=1)
    assert [j.level for j in other.jobs] != levels
    assert [j.duration_ms for j in other.jobs] == [j.duration_ms for j in wl.jobs]


def test_an_alibaba_trace_with_an_unknown_qos_or_name_is_refused(tmp_path):
    from replay.workload import load_alibaba, load_trace

    path = tmp_path / "ali.csv"
    path.write_text("job,submit_s,duration_s,gpus,qos\na,0,60,1,LS\nb,5,60,1,Platinum\n")
    with pytest.raises(TraceError, match=r"ali.csv:3: qos must be one of Guaranteed, LS, Burstable, BE"):
        load_alibaba(str(path))
    with pytest.raises(TraceError, match="unknown Alibaba trace 'gpu-v1999'"):
        load_trace("alibaba:gpu-v1999")
