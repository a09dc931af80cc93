"""The gateway's client connections: how long one may take, how many may be open, and
what a request the HTTP parser cannot read gets back.

- headers: a request's headers must be complete ``HEADER_TIMEOUT`` seconds after its
  first byte; a connection with no request is closed after ``IDLE_TIMEOUT`` (slowloris
  holds nothing for good);
- a cap on open connections below the fd limit, leaving room for the daemon's own
  work (passes spawn engines, read records, probe): past it the oldest connection that
  has no request in progress is closed (a flood of half-open ones cannot lock out a
  real client; nor make a pass fail for want of an fd);
- unreadable HTTP: an OpenAI error body that quotes none of the request's bytes, and a
  rate-limited info line without a traceback (aiohttp's own answer echoes the raw
  request, key included, and logs it at error level).
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Callable
from typing import Any

from aiohttp import web

from controller.gateway.http.aiohttp_internals import Handler, answer_begun
from controller.gateway.http.aiohttp_internals import parse_errors as hx
from controller.gateway.http.answers import error
from controller.gateway.http.quiet import Throttle
from controller.logsetup import get_logger

log = get_logger("reconcile")

HEADER_TIMEOUT = 10.0  # seconds from a request's first byte to its last header
KEEPALIVE_LINGER = 1.0  # seconds a draining gateway waits for a kept-alive client's next request
FRESH_WAIT = 10.0  # seconds a draining gateway waits for a new connection's first request
DRAIN_TICK = 0.05  # seconds between looks at the connections while draining
SETTLE_LOOKS = 2  # looks in a row that must agree before the drain acts (Connections.drain)
IDLE_TIMEOUT = 60.0  # seconds a connection may sit with no request (keep-alive included)
FD_RESERVE = 64  # fds always left to the daemon (engines' pipes and logs, records, probes)

# What each parse error says, in words of our own: the library's messages quote raw bytes.
PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (hx.LineTooLong, "a request line or header is longer than the gateway accepts"),
    (hx.BadHttpMethod, "the request method is not a valid HTTP method"),
    (hx.BadStatusLine, "the request line is malformed (METHOD PATH HTTP/1.1, lines ending CRLF)"),
    (hx.InvalidURLError, "the request target is malformed"),
    (hx.InvalidHeader, "a request header is malformed"),
    (hx.ContentEncodingError, "the request body is not encoded as its Content-Encoding says"),
    (hx.PayloadEncodingError, "the request body's framing is malformed"),
)


def connection_cap(soft_limit: int | None = None) -> int:
    """Client connections the gateway holds at most: half of the fds past the reserve
    (each proxied request holds a second fd, its engine connection)."""
    if soft_limit is None:
        soft_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft_limit == resource.RLIM_INFINITY:
        soft_limit = 1 << 20
    reserve = max(FD_RESERVE, soft_limit // 8)
    return max(8, (soft_limit - reserve) // 2)


class Connections:
    """The open client connections, oldest first, at most ``cap`` of them."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._open: dict[Protocol, None] = {}  # a dict keeps the order they came in

    def admit(self, conn: Protocol) -> None:
        self._open[conn] = None
        while len(self._open) > self.cap:
            victim = next((c for c in self._open if c.idle()), conn)
            self._open.pop(victim, None)
            victim.force_close()

    def drop(self, conn: Protocol) -> None:
        self._open.pop(conn, None)

    async def drain(self, grace: float) -> None:
        """The listener is closed: end every connection between requests, none mid-way.

        A connection whose request is in progress is left alone: its answer says
        ``Connection: close`` (the caller's ``on_response_prepare``), and it ends after
        it. (aiohttp's own ``close()`` is no way to say so: from then on it drops every
        byte that arrives, so a request whose body was still on its way never ended.)
        One accepted but with no request read yet is waited for: its client sent (or is
        sending) a request and closing it would reset that request, however long the
        kernel or the client took (``FRESH_WAIT``). One kept alive after an answer gets
        ``KEEPALIVE_LINGER`` for its client's next request, then closes while idle.

        A connection is closed only once two looks in a row found it closable: between
        taking a request off its queue and starting its handler aiohttp shows it idle for
        one turn of the loop, and closing it then would reset that request. For the same
        reason the drain ends only after two looks found nothing open: a connection the
        loop accepted as the listener closed is admitted a turn or two later. Past
        ``grace`` the rest are left to the caller (cut).
        """
        loop = asyncio.get_running_loop()
        began = loop.time()
        closable: set[Protocol] = set()  # closable at the last look
        empty_looks = 0
        while empty_looks < SETTLE_LOOKS and loop.time() - began < grace:
            waited = loop.time() - began
            empty_looks = empty_looks + 1 if not self._open else 0
            now = {c for c in self._open if c.idle() and _closable(c, waited)}
            for conn in now & closable:
                self._open.pop(conn, None)
                conn.force_close()
            closable = now - closable
            await asyncio.sleep(DRAIN_TICK)

    def __len__(self) -> int:
        return len(self._open)


def _closable(conn: Protocol, waited: float) -> bool:
    """Idle ``conn`` may be closed ``waited`` s into a drain (Connections.drain)."""
    return waited >= FRESH_WAIT or (conn.between_requests() and waited >= KEEPALIVE_LINGER)


class Protocol(Handler):
    """aiohttp's connection handler with the timeouts, the cap and the quiet errors."""

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        connections: Connections,
        throttle: Throttle,
    ) -> None:
        super().__init__(manager, loop=loop, idle=IDLE_TIMEOUT)
        self._connections = connections
        self._throttle = throttle
        self._header_timer: asyncio.TimerHandle | None = None
        self._heard = False  # a byte of a request arrived on it

    def between_requests(self) -> bool:
        """Idle after a request, none begun since: closing it now is what keep-alive
        allows. A new connection is not (its first request may be on its way), nor one
        with part of a request read (its header timer runs)."""
        return self._heard and self._header_timer is None and self.idle()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._connections.admit(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._connections.drop(self)
        self._stop_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._heard = True
        if self._header_timer is None and self.idle():
            self._header_timer = self.call_later(HEADER_TIMEOUT, self._headers_late)
        super().data_received(data)
        if self.parsed():
            self._stop_header_timer()

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.idle() and self.transport is not None:
            quiet("request headers incomplete in time; connection closed", self._throttle)
            self.force_close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The answer to a request that failed outside its handler, or with an exception
        no handler caught: an OpenAI body; only the latter is logged as an error."""
        if status == 500 and exc is not None and not isinstance(exc, ConnectionError):
            log.error("gateway request failed", error=type(exc).__name__, exc_info=exc)
            why, code = "the gateway failed to handle the request", "internal_error"
        elif status == 504:
            why, code = "the request took too long", "timeout"
        else:
            why, code = _problem(exc), "malformed_request"
            quiet(f"malformed request: {why}", self._throttle, peer=str(request.remote))
        if answer_begun(request):
            raise ConnectionError("the answer had begun: no error answer can follow")
        answer = error(status, why, code)
        answer.force_close()
        return answer


def _problem(exc: BaseException | None) -> str:
    for kind, words in PROBLEMS:
        if isinstance(exc, kind):
            return words
    return "the request is not HTTP/1.1 the gateway can read"


def quiet(event: str, throttle: Throttle, **fields: str) -> None:
    """An info line about a client, at most a few per window (with how many were not)."""
    held = throttle.allow(event)
    if held is not None:
        log.info(event, **fields, **({"similar_left_out": str(held)} if held else {}))


def factory(
    server: web.Server, loop: asyncio.AbstractEventLoop, connections: Connections
) -> Callable[[], Protocol]:
    """The protocol factory for ``loop.create_server``: one throttle for all connections."""
    throttle = Throttle()
    return lambda: Protocol(server, loop=loop, connections=connections, throttle=throttle)


LoopHandler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]


def exception_handler(throttle: Throttle) -> LoopHandler:
    """The gateway loop's handler: asyncio's accept error (out of fds) rate-limited, the
    rest as asyncio would say it."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith("socket.accept() out of system resource"):
            held = throttle.allow("accept")
            if held is not None:
                exc = context.get("exception")
                log.warning(
                    "gateway cannot accept connections: out of file descriptors",
                    error=str(exc) if exc else message,
                    similar_left_out=str(held),
                )
            return
        loop.default_exception_handler(context)

    return handle
