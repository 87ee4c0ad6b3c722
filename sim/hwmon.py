"""A simulated hwmon tree: the kernel's power-cap files of a bank's AMD and Intel cards,
served from the same physics as the simulated NVML library (:mod:`powerbudgetd_sim.physics`).

:class:`SimHwmonTree` lays out a real directory (``hwmonN/name``, ``hwmonN/device`` as a
link to ``devices/<PCI bus id>``, the power files) in a temporary directory, and is the
:class:`~powerbudgetd.hw.hwmon.HwmonFiles` the production ``Hwmon`` backend reads it
through: each file is brought up to date from the physics just before it is read, and
each write goes to the physics (or is refused with the kernel's errno). The backend's
own path handling, parsing and errno mapping run on real files.

What the card's files say (µW):

- ``power1_cap`` (amdgpu) / ``power1_max`` (xe): the highest limit that may be in force
  on the card now (requested, enforced after the lag, in flight): a raise reads back at
  once, a cut once it bites; an outside floor shows as the cap it holds;
- ``power1_cap_min`` / ``_max`` (``power1_rated_max`` on xe): the reported constraints
  (they may lie, as NVML's may); ``power1_cap_default``;
- ``power1_average`` / ``power1_input``: the 1 s average and the instant draw (amdgpu;
  no ``power1_input`` on a card without an instant reading); ``energy1_input`` (xe, µJ).

Cards come and go with the bank's ``appear`` / ``disappear`` events: a card leaving
takes its ``hwmonN`` directory with it, and comes back under a new number (as the kernel
numbers them), at the same bus id. Faults (:class:`HwmonFault`) refuse a read or write
with an errno, make a file vanish, or hang a call (on virtual time the caller's deadline
passes at once: ``ETIMEDOUT``; a write in a hung call lands when it would have returned).
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import shutil
import tempfile
import threading
import weakref
from dataclasses import dataclass

from powerbudgetd_sim.physics import SimBank, SimCard

DRIVER = {"amd": "amdgpu", "intel": "xe"}
ERRNOS = {"EACCES": errno.EACCES, "EINVAL": errno.EINVAL, "ENODEV": errno.ENODEV, "EIO": errno.EIO,
          "EOPNOTSUPP": errno.EOPNOTSUPP, "ENODATA": errno.ENODATA}
KINDS = (*ERRNOS, "VANISH", "HANG")


def bus_id(card: SimCard) -> str:
    """The simulated PCI bus id of a card: fixed by its place in the scenario."""
    return f"0000:{0x10 + card.index:02x}:00.0"


@dataclass(frozen=True)
class HwmonFault:
    """``error`` on ``op`` (``read``, ``write`` or ``*``) of ``file`` (``power1_cap``, ...,
    or ``*``) of card ``card`` (scenario position; None: every card), while ``from_s <=
    t < until_s`` in bank time, for the first ``count`` matching calls (None: all).

    ``error``: an errno name (EACCES, EINVAL, ENODEV, EIO, EOPNOTSUPP, ENODATA); ``VANISH``:
    the file is gone (ENOENT, and not listed) while the fault holds; ``HANG``: the call
    hangs ``delay_s`` s of bank time (ETIMEDOUT at once; the card's calls time out until
    then; a write lands then).
    """

    file: str
    error: str
    op: str = "*"
    card: int | None = None
    from_s: float = 0.0
    until_s: float = math.inf
    count: int | None = None
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.error not in KINDS:
            raise ValueError(f"hwmon fault error {self.error!r} is not one of {', '.join(KINDS)}")
        if self.op not in ("read", "write", "*"):
            raise ValueError(f"hwmon fault op must be read, write or *, got {self.op!r}")
        if self.error == "HANG" and not self.delay_s > 0:
            raise ValueError(f"a HANG fault needs delay_s > 0, got {self.delay_s!r}")


class SimHwmonTree:
    """The hwmon tree of ``bank``'s non-NVIDIA cards in a temporary directory (removed
    with the object); pass ``root`` and the object itself to ``Hwmon(root, files)``."""

    def __init__(self, bank: SimBank, faults: list[HwmonFault] | None = None) -> None:
        self.bank = bank
        self.faults = list(faults or [])
        self._hits: dict[int, int] = {}
        self._lock = threading.RLock()
        self.base = tempfile.mkdtemp(prefix="powerbudgetd-hwmon-")
        self._finalizer = weakref.finalize(self, shutil.rmtree, self.base, True)
        self.root = os.path.join(self.base, "class", "hwmon")
        os.makedirs(self.root)
        self._numbers = itertools.count(0)
        self._dirs: dict[int, str] = {}  # card index -> its hwmonN directory while present
        self._hung_until: dict[int, float] = {}
        self.cards = [c for c in bank.cards if c.spec.vendor != "nvidia"]
        for c in self.cards:
            dev = os.path.join(self.base, "devices", bus_id(c))
            os.makedirs(dev)
            with open(os.path.join(dev, "product_name"), "w") as fh:
                fh.write(c.spec.name + "\n")
        self._sync()

    def close(self) -> None:
        self._finalizer()

    # -- the tree -------------------------------------------------------------------
    def _files(self, c: SimCard) -> list[str]:
        if c.spec.vendor == "amd":
            names = ["power1_cap", "power1_cap_min", "power1_cap_max", "power1_cap_default", "power1_average"]
            return names + (["power1_input"] if c.spec.has_instant else [])
        return ["power1_max", "power1_rated_max", "energy1_input", "power1_max_interval"]

    def _sync(self) -> None:
        """Directories follow the cards on the bus: one leaving takes its ``hwmonN``,
        one coming back gets a new number."""
        for c in self.cards:
            d = self._dirs.get(c.index)
            if not c.present and d is not None:
                shutil.rmtree(d, ignore_errors=True)
                del self._dirs[c.index]
            elif c.present and d is None:
                d = os.path.join(self.root, f"hwmon{next(self._numbers)}")
                os.makedirs(d)
                with open(os.path.join(d, "name"), "w") as fh:
                    fh.write(DRIVER[c.spec.vendor] + "\n")
                os.symlink(os.path.join("..", "..", "..", "devices", bus_id(c)), os.path.join(d, "device"))
                for f in self._files(c):
                    open(os.path.join(d, f), "w").close()
                self._dirs[c.index] = d

    def _where(self, path: str) -> tuple[SimCard | None, str]:
        d, name = os.path.split(path)
        for index, cd in self._dirs.items():
            if cd == d:
                return self.bank.cards[index], name
        return None, name

    def _fault(self, c: SimCard, name: str, op: str, now: float, kinds: tuple[str, ...] | None = None,
               count_hit: bool = True) -> HwmonFault | None:
        for i, f in enumerate(self.faults):
            if kinds is not None and f.error not in kinds:
                continue
            if f.file not in ("*", name) or f.op not in ("*", op) or (f.card is not None and f.card != c.index):
                continue
            if not f.from_s <= now < f.until_s:
                continue
            hits = self._hits.get(i, 0)
            if f.count is not None and hits >= f.count:
                continue
            if count_hit:
                self._hits[i] = hits + 1
            return f
        return None

    def _value_uw(self, c: SimCard, name: str, now: float) -> int:
        lo = c.min_mw if c.spec.reported_min_w is None else round(c.spec.reported_min_w * 1000)
        hi = c.max_mw if c.spec.reported_max_w is None else round(c.spec.reported_max_w * 1000)
        mw = {
            "power1_cap": lambda: c.limit_bound_mw(now),
            "power1_max": lambda: c.limit_bound_mw(now),
            "power1_cap_min": lambda: lo,
            "power1_cap_max": lambda: hi,
            "power1_rated_max": lambda: hi,
            "power1_cap_default": lambda: c.default_mw,
            "power1_average": lambda: c.reported_avg_mw(now),
            "power1_input": lambda: c.reported_instant_mw(now),
        }
        if name == "energy1_input":
            return int(c.energy_mj * 1000)
        if name == "power1_max_interval":
            return 28  # ms, PL1's time window
        return int(mw[name]()) * 1000

    def _enter(self, path: str, op: str) -> tuple[SimCard | None, str, float]:
        now = self.bank.time()
        self._sync()
        c, name = self._where(path)
        if c is None:
            return None, name, now
        if now < self._hung_until.get(c.index, -math.inf):
            raise OSError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT), path)
        f = self._fault(c, name, op, now)
        if f is not None and f.error == "HANG":
            self._hung_until[c.index] = now + f.delay_s
            raise _Hung(c, now, f.delay_s, path)
        if f is not None and f.error == "VANISH":
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if f is not None:
            code = ERRNOS[f.error]
            raise OSError(code, os.strerror(code), path)
        return c, name, now

    # -- HwmonFiles -----------------------------------------------------------------
    def read(self, path: str) -> str:
        with self._lock:
            c, name, now = self._enter(path, "read")
            if c is not None and name in self._files(c):
                with open(path, "w") as fh:
                    fh.write(f"{self._value_uw(c, name, now)}\n")
            with open(path) as fh:
                return fh.read()

    def write(self, path: str, text: str) -> None:
        with self._lock:
            try:
                c, name, now = self._enter(path, "write")
            except _Hung as hung:
                uw = int(text)
                if hung.card.min_mw <= uw // 1000 <= hung.card.max_mw and not hung.card.spec.ignores_writes:
                    hung.card.set_limit(hung.now, self._stored_mw(hung.card, uw), delay_s=hung.delay_s)
                raise
            if c is None or name not in ("power1_cap", "power1_max"):
                raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)  # read-only attributes
            try:
                uw = int(text.strip())
            except ValueError:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path) from None
            mw = self._stored_mw(c, uw)
            if c.spec.ignores_writes:  # "success", and nothing changes
                c.set_limit(now, mw)
                return
            if not c.min_mw <= mw <= c.max_mw:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
            c.set_limit(now, mw)
            self.bank.save_state()

    @staticmethod
    def _stored_mw(c: SimCard, uw: int) -> int:
        """What the driver keeps of a cap written in µW: amdgpu whole W, xe 1/8 W."""
        if c.spec.vendor == "amd":
            return uw // 1_000_000 * 1000
        return uw // 125_000 * 125

    def listdir(self, path: str) -> list[str]:
        with self._lock:
            self.bank.time()
            self._sync()
            return os.listdir(path)

    def realpath(self, path: str) -> str:
        return os.path.realpath(path)

    def exists(self, path: str) -> bool:
        with self._lock:
            now = self.bank.time()
            self._sync()
            c, name = self._where(path)
            if c is not None and self._fault(c, name, "read", now, ("VANISH",), count_hit=False):
                return False
            return os.path.exists(path)


class _Hung(OSError):
    """A HANG fault: the caller's deadline passed (ETIMEDOUT); the call would have
    returned ``delay_s`` s of bank time after ``now``."""

    def __init__(self, card: SimCard, now: float, delay_s: float, path: str) -> None:
        super().__init__(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT), path)
        self.card, self.now, self.delay_s = card, now, delay_s
