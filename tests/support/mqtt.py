"""A Mosquitto broker of the test's own on a free loopback port, and test-side clients:
a watcher that records what arrives on its topics, and one-shot publishing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import getpass
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiomqtt

from support.wait import free_port, wait_until


def mosquitto_path() -> str:
    found = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin:/usr/local/sbin")
    assert found, "mosquitto is missing: run scripts/install-test-deps"
    return found


class Mosquitto:
    """A broker of our own on 127.0.0.1:<free port>, which a test may kill and restart."""

    def __init__(self, workdir: Path, acl: str | None = None) -> None:
        """``acl``: the text of an ACL file (mosquitto's ``acl_file``) the broker enforces."""
        self.port = free_port()
        self.conf = workdir / "mosquitto.conf"
        self.conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
        if acl is not None:
            (workdir / "mosquitto.acl").write_text(acl)
            with self.conf.open("a") as conf:
                # Run as root, mosquitto drops to its own user before reading the file (in a
                # directory only we may read): keep our user (ignored when not root).
                conf.write(f"acl_file {workdir / 'mosquitto.acl'}\nuser {getpass.getuser()}\n")
        self.log = workdir / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([mosquitto_path(), "-c", str(self.conf)], stdout=out, stderr=out)

        def listening() -> bool:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True

        wait_until(listening, 10, f"mosquitto to listen on {self.port}", step_s=0.02, proc=self.proc, log=self.log,
                   ignore=(OSError,))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Watcher:
    """A test-side MQTT client that records what arrives on ``topics``."""

    def __init__(self, port: int, topics: list[str]) -> None:
        self.port, self.topics = port, topics
        self.messages: list[aiomqtt.Message] = []
        self._new = asyncio.Event()
        self.client: aiomqtt.Client | None = None

    async def run(self) -> None:
        async with aiomqtt.Client("127.0.0.1", self.port, identifier=f"watcher-{id(self)}") as client:
            self.client = client
            for t in self.topics:
                await client.subscribe(t, qos=1)
            async for msg in client.messages:
                self.messages.append(msg)
                self._new.set()

    def payloads(self, topic: str) -> list[bytes]:
        return [m.payload for m in self.messages if str(m.topic) == topic]  # type: ignore[misc]

    async def wait_for(self, pred: Callable[[], Any], timeout: float = 10.0) -> Any:
        """``pred()``'s first true answer, asked again as each message arrives."""
        deadline = time.monotonic() + timeout
        while not (value := pred()):
            left = deadline - time.monotonic()
            assert left > 0, f"timed out; got {[(str(m.topic), m.payload) for m in self.messages][-8:]}"
            self._new.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._new.wait(), timeout=min(left, 0.2))
        return value

    def last_json(self, topic: str) -> dict[str, Any] | None:
        got = self.payloads(topic)
        return json.loads(got[-1]) if got else None


@contextlib.asynccontextmanager
async def watching(port: int, topics: list[str]) -> AsyncIterator[Watcher]:
    """A :class:`Watcher` subscribed to ``topics`` (retained messages in) for the block."""
    w = Watcher(port, topics)
    task = asyncio.create_task(w.run())
    deadline = time.monotonic() + 5
    while w.client is None or len(w.client._pending_subscribes):  # wait until subscribed
        assert not task.done(), task.exception()
        assert time.monotonic() < deadline, "watcher did not connect"
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.1)  # the last SUBACK, and retained messages
    try:
        yield w
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def publish(port: int, topic: str, payload: bytes | str, *, retain: bool = False) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{time.monotonic_ns()}") as client:
        await client.publish(topic, payload, qos=1, retain=retain)
