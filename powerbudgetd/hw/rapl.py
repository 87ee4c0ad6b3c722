"""The kernel's powercap RAPL files: each CPU package's energy counter under
``/sys/class/powercap`` (a root given for tests). Only the package zones
(``intel-rapl:N``) are read: their sub-zones (``intel-rapl:N:M``: cores, uncore, DRAM)
are parts of what the package counts, or not the CPU's. Since Linux 5.10 ``energy_uj`` is
readable by root only.
"""

from __future__ import annotations

import re
from pathlib import Path

from powerbudgetd.core.rapl import ZoneSample

PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")


class RaplError(OSError):
    """No usable sample: no package zone, or a file that cannot be read or parsed (the
    message names it)."""


def package_zones(root: Path) -> list[Path]:
    """The package zones under ``root``, in order. Raises RaplError when there are none."""
    try:
        zones = sorted((p for p in root.iterdir() if PACKAGE_ZONE.match(p.name)), key=lambda p: p.name)
    except OSError as exc:
        raise RaplError(f"cannot list {root}: {exc.strerror or exc}") from None
    if not zones:
        raise RaplError(f"no RAPL package zone (intel-rapl:N) under {root}: no RAPL on this CPU, or not Linux")
    return zones


def _read_int(path: Path) -> int:
    try:
        text = path.read_text()
    except OSError as exc:
        raise RaplError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return int(text.strip())
    except ValueError:
        raise RaplError(f"{path}: not an integer: {text.strip()[:40]!r}") from None


def read_zones(zones: list[Path]) -> dict[str, ZoneSample]:
    """Each zone's counter and range. Raises RaplError naming the file that failed."""
    return {z.name: ZoneSample(_read_int(z / "energy_uj"), _read_int(z / "max_energy_range_uj")) for z in zones}
