"""NVML calls awaited from the event loop (``DeadlineCalls.many_async``/``drive_async``,
the daemon's ticks): the loop hands a batch to the workers and goes on serving; a hung
call costs its key a deadline, never the loop; a task cancelled mid-tick leaves the
tick's steps finished, every call not awaited answered as past its deadline."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Generator, Mapping
from typing import Any

from powerbudgetd.errors import NvmlTimeout
from powerbudgetd.hw.calls import Call, DeadlineCalls

HANG_S = 1.0


async def heartbeat(gaps: list[float], stop: asyncio.Event) -> None:
    """The loop's responsiveness: the largest gap between 5 ms sleeps, appended."""
    last, worst = time.monotonic(), 0.0
    while not stop.is_set():
        await asyncio.sleep(0.005)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    gaps.append(worst)


async def test_a_hung_call_costs_its_key_the_deadline_and_never_blocks_the_loop() -> None:
    calls = DeadlineCalls(0.2)
    gate = threading.Event()
    threads: dict[str, str] = {}

    def answer(key: str) -> str:
        threads[key] = threading.current_thread().name
        if key == "hung":
            gate.wait(HANG_S)
        return key

    stop, gaps = asyncio.Event(), []
    beat = asyncio.create_task(heartbeat(gaps, stop))
    t0 = time.monotonic()
    out = await calls.many_async({k: (answer, (k,)) for k in ("a", "hung", "b", "c")})
    took = time.monotonic() - t0
    stop.set()
    await beat
    gate.set()
    assert isinstance(out["hung"], NvmlTimeout) and [out[k] for k in "abc"] == ["a", "b", "c"]
    assert 0.19 <= took < 0.6, took  # the deadline, not the hang
    assert gaps[0] < 0.1, f"the loop stood still {gaps[0]:.3f} s"  # it never waited on the call
    assert all(name.startswith("nvml-worker") for name in threads.values()), threads
    assert "hung" in calls.overdue()


async def test_a_stalled_batch_gets_another_worker_when_awaited_from_the_loop() -> None:
    """A call that lags holds up the calls after it by a few SPREAD_S, not its deadline."""
    calls = DeadlineCalls(2.0)
    back: dict[str, float] = {}
    t0 = time.monotonic()

    def answer(key: str) -> str:
        if key == "slow":
            time.sleep(0.5)
        back[key] = time.monotonic() - t0
        return key

    out = await calls.many_async({k: (answer, (k,)) for k in ("slow", "next")})
    assert out == {"slow": "slow", "next": "next"}
    assert back["next"] < 0.25, back


def tick_like(seen: list[Any], done: list[bool]) -> Generator[Mapping[str, Call], dict[str, Any], str]:
    """Two batches, as a tick's reads then a write; records what it is sent."""
    first = yield {"card": (time.sleep, (HANG_S,))}
    seen.append(first["card"])
    second = yield {"card": (lambda: "written", ())}
    seen.append(second["card"])
    done.append(True)
    return "report"


async def test_a_tick_cancelled_mid_batch_runs_to_its_end_with_the_calls_unanswered() -> None:
    calls = DeadlineCalls(5.0)
    seen: list[Any] = []
    done: list[bool] = []
    task = asyncio.create_task(calls.drive_async(tick_like(seen, done)))
    await asyncio.sleep(0.05)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the cancellation was swallowed")
    assert done == [True]  # never left half-way
    assert [type(s) for s in seen] == [NvmlTimeout, NvmlTimeout], seen  # nothing of either batch believed
    assert "card" in calls.overdue()  # the call under way is abandoned: nothing else runs beside it


async def test_steps_driven_on_the_loop_return_their_outcome() -> None:
    calls = DeadlineCalls(1.0)
    seen: list[Any] = []
    done: list[bool] = []

    def quick() -> Generator[Mapping[str, Call], dict[str, Any], str]:
        got = yield {"a": (lambda: 1, ()), "b": (lambda: 2, ())}
        seen.append(got)
        got = yield {"a": (lambda: 3, ())}
        seen.append(got)
        done.append(True)
        return "report"

    assert await calls.drive_async(quick()) == "report"
    assert seen == [{"a": 1, "b": 2}, {"a": 3}] and done == [True]
