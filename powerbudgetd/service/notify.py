"""systemd notification (``sd_notify``) over ``$NOTIFY_SOCKET``, and the watchdog interval.

A small notifier of our own: the ``sdnotify`` package swallows every error and has no
watchdog helper. Without ``NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time


class Notifier:
    """Send ``KEY=value`` lines to systemd. Errors are remembered, never raised."""

    def __init__(self, address: str | None = None) -> None:
        address = address if address is not None else os.environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        self.address = address or None
        self.last_error: OSError | None = None
        self._sock: socket.socket | None = None
        if self.address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *lines: str) -> bool:
        if self._sock is None or self.address is None:
            return False
        try:
            self._sock.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            self.last_error = exc
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """Half of ``$WATCHDOG_USEC`` in s (how often to ping), or None when no watchdog is
    set or ``$WATCHDOG_PID`` names another process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid.isdigit() and int(pid) != os.getpid()):
        return None
    try:
        return int(usec) / 2e6
    except ValueError:
        return None
