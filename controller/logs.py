"""structlog set-up: a human console on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(verbosity: int = 0, *, json: bool | None = None) -> None:
    level = logging.INFO - 10 * verbosity
    level = max(level, logging.DEBUG)
    as_json = not sys.stderr.isatty() if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
