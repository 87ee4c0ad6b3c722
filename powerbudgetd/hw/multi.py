"""One bank, several backends: NVIDIA cards through NVML, AMD and Intel cards through
hwmon or AMD SMI, under one budget.

:class:`MultiBackend` lists each backend's cards one after another (in the order the
backends are given) with one index sequence, and routes every call on a card to the
backend that listed it, by the card's identity (NVML's UUID, hwmon's
``<driver>-<bus id>``, AMD SMI's ``amdsmi-<bus id>``): identities never collide across
backends and do not change when another backend's cards come or go.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from powerbudgetd.errors import NvmlError, NvmlGpuLost, NvmlNotInitialized
from powerbudgetd.hw.card import CardBackend, GpuInfo, PowerReading


class MultiBackend:
    """Several backends as one (a :class:`~powerbudgetd.hw.card.CardBackend`).

    Errors are the backends' own; a card no backend lists raises NvmlGpuLost.
    """

    name = "multi"

    def __init__(self, backends: Sequence[CardBackend]) -> None:
        if not backends:
            raise ValueError("MultiBackend needs at least one backend")
        self.backends = list(backends)
        self._owner: dict[str, CardBackend] = {}

    def init(self) -> None:
        """Start every backend. Raises NvmlNotInitialized naming each that failed."""
        failed = []
        for b in self.backends:
            try:
                b.init()
            except NvmlError as exc:
                failed.append(f"{b.name}: {exc}")
        if failed:
            raise NvmlNotInitialized("; ".join(failed), call="init")

    def shutdown(self) -> None:
        for b in self.backends:
            b.shutdown()

    def driver_version(self) -> str:
        parts = []
        for b in self.backends:
            try:
                parts.append(f"{b.name} {b.driver_version()}")
            except NvmlError as exc:
                parts.append(f"{b.name} unknown ({exc})")
        return ", ".join(parts)

    def devices(self, skip_errors: bool = False) -> list[GpuInfo]:
        out: list[GpuInfo] = []
        for b in self.backends:
            for info in b.devices(skip_errors):
                self._owner[info.uuid] = b
                out.append(_reindexed(info, len(out)))
        return out

    def device_count(self) -> int:
        return sum(b.device_count() for b in self.backends)

    def device(self, index: int) -> GpuInfo:
        """The card at bank index ``index`` (the backends' counts asked now)."""
        first = 0
        for b in self.backends:
            n = b.device_count()
            if index < first + n:
                info = b.device(index - first)
                self._owner[info.uuid] = b
                return _reindexed(info, index)
            first += n
        raise NvmlGpuLost(f"no card at index {index} (the bank has {first})", call="lookup")

    def _of(self, uuid: str) -> CardBackend:
        b = self._owner.get(uuid)
        if b is None:
            self.devices(skip_errors=True)
            b = self._owner.get(uuid)
        if b is None:
            raise NvmlGpuLost(f"card {uuid} is listed by no backend", call="lookup")
        return b

    def read(self, uuid: str) -> PowerReading:
        return self._of(uuid).read(uuid)

    def power_instant_w(self, uuid: str) -> float | None:
        return self._of(uuid).power_instant_w(uuid)

    def energy_j(self, uuid: str) -> float | None:
        return self._of(uuid).energy_j(uuid)

    def persistence_mode(self, uuid: str) -> bool | None:
        return self._of(uuid).persistence_mode(uuid)

    def set_persistence_mode(self, uuid: str, enabled: bool) -> None:
        self._of(uuid).set_persistence_mode(uuid, enabled)

    def set_power_limit(self, uuid: str, limit_w: float) -> None:
        self._of(uuid).set_power_limit(uuid, limit_w)


def _reindexed(info: GpuInfo, index: int) -> GpuInfo:
    return info if info.index == index else replace(info, index=index)
