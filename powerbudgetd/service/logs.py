"""Logging: structlog JSON lines on stdout (journald stores them), a console format on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    """Route every ``structlog`` event to ``stream`` (default stdout).

    ``json``: None picks JSON unless ``stream`` is a terminal. ``level``: debug, info,
    warning or error; ``off`` drops every event (``simulate`` without ``--log-level``:
    its report summarises what the controller did).
    """
    stream = stream or sys.stdout
    if level == "off":
        structlog.configure(processors=[_drop], logger_factory=structlog.PrintLoggerFactory(stream),
                            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
                            cache_logger_on_first_use=False)
        return
    if json is None:
        json = not stream.isatty()
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
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
