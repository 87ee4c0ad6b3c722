"""Max-min fair division of a pool (pure): the one rule every sharer of watts uses (the
circuit's grants, the power tree's nodes)."""

from __future__ import annotations

from collections.abc import Mapping


def max_min_fair(pool_w: float, wants: Mapping[str, float], cost: Mapping[str, float] | None = None) -> dict[str, float]:
    """Max-min fair division of ``pool_w`` (W) over ``wants`` (W each): every host gets
    min(want, L) for the largest level L whose total fits. ``cost``: the pool's watts
    each host's watt takes (default 1; a power tree's node carries a share of a
    dual-corded host's draw, see ``core.tree``), so that sum(cost x share) <= pool.
    Returns W per host (0 for a non-positive pool); the total (at cost) never exceeds
    ``max(pool_w, 0)``."""
    out = {host: 0.0 for host in wants}
    left = max(0.0, pool_w)
    weight = {h: 1.0 if cost is None else cost[h] for h in wants}
    open_hosts = sorted((max(0.0, w), h) for h, w in wants.items() if w > 0)
    while open_hosts and left > 0:
        level = left / sum(weight[h] for _, h in open_hosts)
        want, host = open_hosts[0]
        if want <= level:  # the smallest want is met in full; split the rest again
            out[host] = want
            left -= want * weight[host]
            open_hosts.pop(0)
            continue
        for _, h in open_hosts:
            out[h] = level
        left = 0.0
        break
    return out
