"""Shared test set-up: lets tests import the scenario helpers beside them."""

import os
import pwd
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# Host agents started by tests run their jobs as the test's own user, as before (a test's
# temporary folders are not reachable by other users); tests/test_security_job_user.py checks
# the default (each run as its own uid under an agent running as root).
os.environ.setdefault("XIRANG_JOB_USER", pwd.getpwuid(os.geteuid()).pw_name)

# Under pytest-xdist (`make test`: PYTEST_WORKERS processes, `--dist loadfile`) each worker takes
# one test file at a time, in collection order. The kinds of file that simulate or wait on real
# clusters go first (test_sim_cli is the longest), so that the many quick core files fill the
# gaps at the end instead of one slow file finishing last alone.
DISPATCH_FIRST = ("test_sim_", "test_live_", "test_data_", "test_security_")


def _dispatch_rank(file_name: str) -> int:
    return next(
        (i for i, prefix in enumerate(DISPATCH_FIRST) if file_name.startswith(prefix)), len(DISPATCH_FIRST)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under xdist: slow kinds of file first (a stable sort: a file's tests stay together)."""
    if hasattr(config, "workerinput"):  # a serial run keeps the plain order
        items.sort(key=lambda item: _dispatch_rank(item.path.name))
