"""Forecasts: when holding jobs release their GPUs, when a gang fits, how long a queued job waits."""
