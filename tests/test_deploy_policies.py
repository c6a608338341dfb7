"""The opt-in policy files shipped in deploy/policies load as every command loads a policy
file, and each changes something of this release's defaults (else it would opt into nothing)."""

from pathlib import Path

import pytest

from core.model.policy import Policy
from xirang.policy_file import load_policy_file

FILES = sorted((Path(__file__).parent.parent / "deploy" / "policies").glob("*.toml"))


def test_there_are_opt_in_policy_files():
    assert FILES


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_each_opt_in_policy_file_loads_and_changes_a_default(path):
    policy = load_policy_file(str(path))
    assert policy != Policy()


def test_the_general_rights_rule_lets_every_level_preempt_every_less_urgent_one():
    policy = load_policy_file(str(next(p for p in FILES if p.name == "preempt-any-less-urgent.toml")))
    assert policy.preempts_from_level == [level + 1 for level in range(8)]
