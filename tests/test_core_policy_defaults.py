"""Policy defaults are versioned per log (core/model/policy_defaults.py): a log names the
table of defaults it was decided under in its first record, a log that names none folds
with the legacy table, and so a release that changes a default changes what no log already
written means: folding, auditing, snapshots, re-deciding and the what-if all read the
version from the log."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from core import new_state, snapshot_bytes, step
from core import types as T
from core.model.policy import Policy, with_params
from core.model.policy_defaults import (
    DEFAULTS_BY_VERSION,
    LEGACY_DEFAULTS_VERSION,
    defaults_of,
    log_policy,
    older_defaults_note,
    pin_params,
)
from core.model.state import load_snapshot
from core.replay import ChainError, rebuild, run_inputs
from data_helpers import xirang
from scenario import MIN, node

GOLDEN = Path(__file__).parent / "data" / "golden-logs"
LEGACY_LOGS = ("written-by-276a06d.jsonl", "written-by-dac0952.jsonl", "written-with-digest-schema-2.jsonl")


def _fold_file(path: Path):
    return rebuild(T.decode_record(line) for line in path.read_bytes().splitlines())


def _inputs() -> list[T.Input]:
    return [T.parse_input(line) for line in (GOLDEN / "inputs.jsonl").read_bytes().splitlines()]


def test_every_version_names_the_same_parameters_and_the_policy_defaults_are_one_version():
    names = {version: sorted(table) for version, table in DEFAULTS_BY_VERSION.items()}
    assert len({tuple(n) for n in names.values()}) == 1, names
    assert sorted(DEFAULTS_BY_VERSION) == list(range(1, len(DEFAULTS_BY_VERSION) + 1))
    assert Policy() == defaults_of(Policy().defaults_version)
    older = [defaults_of(v) for v in sorted(DEFAULTS_BY_VERSION)]
    assert all(a != b for a, b in zip(older, older[1:]))  # each version changes something


def test_a_new_log_names_its_defaults_version_first_and_folds_back_to_the_same_policy():
    explicit = with_params(defaults_of(2), {"net_benefit_min": 5.0, "fair_share_half_life_s": 3600.0})
    for policy in (Policy(), defaults_of(LEGACY_DEFAULTS_VERSION), explicit):
        state = new_state(policy)
        _, records = step(state, T.NodeUp(t=1, node="n1", gpu_model="A100", gpus=8))
        first = records[0].event
        assert isinstance(first, T.PolicyChanged) and first.params == pin_params(policy)
        assert first.params["defaults_version"] == policy.defaults_version
        folded = rebuild(records)
        assert folded.canonical.policy == policy == state.canonical.policy
    assert pin_params(explicit) == {
        "defaults_version": 2,
        "fair_share_half_life_s": 3600.0,
        "net_benefit_min": 5.0,
    }


@pytest.mark.parametrize("name", LEGACY_LOGS)
def test_a_log_that_names_no_version_folds_with_the_legacy_table(name):
    state = _fold_file(GOLDEN / name)
    c = state.canonical
    assert "defaults_version" not in c.policy_params
    assert c.policy == log_policy(c.policy_params) == with_params(defaults_of(1), c.policy_params)
    for param, legacy in DEFAULTS_BY_VERSION[LEGACY_DEFAULTS_VERSION].items():
        assert getattr(c.policy, param) == legacy
    assert c.usage == {}  # no half-life in version 1: folding kept no decayed usage
    # A snapshot of it says the same after a reload (one written before versions lacks the number).
    body = msgspec.json.decode(snapshot_bytes(c))
    del body["policy"]["defaults_version"]
    reloaded = load_snapshot(msgspec.json.encode(body))
    assert reloaded.canonical.policy == c.policy and reloaded.canonical.policy.defaults_version == 1


def _written_under(version: int) -> list[T.Record]:
    return list(run_inputs(_inputs(), new_state(defaults_of(version))))


def test_the_same_inputs_under_two_versions_fold_each_to_its_own_policy_and_audit_clean(tmp_path):
    """Version 2 keeps decayed usage (a half-life): its state, digests included, differs from
    version 1's, and each log folds and audits with its own table, in one release."""
    one, two = _written_under(1), _written_under(2)
    assert one[0].event.params == {"defaults_version": 1} and two[0].event.params == {"defaults_version": 2}
    folded_one, folded_two = rebuild(one), rebuild(two)
    assert folded_one.canonical.policy.fair_share_half_life_s == 0 and not folded_one.canonical.usage
    assert folded_two.canonical.policy.fair_share_half_life_s == 7 * 24 * 3600 and folded_two.canonical.usage
    for version, records in ((1, one), (2, two)):
        path = tmp_path / f"v{version}.jsonl"
        path.write_bytes(b"".join(T.encode_record(r) + b"\n" for r in records))
        summary = json.loads(xirang("audit", "--log", str(path), "--json", "--redecide").stdout)
        assert summary["ok"], summary.get("problem")
        assert summary["state_digests_verified"] >= 20
        assert summary["redecide"]["same"] is True
        assert summary["redecide"]["policy_defaults"] == f"version {version} (named by the log)"


def test_a_log_moves_to_newer_defaults_by_a_set_policy_keeping_what_it_set():
    state = new_state(defaults_of(1))
    step(state, node("n1"))
    step(
        state,
        T.SetPolicy(t=MIN, params={"net_benefit_min": 7.0, "compensation_when_exceeded": False}, by="ops"),
    )
    note = older_defaults_note(state.canonical.policy_params)
    newest = Policy().defaults_version
    assert "fair_share_half_life_s 0.0 -> 604800.0" in note and f"defaults_version = {newest}" in note
    assert "compensation_when_exceeded" not in note  # the log set it: no version changes it
    _, records = step(state, T.SetPolicy(t=2 * MIN, params={"defaults_version": newest}, by="ops"))
    assert any(isinstance(r.event, T.PolicyChanged) for r in records)
    p = state.canonical.policy
    assert p.defaults_version == newest and p.fair_share_half_life_s == 7 * 24 * 3600
    assert p.notice_covers_save_in_progress and p.late_release_counts_as_preemption
    assert p.net_benefit_min == 7.0 and p.compensation_when_exceeded is False  # the log set these
    assert older_defaults_note(state.canonical.policy_params) == ""


def test_a_version_this_release_does_not_know_is_refused_by_name():
    state = new_state()
    step(state, node("n1"))
    _, records = step(state, T.SetPolicy(t=MIN, params={"defaults_version": 99}, by="ops"))
    refused = [r.event for r in records if isinstance(r.event, T.InputRejected)]
    assert refused and refused[0].reason == "invalid_policy"
    assert "defaults_version 99" in refused[0].detail and "newer xirang" in refused[0].detail
    # A log that names one (written by a newer release) does not fold here: the record is named.
    newer = [
        T.Record(
            n=1,
            prev="0" * 64,
            hash="",
            input_seq=0,
            event=T.PolicyChanged(t=1, params={"defaults_version": 99}, by="xirang"),
        )
    ]
    newer[0] = msgspec.structs.replace(newer[0], hash=T.chain_hash(newer[0].prev, T.encode(newer[0].event)))
    with pytest.raises((ChainError, ValueError), match="defaults_version 99"):
        rebuild(newer)


def test_the_what_if_reads_the_policy_of_the_window_from_the_logs_version():
    from replay.whatif import scan

    for version in (1, 2):
        records = _written_under(version)
        window = scan(records, records[-1].event.t, None)
        assert window.policy.defaults_version == version
        assert window.policy.fair_share_half_life_s == DEFAULTS_BY_VERSION[version]["fair_share_half_life_s"]
    legacy = [T.decode_record(line) for line in (GOLDEN / LEGACY_LOGS[2]).read_bytes().splitlines()]
    assert (
        scan(legacy, legacy[-1].event.t, None).policy == _fold_file(GOLDEN / LEGACY_LOGS[2]).canonical.policy
    )


def test_the_simulators_kept_log_folds_back_to_the_policy_it_ran_under(tmp_path):
    from replay.sim import Cluster, simulate
    from replay.workload import TraceJob, Workload

    jobs = [
        TraceJob(
            id=f"j{i}",
            submit_ms=i * MIN,
            duration_ms=10 * MIN,
            gpus=1,
            team=f"t{i % 2}",
            user="u",
            level=4,
            gpu_models=["A100"],
            ckpt_interval_ms=0,
            ckpt_cost_ms=0,
            restore_cost_ms=0,
            est_runtime_ms=10 * MIN,
        )  # fmt: skip
        for i in range(6)
    ]
    policy = with_params(defaults_of(1), {"fair_share_half_life_s": 600.0})
    path = tmp_path / "sim.jsonl"
    simulate(Workload(name="w", jobs=jobs, seed=0), Cluster.uniform(8), "xirang",
             {"policy": policy, "log_path": str(path)}, seed=0)  # fmt: skip
    first = T.decode_record(path.read_bytes().splitlines()[0]).event
    assert isinstance(first, T.PolicyChanged) and "defaults_version" in first.params
    folded = _fold_file(path).canonical
    assert folded.policy == policy and folded.policy_params["defaults_version"] == 1


def test_the_scheduler_names_an_older_version_and_how_to_adopt_the_newer():
    if Policy().defaults_version == LEGACY_DEFAULTS_VERSION:
        assert older_defaults_note({}) == ""
        return
    note = older_defaults_note({})
    assert f"version {LEGACY_DEFAULTS_VERSION}" in note and "fair_share_half_life_s" in note
    assert f"defaults_version = {Policy().defaults_version}" in note
    assert older_defaults_note({}, {"defaults_version": Policy().defaults_version}) == ""


def test_the_golden_log_of_version_2_folds_with_version_2_whatever_this_releases_defaults_are():
    state = _fold_file(GOLDEN / "written-with-defaults-version-2.jsonl")
    c = state.canonical
    assert c.policy_params["defaults_version"] == 2
    assert c.policy == with_params(defaults_of(2), c.policy_params)
    assert c.policy.fair_share_half_life_s == 7 * 24 * 3600 and c.usage  # decayed usage, digested
