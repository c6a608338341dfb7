"""Where a job's output lies on a local cluster: each run's `output.log` under the host
agent's folder (`<data-dir>/hosts/<node>/runs/<job>-<record n>-<secret>/`), found from the
log's start and resume records (listing the runs folder, which the operator may and jobs may
not)."""

from __future__ import annotations

from pathlib import Path

from core import types as T

from transport.bus import node_token

from .runfolders import run_folders


def job_output_paths(records, job: str, hosts_dir: Path) -> list[Path] | None:
    """The output files of the job's runs on its primary node, oldest first; None when the
    log has never seen the job, [] when it has not started (no run folder yet)."""
    seen = False
    paths = []
    for record in records:
        ev = record.event
        if getattr(ev, "job", "") != job:
            continue
        seen = seen or isinstance(ev, T.JobSubmitted)  # a rejected input may name any job
        if isinstance(ev, (T.JobStartRequested, T.JobResumeRequested)) and ev.placement:
            node = ev.placement[0].node
            runs_dir = Path(hosts_dir) / node_token(node) / "runs"
            paths.extend(folder / "output.log" for folder in run_folders(runs_dir, job, record.n))
    return paths if seen else None
