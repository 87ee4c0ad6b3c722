"""NVML calls with a deadline, off the caller's thread, so that no call can stall control.

:class:`InlineCalls` runs each call in the caller's thread (virtual time: the simulator
and the tests, where a call cannot hang in real time). :class:`DeadlineCalls` runs each
call in a daemon thread of its own and waits at most ``timeout_s``: a call that has not
returned by then is **abandoned, not awaited** (its thread runs on; NVML gives no way to
cancel a call) and raises :class:`~powerbudgetd.errors.NvmlTimeout`. Until an abandoned
call returns, every further call under the same key (one key per card) raises
NvmlTimeout at once instead of queueing behind it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from powerbudgetd.errors import NvmlError, NvmlTimeout

Call = tuple[Callable[..., Any], tuple[Any, ...]]


class InlineCalls:
    """Run every call at once in the caller's thread (no deadline)."""

    def call(self, key: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        return fn(*args)

    def many(self, calls: Mapping[str, Call]) -> dict[str, Any]:
        """Each call's result or the NvmlError it raised, by key, in order."""
        out: dict[str, Any] = {}
        for key, (fn, args) in calls.items():
            try:
                out[key] = fn(*args)
            except NvmlError as exc:
                out[key] = exc
        return out

    def overdue(self) -> dict[str, float]:
        return {}


class DeadlineCalls(InlineCalls):
    """Run calls in worker threads with a deadline of ``timeout_s`` (s)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._running: dict[str, float] = {}  # key -> when its abandoned call started

    def overdue(self) -> dict[str, float]:
        """Keys with an abandoned call still running, and since when (clock s)."""
        with self._lock:
            return dict(self._running)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[threading.Event, dict, float]:
        with self._lock:
            since = self._running.get(key)
        if since is not None:
            raise NvmlTimeout(f"an NVML call on {key} has not returned for {self.clock() - since:.1f} s", call="deadline")
        box: dict[str, Any] = {}
        done = threading.Event()
        started = self.clock()

        def work() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                box["error"] = exc
            finally:
                with self._lock:
                    done.set()
                    self._running.pop(key, None)

        threading.Thread(target=work, name=f"nvml-{key}", daemon=True).start()
        return done, box, started

    def _finish(self, key: str, done: threading.Event, box: dict, started: float) -> Any:
        with self._lock:
            if not done.is_set():
                self._running[key] = started
                raise NvmlTimeout(f"an NVML call on {key} did not return in time", call="deadline")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def call(self, key: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """``fn(*args)`` within ``timeout_s`` (default: the instance's). Raises NvmlTimeout."""
        done, box, started = self._start(key, fn, args)
        done.wait(self.timeout_s if timeout_s is None else timeout_s)
        return self._finish(key, done, box, started)

    def many(self, calls: Mapping[str, Call]) -> dict[str, Any]:
        """All calls at once, one thread each, under one deadline; by key."""
        out: dict[str, Any] = {}
        started: dict[str, tuple[threading.Event, dict, float]] = {}
        for key, (fn, args) in calls.items():
            try:
                started[key] = self._start(key, fn, args)
            except NvmlError as exc:
                out[key] = exc
        deadline = self.clock() + self.timeout_s
        for key, (done, box, t0) in started.items():
            done.wait(max(0.0, deadline - self.clock()))
            try:
                out[key] = self._finish(key, done, box, t0)
            except NvmlError as exc:
                out[key] = exc
        return {k: out[k] for k in calls}
