"""The control loop's thread: one thread for every tick, in order, the loop free meanwhile."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from powerbudgetd.service.tickthread import TickThread
from support.pulse import beat


def _threads_named(name: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == name]


async def test_every_call_runs_on_one_thread_and_no_thread_is_started_per_call() -> None:
    ticks = TickThread("test-tick")
    seen: set[int] = set()

    def tick(k: int) -> int:
        seen.add(threading.get_ident())
        return k * 2

    try:
        for k in range(300):
            assert await ticks.run(tick, k) == 2 * k
        assert len(seen) == 1 and threading.get_ident() not in seen  # off the loop, always the same thread
        assert len(_threads_named("test-tick")) == 1
    finally:
        ticks.close()


async def test_an_exception_reaches_the_awaiting_task_and_the_thread_goes_on() -> None:
    ticks = TickThread("test-tick-raise")

    def fail() -> None:
        raise ValueError("bad reading")

    try:
        with pytest.raises(ValueError, match="bad reading"):
            await ticks.run(fail)
        assert await ticks.run(lambda: "next") == "next"
        assert len(_threads_named("test-tick-raise")) == 1
    finally:
        ticks.close()


async def test_the_loop_keeps_its_cadence_while_a_tick_blocks() -> None:
    """A tick stuck for 0.5 s (a slow driver) leaves the loop's 10 ms timer on time: the
    loop's tick gaps, not the tick's duration, are what is asserted."""
    ticks = TickThread("test-tick-slow")
    release = threading.Event()
    gaps: list[float] = []

    try:
        beating = asyncio.create_task(beat(0.01, gaps, release.is_set))
        slow = asyncio.create_task(ticks.run(release.wait, 0.5))
        assert await slow is False  # timed out after 0.5 s, on the tick's thread
        release.set()
        await beating
        assert len(gaps) >= 20
        assert max(gaps) < 0.25, f"the loop stalled {max(gaps):.3f} s while a tick blocked"
    finally:
        release.set()
        ticks.close()


async def test_a_cancelled_await_leaves_the_tick_to_finish_before_the_next_runs() -> None:
    """Ticks never overlap: one whose awaiting task is cancelled runs to its end first."""
    ticks = TickThread("test-tick-cancel")
    go = threading.Event()
    order: list[str] = []

    def first() -> None:
        go.wait(5)
        time.sleep(0.05)
        order.append("first")

    def second() -> str:
        order.append("second")
        return "done"

    try:
        task = asyncio.create_task(ticks.run(first))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        go.set()
        assert await ticks.run(second) == "done"
        assert order == ["first", "second"]
    finally:
        ticks.close()


async def test_close_ends_the_thread() -> None:
    ticks = TickThread("test-tick-close")
    await ticks.run(lambda: None)
    (thread,) = _threads_named("test-tick-close")
    ticks.close()
    thread.join(2)
    assert not thread.is_alive()


async def test_a_stop_iteration_in_a_tick_wakes_the_loop_as_an_error() -> None:
    """A stray ``next()`` in a tick: a future refuses a StopIteration, and the awaiting
    task would never wake (ticks would stop until the watchdog)."""
    ticks = TickThread("test-tick-stopiteration")
    try:
        with pytest.raises(RuntimeError, match="StopIteration"):
            await asyncio.wait_for(ticks.run(next, iter(())), 2.0)
        assert await ticks.run(lambda: 1) == 1
    finally:
        ticks.close()


async def test_nothing_runs_after_close() -> None:
    """Closed is final: a second thread could run beside a last tick still finishing."""
    ticks = TickThread("test-tick-final")
    await ticks.run(lambda: None)
    ticks.close()
    with pytest.raises(RuntimeError, match="closed"):
        await ticks.run(lambda: None)
