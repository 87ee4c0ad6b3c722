"""Persistence mode at boot: a power limit is volatile without it.

Without persistence mode the driver unloads when no process holds a card, and the
power limit goes back to its default on the next load: the cap silently stops holding
(brief: "A cap that is not persisted is worse than none"). At boot every card is
checked; where it is off and the config allows, it is turned on and read back;
otherwise the daemon warns loudly, in the logs and in systemd's STATUS line.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.nvml import Nvml

log = structlog.get_logger("powerbudgetd")

WHY = "power limits are volatile without persistence mode: they return to the default when the driver unloads"


def ensure_persistence_mode(nvml: Nvml, cards: Iterable[tuple[int, str, bool]], enable: bool) -> list[int]:
    """Check (and where ``enable``, turn on) persistence mode on each card.

    ``cards``: (index, UUID, may we change it) per card; excluded cards are only
    checked. Returns the indexes of the cards left with persistence mode off or
    unknown. Never raises: NVML errors are logged and the card counts as off.
    """
    off: list[int] = []
    for index, uuid, ours in cards:
        try:
            on = nvml.persistence_mode(uuid)
        except NvmlError as exc:
            log.warning("persistence_mode_unknown", index=index, uuid=uuid, error=str(exc), detail=WHY)
            off.append(index)
            continue
        if on is None:  # not supported (not Linux): nothing to turn on
            log.info("persistence_mode_unsupported", index=index, uuid=uuid)
            continue
        if on:
            continue
        if enable and ours:
            try:
                nvml.set_persistence_mode(uuid, True)
                on = nvml.persistence_mode(uuid)  # read back, as every write
            except NvmlError as exc:
                log.error("persistence_mode_off", index=index, uuid=uuid, error=str(exc), detail=WHY)
                off.append(index)
                continue
            if on:
                log.info("persistence_mode_enabled", index=index, uuid=uuid)
                continue
        log.error(
            "persistence_mode_off", index=index, uuid=uuid,
            error="not turned on (enable_persistence_mode = false, or --dry-run); start nvidia-persistenced"
            if not enable
            else ("the card is excluded" if not ours else "turned on, but reads back off"),
            detail=WHY,
        )
        off.append(index)
    return off
