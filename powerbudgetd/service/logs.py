"""Logging: structlog JSON lines on stdout (journald stores them), a console format on a TTY."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog


def configure_logging(level: str = "info", stream: TextIO | None = None, json: bool | None = None) -> None:
    """Route every ``structlog`` event to ``stream`` (default stdout).

    ``json``: None picks JSON unless ``stream`` is a terminal. ``level``: debug, info,
    warning or error.
    """
    stream = stream or sys.stdout
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
