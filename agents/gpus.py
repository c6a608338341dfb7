"""GPU inventory of a host: pynvml discovery (model, memory, UUID, utilisation) or a
simulated inventory (`--simulate 8xH100`) where no NVIDIA GPU exists."""

from __future__ import annotations

import re
import warnings

import msgspec

SIMULATE_PATTERN = re.compile(r"^(\d+)x([A-Za-z0-9][A-Za-z0-9_.-]*)$")


class Gpu(msgspec.Struct, kw_only=True):
    """One GPU of the host, as NVML (or the simulation) reports it."""

    index: int
    model: str
    memory_mib: int
    uuid: str
    utilisation_pct: int = 0


class Inventory(msgspec.Struct, kw_only=True):
    """The host's GPUs (one model a host) and whether they are simulated."""

    model: str
    gpus: list[Gpu]
    simulated: bool


class NoGpus(RuntimeError):
    """No usable NVIDIA GPU: the message says what to do instead."""


def parse_simulate(spec: str) -> Inventory:
    """An inventory of simulated GPUs from `COUNTxMODEL` (e.g. 8xH100)."""
    match = SIMULATE_PATTERN.match(spec.strip())
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"--simulate {spec!r}: write COUNTxMODEL, for example 8xH100")
    count, model = int(match.group(1)), match.group(2)
    gpus = [Gpu(index=i, model=model, memory_mib=81_559, uuid=f"GPU-sim-{model}-{i}") for i in range(count)]
    return Inventory(model=model, gpus=gpus, simulated=True)


def short_model(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100-80GB-HBM3': what users put in gpu_models."""
    name = name.removeprefix("NVIDIA").strip()
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "unknown"


def discover() -> Inventory:
    """The host's real NVIDIA GPUs through NVML; `NoGpus` says what to do when there are none."""
    try:
        with warnings.catch_warnings():  # the pynvml shim warns that it is deprecated
            warnings.simplefilter("ignore", FutureWarning)
            import pynvml
    except ImportError as err:
        raise NoGpus("pynvml is not installed; pass --simulate 8xH100 for a simulated host") from err
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        raise NoGpus(
            f"no NVIDIA driver found ({err}); pass --simulate 8xH100 to run a simulated host"
        ) from err
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = _text(pynvml.nvmlDeviceGetName(handle))
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except pynvml.NVMLError:
                util = 0
            gpus.append(
                Gpu(
                    index=i,
                    model=short_model(name),
                    memory_mib=memory.total // 2**20,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    utilisation_pct=util,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    if not gpus:
        raise NoGpus("the NVIDIA driver reports no GPUs; pass --simulate 8xH100 for a simulated host")
    models = sorted({g.model for g in gpus})
    if len(models) > 1:
        # The scheduler models one GPU model per node; take the most common one.
        models.sort(key=lambda m: -sum(g.model == m for g in gpus))
        gpus = [g for g in gpus if g.model == models[0]]
    return Inventory(model=models[0], gpus=gpus, simulated=False)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
