"""Fixtures for the tests (quiet logs, a temporary state and runtime directory for each; a NOTIFY
socket, the daemon launcher, brokers, an idle-bank controller on request) and the quick
profile's Hypothesis settings. Support code (the rig, waiting, the daemon as a
subprocess) is in ``support/``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from powerbudgetd.control.controller import Controller
from powerbudgetd.core.model import Timings
from powerbudgetd.service.backend import make_nvml
from powerbudgetd.service.logs import configure_logging
from support.nut import Nut
from support.daemon import DaemonProcess, Launch, NotifySocket
from support.examples import QUICK_EXAMPLES
from support.mqtt import Mosquitto
from support.scenarios import idle_4
from support.wait import reap


settings.register_profile("quick", max_examples=QUICK_EXAMPLES)


def pytest_configure(config: pytest.Config) -> None:
    # The quick profile (README, Tests): `-m "not slow"` runs the property tests with a
    # tenth of their examples (support/examples.py) unless a Hypothesis profile is named.
    quick = " ".join((config.option.markexpr or "").split()) == "not slow"
    if quick and not config.getoption("hypothesis_profile", None):
        settings.load_profile("quick")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Under pytest-xdist (CI: `-n`, `--dist loadgroup`; README, Tests):
    # - a module's tests that share a module-scoped fixture (a Home Assistant venv, a
    #   recorded log, a built library) go to one worker, which sets it up once;
    # - modules with slow tests first, so that the long tests start at once and the quick
    #   ones fill the workers' last minutes. A module stays whole (its fixtures once).
    for item in items:
        defs = getattr(item, "_fixtureinfo", None)
        if defs is not None and any(d.scope in ("module", "package", "session")
                                    for name in item.fixturenames for d in defs.name2fixturedefs.get(name, ())
                                    if not d.argname.startswith("_") and d.baseid):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    slow_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow_modules)


_DEVNULL = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the test session


@pytest.fixture(autouse=True)
def _quiet_logs() -> None:
    # Commands under test reconfigure logging onto captured streams; start each test
    # on the real stderr again.
    # Everything down to debug reaches structlog.testing.capture_logs(); nothing is printed.
    configure_logging(level="debug", stream=_DEVNULL, json=True)


@pytest.fixture(autouse=True)
def _state_directory(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # The flight recorder defaults to $STATE_DIRECTORY: a daemon started by a test
    # (here or as a subprocess) records into a temporary directory, never /var/lib.
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path_factory.mktemp("state")))
    # The instance lock of a real-NVML run is $RUNTIME_DIRECTORY/powerbudgetd.lock: each
    # test its own, so that tests running side by side (pytest-xdist) or another
    # checkout's suite never find a daemon of theirs holding /run/powerbudgetd's.
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(tmp_path_factory.mktemp("run")))


@pytest.fixture
def notify() -> Iterator[NotifySocket]:
    """A NOTIFY_SOCKET of the test's own, as systemd's."""
    with NotifySocket() as sock:
        yield sock


@pytest.fixture
def launch() -> Iterator[Launch]:
    """``launch(config, *args, **kw)``: a :class:`DaemonProcess`, stopped and reaped at
    the end of the test whatever happened."""
    started: list[DaemonProcess] = []

    def start(config: Path, *args: str, **kw: Any) -> DaemonProcess:
        started.append(DaemonProcess(config, *args, **kw))
        return started[-1]

    yield start
    for daemon in started:
        reap(daemon.proc)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A Mosquitto of the test's own, running."""
    b = Mosquitto(tmp_path)
    b.start()
    yield b
    b.kill()


@pytest.fixture
def stopped_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A Mosquitto of the test's own, not started yet."""
    b = Mosquitto(tmp_path)
    yield b
    b.kill()


@pytest.fixture
def nut(tmp_path: Path) -> Iterator[Nut]:
    """A real upsd serving one dummy UPS (user ``gpu``, password ``s3cret``)."""
    server = Nut(tmp_path / "nut", users={"gpu": "s3cret"}).start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def ctl(tmp_path: Path) -> Controller:
    """Four idle 150-300 W cards under 1000 W on the wall clock, started (their boot
    writes not yet confirmed)."""
    nvml = make_nvml("sim", str(idle_4(tmp_path)))
    nvml.init()
    c = Controller(nvml, 1000, Timings())
    c.start()
    return c
