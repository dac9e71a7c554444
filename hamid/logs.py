"""Structured logs through structlog: one event per line.

JSON lines in production (not a terminal, or ``logFormat: json``), a readable
console format on a terminal. Every part logs through ``get_logger``.
"""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure(fmt: str = "auto", level: str = "info", stream=None) -> None:
    stream = stream or sys.stderr
    json_out = fmt == "json" or (fmt == "auto" and not stream.isatty())
    renderer = structlog.processors.JSONRenderer() if json_out else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def get_logger(name: str):
    return structlog.get_logger(component=name)
