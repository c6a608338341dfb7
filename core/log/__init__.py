"""The log: applying events to the state (`evolve`), sealing them into the hash chain, and the state digests."""
