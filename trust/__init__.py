"""Trust: what proves who wrote what.

- `trust.signing`: the scheduler's Ed25519 key; it signs the log's records, and every
  reader (audit, the standby scheduler, host agents) verifies them with the public key.

It imports `core` (the record types) and the `cryptography` package, nothing above.
"""
