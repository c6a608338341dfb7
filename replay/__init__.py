"""Simulation and comparison of scheduling policies on GPU job traces.

- `replay.workload`: traces (canonical CSV, Philly) and seeded defaults for missing columns;
- `replay.sim`: the discrete-event simulator (`simulate(...) -> SimResult`), its job and
  host model, and `Cluster`;
- `replay.peers`: the policies it runs (`none`, `k8s`, `slurm`, and `xirang`, which is
  `core.step` itself);
- `replay.scorecard`: per-policy metrics, the terminal table, JSON, DuckDB and PNG output;
- `replay.bench`: `xirang bench sim`.

Folding a recorded log back into state lives in `core.replay`.
"""
