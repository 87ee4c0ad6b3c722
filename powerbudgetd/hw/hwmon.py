"""The kernel's hwmon power caps: AMD (``amdgpu``) and Intel (``xe``, ``i915``) cards
without a vendor library.

Files read and written, per ``/sys/class/hwmon/hwmonN`` (every value in µW):

- amdgpu: ``power1_cap`` (rw, the cap in force), ``power1_cap_min``, ``power1_cap_max``,
  ``power1_cap_default``, ``power1_average`` (or ``power1_input`` on cards without an
  average); the kernel keeps the cap in whole W (it divides what is written by 10^6).
- Intel xe / i915: ``power1_max`` (rw, PL1; 0 = disabled: the card may then draw up to
  ``power1_rated_max``), ``power1_rated_max``, ``energy1_input`` (µJ); the PL1 unit is
  1/8 W. They publish no minimum: an Intel card is monitored and counted, not written,
  unless its hwmon has a ``power1_cap_min``.

The card's identity is ``<driver>-<PCI bus id>`` (the ``device`` link's target): hwmon
numbers change from boot to boot, bus ids do not. There is one cap and no separate
requested limit: a write counts once read back (:class:`~powerbudgetd.hw.card.Capabilities`).
Limits read (the cap, the range, the default) are rounded **up** to whole mW (never
counted under what is or may come to be in force); limits written are rounded **down**
to the card's step (never above the target).

A failed file operation becomes the project's errors by the kernel's errno: EACCES /
EPERM -> NvmlNoPermission, EINVAL / ERANGE -> NvmlInvalidArgument, ENODEV / ENOENT /
ENXIO -> NvmlGpuLost, EOPNOTSUPP -> NvmlNotSupported, ETIMEDOUT / EAGAIN / EBUSY ->
NvmlTimeout, anything else -> NvmlError. No card here has been checked on real
hardware (docs/getting-started/amd-intel.md).
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Collection
from typing import Any, Protocol, TypeVar

from powerbudgetd.errors import (
    NvmlError,
    NvmlGpuLost,
    NvmlInvalidArgument,
    NvmlNoPermission,
    NvmlNotInitialized,
    NvmlNotSupported,
    NvmlTimeout,
)
from powerbudgetd.core.units import uw_to_w_up, w_to_uw_down
from powerbudgetd.hw.card import Capabilities, GpuInfo, PowerReading, ScannedCards

HWMON_ROOT = "/sys/class/hwmon"
DRIVERS = {"amdgpu": "amd", "xe": "intel", "i915": "intel"}  # hwmon ``name`` -> vendor
AMD_CAPS = Capabilities(separate_requested=False, instant_reading=True, energy=False, persistence=False,
                        limit_step_w=1.0)
INTEL_CAPS = Capabilities(separate_requested=False, instant_reading=False, energy=True, persistence=False,
                          limit_step_w=0.125)

T = TypeVar("T")

_ERRNO_KINDS: dict[int, type[NvmlError]] = {
    errno.EACCES: NvmlNoPermission, errno.EPERM: NvmlNoPermission,
    errno.EINVAL: NvmlInvalidArgument, errno.ERANGE: NvmlInvalidArgument,
    errno.ENODEV: NvmlGpuLost, errno.ENOENT: NvmlGpuLost, errno.ENXIO: NvmlGpuLost,
    errno.EOPNOTSUPP: NvmlNotSupported,
    errno.ETIMEDOUT: NvmlTimeout, errno.EAGAIN: NvmlTimeout, errno.EBUSY: NvmlTimeout,
}


class HwmonFiles(Protocol):
    """How the backend reaches the files: the OS (:class:`OsFiles`), or the simulator's
    tree, which brings each file up to date from its physics before it is read."""

    def read(self, path: str) -> str: ...

    def write(self, path: str, text: str) -> None: ...

    def listdir(self, path: str) -> list[str]: ...

    def realpath(self, path: str) -> str: ...

    def exists(self, path: str) -> bool: ...


class OsFiles:
    """The files as the kernel serves them."""

    def read(self, path: str) -> str:
        with open(path) as fh:
            return fh.read()

    def write(self, path: str, text: str) -> None:
        # One write(2) per value, unbuffered: the kernel takes a sysfs store whole or refuses it.
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)


def _num(key: str) -> int:
    m = re.search(r"(\d+)$", key)
    return int(m.group(1)) if m else -1


class _Card:
    """Where one card's files are."""

    def __init__(self, directory: str, driver: str, bus_id: str) -> None:
        self.dir, self.driver, self.bus_id = directory, driver, bus_id
        self.vendor = DRIVERS[driver]
        self.uuid = f"{driver}-{bus_id}"
        amd = driver == "amdgpu"
        self.cap_file = "power1_cap" if amd else "power1_max"
        self.caps = AMD_CAPS if amd else INTEL_CAPS


class Hwmon(ScannedCards[_Card]):
    """A bank of AMD / Intel cards through the kernel's hwmon files (W in, W out).

    ``root``: the hwmon class directory; ``files``: how to reach it (the simulator's tree
    in tests); ``skip_bus_ids``: PCI bus ids of cards another backend has (AMD SMI's,
    under ``--backend auto``): never listed here. Every call raises project exceptions,
    mapped from the kernel's errno. Cards are listed in PCI bus id order, so indices do
    not follow hwmon numbering.
    """

    KIND = "hwmon"

    name = "hwmon"

    def __init__(self, root: str = HWMON_ROOT, files: HwmonFiles | None = None,
                 skip_bus_ids: Collection[str] = ()) -> None:
        self.root = root
        self.files: HwmonFiles = files or OsFiles()
        self.skip_bus_ids = skip_bus_ids
        self._cards: dict[str, _Card] = {}

    # -- plumbing -------------------------------------------------------------------
    def _io(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except OSError as exc:
            code = exc.errno or 0
            kind = _ERRNO_KINDS.get(code, NvmlError)
            raise kind(f"{what}: {os.strerror(code) if code else exc}", code=code, call=what) from None

    def _read_uw(self, card: _Card, name: str) -> int:
        text = self._io(f"{card.uuid} {name}", self.files.read, os.path.join(card.dir, name)).strip()
        try:
            value = int(text)
        except ValueError:
            raise NvmlError(f"{card.uuid} {name}: not a number: {text!r}", call=name) from None
        if value < 0:
            raise NvmlError(f"{card.uuid} {name}: negative: {value}", call=name)
        return value

    def _optional_uw(self, card: _Card, name: str) -> int | None:
        if not self.files.exists(os.path.join(card.dir, name)):
            return None
        try:
            return self._read_uw(card, name)
        except (NvmlNotSupported, NvmlGpuLost, NvmlInvalidArgument):
            # ENODATA / ENOENT on one attribute (a vanished file, an unsupported sensor):
            # unknown, not a lost card; a lost card fails its cap read.
            return None

    def _optional_power_uw(self, card: _Card, name: str) -> int | None:
        """A power reading's raw figure (µW), negative or absurd as the file says: judged
        by the control layer's plausibility rule as NVML's readings are, and never a
        reason to fail the read (the cap read beside it is what the budget needs).
        None: no such file, unreadable, or not a number."""
        path = os.path.join(card.dir, name)
        if not self.files.exists(path):
            return None
        try:
            text = self._io(f"{card.uuid} {name}", self.files.read, path).strip()
        except (NvmlNotSupported, NvmlGpuLost, NvmlInvalidArgument):
            return None
        try:
            return int(text)
        except ValueError:
            return None

    def _listed_by(self) -> str:
        return f"not found under {self.root}"

    def _gone(self, card: _Card) -> bool:
        return not self.files.exists(card.dir)

    def _scan(self) -> list[_Card]:
        found = []
        for entry in sorted(self._io("listdir", self.files.listdir, self.root), key=_num):
            d = os.path.join(self.root, entry)
            try:
                driver = self.files.read(os.path.join(d, "name")).strip()
                if driver not in DRIVERS:
                    continue
                bus_id = os.path.basename(self.files.realpath(os.path.join(d, "device")))
            except OSError:
                continue  # vanished while listed: gone
            if bus_id in self.skip_bus_ids:
                continue  # another backend's card
            found.append(_Card(d, driver, bus_id))
        found.sort(key=lambda c: c.bus_id)
        self._cards = {c.uuid: c for c in found}
        return found

    # -- lifecycle ------------------------------------------------------------------
    def init(self) -> None:
        """Check the hwmon directory can be listed. Raises NvmlNotInitialized."""
        try:
            self._scan()
        except NvmlError as exc:
            raise NvmlNotInitialized(f"hwmon: {exc}", call="init") from None

    def shutdown(self) -> None:
        self._cards = {}

    def driver_version(self) -> str:
        """The kernel release (the amdgpu / xe / i915 drivers ship with it)."""
        return os.uname().release

    # -- enumeration ----------------------------------------------------------------

    def _info(self, index: int, card: _Card) -> GpuInfo:
        self._read_uw(card, card.cap_file)  # a card whose cap cannot be read is not listed as answering
        amd = card.driver == "amdgpu"
        lo = self._optional_uw(card, "power1_cap_min")
        hi = self._optional_uw(card, "power1_cap_max" if amd else "power1_rated_max")
        default = self._optional_uw(card, "power1_cap_default" if amd else "power1_rated_max")
        name = card.driver
        product = os.path.join(card.dir, "device", "product_name")
        if self.files.exists(product):
            try:
                name = self.files.read(product).strip() or name
            except OSError:
                pass
        # Every limit rounded up to whole mW: the minimum is the lowest the card may hold,
        # the maximum and the default what it may have or come back with (worst cases,
        # never counted lower); a target is rounded down to the card's step when written.
        return GpuInfo(index, card.uuid, name, None if lo is None else uw_to_w_up(lo),
                       None if hi is None else uw_to_w_up(hi), None if default is None else uw_to_w_up(default),
                       None, card.vendor, "hwmon", card.bus_id, card.caps)

    # -- reads ----------------------------------------------------------------------
    def _cap_w(self, card: _Card) -> float:
        uw = self._read_uw(card, card.cap_file)
        if uw == 0 and card.driver != "amdgpu":  # PL1 disabled: up to the rated maximum
            rated = self._optional_uw(card, "power1_rated_max")
            if rated is None:
                raise NvmlError(f"{card.uuid}: PL1 disabled and no power1_rated_max", call=card.cap_file)
            uw = rated
        return uw_to_w_up(uw)

    def read(self, uuid: str) -> PowerReading:
        """The cap read back (as both limits) and the draw. Raises NvmlGpuLost, NvmlError."""
        card = self._card(uuid)
        cap_w = self._cap_w(card)
        avg = self._optional_power_uw(card, "power1_average")
        inst = self._optional_power_uw(card, "power1_input")
        if avg is None:
            avg, inst = inst, None
        return PowerReading(None if avg is None else avg / 1e6, None if inst is None else inst / 1e6, cap_w, cap_w)

    def power_instant_w(self, uuid: str) -> float | None:
        card = self._card(uuid)
        if not self.files.exists(os.path.join(card.dir, "power1_average")):
            return None  # power1_input is then the average itself
        inst = self._optional_power_uw(card, "power1_input")
        return None if inst is None else inst / 1e6

    def energy_j(self, uuid: str) -> float | None:
        """``energy1_input`` (µJ) in J; None where the card has none."""
        uj = self._optional_uw(self._card(uuid), "energy1_input")
        return None if uj is None else uj / 1e6

    def persistence_mode(self, uuid: str) -> bool | None:
        return None  # no such mode: the kernel driver stays loaded and keeps the cap

    # -- writes ---------------------------------------------------------------------
    def set_persistence_mode(self, uuid: str, enabled: bool) -> None:
        raise NvmlNotSupported(f"{uuid}: hwmon cards have no persistence mode", call="persistence")

    def set_power_limit(self, uuid: str, limit_w: float) -> None:
        """Write the cap (µW, rounded down to the card's step). Raises NvmlNoPermission
        (EACCES: needs root), NvmlInvalidArgument (EINVAL: outside the range; 0 W, which
        would disable Intel's PL1, is never written), NvmlGpuLost, NvmlError."""
        card = self._card(uuid)
        uw = w_to_uw_down(limit_w, card.caps.limit_step_w)
        if uw <= 0:
            raise NvmlInvalidArgument(f"{uuid}: a cap of {limit_w} W is not a limit", call=card.cap_file)
        self._io(f"{uuid} {card.cap_file}", self.files.write, os.path.join(card.dir, card.cap_file), str(uw))
