"""``powerbudgetd probe``: what an operator runs first on new hardware (read-only)."""

from __future__ import annotations

from typing import Any

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.nvml import Nvml


def probe(nvml: Nvml) -> dict[str, Any]:
    """Read every card's limits, draw and persistence mode; writes nothing.

    Returns ``{"driver": str, "gpus": [...]}``, every power in W; a value NVML does not
    support is None, a card that fails to read carries ``error``.
    """
    out: dict[str, Any] = {"driver": None, "gpus": []}
    try:
        out["driver"] = nvml.driver_version()
    except NvmlError:
        pass
    for info in nvml.devices():
        gpu: dict[str, Any] = {
            "index": info.index,
            "uuid": info.uuid,
            "name": info.name,
            "min_limit_w": info.min_limit_w,
            "max_limit_w": info.max_limit_w,
            "default_limit_w": info.default_limit_w,
        }
        try:
            r = nvml.read(info.uuid)
            gpu.update(
                requested_limit_w=r.requested_limit_w,
                enforced_limit_w=r.enforced_limit_w,
                power_avg_w=r.power_avg_w,
                power_instant_w=r.power_instant_w,
                persistence_mode=nvml.persistence_mode(info.uuid),
                energy_j=nvml.energy_j(info.uuid),
            )
        except NvmlError as exc:
            gpu["error"] = f"{exc.kind}: {exc}"
        out["gpus"].append(gpu)
    return out


def format_probe(result: dict[str, Any]) -> str:
    def w(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1f}"

    lines = [f"driver {result['driver'] or 'unknown'}, {len(result['gpus'])} GPU(s)"]
    for g in result["gpus"]:
        lines.append(f"GPU {g['index']}  {g['name']}  {g['uuid']}")
        if "error" in g:
            lines.append(f"  error: {g['error']}")
            continue
        pm = {True: "on", False: "OFF (limits are lost when the driver unloads)", None: "n/a"}[g["persistence_mode"]]
        lines += [
            f"  limit constraints  {w(g['min_limit_w'])} - {w(g['max_limit_w'])} W (default {w(g['default_limit_w'])} W)",
            f"  limit              requested {w(g['requested_limit_w'])} W, enforced {w(g['enforced_limit_w'])} W",
            f"  board power        {w(g['power_avg_w'])} W (1 s average), {w(g['power_instant_w'])} W (instant)",
            f"  persistence mode   {pm}",
        ]
    return "\n".join(lines)
