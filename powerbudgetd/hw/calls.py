"""NVML calls with a deadline, off the caller's thread, so that no call can stall control.

:class:`InlineCalls` runs each call in the caller's thread (virtual time: the simulator
and the tests, where a call cannot hang in real time). :class:`DeadlineCalls` hands a
batch of calls (one per key: a card's UUID, ``"bank"`` for calls on no card) to a small
pool of long-lived **workers** and waits at most ``timeout_s`` for them all. No thread is
started per call: a worker is started only when none is idle, and ends after
``IDLE_EXIT_S`` without work.

One worker runs a batch's calls one after another while calls are quick (every thread
woken costs more than a healthy call: waking one worker per card tripled the CPU of an
8-card read, measured), however many there are: a quick call is Python's time, which
threads would only share under the GIL. Where even the fastest call of the last batch of
several took ``SLOW_CALL_S`` or more (the driver's time, every call of it: an H200's
``GetFieldValues`` takes ~3 ms, the brief; a wait for the GIL delays a call or two, not
all), a batch gets as many workers as run it in about ``SPREAD_S`` at that time: one per
card at 2 ms or more, read side by side (a call abandoned at its deadline is no measure).
When a batch has made no progress for ``SPREAD_S`` (a call lags: a hung card, a driver
slower than it was), one more worker joins it and takes its next calls, and so on until
the batch is done or its deadline passes, never while a worker handed over has not yet
reached it (on a loaded machine a thread may take longer than that to run). A lagging
card therefore delays the others by a few ``SPREAD_S`` (2-5 ms measured), not by its
deadline. Starting a worker's thread counts against the deadline: none is started
past it.

A call that has not returned by the deadline is **abandoned, not awaited** (NVML gives no
way to cancel a call) and raises :class:`~powerbudgetd.errors.NvmlTimeout`; a call the
deadline found not yet started raises it too. Calls on one key never run side by side:
until an abandoned call returns, every further call on its key raises NvmlTimeout at
once instead of running beside it, so nothing overtakes a limit write that may still
land. A hung card thus ties up one worker (the one in its call), and the other keys'
calls go on.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from powerbudgetd.errors import NvmlError, NvmlTimeout

Call = tuple[Callable[..., Any], tuple[Any, ...]]

IDLE_EXIT_S = 30.0  # a worker with no work for this long ends
# What a batch should take (s); one with no call started or returned for this long gets
# one more worker. Far above a healthy call (tens of us through the bindings), below one
# GetFieldValues on an H200 (~3 ms median, the brief's measurement).
SPREAD_S = 0.002
SLOW_CALL_S = 0.001  # a batch whose every call took this long was the driver's, not Python's


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


class _Job:
    """One call of a batch: its outcome once ``done``."""

    __slots__ = ("key", "fn", "args", "started", "began", "took", "done", "value", "error")

    def __init__(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.key, self.fn, self.args = key, fn, args
        self.started: float | None = None  # the owner's clock, once a worker took it
        self.began = 0.0  # time.monotonic() then
        self.took = 0.0  # how long the call ran (s), from just before to just after it
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None


class _Batch:
    """Jobs taken in order by the workers on it; :attr:`gate` is released (once, outside
    the owner's lock) when the last is back, so the caller wakes once for them all.
    Every field but ``gate`` is read and written under the owner's lock."""

    __slots__ = ("jobs", "next", "left", "pending", "gate", "opened", "moved")

    def __init__(self, jobs: list[_Job]) -> None:
        self.jobs = jobs
        self.next = 0  # the first job no worker has taken
        self.left = len(jobs)  # jobs not back yet (a refused one is back at once)
        self.pending = 0  # workers handed this batch that have not reached it yet
        self.gate = threading.Lock()
        self.gate.acquire()
        self.opened = False  # the gate was released (or is about to be)
        self.moved = time.monotonic()  # when a job was last taken or came back

    def open(self) -> bool:
        """True, once, when every job is back: the gate is then to be released."""
        if self.left or self.opened:
            return False
        self.opened = True
        return True

    def close(self) -> list[_Job]:
        """No job is taken from now on; returns those never taken."""
        untaken, self.next = self.jobs[self.next:], len(self.jobs)
        return untaken


class _Raised:
    """An exception a call raised (a call may also return one as its value)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Worker:
    """One pool thread: takes jobs from the batch it is handed until none is left, then
    waits idle for the next batch; ends after ``IDLE_EXIT_S`` idle."""

    def __init__(self, owner: DeadlineCalls, name: str, batch: _Batch) -> None:
        self.owner = owner
        self.inbox: queue.SimpleQueue[_Batch] = queue.SimpleQueue()
        self.inbox.put(batch)
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)

    def _serve(self) -> None:
        owner = self.owner
        while True:
            try:
                batch = self.inbox.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                with owner._lock:
                    if self in owner._idle:  # not handed a batch meanwhile: leave
                        owner._idle.remove(self)
                        owner._alive -= 1
                        return
                continue
            self._work(batch)

    def _work(self, batch: _Batch) -> None:
        owner = self.owner
        job: _Job | None = None
        with owner._lock:
            batch.pending -= 1
        while True:
            with owner._lock:
                if job is not None:  # the last job came back: record it, take the next in one step
                    job.done = True
                    del owner._busy[job.key]  # its key may be called again (an abandoned call too)
                    owner._abandoned.discard(job.key)
                    batch.left -= 1
                    batch.moved = time.monotonic()
                job = owner._take(batch)
                if job is None:
                    owner._idle.append(self)
                release = batch.open()
            if release:
                batch.gate.release()
            if job is None:
                return
            try:
                job.value = job.fn(*job.args)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                job.error = exc
            job.took = time.monotonic() - job.began  # before waiting for the lock


class DeadlineCalls(InlineCalls):
    """Run calls on a small pool of worker threads with a deadline of ``timeout_s`` (s)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self.clock = clock
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []  # the last to go idle is handed the next batch
        self._alive = 0
        self._started = 0
        self._busy: dict[str, float] = {}  # key -> when its running call started (clock s)
        self._call_s = 0.0  # the fastest call of the last batch of several, back in time (s)
        self._abandoned: set[str] = set()  # keys whose running call missed its deadline

    def overdue(self) -> dict[str, float]:
        """Keys with an abandoned call still running, and since when (clock s)."""
        with self._lock:
            return {k: self._busy[k] for k in self._abandoned}

    def workers(self) -> int:
        """Worker threads alive now (idle ones included)."""
        with self._lock:
            return self._alive

    # -- under the lock ---------------------------------------------------------------
    def _take(self, batch: _Batch) -> _Job | None:
        """The batch's next job for a worker, its key marked busy; a job whose key is busy
        (an abandoned call still running) is refused on the way and counts as back."""
        while batch.next < len(batch.jobs):
            job = batch.jobs[batch.next]
            batch.next += 1
            batch.moved = time.monotonic()
            if job.key in self._busy:  # a call on it runs still (another caller's, or abandoned)
                job.error, job.done = self._refusal(job.key), True
                batch.left -= 1
                continue
            job.started = self._busy[job.key] = self.clock()
            job.began = time.monotonic()
            return job
        return None

    def _refusal(self, key: str) -> NvmlTimeout:
        since = self._busy[key]
        return NvmlTimeout(f"an NVML call on {key} has not returned for {self.clock() - since:.1f} s", call="deadline")

    def _hand(self, batch: _Batch) -> threading.Thread | None:
        """One more worker on ``batch``: the last idle one, else a new one, whose thread
        is returned for the caller to start once it has let go of the lock."""
        batch.pending += 1
        if self._idle:
            self._idle.pop().inbox.put(batch)
            return None
        self._alive += 1
        self._started += 1
        return _Worker(self, f"nvml-worker-{self._started}", batch).thread

    # -- the caller's side -------------------------------------------------------------
    def _run(self, calls: Mapping[str, Call], timeout_s: float) -> dict[str, Any]:
        """Every call's value, or its exception as a :class:`_Raised`, by key, within
        ``timeout_s`` (none is started with no time left)."""
        deadline = time.monotonic() + timeout_s  # starting a worker's thread counts against it
        out: dict[str, Any] = {}
        jobs: list[_Job] = []
        new: list[threading.Thread | None] = []
        with self._lock:
            for key, (fn, args) in calls.items():
                if key in self._busy:  # refused at once: no worker woken for it
                    out[key] = _Raised(self._refusal(key))
                elif timeout_s <= 0:
                    out[key] = _Raised(NvmlTimeout(f"no time left for an NVML call on {key}", call="deadline"))
                else:
                    jobs.append(_Job(key, fn, args))
            batch = _Batch(jobs)
            # Slow calls: as many workers as run the batch in about SPREAD_S at their time.
            workers = math.ceil(len(jobs) * self._call_s / SPREAD_S) if self._call_s >= SLOW_CALL_S else 1
            for _ in range(min(len(jobs), workers)):
                new.append(self._hand(batch))
        if jobs:
            out.update(self._wait(batch, deadline, [t for t in new if t is not None]))
        return {k: out[k] for k in calls}

    def _wait(self, batch: _Batch, deadline: float, new: list[threading.Thread]) -> dict[str, Any]:
        """Start the ``new`` workers' threads, then wait until every job is back or
        ``deadline`` (monotonic s), a worker more each time the batch stalls for
        ``SPREAD_S`` (none while one handed over has not reached it); then (whatever
        ended the wait, an interrupt too) close the batch and abandon its laggards.
        Returns each job's value or :class:`_Raised`, by key."""
        untaken = True  # wake each SPREAD_S only while a job may still wait for a worker
        try:
            for i, thread in enumerate(new):
                if time.monotonic() >= deadline:  # starting threads takes time too: no more past it
                    with self._lock:
                        self._alive -= len(new) - i
                        batch.pending -= len(new) - i
                    break
                thread.start()
            while (left_s := deadline - time.monotonic()) > 0:
                wait_s = min(SPREAD_S, left_s) if untaken else min(left_s, threading.TIMEOUT_MAX)
                if batch.gate.acquire(timeout=wait_s):
                    break
                with self._lock:
                    untaken = batch.next < len(batch.jobs)
                    more = None
                    if untaken and not batch.pending and time.monotonic() - batch.moved >= SPREAD_S:
                        batch.moved = time.monotonic()
                        more = self._hand(batch)
                if more is not None:
                    more.start()
        finally:
            out: dict[str, Any] = {}
            with self._lock:  # a job's outcome is final once it is done (written before, under this lock)
                for job in batch.close():
                    out[job.key] = _Raised(NvmlTimeout(f"an NVML call on {job.key} was not started in time",
                                                       call="deadline"))
                back = [job.took for job in batch.jobs if job.done and job.started is not None]
                if len(batch.jobs) > 1 and back:  # a batch of several: its fastest call's time
                    self._call_s = min(back)
                for job in batch.jobs:
                    if job.done:
                        out[job.key] = job.value if job.error is None else _Raised(job.error)
                    elif job.key not in out:
                        self._abandoned.add(job.key)
                        out[job.key] = _Raised(NvmlTimeout(f"an NVML call on {job.key} did not return in time",
                                                           call="deadline"))
        return out

    def call(self, key: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        """``fn(*args)`` on a worker within ``timeout_s`` (default: the instance's).
        Raises NvmlTimeout, or what the call raised."""
        result = self._run({key: (fn, args)}, self.timeout_s if timeout_s is None else timeout_s)[key]
        if isinstance(result, _Raised):
            raise result.error
        return result

    def many(self, calls: Mapping[str, Call]) -> dict[str, Any]:
        """All calls under one deadline, by key: each call's result or the NvmlError it
        raised (any other exception is raised)."""
        out = self._run(calls, self.timeout_s)
        for key, value in out.items():
            if isinstance(value, _Raised):
                if not isinstance(value.error, NvmlError):
                    raise value.error
                out[key] = value.error
        return out
