"""The power limits the daemon found on each card before it first wrote one, kept for
``powerbudgetd restore``.

At its first start on a host the daemon reads every card's requested power limit
(``nvmlDeviceGetPowerManagementLimit``, what ``nvidia-smi -pl`` sets) and writes them,
by UUID, to ``original-limits.json`` beside the flight recorder's log. A later start
keeps what is there (the cards then hold the daemon's own limits, not the operator's)
and only adds a card it has never seen. The file is replaced atomically (a temporary
file, fsync, rename, fsync of the directory), so a crash leaves the old record or the
new one, never a torn one.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from powerbudgetd.config import Settings
from powerbudgetd.errors import NvmlError
from powerbudgetd.hw.calls import InlineCalls
from powerbudgetd.hw.card import CardBackend, GpuInfo, PowerReading

FILE_NAME = "original-limits.json"
FORMAT = 1  # the file's "format"; a reader refuses any other
# One NVML call's deadline while the record is taken (s): once, before any write, with
# nothing waiting on it, on a host that may be loaded at boot: not the tick's 50 ms, under
# which a card or the count that misses it is left out (none recorded at all, at worst).
RECORD_CALL_TIMEOUT_S = 2.0


class OriginalsError(Exception):
    """The record cannot be read: missing, unreadable, or not a record of this format."""


@dataclass(frozen=True)
class Original:
    """One card as found (W): its requested limit, and for the record its enforced limit
    and constraints then; ``index`` is NVML's index at that start (informational:
    indices change, UUIDs do not)."""

    index: int
    name: str
    limit_w: float
    enforced_w: float | None
    min_w: float | None
    max_w: float | None
    default_w: float | None
    recorded_at: str


def originals_path(settings: Settings, backend: str) -> Path:
    """Where the record lives: the flight recorder's directory for ``backend``."""
    return settings.recorder.dir_for(backend) / FILE_NAME


def load(path: Path) -> dict[str, Original]:
    """The record by UUID. Raises OriginalsError naming the file and what is wrong."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise OriginalsError(f"{path}: no record of the limits found (the daemon writes it at its first start "
                             "on this host)") from None
    except (OSError, ValueError) as exc:
        raise OriginalsError(f"{path}: cannot be read: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("cards"), dict):
        raise OriginalsError(f"{path}: not a record of original limits (format {FORMAT})")
    out = {}
    for uuid, card in data["cards"].items():
        try:
            out[uuid] = Original(**card)
        except TypeError as exc:
            raise OriginalsError(f"{path}: card {uuid}: {exc}") from None
        if not isinstance(out[uuid].limit_w, int | float) or not out[uuid].limit_w > 0:
            raise OriginalsError(f"{path}: card {uuid}: limit_w must be a positive number of W")
    return out


def save(path: Path, cards: Mapping[str, Original]) -> None:
    """Write the record atomically (see the module docstring). Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "host": socket.gethostname(),
            "cards": {uuid: asdict(card) for uuid, card in sorted(cards.items(), key=lambda kv: kv[1].index)}}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out, indent=2)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def record_found(nvml: CardBackend, path: Path, calls: InlineCalls | None = None) -> list[str]:
    """Add every card not yet in the record at ``path`` with the limits it has now; the
    UUIDs added (none: the file is left as it was). Called before the daemon's first
    write. A card that cannot be enumerated or read is left out (the next start adds
    it). Raises OriginalsError for a record that exists but cannot be read (it is never
    overwritten: it may be the only copy of the operator's limits), OSError when it
    cannot be written, NvmlError when NVML cannot count the cards."""
    calls = calls or InlineCalls()
    known = load(path) if path.exists() else {}
    count = calls.call("bank", nvml.device_count)
    found = calls.many({f"index {i}": (nvml.device, (i,)) for i in range(count)})
    infos = [v for v in found.values() if isinstance(v, GpuInfo) and v.uuid not in known]
    reads = calls.many({i.uuid: (nvml.read, (i.uuid,)) for i in infos})
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    added = {}
    for info in infos:
        r = reads.get(info.uuid)
        if isinstance(r, PowerReading) and r.requested_limit_w is not None:
            added[info.uuid] = Original(info.index, info.name, r.requested_limit_w, r.enforced_limit_w,
                                        info.min_limit_w, info.max_limit_w, info.default_limit_w, stamp)
    if added:
        save(path, {**known, **added})
    return list(added)


def record_found_logged(nvml: CardBackend, path: Path, calls: InlineCalls | None = None) -> None:
    """:func:`record_found` for the daemon: what happened is logged; nothing raised (a
    record that cannot be kept must not keep the budget from being enforced)."""
    import structlog

    log = structlog.get_logger("powerbudgetd")
    try:
        added = record_found(nvml, path, calls)
    except (OriginalsError, OSError, NvmlError) as exc:
        log.error("original_limits_not_recorded", path=str(path), error=str(exc),
                  action="`powerbudgetd restore` cannot give these cards their limits back; fix the file or directory")
        return
    if added:
        log.info("original_limits_recorded", path=str(path), uuids=added)
