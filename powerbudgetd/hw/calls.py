"""NVML calls with a deadline, off the caller's thread, so that no call can stall control.

:class:`InlineCalls` runs each call in the caller's thread (virtual time: the simulator
and the tests, where a call cannot hang in real time). :class:`DeadlineCalls` hands each
call to the long-lived **worker** of its key (one key per card, ``"bank"`` for calls on
no card), which serves that key's calls one after another, and waits at most
``timeout_s``. No thread is started per call: a key's worker is started by its first call
and ends after ``IDLE_EXIT_S`` without one.

A call that has not returned by its deadline is **abandoned, not awaited** (NVML gives
no way to cancel a call) and raises :class:`~powerbudgetd.errors.NvmlTimeout`. Its worker
stays the key's worker: until the call returns, every further call under the same key
raises NvmlTimeout at once instead of queueing behind it, and none is sent beside it
(no replacement worker), so nothing overtakes a limit write that may still land. A hung
card therefore ties up its own worker only (the cap: one thread per key), and the other
keys' calls go on.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from powerbudgetd.errors import NvmlError, NvmlTimeout

Call = tuple[Callable[..., Any], tuple[Any, ...]]

IDLE_EXIT_S = 30.0  # a worker with no call for this long ends (a card gone, a one-off key)


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


class _Gate:
    """Released once ``count`` calls have returned: the caller of :meth:`DeadlineCalls.many`
    wakes once for them all, not once a call (each wake-up is a thread switch)."""

    __slots__ = ("lock", "left")

    def __init__(self, count: int) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.left = count  # under the owner's lock

    def one_back(self) -> bool:
        """One call returned (or was refused), under the owner's lock: True when it was
        the last, and :attr:`lock` is to be released (outside the owner's lock, so the
        caller does not wake only to wait for it)."""
        self.left -= 1
        return self.left == 0


class _Job:
    """One call handed to a worker: ``gate`` is released when it (and the rest of its
    batch) has returned."""

    __slots__ = ("fn", "args", "started", "gate", "done", "value", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], started: float, gate: _Gate) -> None:
        self.fn, self.args, self.started, self.gate = fn, args, started, gate
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class _Worker:
    """One key's thread: runs the key's jobs in order, ends after ``IDLE_EXIT_S`` idle."""

    def __init__(self, owner: DeadlineCalls, key: str) -> None:
        self.owner, self.key = owner, key
        self.jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self.queued = 0  # jobs handed over and not yet finished (under the owner's lock)
        threading.Thread(target=self._serve, name=f"nvml-{key}", daemon=True).start()

    def _serve(self) -> None:
        owner = self.owner
        while True:
            try:
                job = self.jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with owner._lock:
                    if self.queued == 0:  # nothing handed over meanwhile: leave
                        owner._workers.pop(self.key, None)
                        return
                continue
            try:
                job.value = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
            with owner._lock:
                job.done = True
                self.queued -= 1
                owner._running.pop(self.key, None)  # an abandoned call of this key has returned
                last = job.gate.one_back()
            if last:
                job.gate.lock.release()


class DeadlineCalls(InlineCalls):
    """Run calls on per-key worker threads with a deadline of ``timeout_s`` (s)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._running: dict[str, float] = {}  # key -> when its abandoned call started

    def overdue(self) -> dict[str, float]:
        """Keys with an abandoned call still running, and since when (clock s)."""
        with self._lock:
            return dict(self._running)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], gate: _Gate) -> _Job:
        """Hand ``fn(*args)`` to ``key``'s worker. Raises NvmlTimeout at once while an
        abandoned call of ``key`` has not returned (``gate`` then counts one call less)."""
        with self._lock:
            since = self._running.get(key)
            if since is None:
                worker = self._workers.get(key)
                if worker is None:
                    worker = self._workers[key] = _Worker(self, key)
                job = _Job(fn, args, self.clock(), gate)
                worker.queued += 1
                worker.jobs.put(job)
                return job
            last = gate.one_back()
        if last:
            gate.lock.release()
        raise NvmlTimeout(f"an NVML call on {key} has not returned for {self.clock() - since:.1f} s", call="deadline")

    def _finish(self, key: str, job: _Job) -> Any:
        with self._lock:
            if not job.done:
                self._running[key] = job.started
                raise NvmlTimeout(f"an NVML call on {key} did not return in time", call="deadline")
        if job.error is not None:
            raise job.error
        return job.value

    def call(self, key: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """``fn(*args)`` on ``key``'s worker within ``timeout_s`` (default: the instance's).
        Raises NvmlTimeout, or what the call raised."""
        job = self._start(key, fn, args, _Gate(1))
        job.gate.lock.acquire(timeout=self.timeout_s if timeout_s is None else timeout_s)
        return self._finish(key, job)

    def many(self, calls: Mapping[str, Call]) -> dict[str, Any]:
        """All calls at once, each on its key's worker, under one deadline; by key."""
        out: dict[str, Any] = {}
        started: dict[str, _Job] = {}
        gate = _Gate(len(calls))
        for key, (fn, args) in calls.items():
            try:
                started[key] = self._start(key, fn, args, gate)
            except NvmlError as exc:
                out[key] = exc
        if calls:
            gate.lock.acquire(timeout=self.timeout_s)  # every call back, or the deadline
        for key, job in started.items():
            try:
                out[key] = self._finish(key, job)
            except NvmlError as exc:
                out[key] = exc
        return {k: out[k] for k in calls}

    def workers(self) -> int:
        """Worker threads alive now, one per key called within ``IDLE_EXIT_S``."""
        with self._lock:
            return len(self._workers)
