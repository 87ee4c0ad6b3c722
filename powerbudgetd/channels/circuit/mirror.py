"""The circuit's keys as a watch tells them: a host's copy, so that a woken round reads
nothing from etcd.

A host's watch (``CircuitStore.changes``) first reads the circuit once (one range read,
revision R) and then watches its prefix from R + 1 on the same connection: every change
after the read is told, in revision order, none twice. :class:`CircuitMirror` holds the
keys so known; ``CircuitStore.read`` builds its :class:`~.store.Read` from them while the
watch stands (no range read: a woken round's cost no longer grows with the circuit's
size on etcd or on the wire, and no parse is repeated: each value is parsed once,
:meth:`Entry.doc`).

Consistent at one revision: etcd sends each revision's events in one watch response,
and the client hands them on without giving the event loop back between them (an
unbounded queue's put and get do not suspend), so no other task sees the mirror between
two events of one transaction; :attr:`CircuitMirror.revision` is the last one applied. A
mirror behind etcd is a read taken earlier: a transaction computed from it compares the
keys it depends on against that revision (``store``), and fails where any changed
since. A host's own write is seen before its next read: the store asks etcd's current
revision after writing and waits for the mirror to reach it (else it reads the range).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from powerbudgetd.channels.circuit import records


class Entry:
    """One key's value as last told: its value, mod and create revisions and lease id
    (0: none); its parsed record computed once (``records.parse``)."""

    __slots__ = ("value", "mod", "created", "lease", "_doc")

    def __init__(self, value: bytes, mod: int, created: int, lease: int) -> None:
        self.value, self.mod, self.created, self.lease = value, mod, created, lease
        self._doc: dict[str, Any] | records.BadRecord | None = None

    def doc(self) -> dict[str, Any]:
        """The value as a record (``records.parse``; raises ``records.BadRecord``, every time)."""
        if self._doc is None:
            try:
                self._doc = records.parse(self.value)
            except records.BadRecord as exc:
                self._doc = exc
        if isinstance(self._doc, records.BadRecord):
            raise self._doc
        return self._doc


class CircuitMirror:
    """A circuit's keys at :attr:`revision`, kept by a watch; :attr:`live` while it stands."""

    def __init__(self) -> None:
        self.kvs: dict[bytes, Entry] = {}
        self.revision = 0
        self.floor = 0  # the last load's revision: the watch's events up to it are in it already
        self.live = False
        self.lock = asyncio.Lock()  # one range read at a time brings a lagging mirror forward
        self.memo: tuple[int, Any] | None = None  # (revision, what the store built from it)
        self._moved = asyncio.Event()

    def load(self, kvs: Iterable[tuple[bytes, Entry]], revision: int) -> bool:
        """The keys of one range read at ``revision``, where it is newer than the mirror's
        (or the mirror is not live): the watch's events up to ``revision`` are then skipped
        as they come. Entries held, unchanged, are kept (parsed once). False: ignored."""
        if self.live and revision <= self.revision:
            return False
        old = self.kvs
        self.kvs = {k: old[k] if k in old and old[k].mod == e.mod and old[k].value == e.value else e for k, e in kvs}
        self.floor = revision
        self.revision = 0
        self._moved_to(revision)
        return True

    def put(self, key: bytes, value: bytes, mod: int, created: int, lease: int) -> None:
        """A watch event: ``key`` written at ``mod`` (events come in revision order)."""
        if mod > self.floor:
            self.kvs[key] = Entry(value, mod, created, lease)
            self._moved_to(mod)

    def delete(self, key: bytes, revision: int) -> None:
        """A watch event: ``key`` deleted at ``revision``."""
        if revision > self.floor:
            self.kvs.pop(key, None)
            self._moved_to(revision)

    def _moved_to(self, revision: int) -> None:
        if revision > self.revision:
            self.revision = revision
            self.memo = None
        self._moved.set()
        self._moved = asyncio.Event()

    def stop(self) -> None:
        """The watch ended: nothing more is told (reads go to etcd)."""
        self.live = False
        self.memo = None
        self._moved.set()

    async def reached(self, revision: int, timeout_s: float) -> bool:
        """Whether the mirror reaches ``revision`` within ``timeout_s`` (False: its watch lags or ended)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.live and self.revision < revision:
            left = deadline - loop.time()
            if left <= 0:
                return False
            try:
                async with asyncio.timeout(left):
                    await self._moved.wait()
            except TimeoutError:
                return False
        return self.live and self.revision >= revision
