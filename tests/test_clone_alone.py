"""A clone of the repository alone (no `shared` folder beside it) has every file its tests read.

The clone is made from the committed HEAD into a temporary folder, so what it proves is what a
fresh `git clone` gets; the trace-dependent tests then run inside it, importing the clone's own
modules.
"""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests that read the Philly trace or the example scenario.
TRACE_DEPENDENT = ["tests/test_sim_trace.py", "tests/test_cli_replay.py"]


def _git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    if shutil.which("git") is None or _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: nothing to clone")
    target = tmp_path_factory.mktemp("alone") / "xirang"
    made = _git("clone", "--quiet", "--no-hardlinks", ROOT, str(target))
    assert made.returncode == 0, made.stderr
    assert not (target.parent / "shared").exists() and not (target.parent.parent / "shared").exists()
    return target


def test_no_tracked_code_reads_a_shared_folder_beside_the_repository(clone):
    # Code, build and CI files; prose is the docs' business.
    # (The patterns are built so that this file does not match itself.)
    beside, absolute = "/".join(["..", "shared"]), "/".join(["", "work", "shared"])
    hits = _git("grep", "-n", "-I", "-F", "-e", beside, "-e", absolute, "--", ":!*.md", cwd=clone)
    assert hits.returncode == 1, f"files still point outside the repository:\n{hits.stdout}"


def test_the_trace_dependent_tests_pass_in_a_clone_alone(clone):
    env = dict(os.environ, PYTHONPATH=str(clone))
    probe = subprocess.run(
        [sys.executable, "-c", "import replay.workload as w; print(w.default_philly_path())"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip().startswith(str(clone)), probe.stdout
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *TRACE_DEPENDENT],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "skipped" not in run.stdout.splitlines()[-1], run.stdout[-2000:]
