"""The SDK's checkpoints against a real nats-server: stored as safetensors tensors, saved in
the background while training goes on (measured: steps done during the upload),
incrementally (a tensor whose content did not change is not uploaded again), a notice
arriving mid-save waits for that save, and a restore brings back the tensors and the
random-number states exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.local_cluster import REPO
from core import types as T
from transport import bus
from transport.natsd import EmbeddedNats
from agents.interrupts import run_until_stopped

pytestmark = pytest.mark.timeout(120)

TRAIN = """\
import json, os, random, signal, sys, time
import numpy as np
from agents import sdk

job = sdk.Job(checkpoint_every_s=3600)
frozen = np.random.default_rng(0).normal(size=4_000_000)  # 32 MB that never changes
w = np.zeros(1000)
random.seed(11); np.random.seed(12)
out = {}

def train_while_saving(step):
    global w
    while job.saving():
        step += 1
        w = w + 1.0
        time.sleep(0.001)
    return step

step = 0
assert job.checkpoint_async(step, {"frozen": frozen, "w": w})
after = train_while_saving(step)
out["first"] = {"bytes": job.last_upload_bytes, "steps_during_save": after - step}
step = after
assert job.checkpoint_async(step, {"frozen": frozen, "w": w})
after = train_while_saving(step)
out["second"] = {"bytes": job.last_upload_bytes, "steps_during_save": after - step}
step = after
frozen = frozen + 1.0  # changed: uploaded again, a long save
assert job.checkpoint_async(step, {"frozen": frozen, "w": w})
notice = {"saga": "s1", "deadline_t": int((time.time() + 60) * 1000), "checkpoint_needed": True}
(job.dir / "notice.json").write_text(json.dumps(notice))
os.kill(os.getpid(), signal.SIGUSR1)
out["notified_while_saving"] = job.saving()
out["final_step"] = step + 1
out["w_sum"] = float(w.sum())
# The next draws, with the states put back: the checkpoint at the notice holds these states.
states = random.getstate(), np.random.get_state()
out["next_draws"] = [random.random(), float(np.random.random())]
random.setstate(states[0]); np.random.set_state(states[1])
print(json.dumps(out), flush=True)
job.safe_point(step + 1, {"frozen": frozen, "w": w})  # waits for the save, saves, releases, exits
print("not reached", flush=True)
"""

RESTORE = """\
import json, random
import numpy as np
from agents import sdk

job = sdk.Job()
step, state = job.restore()
print(json.dumps({
    "step": step,
    "frozen_head": state["frozen"][:3].tolist(),
    "w_sum": float(state["w"].sum()),
    "rng": [random.random(), float(np.random.random())],
}), flush=True)
"""


def inputs(url: str) -> list[T.Input]:
    async def go():
        nc, js = await bus.connect(url, reconnects=3)
        try:
            end = await bus.stream_last_seq(js, bus.IN_STREAM)
            return [T.parse_input((await js.get_msg(bus.IN_STREAM, seq)).data) for seq in range(1, end + 1)]
        finally:
            await nc.close()

    return run_until_stopped(go())


def ensure_streams(url: str) -> None:
    async def go():
        nc, js = await bus.connect(url, reconnects=3)
        try:
            await bus.ensure_streams(js)
        finally:
            await nc.close()

    run_until_stopped(go())


def run_job(code: str, url: str, job_dir: Path, run: int, **extra: str) -> dict:
    job_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, XR_JOB="j", XR_NODE="h1", XR_NATS_URL=url, XR_JOB_DIR=str(job_dir))
    env.update(XR_RUN=f"h1/j/{run}", **extra)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=90
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def test_saves_go_on_in_the_background_incrementally_and_a_notice_waits_for_the_save_in_progress(tmp_path):
    nats = EmbeddedNats(tmp_path / "nats").start()
    try:
        ensure_streams(nats.url)
        out = run_job(TRAIN, nats.url, tmp_path / "run5", 5)
        print("measured:", json.dumps(out))
        # Training went on while the first (32 MB) save was written and uploaded.
        assert out["first"]["bytes"] > 30_000_000
        assert out["first"]["steps_during_save"] >= 10, out
        # The second save uploaded only what changed (w and the manifest, not the 32 MB).
        assert out["second"]["bytes"] < 100_000, out
        assert out["notified_while_saving"]
        facts = [i for i in inputs(nats.url) if T.input_job(i) == "j"]
        kinds = [(T.type_name(i), getattr(i, "step", None)) for i in facts]
        saved = [i for i in facts if isinstance(i, T.CheckpointSaved)]
        assert len(saved) == 4 and all(i.path.startswith("xr-ckpt:h1/5-") for i in saved), kinds
        # The save in progress at the notice was reported before the notice's own save and the release.
        assert kinds[-3:] == [
            ("checkpoint_started", None),
            ("checkpoint_saved", out["final_step"]),
            ("released", None),
        ]
        assert [k for k in kinds if k[0] == "checkpoint_saved"][2][1] == out["final_step"] - 1
        last = saved[-1]
        points = [{"step": i.step, "digest": i.digest, "path": i.path} for i in reversed(saved)]
        restored = run_job(
            RESTORE,
            nats.url,
            tmp_path / "run9",
            9,
            XR_RESUME_DIGEST=last.digest,
            XR_RESUME_STEP=str(last.step),
            XR_RESUME_POINTS=json.dumps(points),
        )
        assert restored["step"] == out["final_step"] and restored["w_sum"] == out["w_sum"]
        import numpy as np

        assert restored["frozen_head"] == (np.random.default_rng(0).normal(size=3) + 1.0).tolist()
        # The random-number states saved at the notice come back: the same next draws.
        assert restored["rng"] == out["next_draws"]
    finally:
        nats.stop()


OLD_RESTORE = """\
import json
from agents import sdk

job = sdk.Job()
step, state = job.restore()
print(json.dumps({"step": step, "w": state["w"].tolist()}), flush=True)
"""


def test_a_checkpoint_in_the_earlier_npz_format_still_restores(tmp_path):
    import random

    import numpy as np

    from agents import ckptfile, sdk
    from transport import checkpoints as ckptstore

    nats = EmbeddedNats(tmp_path / "nats").start()
    try:
        ensure_streams(nats.url)
        payload = {
            "step": 7,
            "state": {"w": np.arange(4.0)},
            "rng": {"python": random.getstate(), "numpy": np.random.get_state()},
        }
        data = ckptfile.encode(payload, None)  # what the SDK of the earlier release wrote
        digest = sdk.digest_of(data)
        index = [{"step": 7, "digest": digest, "bytes": len(data), "slot": 0, "node": "h1"}]

        async def store():
            nc, js = await bus.connect(nats.url, reconnects=3)
            try:
                await ckptstore.put(js, "j", "h1", 0, data)
                await ckptstore.put_index(js, "j", "h1", json.dumps(index).encode())
            finally:
                await nc.close()

        run_until_stopped(store())
        restored = run_job(
            OLD_RESTORE, nats.url, tmp_path / "run3", 3, XR_RESUME_DIGEST=digest, XR_RESUME_STEP="7"
        )
        assert restored == {"step": 7, "w": [0.0, 1.0, 2.0, 3.0]}
    finally:
        nats.stop()
