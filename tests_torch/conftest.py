"""Set-up of the torch tests (`make test-torch`, never the default suite): the helpers of
tests/ importable, jobs run as the test's own user as in tests/conftest.py."""

import os
import pwd
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
os.environ.setdefault("XIRANG_JOB_USER", pwd.getpwuid(os.geteuid()).pw_name)
