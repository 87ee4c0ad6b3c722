"""The control loop's own thread: the event loop hands it each tick and awaits the report.

``asyncio.to_thread`` would do the same through the loop's executor: a context copy, a
``concurrent.futures`` future under a condition lock and a second future chained to it,
each tick, on both threads. That machinery was a tenth of the daemon's own CPU at 8
cards (the daemon's 10 Hz tick otherwise costs well under a millisecond). Here one
daemon thread takes ``(future, fn, args)`` from a queue and hands the outcome back with
one ``call_soon_threadsafe``. Ticks run one at a time, in order, even when an awaiting
task was cancelled; and being a daemon thread, a tick stuck in the driver (every NVML
call has its own deadline, so it should not be) holds up no exit, as the executor's
threads, joined at exit, would.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Work = tuple[asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[Any, ...]]


def _settle(done: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if done.done():  # the awaiting task was cancelled: nobody wants the outcome
        return
    if error is None:
        done.set_result(value)
    else:
        done.set_exception(error)


class TickThread:
    """One long-lived daemon thread named ``name`` that runs what :meth:`run` hands it,
    one call at a time, in order. Started by the first :meth:`run`; :meth:`close` lets
    it end once the call it runs (if any) returns."""

    def __init__(self, name: str = "powerbudgetd-tick") -> None:
        self.name = name
        self._inbox: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()  # the running thread's
        self._thread: threading.Thread | None = None

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread: its value, or the exception it raised. Cancelling
        the await leaves the call to finish (its outcome dropped); the next call waits
        for it."""
        if self._thread is None:
            self._inbox = queue.SimpleQueue()  # its own: a closed thread's last call may still run
            self._thread = threading.Thread(target=_serve, args=(self._inbox,), name=self.name, daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._inbox.put((loop, done, fn, args))
        return await done

    def close(self) -> None:
        """Let the thread end after what it has been handed (it is a daemon thread: a
        call that never returns does not hold up the process's exit)."""
        if self._thread is not None:
            self._inbox.put(None)
            self._thread = None


def _serve(inbox: queue.SimpleQueue[_Work | None]) -> None:
    while (work := inbox.get()) is not None:
        loop, done, fn, args = work
        value, error = None, None
        try:
            value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, value, error)
        del work, done, value, error  # hold nothing of a tick until the next one comes
