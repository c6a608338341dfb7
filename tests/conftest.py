"""Shared test set-up: lets tests import the scenario helpers beside them."""

import os
import pwd
import sys

sys.path.insert(0, os.path.dirname(__file__))

# Host agents started by tests run their jobs as the test's own user, as before (a test's
# temporary folders are not reachable by other users); tests/test_security_job_user.py checks
# the default (each run as its own uid under an agent running as root).
os.environ.setdefault("XIRANG_JOB_USER", pwd.getpwuid(os.geteuid()).pw_name)
