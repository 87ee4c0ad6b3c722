"""The tree key is parsed and checked only when its value changes, and off the event
loop: a large tree must not hold up a daemon's loop (and its watchdog ping) each round."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

from powerbudgetd.channels.circuit import store as store_mod
from powerbudgetd.channels.circuit.store import CircuitStore, tree_doc
from powerbudgetd.core.tree import Host, Node, PowerTree

TREE = PowerTree({"r": Node("r", 3000.0), "a": Node("a", 2000.0, "r"), "b": Node("b", 2000.0, "r")},
                 {"h1": Host("h1", {"a": 0.5, "b": 0.5}), "h2": Host("h2", {"a": 1.0})})


class Kvs(list):
    header = SimpleNamespace(revision=7)


def kv(key: bytes, doc: dict) -> SimpleNamespace:
    return SimpleNamespace(key=key, value=json.dumps(doc).encode(), mod_revision=5, create_revision=2, lease=0)


def test_the_tree_is_parsed_once_per_value_and_in_a_worker_thread(monkeypatch):
    store = CircuitStore(["127.0.0.1:9"], "row")
    docs = {"tree": tree_doc(TREE)}
    seats = {"h1": 800.0}

    async def fake_call(fn, *, write=True):
        return Kvs([kv(store.spec_key, {"budget_w": 3000.0, "ttl_s": 5}), kv(store.tree_key, docs["tree"]),
                    *(kv(store.seats + h.encode(), {"reserve_w": w}) for h, w in seats.items())])

    parsed_on: list[str] = []
    real = store_mod.tree_from_doc

    def counting(doc, seats_w):
        parsed_on.append(threading.current_thread().name)
        return real(doc, seats_w)

    monkeypatch.setattr(store, "_call", fake_call)
    monkeypatch.setattr(store_mod, "tree_from_doc", counting)
    monkeypatch.setattr(store_mod, "_SHAPES", {})  # none parsed yet in this process

    async def reads() -> list:
        loop_thread = threading.current_thread().name
        out = [await store.read() for _ in range(3)]
        seats["h2"] = 500.0  # a seat changes: the same tree, new reserves, not parsed again
        out.append(await store.read())
        docs["tree"] = {**tree_doc(TREE), "pairs": [{"feeds": ["a", "b"], "mode": "oversubscribed", "shed_s": 2}]}
        out.append(await store.read())
        return [loop_thread, out]

    loop_thread, out = asyncio.run(reads())
    assert len(parsed_on) == 2 and loop_thread not in parsed_on
    assert out[0].view.tree.hosts["h1"].reserve_w == 800.0
    assert out[3].view.tree.hosts["h2"].reserve_w == 500.0
    assert out[3].view.tree.mode_of("h1") == "redundant"
    assert out[4].view.tree.mode_of("h1") == "oversubscribed"
    assert out[4].view.tree.hosts["h2"].reserve_w == 500.0
