"""What the gateway lets the HTTP library say: rate-limited, and never a key.

Anyone who reaches the port decides what reaches the daemon's log. So a client's
garbage is an info line at most a few times a window (with the count of those left
out), never a traceback; and every line an HTTP library (aiohttp's client, asyncio)
writes passes a filter that cuts credentials and key-like tokens out of its text, in
case one of its messages quotes raw request bytes (aiohttp's parse errors did, when its
server was the gateway's).
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from controller.redact import REDACTED

LIBRARY_LOGGERS = (
    *("aiohttp", "aiohttp.server", "aiohttp.web", "aiohttp.access"),
    *("aiohttp.client", "aiohttp.internal", "aiohttp.websocket", "asyncio"),
)
WINDOW = 10.0  # seconds
BURST = 5  # lines of one kind per window

# A credential header as a library quotes it (`Authorization: x`, `'x-api-key': 'x'`),
# a bearer token, and tokens that look like keys: `sk-...`, long runs of key alphabets.
_HEADER = re.compile(
    r"((?:proxy-)?authorization|x-api-key|api-key|cookie)(['\"]?\s*[:=]\s*['\"]?)[^\r\n'\"]*",
    re.IGNORECASE,
)
_BEARER = re.compile(r"(bearer|basic)(\s+)[^\s'\"\\]+", re.IGNORECASE)
_KEYLIKE = re.compile(
    r"\b(?:sk|pk|rk)[-_][A-Za-z0-9_-]{4,}"  # OpenAI-style keys
    r"|(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{20,}"  # long mixed tokens
)


def redact_text(text: str) -> str:
    """``text`` without credentials: header values, bearer tokens, key-like runs."""
    text = _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _KEYLIKE.sub(REDACTED, text)


@dataclass
class Throttle:
    """At most ``burst`` lines of each kind per ``window`` seconds."""

    window: float = WINDOW
    burst: int = BURST
    clock: Callable[[], float] = time.monotonic
    _seen: dict[str, tuple[float, int, int]] = field(default_factory=dict)  # start, said, held

    def allow(self, kind: str) -> int | None:
        """None: leave this line out. Else say it, with how many were left out before."""
        now = self.clock()
        start, said, held = self._seen.get(kind, (now, 0, 0))
        if now - start >= self.window:
            start, said = now, 0
        if said >= self.burst:
            self._seen[kind] = (start, said, held + 1)
            return None
        self._seen[kind] = (start, said + 1, 0)
        return held


class LibraryFilter(logging.Filter):
    """Redacts every record of the HTTP library; its exceptions become redacted text.

    A traceback is rendered here (then redacted) rather than by the log renderer,
    which would print the exception's message, raw request bytes and all, as is.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message += "\n" + "".join(traceback.format_exception(exc))
            record.exc_info = None
            record.exc_text = None
        record.msg = redact_text(message)
        record.args = None
        return True


_FILTER = LibraryFilter()


def install() -> None:
    """Put the filter on each of the library's loggers (a filter is not inherited)."""
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
