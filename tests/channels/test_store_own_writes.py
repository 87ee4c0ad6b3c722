"""A host's own write is seen by its next read from the watch's mirror
(``channels.circuit.store.CircuitStore.read``), even when a read began while the write
was on its way: that read cleared the mark, so the write's end sets it again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from powerbudgetd.channels.circuit.store import CircuitStore


class Client:
    """etcd as the store's calls see it: a revision, and a write that waits to be let through."""

    def __init__(self) -> None:
        self.revision = 5
        self.probes = 0
        self.let_through = asyncio.Event()

    async def get_prefix(self, key: bytes) -> SimpleNamespace:
        self.probes += 1
        return SimpleNamespace(header=SimpleNamespace(revision=self.revision))

    async def put(self) -> None:
        await self.let_through.wait()


def test_a_read_begun_during_our_write_leaves_the_next_read_to_ask_etcd_again():
    async def main() -> tuple[int, int]:
        store = CircuitStore(["127.0.0.1:1"], "c")
        store.confirm_s = 1e9  # no probe for the mirror's age: only our write asks again
        client = Client()
        store._client = client  # type: ignore[assignment]
        store.mirror.load([], client.revision)
        store.mirror.live = True
        await store.read()  # the first read asks etcd's revision (and marks the mirror confirmed)
        write = asyncio.create_task(store._call(lambda c: c.put()))  # type: ignore[attr-defined]
        await asyncio.sleep(0)
        await store.read()  # begun while the write is on its way: asks, and clears the mark
        asked = client.probes
        client.let_through.set()
        await write
        await store.read()  # after the write: must ask again (the write may have landed after the probe)
        return asked, client.probes

    asked, after = asyncio.run(main())
    assert after == asked + 1
