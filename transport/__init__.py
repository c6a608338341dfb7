"""NATS transport: the embedded nats-server (`natsd`) and the JetStream streams, buckets
and subjects every process talks through (`bus`). Used by agents, projections and the CLI
alike; knows nothing of them."""
