"""What the core tells every part of a run: the nodes' advertised addresses (a gang's
rendezvous), the job's own preemption signal and grace time, and the checkpoints a resume
may start from (with where they lie); a gang is stopped whole when one of its nodes is
lost or one of its parts cannot start."""

import msgspec

from core import new_state, rebuild, state_digest, step
from core import types as T

from tests.scenario import Run, submit


def up(name: str, addr: str = "", gpus: int = 8) -> T.NodeUp:
    return T.NodeUp(node=name, gpu_model="A100", gpus=gpus, advertise_addr=addr)


def starts(run: Run, job: str):
    return [
        e for e in run.events() if isinstance(e, (T.JobStartRequested, T.JobResumeRequested)) and e.job == job
    ]


def test_a_gang_start_names_every_node_with_the_address_it_advertised():
    run = Run()
    run.at(1, up("h1", "10.0.0.1"), up("h2", "10.0.0.2"))
    run.at(2, submit("g", 3, 16))
    (start,) = starts(run, "g")
    assert start.nodes == ["h1", "h2"]
    assert start.addrs == ["10.0.0.1", "10.0.0.2"]
    assert run.state.canonical.nodes["h2"].addr == "10.0.0.2"


def test_nodes_that_advertise_nothing_give_no_addresses():
    run = Run()
    run.at(1, up("h1"), up("h2"))
    run.at(2, submit("g", 3, 16))
    assert starts(run, "g")[0].addrs == []


def test_an_address_with_spaces_is_refused_and_the_node_does_not_join():
    run = Run()
    events = run.at(1, up("h1", "10.0.0.1 ; rm"))
    assert [e.reason for e in events if isinstance(e, T.InputRejected)] == ["advertise_addr_invalid"]
    assert "h1" not in run.state.canonical.nodes


def test_a_jobs_preempt_signal_and_grace_reach_its_start_and_widen_its_notice_deadline():
    run = Run()
    run.at(1, up("h1"))
    run.at(2, submit("v", 6, 8, est_runtime_s=36000, preempt_signal="usr1", grace_s=90))
    run.at(3, T.Started(job="v"))
    (start,) = starts(run, "v")
    assert (start.preempt_signal, start.grace_s) == ("SIGUSR1", 90.0)
    run.at(60_000, submit("u", 0, 8, team="t2"))
    notices = [e for e in run.events(T.VictimNotified) if e.job == "v"]
    assert notices, [type(e).__name__ for e in run.events()]
    assert notices[0].deadline_t - 60_000 >= 90_000


def test_an_unknown_preempt_signal_or_a_grace_out_of_range_is_refused_with_what_to_use():
    run = Run()
    run.at(1, up("h1"))
    bad = run.at(2, submit("a", 3, 1, preempt_signal="KILL"), submit("b", 3, 1, grace_s=0.0))
    bad += run.at(3, submit("c", 3, 1, grace_s=1e9))
    reasons = [(e.reason, e.detail) for e in bad if isinstance(e, T.InputRejected)]
    assert [r for r, _ in reasons] == [
        "preempt_signal_unknown",
        "grace_s_out_of_range",
        "grace_s_out_of_range",
    ]
    assert "USR1" in reasons[0][1]


def test_a_resume_lists_the_checkpoints_with_paths_newest_first():
    run = Run()
    run.at(1, up("h1"))
    run.at(2, submit("j", 5, 8))
    run.at(3, T.Started(job="j"))
    for t, step_no in ((10_000, 100), (20_000, 200)):
        run.at(
            t,
            T.CheckpointSaved(
                job="j", step=step_no, digest=f"sha256:{step_no}", bytes=1, path=f"/ck/j/{step_no}"
            ),
        )
    run.at(30_000, T.NodeDown(node="h1"))
    run.at(31_000, up("h2"))
    resume = starts(run, "j")[-1]
    assert isinstance(resume, T.JobResumeRequested)
    assert (resume.ckpt_step, resume.ckpt_digest) == (200, "sha256:200")
    assert [(p.step, p.path) for p in resume.resume_points] == [(200, "/ck/j/200"), (100, "/ck/j/100")]


def test_a_lost_node_stops_the_gangs_part_on_the_other_node_and_requeues_it():
    run = Run()
    run.at(1, up("h1"), up("h2"))
    run.at(2, submit("g", 3, 16))
    run.at(3, T.Started(job="g"))
    events = run.at(4, T.NodeDown(node="h2"))
    stops = [e for e in events if isinstance(e, T.JobStopRequested)]
    assert [(e.job, e.nodes, e.reason) for e in stops] == [("g", ["h1"], "node_lost")]
    assert run.job_state("g") == "queued"


def test_a_part_that_cannot_start_stops_the_whole_gang_and_queues_it_again():
    state, log = new_state(), []
    for inp in (
        T.NodeUp(t=1, node="h1", gpu_model="A100", gpus=8),
        T.NodeUp(t=1, node="h2", gpu_model="A100", gpus=8),
        T.NodeUp(t=1, node="h3", gpu_model="A100", gpus=8),
        T.Submit(t=2, job="g", team="t", user="u", level=3, gpus=16, gpu_models=["A100"]),
    ):
        log += step(state, inp)[1]
    first = [r.n for r in log if isinstance(r.event, T.JobStartRequested)][-1]
    records = step(state, T.Finished(t=3, job="g", ok=False, exit_code=None, requeue=True, attempt=first))[1]
    log += records
    kinds = [T.type_name(r.event) for r in records]
    assert "JobStopRequested" in kinds and "JobRequeued" in kinds and "JobFailed" not in kinds
    stop = next(r.event for r in records if isinstance(r.event, T.JobStopRequested))
    assert stop.reason == "gang_part_lost" and len(stop.nodes) == 2
    assert any(isinstance(r.event, T.JobStartRequested) and r.n > first for r in log)  # a new run
    assert state_digest(rebuild(log).canonical) == state_digest(state.canonical)


def test_events_written_before_these_fields_still_decode_with_their_defaults():
    old = b'{"type":"NodeJoined","t":1,"v":1,"node":"h1","gpu_model":"A100","gpus":8}'
    ev = msgspec.json.decode(old, type=T.Event)
    assert ev.addr == ""
    start = msgspec.json.decode(
        b'{"type":"JobResumeRequested","t":1,"v":1,"job":"j","placement":[],"nodes":[],'
        b'"ckpt_step":3,"ckpt_digest":"sha256:x"}',
        type=T.Event,
    )
    assert (start.addrs, start.preempt_signal, start.grace_s, start.resume_points) == ([], "", 0.0, [])
