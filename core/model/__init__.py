"""The model: the input and event types, the policy, the input limits, the state and its index, and where a gang fits on nodes."""
