"""Bad input becomes InputRejected with a reason a person can act on; nothing else is lost."""

import msgspec
import pytest

from core import Policy, PolicyError, load_policy_toml, parse_input, state_digest
from core import types as T

from scenario import Run, node, of, submit


def rejected(events) -> list[str]:
    return [e.reason for e in of(events, T.InputRejected)]


@pytest.mark.parametrize(
    "line, reason",
    [
        (
            '{"type":"submit","t":5,"job":"x","team":"a","user":"u","level":12,"gpus":1}',
            "level_must_be_0_to_7",
        ),
        (
            '{"type":"submit","t":5,"job":"x","team":"a","user":"u","level":1,"gpus":0}',
            "gpus_must_be_positive",
        ),
        ('{"type":"submit","t":5,"job":"","team":"a","user":"u","level":1,"gpus":1}', "job_must_be_named"),
        ('{"type":"submit","t":5,"job":"x","team":"","user":"u","level":1,"gpus":1}', "team_must_be_set"),
        (
            '{"type":"submit","t":5,"job":"x","team":"a","user":"u","level":1,"gpus":"four"}',
            "malformed_input",
        ),
        ('{"type":"launch","t":5}', "malformed_input"),
        ("not json at all", "malformed_input"),
        ('{"type":"started","t":5,"job":"nobody"}', "unknown_job"),
        ('{"type":"released","t":5,"job":"ok-job"}', "job_is_starting"),
        ('{"type":"node_up","t":5,"node":"n","gpu_model":"A100","gpus":-2}', "gpus_must_be_positive"),
        ('{"type":"set_policy","t":5,"params":{"victims_per_preemption_max":0}}', "invalid_policy"),
        ('{"type":"set_policy","t":5,"params":{"no_such_knob":1}}', "invalid_policy"),
        (
            '{"type":"submit","t":5,"v":9,"job":"x","team":"a","user":"u","level":1,"gpus":1}',
            "unsupported_schema_version",
        ),
    ],
)
def test_bad_input_is_rejected_with_a_named_reason_and_loses_nothing(line, reason):
    run = Run()
    run.at(1, node("a1"))
    run.at(2, submit("ok-job", 3, 8))
    run.at(3, submit("blocked", 3, 8, team="b"))
    before = state_digest(run.state.canonical)
    jobs_before = msgspec.json.encode(run.state.canonical.jobs)
    events = run.feed(parse_input(line))
    assert rejected(events) == [reason]
    assert len(events) == 1
    assert msgspec.json.encode(run.state.canonical.jobs) == jobs_before
    assert state_digest(run.state.canonical) != before  # only the chain head moved
    assert run.job_state("ok-job") == "starting"


def test_time_must_not_go_back():
    run = Run()
    run.at(10_000, node("a1"))
    events = run.feed(submit("late", 3, 1, t=5_000))
    assert rejected(events) == ["time_must_not_go_back"]


def test_duplicate_job_id_is_rejected_even_after_it_finished():
    run = Run()
    run.at(1, node("a1"))
    run.at(2, submit("j", 3, 1))
    run.at(3, T.Started(job="j"))
    run.at(4, T.Finished(job="j", ok=True))
    assert rejected(run.at(5, submit("j", 3, 1))) == ["job_id_already_used"]
    assert rejected(run.at(6, T.Started(job="j"))) == ["job_already_finished"]


def test_an_input_already_applied_is_skipped():
    run = Run()
    run.feed(T.NodeUp(t=1, seq=7, node="a1", gpu_model="A100", gpus=8))
    events = run.feed(T.NodeUp(t=2, seq=7, node="a2", gpu_model="A100", gpus=8))
    assert rejected(events) == ["input_already_applied"]
    assert "a2" not in run.state.canonical.nodes


def test_a_quiet_tick_changes_nothing_and_logs_nothing():
    run = Run()
    run.at(1, node("a1"))
    before = state_digest(run.state.canonical)
    assert run.at(1000, T.Tick()) == []
    assert state_digest(run.state.canonical) == before
    assert run.at(2000, node("a1")) == []  # a repeated node report is quiet too


def test_set_policy_changes_the_policy_through_an_event():
    run = Run()
    events = run.at(1, T.SetPolicy(params={"victims_per_preemption_max": 3}, by="tuner"))
    pin, changed = of(events, T.PolicyChanged)  # the log's first record names its policy
    assert pin.by == "xirang" and pin.params == {"defaults_version": Policy().defaults_version}
    assert changed.by == "tuner" and changed.params == {"victims_per_preemption_max": 3}
    assert run.state.canonical.policy.victims_per_preemption_max == 3


def test_policy_toml_errors_name_the_file_and_the_field(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text("victims_per_preemption_max = 3\nlevel_weight = [8,7,6,5,4,3,2,1]\n")
    assert load_policy_toml(str(good)).victims_per_preemption_max == 3
    bad = tmp_path / "bad.toml"
    bad.write_text("preempts_from_level = [0,3,4,6,7,8,8,8]\n")
    with pytest.raises(PolicyError, match="bad.toml.*preempts_from_level\\[0\\]"):
        load_policy_toml(str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("victim_cap = 3\n")
    with pytest.raises(PolicyError, match="unknown policy parameter 'victim_cap'"):
        load_policy_toml(str(unknown))
    broken = tmp_path / "broken.toml"
    broken.write_text("victims_per_preemption_max = = 3\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load_policy_toml(str(broken))


@pytest.mark.parametrize(
    "line,words",
    [
        ("user_preempting_max = -3", "user_preempting_max must not be negative, got -3"),
        ("release_wait_max_ms = [30000, -1, 0, 0, 0, 0, 0, 0]", "release_wait_max_ms must not be negative"),
        ("team_quota = { a = 0.0 }", "team_quota\\['a'\\] must be positive"),
    ],
)
def test_a_negative_limit_time_or_quota_is_refused_with_its_name(tmp_path, line, words):
    path = tmp_path / "p.toml"
    path.write_text(line + "\n")
    with pytest.raises(PolicyError, match=words):
        load_policy_toml(str(path))
    signed = tmp_path / "signed.toml"
    signed.write_text("net_benefit_min = -5.0\n")  # a small net loss may be accepted
    assert load_policy_toml(str(signed)).net_benefit_min == -5.0


def test_ab_variant_assignment_is_stable_and_uses_the_variant_policy():
    from core.model.policy import Policy, assign_variant, with_params

    policy = with_params(Policy(), {"ab_variants": {"A": {}, "B": {"net_benefit_min": 1e12}}})
    teams = [f"team-{i}" for i in range(40)]
    first = [assign_variant(policy, team, "job") for team in teams]
    assert first == [assign_variant(policy, team, "other") for team in teams]
    assert set(first) == {"A", "B"}
    run = Run(policy)
    run.at(0, node("a1"))
    run.at(1, submit("bg", 6, 8, team="bg", est_runtime_s=36000))
    run.at(2, T.Started(job="bg"))
    b_team = teams[first.index("B")]
    a_team = teams[first.index("A")]
    declined = of(run.at(3_600_000, submit("b-job", 1, 8, team=b_team)), T.PreemptionDeclined)
    assert declined[0].reason == "benefit_below_cost"
    assert of(run.at(3_600_001, submit("a-job", 1, 8, team=a_team)), T.PreemptionPlanned)


def test_the_policys_output_cap_rides_on_each_start_only_when_the_policy_sets_one():
    run = Run()
    run.at(1, node("a1"))
    start = of(run.at(2, submit("plain", 3, 1)), T.JobStartRequested)[0]
    assert b"output_max_bytes" not in T.encode(start)  # records as before the parameter
    run.at(3, T.SetPolicy(params={"job_output_max_mb": 0.5}))
    start = of(run.at(4, submit("capped", 3, 1)), T.JobStartRequested)[0]
    assert start.output_max_bytes == 2**19
    for bad in (-1.0, 0.001, float("inf"), 2.0**21):
        refused = of(run.at(5, T.SetPolicy(params={"job_output_max_mb": bad})), T.InputRejected)
        assert refused and "job_output_max_mb" in refused[0].detail, bad
