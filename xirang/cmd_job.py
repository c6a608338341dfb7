"""What a running job says about itself without the SDK, from any of its processes, a shell
script or a framework's callback:

    xirang job checkpoint-saved --step N [--path P] [--digest D]
    xirang job released

They work inside a run only (its host agent gave it `$XR_OUTBOX`, `$XR_RUN`, `$XR_JOB`): the
fact goes to the run's own durable outbox, which its host agent delivers as the run's, after
checking it is the job's own and (for a path) that the path lies in the job's checkpoint
folders (`$XR_CKPT_ROOTS`; agents/ckptpath.py). `--digest` is computed from the path when
left out (a folder's files too). Only the run's part on its first node (`NODE_RANK` 0)
reports: a call from another node's part is a no-op that says so, because a checkpoint
counts once every rank's part of it is saved, which the job knows (its save returned on
every rank, a barrier) and the scheduler does not. After `released` the job should exit;
its host stops what is left of it at the end of its grace time.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from xirang.errors import UserError


def register(sub) -> None:
    """Add `xirang job ...` to the CLI."""
    job = sub.add_parser("job", help="what a running job reports about itself (checkpoints, release)")
    verbs = job.add_subparsers(dest="verb", metavar="VERB")
    verbs.required = True
    saved = verbs.add_parser(
        "checkpoint-saved",
        help="a checkpoint of this run is complete on every rank (priced and resumed from)",
    )
    saved.add_argument("--step", type=int, required=True, help="the training step the checkpoint holds")
    saved.add_argument("--path", default="", help="the file or folder written (under $XR_CKPT_DIR)")
    saved.add_argument("--digest", default="", help="its content digest (default: computed from --path)")
    saved.set_defaults(func=cmd_checkpoint_saved)
    released = verbs.add_parser("released", help="this run has let its GPUs go after a preemption notice")
    released.set_defaults(func=cmd_released)


def _run_env() -> dict[str, str]:
    env = {name: os.environ.get(name, "") for name in ("XR_OUTBOX", "XR_RUN", "XR_JOB", "NODE_RANK")}
    if not (env["XR_OUTBOX"] and env["XR_RUN"] and env["XR_JOB"]):
        raise UserError(
            "not inside a xirang run ($XR_OUTBOX, $XR_RUN, $XR_JOB unset): run this from a job a host agent started"
        )
    return env


def _not_first_node(env: dict[str, str], what: str) -> bool:
    if env["NODE_RANK"] not in ("", "0"):
        print(
            f"xirang job {what}: not reported from node rank {env['NODE_RANK']}; the part on node rank 0"
            " reports for the whole run",
            file=sys.stderr,
        )
        return True
    return False


def _put(env: dict[str, str], inp, suffix: str) -> None:
    import msgspec

    from agents.outbox import Outbox

    attempt = env["XR_RUN"].rsplit("/", 1)[-1]
    inp = msgspec.structs.replace(
        inp, id=f"{env['XR_RUN']}:{suffix}", attempt=int(attempt) if attempt.isdigit() else 0
    )
    Outbox(env["XR_OUTBOX"]).put(inp)


def cmd_checkpoint_saved(args) -> int:
    """`xirang job checkpoint-saved`: report a checkpoint this run wrote itself."""
    from agents import ckptpath
    from core import types as T

    env = _run_env()
    if args.step < 0:
        raise UserError(f"--step {args.step}: give the (non-negative) training step the checkpoint holds")
    if _not_first_node(env, "checkpoint-saved"):
        return 0
    path, digest, size = args.path, args.digest, 0
    if path:
        path = os.path.abspath(path)
        roots = [Path(p) for p in os.environ.get("XR_CKPT_ROOTS", "").split(os.pathsep) if p]
        problem = ckptpath.path_problem(path, roots)
        if problem:
            raise UserError(f"--path refused: {problem}; write the checkpoint under $XR_CKPT_DIR")
        try:
            computed, size = ckptpath.digest_path(path)
        except OSError as err:
            raise UserError(f"--path {path}: cannot read it ({err})") from err
        if digest and digest != computed:
            raise UserError(f"--digest {digest} does not match {path} (its content digest is {computed})")
        digest = computed
    if not digest:
        raise UserError("give --path (its digest is computed) or --digest: a checkpoint must be verifiable")
    inp = T.CheckpointSaved(job=env["XR_JOB"], step=args.step, digest=digest, bytes=size, path=path)
    _put(env, inp, f"ckpt-saved-{args.step}-{digest.rsplit(':', 1)[-1][:12]}")
    print(f"checkpoint of step {args.step} reported ({digest})")
    return 0


def cmd_released(args) -> int:
    """`xirang job released`: after a notice, this run has let its GPUs go."""
    from core import types as T

    env = _run_env()
    if _not_first_node(env, "released"):
        return 0
    _put(env, T.Released(job=env["XR_JOB"]), f"released-{time.time_ns()}")
    job_dir = os.environ.get("XR_JOB_DIR", "")
    if job_dir:
        from trust.durable import write_durably

        # Tells the host agent the release is reported already (not again at the exit).
        write_durably(Path(job_dir) / "released", b"cli")
    print("released reported; exit now")
    return 0
