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


class Throttle:
    """At most one log line per ``interval`` seconds for one kind of event a
    stranger can cause at will (an unauthenticated request): ``ready()`` says
    whether to log now and how many were held back since the last line."""

    def __init__(self, interval: float = 10.0) -> None:
        import time

        self._clock = time.monotonic
        self.interval = interval
        self._last = float("-inf")
        self._held = 0

    def ready(self) -> tuple[bool, int]:
        now = self._clock()
        if now - self._last < self.interval:
            self._held += 1
            return False, 0
        held, self._held, self._last = self._held, 0, now
        return True, held
