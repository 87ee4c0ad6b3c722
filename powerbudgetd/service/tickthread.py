"""The control loop's own thread: the event loop hands it each tick and awaits the report.

``asyncio.to_thread`` would do the same through the loop's executor: a context copy, a
``concurrent.futures`` future under a condition lock and a second future chained to it,
each tick, on both threads. In the daemon at 8 cards that was about 75 us of the event
loop's CPU a tick (``run_in_executor`` 52 us, settling the chained future 22 us, thread
CPU clock) of some 1.2 ms the whole process spends a tick. Here one daemon thread takes
``(future, fn, args)`` from a queue and hands the outcome back with one
``call_soon_threadsafe``. Ticks run one at a time, in order, even when an awaiting
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
    """A thread's outcome into the future the loop awaits (on the loop); dropped when
    the awaiting task is gone. A StopIteration
    (a stray ``next()``) is wrapped in a RuntimeError: a future refuses to take one, and
    the awaiting task would never wake."""
    if done.done():  # the awaiting task was cancelled: nobody wants the outcome
        return
    if error is None:
        done.set_result(value)
    elif isinstance(error, StopIteration):
        done.set_exception(RuntimeError(f"StopIteration raised off the loop: {error!r}"))
    else:
        done.set_exception(error)


def run_for(loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], fn: Callable[..., Any],
            args: tuple[Any, ...]) -> None:
    """``fn(*args)`` on the calling thread (off the loop), its value or the exception it
    raised handed to ``done`` on ``loop``; nothing when the loop is closed meanwhile."""
    value, error = None, None
    try:
        value = fn(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
        error = exc
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(_settle, done, value, error)


class TickThread:
    """One long-lived daemon thread named ``name`` that runs what :meth:`run` hands it,
    one call at a time, in order. Started by the first :meth:`run`; after :meth:`close`
    it ends once what it was handed has run, and :meth:`run` raises RuntimeError."""

    def __init__(self, name: str = "powerbudgetd-tick") -> None:
        self.name = name
        self._inbox: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread: its value, or the exception it raised. A call
        handed over runs to its end even when the await is cancelled (its outcome is
        dropped), and the next call runs after it. Raises RuntimeError after :meth:`close`."""
        if self._closed:
            raise RuntimeError(f"{self.name}: closed")
        if self._thread is None:
            self._thread = threading.Thread(target=_serve, args=(self._inbox,), name=self.name, daemon=True)
            self._thread.start()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[T] = loop.create_future()
        self._inbox.put((loop, done, fn, args))
        return await done

    def close(self) -> None:
        """Let the thread end after what it has been handed (it is a daemon thread: a
        call that never returns does not hold up the process's exit)."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)


def _serve(inbox: queue.SimpleQueue[_Work | None]) -> None:
    while (work := inbox.get()) is not None:
        run_for(*work)
        del work  # hold nothing of a tick between ticks
