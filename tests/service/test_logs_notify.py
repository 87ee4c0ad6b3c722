"""Log format (JSON lines, or a console format on a terminal) and the watchdog interval."""

from __future__ import annotations

import io
import json
import os

import pytest
import structlog

from powerbudgetd.service.logs import configure_logging
from powerbudgetd.service.notify import watchdog_interval_s


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _restore_structlog():  # type: ignore[no-untyped-def]
    yield
    structlog.reset_defaults()


def test_json_lines_off_a_terminal_console_on_one() -> None:
    out = io.StringIO()
    configure_logging(stream=out)
    structlog.get_logger("powerbudgetd").info("power_limit_set", index=0, to_w=250.0)
    event = json.loads(out.getvalue())
    assert (event["event"], event["index"], event["to_w"], event["level"]) == ("power_limit_set", 0, 250.0, "info")
    tty = Terminal()
    configure_logging(stream=tty)
    structlog.get_logger("powerbudgetd").info("power_limit_set", index=0)
    assert "power_limit_set" in tty.getvalue() and not tty.getvalue().lstrip().startswith("{")


def test_watchdog_interval_is_half_of_watchdog_usec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "10000000")
    assert watchdog_interval_s() == 5.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval_s() == 5.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert watchdog_interval_s() is None
