"""Max-min fair division of a pool (pure), for every sharer of watts between hosts (the
circuit's grants, the power tree's nodes): the water-fill of
:mod:`powerbudgetd.core.fairshare` from zero to each host's want, in W."""

from __future__ import annotations

from collections.abc import Mapping

from powerbudgetd.core.fairshare import waterfill


def max_min_fair(pool_w: float, wants: Mapping[str, float], cost: Mapping[str, float] | None = None) -> dict[str, float]:
    """Max-min fair division of ``pool_w`` (W) over ``wants`` (W each): every host gets
    min(want, L) for the largest level L whose total fits. ``cost``: the pool's watts
    each host's watt takes (default 1; a power tree's node carries a share of a
    dual-corded host's draw, see ``core.tree``), so that sum(cost x share) <= pool.
    Returns W per host (0 for a non-positive pool or want)."""
    hosts = list(wants)
    highs = [max(0.0, float(wants[h])) for h in hosts]
    weights = [1.0 if cost is None else float(cost[h]) for h in hosts]
    shares = waterfill(max(0.0, float(pool_w)), [0.0] * len(hosts), highs, weights)
    return dict(zip(hosts, shares))
