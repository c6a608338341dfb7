"""New names (a job's id, team and user at submit, a node's name when it first joins) are
letters, digits and `._-`, starting with a letter or a digit; anything else is refused with a
reason that says what to use. A log written before the rule folds to the same state and its
jobs can still be acted on by name."""

import pytest

from core import inputs
from core import types as T
from core.replay import rebuild
from core.model.state import live_digest

from scenario import Run, node, of, submit

BAD_IDS = ["bad id", "a.b>", "a.b*", "-flag", ".hidden", "..", "x/y", "é", ""]


@pytest.mark.parametrize("bad", BAD_IDS[:-1])
def test_a_submit_with_a_job_team_or_user_outside_the_id_characters_is_refused(bad):
    run = Run()
    run.at(0, node("a1"))
    for field, reason in (
        ("job", "job_id_invalid"),
        ("team", "team_id_invalid"),
        ("user", "user_id_invalid"),
    ):
        args = dict(job="ok-1", team="t1", user="u1")
        args[field] = bad
        refused = of(run.at(1000, submit(args.pop("job"), 5, 1, **args)), T.InputRejected)
        assert [r.reason for r in refused] == [reason], field
        assert "letters, digits and . _ -" in refused[0].detail and repr(bad) in refused[0].detail
    assert not run.state.canonical.jobs


def test_ids_of_letters_digits_dot_underscore_and_dash_are_accepted():
    run = Run()
    run.at(0, node("gpu-box_1.lab"))
    accepted = of(
        run.at(1000, submit("Train_v2.1-a", 5, 1, team="ml.vision", user="ana_b-2")), T.JobSubmitted
    )
    assert accepted and accepted[0].job == "Train_v2.1-a"


def test_a_new_node_with_a_bad_name_is_refused_but_a_known_one_may_come_back():
    run = Run()
    refused = of(run.at(0, node("a b")), T.InputRejected)
    assert refused[0].reason == "node_id_invalid" and "a b" not in run.state.canonical.nodes


def test_a_log_written_before_the_rule_folds_the_same_and_its_jobs_can_still_be_acted_on(monkeypatch):
    run = Run()
    with monkeypatch.context() as old_rules:  # what a release without the rule accepted
        old_rules.setattr(inputs, "id_problem", lambda kind, value: None)
        run.at(0, node("old node"))
        assert of(run.at(1000, submit("bad id", 5, 1, user="u 1")), T.JobSubmitted)
        run.at(2000, T.NodeDown(node="old node", reason="lost"))
    folded = rebuild(run.records)
    assert live_digest(folded) == live_digest(run.state)
    # The node may join again under its old name, and the owner may act on the old job.
    assert of(run.at(3000, node("old node")), T.NodeJoined)
    assert of(run.at(4000, T.SetLevel(job="bad id", level=7, by="u 1")), T.JobLevelSet)
    assert of(run.at(4500, T.Cancel(job="bad id")), T.JobCancelled)
    rebuild(run.records)
