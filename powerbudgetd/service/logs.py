"""Logging: structlog JSON lines on stdout (journald stores them), a console format on a TTY.

Under systemd (stdout connected to the journal, as ``$JOURNAL_STREAM`` says) each line
starts with its syslog priority, sd-daemon's ``<N>`` prefix (:data:`PRIORITIES`): journald
files the line at that priority and strips the prefix, so ``journalctl -p err`` finds
every error event. The unit sets ``SyslogIdentifier=powerbudgetd``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog

# structlog's level -> syslog priority (sd-daemon(3): 3 err, 4 warning, 6 info, 7 debug).
PRIORITIES = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "warn": 4, "info": 6, "debug": 7}


def to_journal(stream: TextIO, environ: dict[str, str] | None = None) -> bool:
    """``stream`` is the journal stream systemd connected (``$JOURNAL_STREAM`` is its
    ``device:inode``, sd_journal_stream_fd(3))."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(stream.fileno())
        dev, ino = (int(x) for x in value.split(":"))
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (dev, ino)


class PriorityPrefix:
    """A renderer's line with sd-daemon's ``<N>`` priority prefix (from the event's
    ``level``; info where it has none)."""

    def __init__(self, renderer: Any) -> None:
        self.renderer = renderer

    def __call__(self, logger: object, method: str, event: structlog.typing.EventDict) -> str:
        priority = PRIORITIES.get(str(event.get("level", method)), 6)
        return f"<{priority}>{self.renderer(logger, method, event)}"


def configure_logging(level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    """Route every ``structlog`` event to ``stream`` (default stdout).

    ``json``: None picks JSON unless ``stream`` is a terminal. ``level``: debug, info,
    warning or error; ``off`` drops every event (``simulate`` without ``--log-level``:
    its report summarises what the controller did). Into the journal, each line carries
    its priority (:class:`PriorityPrefix`).
    """
    stream = stream or sys.stdout
    if level == "off":
        structlog.configure(processors=[_drop], logger_factory=structlog.PrintLoggerFactory(stream),
                            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                            cache_logger_on_first_use=False)
        return
    if json is None:
        json = not stream.isatty()
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    if to_journal(stream):
        renderer = PriorityPrefix(renderer)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def _drop(_logger: object, _method: str, _event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    raise structlog.DropEvent
