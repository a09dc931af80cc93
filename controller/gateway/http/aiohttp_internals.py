"""Everything the gateway takes from aiohttp beyond its documented API, in one place.

The connection's timeouts, cap and quiet errors (``server.py``) need a hook on each
connection's bytes and on the parser's errors, which only a subclass of aiohttp's
connection handler gives, and a look at its private state (is a request in progress?
one parsed and queued?). aiohttp may change any of it in a minor release: pyproject caps
aiohttp below the next minor, and ``missing()`` (run by
tests/gateway/test_aiohttp_internals.py) names whatever the installed aiohttp lacks
before the cap is raised.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any, cast

import aiohttp
from aiohttp import http_exceptions as parse_errors
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_protocol import RequestHandler

__all__ = ["Handler", "answer_begun", "close_connection", "missing", "parse_errors"]

# Read on a live handler (Handler.idle, Handler.parsed, Handler.call_later, server.py).
FIELDS = ("_request_in_progress", "_messages", "_loop", "transport")
# Called or overridden (server.Protocol), with the parameters we pass or take.
METHODS: dict[str, tuple[str, ...]] = {
    "__init__": ("manager", "loop", "keepalive_timeout", "access_log", "auto_decompress"),
    "connection_made": ("transport",),
    "connection_lost": ("exc",),
    "data_received": ("data",),
    "handle_error": ("request", "status", "exc", "message"),
    "force_close": (),
}
# The parser's errors server.PROBLEMS words in our own terms.
PARSE_ERRORS = (
    "LineTooLong",
    "BadHttpMethod",
    "BadStatusLine",
    "InvalidURLError",
    "InvalidHeader",
    "ContentEncodingError",
    "PayloadEncodingError",
)


class Handler(RequestHandler):
    """aiohttp's connection handler, its private state read through methods of ours."""

    def __init__(
        self, manager: web.Server, *, loop: asyncio.AbstractEventLoop, idle: float
    ) -> None:
        super().__init__(
            manager,
            loop=loop,
            keepalive_timeout=idle,
            # None: no access log (aiohttp takes it though its annotation says Logger).
            access_log=cast(logging.Logger, None),
            auto_decompress=False,  # the gateway decodes bodies itself (bodies.py)
        )

    def idle(self) -> bool:
        """No request in progress: closing it loses nothing but a half-sent request."""
        return not self._request_in_progress and not self._messages

    def parsed(self) -> bool:
        """A request's headers were read whole (it waits for, or has, its handler)."""
        return bool(self._messages)

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle:
        return self._loop.call_later(delay, callback)


def answer_begun(request: web.BaseRequest) -> bool:
    """A byte of ``request``'s answer was written: no other answer can follow."""
    return request.writer.output_size > 0


def close_connection(request: web.BaseRequest) -> None:
    """End ``request``'s connection now (its client sees the answer cut off)."""
    if request.protocol is not None:
        request.protocol.force_close()


def missing(handler: type[RequestHandler] = RequestHandler) -> list[str]:
    """What the installed aiohttp lacks of what this module and server.py touch, in words
    (empty: all there). ``handler`` is the class to look at (a test passes a stand-in)."""
    found = [f"{handler.__name__}.{name} (a field read)" for name in _absent_fields(handler)]
    for name, params in METHODS.items():
        method = getattr(handler, name, None)
        if method is None:
            found.append(f"{handler.__name__}.{name} (a method called or overridden)")
            continue
        have = inspect.signature(method).parameters
        found += [f"{handler.__name__}.{name}(..., {p}=...)" for p in params if p not in have]
    found += [f"aiohttp.http_exceptions.{n}" for n in PARSE_ERRORS if not hasattr(parse_errors, n)]
    found += [
        f"web.BaseRequest.{n}" for n in ("writer", "protocol") if not _has(web.BaseRequest, n)
    ]
    if not hasattr(AbstractStreamWriter, "output_size"):
        found.append("aiohttp.abc.AbstractStreamWriter.output_size")
    return [f"aiohttp {aiohttp.__version__} has no {what}" for what in found]


def _absent_fields(handler: type[RequestHandler]) -> list[str]:
    """FIELDS a handler made the way aiohttp's server makes one lacks."""
    loop = asyncio.new_event_loop()
    try:

        async def answer(request: web.BaseRequest) -> web.StreamResponse:
            return web.Response()

        made = handler(web.Server(answer, loop=loop), loop=loop)
        return [name for name in FIELDS if not hasattr(made, name)]
    finally:
        loop.close()


def _has(kind: type[Any], name: str) -> bool:
    return inspect.getattr_static(kind, name, None) is not None
