"""structlog set-up: a human console on a terminal, JSON lines otherwise.

Colours follow no-color.org (``NO_COLOR`` set and not empty, or ``--no-color``) and
``TERM=dumb``. Under systemd (``JOURNAL_STREAM`` names our stderr) each line starts
with its syslog priority (``<4>``), so ``journalctl -p warning`` filters. Lines of
other libraries (stdlib ``logging``) and a thread's uncaught exception are logged
through structlog too, so a traceback never breaks the JSON-lines stream.

structlog (with the asyncio it imports) costs a pass that logs nothing ~25 ms of
start-up, so it is imported with the first log line: modules take their logger from
:func:`get_logger`, a stand-in that applies the configuration and binds the real
logger when first used. Code that calls ``structlog.configure`` itself calls
:func:`apply` first, so the configuration here never lands on top of its own.

structlog is imported through :func:`structlog_module` only: without rich (see there).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, TextIO, cast

from controller.redact import printable

if TYPE_CHECKING:
    from structlog.typing import EventDict, FilteringBoundLogger, Processor, WrappedLogger

_pending: tuple[int, bool | None, bool] | None = None
_lock = threading.RLock()  # apply() holds it while _configure imports structlog
# Modules structlog imports when installed, to render tracebacks (see structlog_module).
_UNWANTED = ("rich", "better_exceptions")
# Imported by structlog at the top but called only by its async methods (`ainfo`...), which
# we never use: asyncio brings ssl and OpenSSL, ~3.5 MB of the daemon's resident memory.
_DEFERRED = ("asyncio",)
# sd-daemon(3) priorities: what `journalctl -p` filters on.
PRIORITY = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "info": 6, "debug": 7}


@dataclass(frozen=True)
class Terminal:
    colour: bool  # ANSI colours
    fancy: bool  # cursor movement and marks like ✔/✘ (a redrawn block)


def terminal(stream: TextIO, *, colour: bool = True) -> Terminal:
    """What ``stream`` can show: no-color.org's ``NO_COLOR``, ``TERM=dumb``, a pipe."""
    tty = stream.isatty()
    dumb = os.environ.get("TERM") == "dumb"
    no_color = bool(os.environ.get("NO_COLOR"))  # any value but the empty string
    return Terminal(colour=tty and not dumb and not no_color and colour, fancy=tty and not dumb)


def under_journald(stream: TextIO) -> bool:
    """True when ``stream`` is the journal's: ``JOURNAL_STREAM`` is its ``dev:inode``."""
    expected = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = expected.partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) == (int(dev), int(ino))


def configure(verbosity: int = 0, *, json: bool | None = None, colour: bool = True) -> None:
    """Set the level and the renderer; structlog is configured when first needed."""
    global _pending
    _pending = (verbosity, json, colour)
    _route_foreign(verbosity)
    if "structlog" in sys.modules:  # already paid for: no reason to wait
        apply()


def _route_foreign(verbosity: int) -> None:
    """Other libraries' log records and dying threads go through our (lazy) logger."""
    root = logging.getLogger()
    root.handlers[:] = [_Forward()]
    root.setLevel(logging.WARNING if verbosity < 2 else logging.DEBUG)
    threading.excepthook = _thread_died


class _Forward(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log = get_logger(record.name)
        fields: dict[str, Any] = {"logger": record.name}
        if record.exc_info:
            fields["exc_info"] = record.exc_info
        log.log(record.levelno, record.getMessage(), **fields)


def _thread_died(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    exc_info: tuple[type[BaseException], BaseException, TracebackType | None] = (
        args.exc_type,
        args.exc_value,
        args.exc_traceback,
    )
    name = args.thread.name if args.thread else "?"
    get_logger("reconcile").error("thread died", thread=name, exc_info=exc_info)


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


def structlog_module() -> ModuleType:
    """structlog, imported (on the first call) without what it imports and we never use.

    Memory: structlog's ``dev`` and ``tracebacks`` modules import rich whenever it is
    installed (import-linter brings it, vLLM does in users' venvs), ~12 MB of RSS for
    the daemon's whole life, and we never render with it: JSON lines or a plain
    console, whose tracebacks are plain too (``plain_traceback`` below). So for this
    one import only, ``sys.modules[name] = None`` makes ``import rich`` (and
    better_exceptions) raise ImportError, structlog's "not installed" branch; and
    asyncio is a stand-in that imports the real one when structlog first uses it.
    The previous entries are back afterwards, so a later import gets the real modules.
    """
    with _lock:
        if "structlog" in sys.modules:  # imported: by us, or before us (then as it was)
            import structlog

            return structlog
        names = (*_UNWANTED, *_DEFERRED)
        saved = {name: sys.modules[name] for name in names if name in sys.modules}
        stand_ins: dict[str, Any] = dict.fromkeys(_UNWANTED)  # None: "import rich" fails
        stand_ins.update({n: _Deferred(n) for n in _DEFERRED if n not in sys.modules})
        sys.modules.update(stand_ins)
        try:
            import structlog
        finally:
            for name in names:
                if sys.modules.get(name) is stand_ins.get(name, False):
                    del sys.modules[name]
            sys.modules.update(saved)
    return structlog


class _Deferred(ModuleType):
    """A module that is imported for real when an attribute of it is first read."""

    def __getattr__(self, attr: str) -> Any:
        if sys.modules.get(self.__name__) is self:  # read while structlog still imports
            del sys.modules[self.__name__]
        import importlib

        return getattr(importlib.import_module(self.__name__), attr)


class _CurrentStderr:
    """``sys.stderr`` as it is at each write, not as it was at configure time: a stream
    swapped later (pytest's capture of each test, ``contextlib.redirect_stderr``) and the
    old one closed must not turn every later log line into "I/O operation on closed
    file" inside the caller (the gateway's loop, a watch's revive)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _CurrentStderr()


def _configure(verbosity: int, json: bool | None, colour: bool) -> None:
    structlog = structlog_module()

    level = logging.INFO - 10 * verbosity
    level = max(level, logging.DEBUG)
    as_json = not sys.stderr.isatty() if json is None else json
    shown = terminal(sys.stderr, colour=colour)
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(
            colors=shown.colour, exception_formatter=structlog.dev.plain_traceback
        )
    )
    if under_journald(sys.stderr):
        renderer = _with_priority(renderer)
    # a traceback as one JSON string, not lines of its own (the console prints it whole)
    tracebacks = [structlog.processors.format_exc_info] if as_json else []
    # JSON escapes control characters itself; the console must, or an engine's text clears
    # the operator's screen
    shielded = [] if as_json else [_printable_values]
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            *tracebacks,
            *shielded,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        # one write() a line (print makes two, message then newline): the daemon and its
        # gateway share stderr, and two processes writing a line in two parts interleave
        logger_factory=structlog.WriteLoggerFactory(file=_STDERR),
        cache_logger_on_first_use=True,
    )


def _printable_values(logger: WrappedLogger, method: str, event: EventDict) -> EventDict:
    """Every string value with its control characters escaped (ESC as ``\\x1b``): what an
    engine, an upstream or a drain's reason wrote is shown, never acted on. A traceback
    (exc_info, rendered later) keeps its lines."""
    for key, value in event.items():
        if isinstance(value, str):
            event[key] = printable(value)
    return event


def _with_priority(renderer: Processor) -> Processor:
    def render(logger: WrappedLogger, method: str, event: EventDict) -> str:
        priority = PRIORITY.get(str(event.get("level", method)), 6)
        text = renderer(logger, method, event)
        shown = text.decode() if isinstance(text, bytes) else str(text)
        return f"<{priority}>{shown}"

    return render


class _Lazy:
    def __init__(self, name: str) -> None:
        self._name = name
        self._real: Any = None

    def __getattr__(self, attr: str) -> Any:  # only for what the instance lacks: log calls
        real = self._real
        if real is None:
            apply()
            real = self._real = structlog_module().get_logger(self._name)
        return getattr(real, attr)


def get_logger(name: str) -> FilteringBoundLogger:
    """A logger that imports and configures structlog on its first call."""
    return cast("FilteringBoundLogger", _Lazy(name))
