"""structlog set-up: a human console on a terminal, JSON lines otherwise.

structlog (with the asyncio it imports) costs a pass that logs nothing ~25 ms of
start-up, so it is imported with the first log line: modules take their logger from
:func:`get_logger`, a stand-in that applies the configuration and binds the real
logger when first used. Code that calls ``structlog.configure`` itself calls
:func:`apply` first, so the configuration here never lands on top of its own.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from structlog.typing import FilteringBoundLogger

_pending: tuple[int, bool | None] | None = None
_lock = threading.Lock()


def configure(verbosity: int = 0, *, json: bool | None = None) -> None:
    """Set the level and the renderer; structlog is configured when first needed."""
    global _pending
    _pending = (verbosity, json)
    if "structlog" in sys.modules:  # already paid for: no reason to wait
        apply()


def apply() -> None:
    """Configure structlog now, if :func:`configure` is waiting to.

    Teardown threads may log their first lines at once: the lock makes every one
    of them wait until the configuration is in place (else structlog's default,
    which prints to stdout, would get a line in).
    """
    global _pending
    with _lock:
        if _pending is not None:
            _configure(*_pending)
            _pending = None


def _configure(verbosity: int, json: bool | None) -> None:
    import structlog

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


class _Lazy:
    def __init__(self, name: str) -> None:
        self._name = name
        self._real: Any = None

    def __getattr__(self, attr: str) -> Any:  # only for what the instance lacks: log calls
        real = self._real
        if real is None:
            apply()
            import structlog

            real = self._real = structlog.get_logger(self._name)
        return getattr(real, attr)


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger that imports and configures structlog on its first call."""
    return cast("FilteringBoundLogger", _Lazy(name))
