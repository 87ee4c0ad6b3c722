"""The card seam: what the control layer needs of a card, whatever its vendor.

A **backend** (NVML, the kernel's hwmon files, AMD SMI, several of them at once) lists
cards as :class:`GpuInfo`, reads each as a :class:`PowerReading` and writes its power
limit, in W. Each card says what its backend can tell (:class:`Capabilities`): the
ledger's worst case and the plausibility rules read those flags, never a vendor's name.
Every backend raises the exceptions of :mod:`powerbudgetd.errors` (``NvmlError`` and its
kinds: the names are historical, the kinds are the backends' common language).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar

from powerbudgetd.errors import NvmlError, NvmlGpuLost

_C = TypeVar("_C")


@dataclass(frozen=True)
class Capabilities:
    """What a backend can tell of a card.

    ``separate_requested``: it reads the requested limit and the enforced one apart
    (NVML); without it (hwmon, AMD SMI) one cap is read back, a write counts once that
    read shows it, and the card is counted at what it read plus what is in flight.
    ``instant_reading``: a sub-second power reading besides the average.
    ``energy``: a cumulative energy counter. ``persistence``: a persistence mode that
    keeps the driver, and the limits, loaded with no process on the card (NVIDIA's).
    ``limit_step_w``: the steps a limit is kept in (W): NVML keeps mW; amdgpu whole W
    (it divides the µW written by 10^6); a target is rounded down to a step, so what is
    read back is what was written and the sum stays within the budget.
    """

    separate_requested: bool = True
    instant_reading: bool = True
    energy: bool = True
    persistence: bool = True
    limit_step_w: float = 0.001


NVML_CAPS = Capabilities()


@dataclass(frozen=True)
class GpuInfo:
    """A physical GPU as enumerated at start; keyed by ``uuid`` (stable across reboots
    and re-enumeration: NVML's UUID, or ``<driver>-<PCI bus id>`` for a card without one).

    Limits in W, from the backend's constraints and default (NVML:
    ``nvmlDeviceGetPowerManagementLimitConstraints`` / ``...DefaultLimit``; hwmon:
    ``power1_cap_min`` / ``_max`` / ``_default``); ``None`` where limit control is not
    supported on the card. ``mig_mode``: MIG enabled (NVML only); None where the card or
    driver has none. ``vendor`` (``nvidia``, ``amd``, ``intel``), ``backend`` (``nvml``,
    ``hwmon``, ``amdsmi``) and ``bus_id`` (PCI, ``0000:03:00.0``; None when unknown) name
    where the card is; ``caps`` what its backend can tell.
    """

    index: int
    uuid: str
    name: str
    min_limit_w: float | None
    max_limit_w: float | None
    default_limit_w: float | None
    mig_mode: bool | None = None
    vendor: str = "nvidia"
    backend: str = "nvml"
    bus_id: str | None = None
    caps: Capabilities = NVML_CAPS


class PowerReading(NamedTuple):
    """One read of a card. Every value in W; ``None`` means unknown (never 0 W). A named
    tuple: made for every card every tick (0.42 us, the frozen dataclass 0.73 us).

    ``power_avg_w``: NVML ``nvmlDeviceGetPowerUsage`` (a trailing 1 s mean on current
    GPUs); hwmon ``power1_average`` (or ``power1_input`` where there is no average).
    ``power_instant_w``: NVML field 186, refreshed every 100 ms; hwmon ``power1_input``;
    ``None`` where there is none.
    ``requested_limit_w``: ``nvmlDeviceGetPowerManagementLimit``; for a backend without
    a separate requested limit, the cap read back (the same as ``enforced_limit_w``).
    ``enforced_limit_w``: ``nvmlDeviceGetEnforcedPowerLimit``, after every limiter;
    hwmon ``power1_cap`` (amdgpu) / ``power1_max`` (Intel).
    """

    power_avg_w: float | None
    power_instant_w: float | None
    requested_limit_w: float | None
    enforced_limit_w: float | None


class CardBackend(Protocol):
    """What the control layer calls on a bank of cards (``Nvml``, ``Hwmon``, ``AmdSmi``, ``MultiBackend``).

    Every call raises NvmlError kinds: NvmlGpuLost (card gone), NvmlTimeout (no answer
    in time), NvmlNoPermission, NvmlInvalidArgument (a value refused), NvmlNotSupported.
    """

    name: str  # the backend's name as --backend and the metrics spell it

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def devices(self, skip_errors: bool = False) -> list[GpuInfo]: ...

    def device(self, index: int) -> GpuInfo: ...

    def device_count(self) -> int: ...

    def read(self, uuid: str) -> PowerReading: ...

    def power_instant_w(self, uuid: str) -> float | None: ...

    def energy_j(self, uuid: str) -> float | None: ...

    def persistence_mode(self, uuid: str) -> bool | None: ...

    def set_persistence_mode(self, uuid: str, enabled: bool) -> None: ...

    def set_power_limit(self, uuid: str, limit_w: float) -> None: ...


class ScannedCards(Generic[_C]):
    """The listing a backend shares that rescans its cards at each call (hwmon, AMD SMI):
    it gives :meth:`_scan` (the cards now, kept in ``_cards`` by UUID) and :meth:`_info`
    (one as :class:`GpuInfo`), and may say a kept card is :meth:`_gone` (rescan);
    ``KIND`` and :meth:`_listed_by` name it and where it looks in a lookup's error."""

    KIND = "card"
    _cards: dict[str, _C]

    def _scan(self) -> list[_C]:
        raise NotImplementedError

    def _listed_by(self) -> str:
        raise NotImplementedError

    def _gone(self, card: _C) -> bool:
        return False

    def _card(self, uuid: str) -> _C:
        """The card ``uuid`` as last listed, rescanning when it is not (or is gone);
        raises NvmlGpuLost when the listing has it no more."""
        card = self._cards.get(uuid)
        if card is None or self._gone(card):
            self._scan()
            card = self._cards.get(uuid)
        if card is None:
            raise NvmlGpuLost(f"card {uuid} {self._listed_by()}", call="lookup")
        return card

    def _info(self, index: int, card: _C) -> GpuInfo:
        raise NotImplementedError

    def devices(self, skip_errors: bool = False) -> list[GpuInfo]:
        out = []
        for i, card in enumerate(self._scan()):
            try:
                out.append(self._info(i, card))
            except NvmlError:
                if not skip_errors:
                    raise
        return out

    def device(self, index: int) -> GpuInfo:
        cards = self._scan()
        if not 0 <= index < len(cards):
            raise NvmlGpuLost(f"no {self.KIND} card at index {index}", call="lookup")
        return self._info(index, cards[index])

    def device_count(self) -> int:
        return len(self._scan())
