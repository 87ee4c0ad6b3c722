"""Waiting in tests on the wall clock: poll with a deadline, free loopback ports, and
ending a helper process."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
Log = Path | Callable[[], str] | None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free when asked (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that was free when asked (the kernel's pick): a free TCP
    port says nothing of the UDP port of the same number."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(log: Log, chars: int = 3000) -> str:
    """The last ``chars`` characters of ``log`` (a file, or a callable giving the text)."""
    if log is None:
        return ""
    if callable(log):
        text = log()
    else:
        text = log.read_text(errors="replace") if log.exists() else f"({log} not written)"
    return text[-chars:]


def wait_until(predicate: Callable[[], T | None], timeout_s: float, what: str, *, step_s: float = 0.05,
               proc: subprocess.Popen | None = None, log: Log = None,
               ignore: tuple[type[Exception], ...] = ()) -> T:
    """Poll ``predicate()`` every ``step_s`` (s) until it returns something true, and
    return that. Raises AssertionError naming ``what`` after ``timeout_s`` (s), or as
    soon as ``proc`` has exited; either message ends with the tail of ``log``. The
    exceptions in ``ignore`` count as a false answer (the last is named on timeout)."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:  # never asked after the deadline: a timeout may be a bound
        exited = proc is not None and proc.poll() is not None  # before the answer: what it did before exiting counts
        try:
            value = predicate()
        except ignore as exc:
            value, last = None, exc
        if value:
            return value
        if exited:
            assert proc is not None
            raise AssertionError(f"waiting for {what}: the process exited ({proc.returncode}) first\n{log_tail(log)}")
        time.sleep(step_s)
    seen = "" if last is None else f" (last: {last!r})"
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{seen}\n{log_tail(log)}".rstrip())


def reap(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """End ``proc`` if it still runs: SIGTERM, then SIGKILL after ``timeout_s`` (s); reaped."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def wait_until_async(predicate: Callable[[], T | None], timeout_s: float, what: str, *, step_s: float = 0.02,
                           log: Log = None) -> T:
    """:func:`wait_until` inside an event loop: sleeps with ``asyncio.sleep`` so that the
    loop's other tasks (a daemon under test) run meanwhile."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        await asyncio.sleep(step_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n{log_tail(log)}".rstrip())
