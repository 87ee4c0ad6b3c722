"""``powerbudgetd probe``: what an operator runs first on new hardware (read-only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.card import CardBackend
from powerbudgetd.hw.nvml import GpuInfo, Nvml


def probe(nvml: CardBackend) -> dict[str, Any]:
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
            "mig_mode": info.mig_mode,
            "vendor": info.vendor,
            "backend": info.backend,
            "bus_id": info.bus_id,
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


MIG_TEXT = {
    True: "enabled (limits are set on this GPU and cover all its MIG devices)",
    False: "disabled",
    None: "n/a (no MIG on this card or driver)",
}


def format_probe(result: dict[str, Any]) -> str:
    def w(v: float | None) -> str:
        """A figure in W with its unit, or ``n/a`` alone (no unit on an absent value)."""
        return "n/a" if v is None else f"{v:.1f} W"

    lines = [f"driver {result['driver'] or 'unknown'}, {len(result['gpus'])} GPU(s)"]
    for g in result["gpus"]:
        lines.append(f"GPU {g['index']}  {g['name']}  {g['uuid']}")
        lines.append(f"  vendor / backend   {g.get('vendor', 'nvidia')} / {g.get('backend', 'nvml')}"
                     + (f", PCI {g['bus_id']}" if g.get("bus_id") else ""))
        if "error" in g:
            lines.append(f"  error: {g['error']}")
            continue
        pm = {True: "on", False: "OFF (limits are lost when the driver unloads)", None: "n/a"}[g["persistence_mode"]]
        lines += [
            f"  limit constraints  {w(g['min_limit_w'])} - {w(g['max_limit_w'])} (default {w(g['default_limit_w'])})",
            f"  limit              requested {w(g['requested_limit_w'])}, enforced {w(g['enforced_limit_w'])}",
            f"  board power        {w(g['power_avg_w'])} (1 s average), {w(g['power_instant_w'])} (instant)",
            f"  persistence mode   {pm}",
            f"  MIG mode           {MIG_TEXT[g.get('mig_mode')]}",
        ]
    return "\n".join(lines)


def _shape(row: dict[str, Any]) -> tuple[Any, ...]:
    if "error" in row:
        return ("error", row["error"])
    value = row["value"]
    inner = tuple(type(v).__name__ for v in value) if isinstance(value, list) else ()
    return (row["type"], inner, len(value) if isinstance(value, list) else None, row.get("value_type"))


def _answer(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("call", "unit")}


def compare_sim(real: Nvml, sim_for: Callable[[list[GpuInfo]], tuple[list[str], Nvml]]) -> dict[str, Any]:
    """Each read-only call's answer on the real cards beside the simulator's answer for
    the nearest preset card. Writes nothing.

    ``sim_for(cards)`` returns (preset name per card, an initialised NVML layer over
    those presets in the same order). Returns ``{"gpus": [{"index", "name", "preset",
    "calls": [{"call", "unit", "real", "sim", "same_shape"}]}], "differences": int}``;
    ``real``/``sim`` are :meth:`Nvml.raw_answers` rows (the caller adds ``backend``); ``same_shape`` is False where the
    type, value type or NOT_SUPPORTED-vs-value differ (values themselves may differ).
    """
    cards = real.devices()
    answers = [real.raw_answers(c.uuid) for c in cards]  # all of the real side first
    presets, sim = sim_for(cards)
    out: dict[str, Any] = {"gpus": [], "differences": 0}
    for info, preset, rows, sim_info in zip(cards, presets, answers, sim.devices()):
        sim_rows = {r["call"]: r for r in sim.raw_answers(sim_info.uuid)}
        calls = []
        for row in rows:
            other = sim_rows[row["call"]]
            same = _shape(row) == _shape(other)
            out["differences"] += not same
            calls.append({"call": row["call"], "unit": row["unit"], "real": _answer(row), "sim": _answer(other),
                          "same_shape": same})
        out["gpus"].append({"index": info.index, "name": info.name, "preset": preset, "calls": calls})
    return out


def format_compare(result: dict[str, Any]) -> str:
    def cell(r: dict[str, Any]) -> str:
        if "error" in r:
            return r["error"].removeprefix("NVML_ERROR_")
        vt = f" vt={r['value_type']}" if "value_type" in r else ""
        return f"{r['value']!r} ({r['type']}{vt})"

    on_sim = result.get("backend") == "sim"
    lines = []
    for g in result["gpus"]:
        lines.append(f"GPU {g['index']}  {g['name']}  vs simulated preset {g['preset']}")
        lines.append(f"  {'call':<48} {'unit':<18} {'sim bank' if on_sim else 'real':<34} simulator")
        for c in g["calls"]:
            mark = " " if c["same_shape"] else "!"
            lines.append(f"{mark} {c['call']:<48} {c['unit']:<18} {cell(c['real']):<34} {cell(c['sim'])}")
    n = result["differences"]
    where = ("on the simulated bank (--backend sim) and in the simulator's presets: the simulator against "
             "itself, not real cards" if on_sim else "on the real cards and in the simulator")
    lines.append(f"{n} call(s) differ in shape (type, value type or NOT_SUPPORTED vs value), {where}: marked !"
                 if n else f"every call has the same shape {where}")
    return "\n".join(lines)
