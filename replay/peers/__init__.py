"""Scheduling policies the simulator runs side by side: `none`, `k8s`, `slurm` (peers
modelled on documented behaviour, each in its module) and `xirang` (core.step itself).
They share one interface, described in `replay.peers.base`."""

from __future__ import annotations

POLICIES = ("none", "k8s", "slurm", "xirang")


def make_policy(name: str, config: dict, cluster, seed: int):
    """The policy named `name` (one of POLICIES) built with its config for this cluster;
    ValueError names the choices."""
    if name == "none":
        from .none import NonePolicy as cls
    elif name == "k8s":
        from .k8s import K8sPolicy as cls
    elif name == "slurm":
        from .slurm import SlurmPolicy as cls
    elif name == "xirang":
        from .xirang import XirangPolicy as cls
    else:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return cls(config, cluster, seed)
