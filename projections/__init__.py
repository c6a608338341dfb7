"""Projections of the log and everything that reads them.

- `projector`: XR_EV into DuckDB, exactly once (the position is committed with the rows);
  `schema` documents every table and view; `logsource` reads JetStream or exported JSONL.
- `audit`: rebuild and verify the log (hash chain, StateDigests), tell a job's history.
- `metrics`, `alerts`, `dashboard`: monitoring numbers, Prometheus text, the web page.
- `ab`, `tuner`, `report`, `whatif`: A/B with bootstrap intervals, policy proposals as
  set_policy inputs, the periodic HTML review, and re-running a window in the simulator.
- `workload`: a seeded closed-loop driver that makes realistic logs for tests and benches.

The command line is `xirang/cmd_data.py`; `xirang bench replay` is `bench.run`.
"""
