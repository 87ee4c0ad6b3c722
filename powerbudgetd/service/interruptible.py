"""A blocking step (NVML at boot) run off the event loop, given up when a stop comes first.

Boot calls NVML outside the control loop's per-call deadlines: ``nvmlInit`` (a wedged
driver can hold it for minutes), the first enumeration (up to ``START_TIMEOUT_S``) and
persistence mode. On the event loop they would keep SIGTERM from being acted on; in
``asyncio.to_thread`` the loop's executor would be joined at exit, waiting for them all
the same. :func:`until_stopped` runs the step on a daemon thread of its own instead, and
stops waiting for it when ``stop`` is set: the thread is abandoned (NVML gives no way to
cancel a call) and holds up no exit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from powerbudgetd.service.tickthread import run_for

T = TypeVar("T")


class Interrupted(Exception):
    """A stop was requested before the step returned; the step is left running."""


async def until_stopped(stop: asyncio.Event, fn: Callable[..., T], *args: Any, name: str) -> T:
    """``fn(*args)`` on a daemon thread named ``name``: its result, or what it raised.
    Raises Interrupted when ``stop`` is set first (also when it is set already)."""
    if stop.is_set():
        raise Interrupted(name)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    threading.Thread(target=run_for, args=(loop, done, fn, args), name=name, daemon=True).start()
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((done, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
        done.cancel()  # no-op once settled; else a late outcome finds it done and is dropped
    if done.cancelled():
        raise Interrupted(name)
    return done.result()
