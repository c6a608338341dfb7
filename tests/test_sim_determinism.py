"""A seeded run is reproducible: same seed, same outcome, whatever the hash seed."""

import hashlib
import os
import subprocess
import sys

import pytest

from replay.scorecard import policy_card
from replay.sim import Cluster, simulate
from replay.workload import load_philly

PHILLY = "/work/shared/traces/philly/philly.csv"
JOBS = 200  # the first Philly jobs include long multi-GPU ones: 64 GPUs are busy enough
pytestmark = pytest.mark.skipif(not os.path.exists(PHILLY), reason="Philly trace not present")

DIGEST_SCRIPT = """
import hashlib, sys
from replay.sim import Cluster, simulate
from replay.workload import load_philly
wl = load_philly(sys.argv[1], seed=int(sys.argv[2]), limit=int(sys.argv[3]))
r = simulate(wl, Cluster.uniform(64), sys.argv[4], {}, int(sys.argv[2]))
rows = [(j.id, j.first_start_ms, j.finish_ms, j.preemptions, j.lost_progress_ms, j.overhead_ms)
        for j in r.jobs]
print(hashlib.sha256(repr(rows).encode()).hexdigest())
"""


def _digest(result) -> str:
    rows = [(j.id, j.first_start_ms, j.finish_ms, j.preemptions, j.lost_progress_ms, j.overhead_ms)
            for j in result.jobs]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


@pytest.mark.parametrize("policy", ["xirang", "k8s", "slurm", "none"])
def test_same_seed_gives_the_same_run(policy):
    wl = load_philly(PHILLY, seed=5, limit=JOBS)
    first = simulate(wl, Cluster.uniform(64), policy, {}, 5)
    again = simulate(load_philly(PHILLY, seed=5, limit=JOBS), Cluster.uniform(64), policy, {}, 5)
    assert _digest(first) == _digest(again)
    card = policy_card(first)
    assert card["unfinished"] == 0 and card["jobs"] == JOBS


def test_xirang_run_does_not_depend_on_the_hash_seed():
    digests = set()
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        proc = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT, PHILLY, "3", str(JOBS), "xirang"],
                              capture_output=True, text=True, env=env, timeout=120,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        assert proc.returncode == 0, proc.stderr
        digests.add(proc.stdout.strip())
    wl = load_philly(PHILLY, seed=3, limit=JOBS)
    digests.add(_digest(simulate(wl, Cluster.uniform(64), "xirang", {}, 3)))
    assert len(digests) == 1


def test_another_seed_gives_another_workload_and_run():
    a = simulate(load_philly(PHILLY, seed=1, limit=JOBS), Cluster.uniform(64), "k8s", {}, 1)
    b = simulate(load_philly(PHILLY, seed=2, limit=JOBS), Cluster.uniform(64), "k8s", {}, 2)
    assert _digest(a) != _digest(b)
