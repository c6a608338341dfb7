"""Each team's GPU use at each level, decayed by half every `fair_share_half_life_s`.

A team holding `g` GPUs from `s` to `e` adds g * H / ln 2 * (2^(-(now - e) / H) - 2^(-(now
- s) / H)) GPU-ms at `now` (H the half-life): what `xirang shares` and the projection's
`team_usage_decayed` give per team. The state keeps, per (level, team), the decayed total up
to the last change of the GPUs the team holds at the level (`Usage`); between changes the
count is constant, so the total at any later time follows in closed form. Kept by `evolve`
only while the half-life is set: with it 0 the state has no usage at all.
"""

from __future__ import annotations

import math

from .entities import Usage

LN2 = math.log(2.0)


def usage_key(level: int, team: str) -> str:
    """The key of a team's use at a level in `Canonical.usage`."""
    return f"{level}/{team}"


def decayed_gpu_ms(usage: Usage | None, held_gpus: int, t: int, half_life_ms: float) -> float:
    """A team's decayed GPU-ms at `t`: its total at `usage.t` decayed since, plus `held_gpus`
    held all the while (the count has not changed since `usage.t`)."""
    if half_life_ms <= 0:
        return 0.0
    since = usage.t if usage is not None else t
    total = usage.gpu_ms if usage is not None else 0.0
    elapsed = max(0, t - since)
    if elapsed == 0:
        return total
    factor = 2.0 ** (-elapsed / half_life_ms)
    return total * factor + held_gpus * half_life_ms / LN2 * (1.0 - factor)


def mean_gpus(gpu_ms: float, half_life_ms: float) -> float:
    """Decayed GPU-ms as the GPUs held on average: holding g GPUs for ever decays to
    g * H / ln 2, so this is g for a team that always held g."""
    if half_life_ms <= 0:
        return 0.0
    return gpu_ms * LN2 / half_life_ms
