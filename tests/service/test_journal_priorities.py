"""Into the journal every log line carries its syslog priority (sd-daemon's ``<N>``), so
``journalctl -p err`` finds every error event: each warning and error event the product
logs is rendered, through the daemon's own logging set-up, at priority 4 or 3. Outside
the journal (a pipe, a file, a test) the lines stay plain JSON."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import structlog

from powerbudgetd.service.logs import configure_logging, to_journal
from support.paths import REPO

LEVELS = {"warning": 4, "error": 3, "exception": 3, "critical": 2}


def logged_events() -> set[tuple[str, str]]:
    """(event, method) of every ``log.<warning|error|exception|critical>("event", ...)``
    in the product."""
    out = set()
    for path in sorted((REPO / "powerbudgetd").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LEVELS
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "log"
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                out.add((node.args[0].value, node.func.attr))
    return out


def journal_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file standing for systemd's journal stream: ``$JOURNAL_STREAM`` names it."""
    path = tmp_path / "journal"
    path.touch()
    st = path.stat()
    monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
    return path


def test_every_warning_and_error_event_reaches_the_journal_at_its_priority(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = logged_events()
    names = {e for e, _ in events}
    assert len(events) >= 40 and {"reload_failed", "over_budget"} & names  # the scan found the product's events
    path = journal_file(tmp_path, monkeypatch)
    with path.open("w") as stream:
        configure_logging(level="info", stream=stream)
        log = structlog.get_logger("test")
        for event, method in sorted(events):
            getattr(log, method)(event)
    lines = path.read_text().splitlines()
    assert len(lines) == len(events)
    for line, (event, method) in zip(lines, sorted(events), strict=True):
        prefix, _, body = line.partition(">")
        assert prefix == f"<{LEVELS[method]}", (event, method, line)
        assert json.loads(body)["event"] == event
    errors = {e for e, m in events if LEVELS[m] <= 3}
    assert "reload_failed" in errors  # journalctl -p err finds it


def test_info_and_debug_are_priorities_6_and_7_and_a_pipe_gets_plain_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = journal_file(tmp_path, monkeypatch)
    with path.open("w") as stream:
        assert to_journal(stream)
        configure_logging(level="debug", stream=stream)
        structlog.get_logger("test").info("budget_changed")
        structlog.get_logger("test").debug("tick")
    assert [line[:3] for line in path.read_text().splitlines()] == ["<6>", "<7>"]
    other = tmp_path / "not-the-journal"
    with other.open("w") as stream:  # JOURNAL_STREAM names another file: not the journal
        assert not to_journal(stream)
        configure_logging(level="info", stream=stream)
        structlog.get_logger("test").error("reload_failed")
    assert json.loads(other.read_text())["event"] == "reload_failed"
    configure_logging(level="info")
