"""The gateway's HTTP/1.1 server: client connections read with httptools (llhttp, the
parser Node.js uses), one request at a time per connection, answered by one handler.

Ours, not aiohttp's (issue 41): a bare proxy on aiohttp's server and client spent 4-5x
the CPU per request of an ``asyncio.Protocol`` on httptools, which spends what uvicorn's
server does (benchmarks/RESULTS.md, "The data path's floors"); and uvicorn has no
deadline for a request's headers (its issue #157), which the policies below need:

- headers: a request's headers must be complete ``HEADER_TIMEOUT`` seconds after its
  first byte; a connection with no request is closed after ``IDLE_TIMEOUT`` (slowloris
  holds nothing for good); a line or header past ``LINE_MAX`` bytes, or more than
  ``HEADERS_MAX`` headers, is refused, as soon as it is (``HELD_MAX``), not once its
  line ends; a chunked body's trailer fields are read and dropped, never added to the
  request's headers; a request with two Host headers, or a Host that is no host, or an
  HTTP/1.1 one with none, is refused (RFC 9112 §3.2): the gateway's checks read the
  first Host, a proxy in front may go by the last;
- a cap on open connections below the fd limit, leaving room for the daemon's own
  work (passes spawn engines, read records, probe): past it the oldest connection that
  has no request in progress is closed (a flood of half-open ones cannot lock out a
  real client; nor make a pass fail for want of an fd);
- unreadable HTTP: an OpenAI error body that quotes none of the request's bytes, and a
  rate-limited info line without a traceback; what the client still sends is dropped
  until the close (``_drop_rest``), so that the close does not reset the answer;
- a client that goes away cancels its handler (so the engine's request is closed and
  the engine stops generating); so does one that reads nothing of its answer for
  ``SEND_TIMEOUT`` while the gateway has some to send (nginx's ``send_timeout``): it
  held its engine's request, and a slot of ``--max-inflight``, for as long as it kept
  the connection open;
- an answer given before its request's body was read (a 401, a 413, a 503) is followed
  by a lingering read of the rest, dropped as it comes, then the close: closing with the
  client still sending resets the connection, and a client that reads its answer once
  it has sent its body (http.client, requests) read "broken pipe", not the answer. The
  read lasts while the body keeps coming: ``LINGER`` s with nothing of it arriving ends
  it, and ``LINGER_MAX`` s in all (nginx's ``lingering_timeout`` and ``lingering_time``,
  the latter as long as a body may take to come when it is read).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import re
import resource
import struct
import termios
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools

from controller.gateway.http.answers import body as error_body
from controller.gateway.http.answers import error
from controller.gateway.http.messages import Body, Request, StreamResponse
from controller.gateway.http.paths import origin_form
from controller.gateway.http.quiet import Throttle
from controller.logsetup import get_logger

log = get_logger("reconcile")

HEADER_TIMEOUT = 10.0  # seconds from a request's first byte to its last header
KEEPALIVE_LINGER = 1.0  # seconds a draining gateway waits for a kept-alive client's next request
FRESH_WAIT = 10.0  # seconds a draining gateway waits for a new connection's first request
DRAIN_TICK = 0.05  # seconds between looks at the connections while draining
SETTLE_LOOKS = 2  # looks in a row that must agree before the drain acts (Connections.drain)
IDLE_TIMEOUT = 60.0  # seconds a connection may sit with no request (keep-alive included)
SEND_TIMEOUT = 60.0  # seconds a client may read nothing while its answer waits to be sent
FD_RESERVE = 64  # fds always left to the daemon (engines' pipes and logs, records, probes)
LINE_MAX = 8190  # bytes of a request target, a header's name or a header's value
HEADERS_MAX = 256  # headers in one request (trailer fields apart)
# Bytes received since the parser last handed over a header or body bytes, while a head or
# a chunked body is read: httptools keeps a header line's bytes until the line ends (a
# 64 MB line held 64 MB, copied at each read), and a chunk extension is read to its end.
# Its longest line: a name and a value at LINE_MAX, their colon, spaces and CRLF.
HELD_MAX = 2 * LINE_MAX + 64
PIPELINE_MAX = 16  # requests read ahead of their answers before the connection stops reading
# Seconds with nothing arriving after which an answered request's unread body, read to be
# dropped, is given up and the connection closed; and seconds that read may last in all:
# as long as a body may take to come when it is read (surface/bodies.py BODY_TIMEOUT), so
# that a client is held no longer than it would be if its body were wanted. A close 2 s
# after the answer, whatever came, reset a client still sending 30 MiB on a loaded box
# (the 503s of a burst, tests/gateway/test_bodies.py): it read "broken pipe". nginx's 30 s
# in all (lingering_time) could cut a burst too: 20 rests of 30 MiB read at once, each at
# a twentieth of a loaded gateway's pace.
LINGER = 2.0
LINGER_MAX = 120.0
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

Handler = Callable[[Request], Awaitable[StreamResponse]]


class _TooLong(Exception):
    """A request line or header past the limits."""


class _BadHost(Exception):
    """A request's Host headers are not one host (RFC 9112 §3.2); its words are the 400's."""


# A Host header's value (RFC 9110 §7.2, RFC 3986 §3.2.2): an IP literal in brackets, or an
# IPv4 address or registered name, either with an optional port; empty is allowed.
_HOST = re.compile(
    rb"(?:\[[A-Za-z0-9._~!$&'()*+,;=:%-]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?"
)


# What each parse error says, in words of our own: llhttp's reasons name its internals.
PROBLEMS: tuple[tuple[type[Exception], str], ...] = (
    (
        _TooLong,
        "a request line or header is longer than the gateway accepts (at most "
        f"{LINE_MAX} bytes a target, header name or value, and {HEADERS_MAX} headers): "
        "send long data in the request body, not in the URL or a header",
    ),
    (httptools.HttpParserInvalidMethodError, "the request method is not a valid HTTP method"),
    (httptools.HttpParserInvalidURLError, "the request target is malformed"),
)
# ... and for llhttp's other errors, by a word of its reason.
REASON_WORDS: tuple[tuple[str, str], ...] = (
    ("header", "a request header is malformed"),
    ("content-length", "the request body's framing is malformed"),
    ("chunk", "the request body's framing is malformed"),
    ("transfer-encoding", "the request body's framing is malformed"),
    ("version", "the request line is malformed (METHOD PATH HTTP/1.1, lines ending CRLF)"),
    ("http/", "the request line is malformed (METHOD PATH HTTP/1.1, lines ending CRLF)"),
)


# A TLS handshake record (content type 22, version 3.x): how a client of https:// opens.
TLS_RECORD = b"\x16\x03"
TLS_HERE = (
    "a TLS handshake on the gateway's plain-HTTP port (the client uses https://): have it "
    "use http://, or give the gateway --tls-cert FILE --tls-key FILE"
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
        # accepted, not yet admitted: TLS connections mid-handshake (tlsaccept.Acceptor)
        self.arriving = 0
        self.deadline: float | None = None  # loop time a drain ends (None: when all did)

    def admit(self, conn: Protocol) -> None:
        self._open[conn] = None
        while len(self._open) > self.cap:
            victim = next((c for c in self._open if c.idle()), conn)
            self._open.pop(victim, None)
            victim.force_close()

    def drop(self, conn: Protocol) -> None:
        self._open.pop(conn, None)

    async def drain(self, grace: float | None) -> None:
        """The listener is closed: end every connection between requests, none mid-way.

        A connection whose request is in progress is left alone: its answer says
        ``Connection: close`` (``Server.draining``), and it ends after it. One accepted
        but with no request read yet is waited for: its client sent (or is sending) a
        request and closing it would reset that request, however long the kernel or the
        client took (``FRESH_WAIT``). One kept alive after an answer gets
        ``KEEPALIVE_LINGER`` for its client's next request, then closes while idle.

        A connection is closed only once two looks in a row found it closable, and the
        drain ends only after two looks found nothing open or arriving: a connection the
        loop accepted as the listener closed is admitted a turn or two later, one over
        TLS once its handshake is done (``arriving``). Past ``grace`` (None: none, until
        ``bound`` sets one) the rest are left to the caller (``Server.cut``).
        """
        loop = asyncio.get_running_loop()
        began = loop.time()
        if grace is not None:  # else none, unless ``bound`` set one (before, or meanwhile)
            self.deadline = began + grace
        closable: set[Protocol] = set()  # closable at the last look
        empty_looks = 0
        while empty_looks < SETTLE_LOOKS and (self.deadline is None or loop.time() < self.deadline):
            waited = loop.time() - began
            empty_looks = empty_looks + 1 if not self._open and not self.arriving else 0
            now = {c for c in self._open if c.idle() and _closable(c, waited)}
            for conn in now & closable:
                self._open.pop(conn, None)
                conn.force_close()
            closable = now - closable
            await asyncio.sleep(DRAIN_TICK)

    def bound(self, grace: float) -> None:
        """A drain without a deadline (a hand-over's) gets one, ``grace`` s from now."""
        now = asyncio.get_running_loop().time()
        if self.deadline is None or self.deadline > now + grace:
            self.deadline = now + grace

    def all(self) -> list[Protocol]:
        return list(self._open)

    def __len__(self) -> int:
        return len(self._open)


def _unavailable(why: str) -> bytes:
    """A 503 written by hand, for a request the gateway cut before any of its answer."""
    said = json.dumps(error_body(503, why, "gateway_stopping")).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(said), said)
    )


def _closable(conn: Protocol, waited: float) -> bool:
    """Idle ``conn`` may be closed ``waited`` s into a drain (Connections.drain)."""
    return waited >= FRESH_WAIT or (conn.between_requests() and waited >= KEEPALIVE_LINGER)


class Server:
    """What every connection shares: the handler, the cap, the log's throttle, and
    whether the gateway drains (each answer then ends its connection)."""

    def __init__(self, handler: Handler, connections: Connections, max_body: int) -> None:
        self.handler = handler
        self.connections = connections
        self.max_body = max_body
        self.throttle = Throttle()
        self.draining = False

    def protocol(self) -> Protocol:
        """The protocol factory for ``loop.create_server``."""
        return Protocol(self)

    async def cut(self, wait: float, why: str) -> None:
        """Past the drain: each handler still running is cancelled with ``why`` on its
        connection (``Protocol.cut``), and gets ``wait`` s to say so to its client (an
        event stream's last event; a 503 where nothing of the answer went out); then every
        connection is closed."""
        running = []
        for conn in self.connections.all():
            if conn.serving is not None:
                conn.cut = why
                conn.serving.cancel()
                running.append(conn.serving)
        if running:
            await asyncio.wait(running, timeout=wait)
        for conn in self.connections.all():
            conn.force_close()


class Protocol(asyncio.Protocol):
    """One client connection: its requests parsed, queued and answered in order."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._remote: str | None = None
        self._queue: deque[Request] = deque()  # parsed (at least their heads), not yet answered
        self.serving: asyncio.Task[None] | None = None  # answers the queue's requests
        self._url = bytearray()
        self._fields: list[tuple[str, str]] = []  # the request's headers as they came
        self._body: Body | None = None  # the body of the request being parsed
        self._last = False  # no request after those queued is answered (_unreadable, upgrade)
        self._expects: Request | None = None  # the request owed a 100 Continue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None  # the deadlines' one timer (_watch)
        self._began = 0.0  # loop time the request being parsed began
        self._idle_since = 0.0  # loop time the connection last became idle
        self._heard = False  # a byte of a request arrived on it
        self._parsing = False  # a request's head is being read
        self._held = 0  # bytes read since the parser handed anything over (-1: in this read)
        self._trailers = 0  # trailer fields of the body being read (dropped: on_header)
        self._hosts = 0  # Host headers of the request being parsed (_check_host)
        self._host_ok = True  # ... and whether each was a host
        self._lingering = False  # an answered request's unread body is dropped as it comes
        self._dropping = False  # refused: what still comes is dropped until the close
        self._dropped_at = 0.0  # monotonic time bytes last came while lingering or dropping
        self._linger_end = 0.0  # monotonic time the lingering read ends, whatever comes
        self._paused: set[str] = set()  # why reading stopped ("body", "queue")
        self._writable: asyncio.Future[None] | None = None  # set while writes are paused
        self._lost = False
        self._sent = 0  # bytes of the current answer sent
        # why the gateway cut the request in progress (its drain ran out), if it did
        self.cut: str | None = None

    # -- what the drain and the cap look at
    def idle(self) -> bool:
        """No request in progress: closing it loses nothing but a half-sent request."""
        return self.serving is None and not self._queue

    def between_requests(self) -> bool:
        """Idle after a request, none begun since: closing it now is what keep-alive
        allows. A new connection is not (its first request may be on its way), nor one
        with part of a request read (its header timer runs)."""
        return self._heard and not self._parsing and self.idle()

    def force_close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # -- asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self._remote = str(peer[0]) if isinstance(peer, tuple) and peer else None
        self._server.connections.admit(self)
        self._loop = loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        self._timer = loop.call_at(self._idle_since + HEADER_TIMEOUT, self._watch)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._server.connections.drop(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        gone = ConnectionResetError("the client closed the connection")
        for request in self._queue:
            request.content.fail(gone)
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(gone)
            self._writable.exception()  # retrieved here: no one may be waiting on it
        if self.serving is not None:
            self.serving.cancel()  # the client went away: its handler (and engine) stop

    def eof_received(self) -> bool:
        """The client sent its FIN: it went away (a closed tab, a killed script) as far as
        can be told; a half-close after a request looks the same. False: the connection
        closes and its handler is cancelled, so a generation no one reads stops at once,
        which matters more here than the rare client that half-closes and still reads."""
        return False

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._dropping or self._lingering:
            self._dropped_at = time.monotonic()  # still coming: the close waits (_linger)
            if self._dropping:
                return  # read only so that the close does not reset the refusal (_drop_rest)
        first = not self._heard
        self._heard = True
        try:
            self._parser.feed_data(data)
            if self._parsing or self._body is not None:  # a head or a body still coming
                if len(self._fields) > HEADERS_MAX:
                    raise _TooLong  # a head still coming, with too many headers already
                # A handover in this read: at most this read since (the bound's slack).
                self._held = 0 if self._held < 0 else self._held + len(data)
                if self._held > HELD_MAX:
                    raise _TooLong  # a header line (or chunk extension) with no end in sight
        except httptools.HttpParserUpgrade:
            # No upgrade is offered: the request is answered as plain HTTP/1.1, and its
            # connection ends with it (the parser reads nothing past an upgrade's head).
            self._last = True
            self.reading(False, why="queue")
        except (httptools.HttpParserError, _TooLong) as exc:
            # A connection that opens with a TLS record: a client of https:// here. Said
            # so, or the operator reads "not a valid HTTP method" and looks for a bug.
            self._unreadable(exc, TLS_HERE if first and data[:2] == TLS_RECORD else None)

    # -- httptools' callbacks
    def on_message_begin(self) -> None:
        self._parsing = True
        self._held = -1
        self._trailers = 0
        self._hosts = 0
        self._host_ok = True
        self._url.clear()
        self._fields = []
        assert self._loop is not None
        self._began = self._loop.time()  # the header deadline runs from here (_watch)

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > LINE_MAX:
            raise _TooLong

    def on_header(self, name: bytes, value: bytes) -> None:
        # Counted after each read (data_received), not here. Decoded one by one: a join
        # of them all and a split, fewer calls, cost twice the CPU (issue 41).
        if len(name) > LINE_MAX or len(value) > LINE_MAX:
            raise _TooLong
        self._held = -1
        if not self._parsing:
            # A trailer field (after a chunked body): dropped. The request's headers were
            # checked and routed on without it (RFC 9110 §6.5.1: not merged into them),
            # and its body goes on re-framed, without trailers.
            self._trailers += 1
            if self._trailers > HEADERS_MAX:
                raise _TooLong
            return
        if len(name) == 4 and name.lower() == b"host":
            self._hosts += 1
            self._host_ok = self._host_ok and _HOST.fullmatch(value) is not None
        self._fields.append((name.decode("latin-1"), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._parsing = False
        if len(self._fields) > HEADERS_MAX:
            raise _TooLong
        parser = self._parser
        major, _, minor = parser.get_http_version().partition(".")
        if self._hosts != 1 or not self._host_ok:
            self._check_host(major, minor)
        self._body = Body(self)
        request = Request(
            parser.get_method().decode("ascii"),
            origin_form(self._url.decode("latin-1")),  # a proxy's absolute-form too
            self._fields,
            (int(major or 1), int(minor or 1)),
            self._remote,
            self._body,
            self,
            parser.should_keep_alive(),
            self._server.max_body,
        )
        if self._lingering:  # read only to be dropped: never answered
            self._body.fail(ConnectionResetError("the connection is closing"))
            return
        self._queue.append(request)
        if len(self._queue) >= PIPELINE_MAX:
            self.reading(False, why="queue")
        if self.serving is None:
            assert self._loop is not None
            # The loop kept, not asyncio's lookup: on Python 3.11 each lookup is a getpid()
            # system call (~3% of a profile at one client).
            self.serving = self._loop.create_task(self._serve())

    def _check_host(self, major: str, minor: str) -> None:
        """A request without exactly one Host header, or with one that is no host: a 400
        (RFC 9112 §3.2), but an HTTP/1.0 one without (Host came with HTTP/1.1)."""
        if self._hosts > 1:
            raise _BadHost(
                f"the request has {self._hosts} Host headers: send exactly one (RFC 9112 §3.2)"
            )
        if self._hosts == 1:
            raise _BadHost(
                "the request's Host header is not a host name or address, with an optional "
                ":port: send the name the gateway is reached by (RFC 9112 §3.2)"
            )
        if (major, minor) != ("1", "0"):
            raise _BadHost(
                "the request has no Host header, which HTTP/1.1 requires: send the name "
                "the gateway is reached by, e.g. `Host: 127.0.0.1:PORT` (RFC 9112 §3.2)"
            )

    def on_body(self, body: bytes) -> None:
        self._held = -1
        if self._body is not None and not self._lingering:
            self._body.feed(body)

    def on_message_complete(self) -> None:
        if self._body is not None:
            self._body.feed_eof()
            self._body = None
        if self._lingering:
            self.force_close()  # the unread body is over: the answer was sent before it

    # -- what a request and its answer ask of the connection (messages.Connection)
    def send(self, data: bytes) -> None:
        if self._lost or self.transport is None or self.transport.is_closing():
            raise ConnectionResetError("the client closed the connection")
        self._sent += len(data)
        self.transport.write(data)

    def must_drain(self) -> bool:
        """Whether ``drain`` has anything to do (a write must wait, or the client left):
        most writes go on at once, without its coroutine."""
        return self._lost or (self._writable is not None and not self._writable.done())

    async def drain(self) -> None:
        if self._lost:
            raise ConnectionResetError("the client closed the connection")
        if self._writable is not None and not self._writable.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._writable), SEND_TIMEOUT)
            except TimeoutError:
                # Aborted, not closed: a close waits to send what the client never reads.
                if self.transport is not None:
                    self.transport.abort()
                quiet("client read nothing of its answer: cut", self._server.throttle,
                      peer=str(self._remote), after=f"{SEND_TIMEOUT:g}s")  # fmt: skip
                raise ConnectionResetError("the client read nothing of its answer") from None

    def reading(self, on: bool, why: str = "body") -> None:
        if self.transport is None or self._lost:
            return
        was = bool(self._paused)
        if on:
            self._paused.discard(why)
        else:
            self._paused.add(why)
        now = bool(self._paused)
        if now and not was:
            self.transport.pause_reading()
        elif was and not now:
            self.transport.resume_reading()

    def continue_once(self) -> None:
        """The handler waits for the body: a client that asked ``Expect: 100-continue``
        is told to send it (once; not at all when the answer comes without it)."""
        if self._expects is not None and self._queue and self._queue[0] is self._expects:
            self._expects = None
            if self.transport is not None and not self._lost:
                self.transport.write(CONTINUE)  # not the answer: _sent stays

    def keeps_alive(self, request: Request) -> bool:
        """Whether ``request``'s answer may leave its connection open: the client's
        wish, the gateway not draining, and the request's body received whole (one still
        on its way is read and dropped before the close: ``_end``)."""
        return (
            request.keep_alive
            and not self._last
            and not self._server.draining
            and request.content.is_eof()
        )

    # -- answering
    async def _serve(self) -> None:
        try:
            while self._queue:
                request = self._queue[0]
                expect = request.headers.get("Expect", "").lower() == "100-continue"
                self._expects = request if expect else None
                keep = await self._answer(request)
                self._queue.popleft()
                if self._paused and len(self._queue) < PIPELINE_MAX:
                    self.reading(True, why="queue")
                if not keep:
                    self._end(request)
                    return
        except asyncio.CancelledError:
            if self._dropping:
                return  # its request was refused (_unreadable): the close comes later
            if self.cut is not None and self._sent == 0 and not self._lost:
                self.send(_unavailable(self.cut))  # nothing of the answer went out yet
            self.force_close()  # the client went away, or the gateway is cut
        finally:
            self.serving = None
            if self._loop is not None:
                self._idle_since = self._loop.time()

    async def _answer(self, request: Request) -> bool:
        """Answer ``request``; whether its connection may carry the next one."""
        self._sent = 0
        try:
            answer = await self._server.handler(request)
        except ConnectionError:
            return False
        except Exception as exc:
            log.error("gateway request failed", error=type(exc).__name__, exc_info=exc)
            if self._sent:  # a byte of its answer went out: no other answer can follow
                return False
            answer = error(500, "the gateway failed to handle the request", "internal_error")
            answer.force_close()
        try:
            if not answer.prepared:
                await answer.prepare(request)
            if not answer.ended:
                await answer.write_eof()
        except ConnectionError:
            return False
        return answer.keep_alive and self.keeps_alive(request)

    def _end(self, request: Request) -> None:
        """No request follows on this connection: close it, once the client sent what it
        was sending of the last request's body (read and dropped: ``_linger``)."""
        if request.content.is_eof() or self._lost:
            self.force_close()
            return
        self._lingering = True
        self.reading(True, why="body")
        self.reading(True, why="queue")
        self._linger()

    def _linger(self) -> None:
        """Close once what the client still sends stopped coming for ``LINGER`` s, or
        ``LINGER_MAX`` s from now (the end of the body closes it at once: on_message_complete).
        A close at a fixed time reset a client still sending at a steady pace."""
        assert self._loop is not None
        self._dropped_at = now = time.monotonic()
        self._linger_end = now + LINGER_MAX
        self._loop.call_later(LINGER, self._lingered)

    def _lingered(self) -> None:
        """The process's clock, not the loop's (uvloop's is cached, from before a stall),
        and bytes the kernel holds unread count as come now: uvloop runs the timers due
        before it reads what came while the gateway stalled (a busy loop, a process the
        kernel left waiting on a loaded box), and the client still sending was reset."""
        if self._lost or self._loop is None:
            return
        now = time.monotonic()
        if _unread(self.transport):
            self._dropped_at = now
        due = min(self._dropped_at + LINGER, self._linger_end)
        if now >= due:
            self.force_close()
        else:
            self._loop.call_later(due - now, self._lingered)

    def _unreadable(self, exc: Exception, why: str | None = None) -> None:
        """The bytes are not HTTP the gateway reads: a 400 that quotes none of them, a
        quiet line, and the close: after the answer in progress, if one is and its request
        was read whole; at once when its own body is what broke. ``why``: what they are,
        when known better than the parser's error."""
        self._parsing = False
        why = why or _problem(exc)
        quiet(f"malformed request: {why}", self._server.throttle, peer=str(self._remote))
        if self.transport is None or self._lost:
            return
        self.reading(False, why="queue")
        if self._lingering:  # the rest of an answered request's body: nothing more to say
            self.force_close()
            return
        broken = self._body  # the body being read when the parser gave up, if any
        self._body = None
        if self.serving is not None and not (self._queue and self._queue[0].content is broken):
            self._last = True  # the answer in progress (another request's) ends it
            return
        # No request in progress, or it is the one whose body broke: its handler would
        # wait for the rest of a body no parser will read. The 400 goes out first (if none
        # of its answer did) and the handler is cancelled, as a client gone is: its engine
        # is not blamed for the body it never got; then the close (at once, where some of
        # the answer went out: nothing more can be said).
        if self.serving is None or self._sent == 0:
            answer = error(400, why, "malformed_request")
            head = answer.body  # a response written by hand: the handler's is not coming
            self.send(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(head), head)
            )
            if self.serving is not None:
                # Its body will never come: it ends here (_serve), or before it began (a
                # task cancelled unstarted runs none of its code: no `finally` says so).
                self.serving.cancel()
                self.serving = None
                self._queue.clear()
            self._drop_rest()
            return
        self.force_close()

    def _drop_rest(self) -> None:
        """Refused with no request in progress: the answer goes out with the close of the
        write side, and what the client still sends is read and dropped (``_linger``).
        Closed at once, with its bytes unread, the connection was reset, and a client
        that sent a long header line read "connection reset", not the 400 saying why."""
        assert self.transport is not None
        self._dropping = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._paused.clear()
        self.transport.resume_reading()
        self._linger()

    # -- the deadlines
    def _watch(self) -> None:
        """The connection's one timer, never set more than ``HEADER_TIMEOUT`` ahead: a
        request's header deadline and the idle timeout are checked when it fires, and it
        is set again for the nearer of the two (a timer made and cancelled for each of
        them on every request was ~3% of a profile at 32 clients)."""
        self._timer = None
        if self._lost or self._loop is None:
            return
        now = self._loop.time()
        due = now + HEADER_TIMEOUT
        if self._parsing and not self._lingering:
            if now >= self._began + HEADER_TIMEOUT:
                if self.idle():
                    late = "request headers incomplete in time; connection closed"
                    quiet(late, self._server.throttle)
                    self.force_close()
                    return
                self._began = now  # read ahead of an answer in progress: it waits for that
            due = min(due, self._began + HEADER_TIMEOUT)
        elif self.idle() and not (self._lingering or self._dropping):  # _linger ends those
            if now >= self._idle_since + IDLE_TIMEOUT:
                self.force_close()
                return
            due = min(due, self._idle_since + IDLE_TIMEOUT)
        self._timer = self._loop.call_at(due, self._watch)


def _unread(transport: asyncio.Transport | None) -> bool:
    """Whether the kernel holds bytes of this connection that the loop has not read."""
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return False
    try:
        held = fcntl.ioctl(sock.fileno(), termios.FIONREAD, bytes(4))
    except OSError:  # closed under it: nothing more comes
        return False
    return bool(struct.unpack("i", held)[0])


def _problem(exc: BaseException | None) -> str:
    cause = exc.__context__ if isinstance(exc, httptools.HttpParserCallbackError) else exc
    if isinstance(cause, _BadHost):
        return str(cause)
    for kind, words in PROBLEMS:
        if isinstance(cause, kind):
            return words
    said = str(exc).lower()
    for word, words in REASON_WORDS:
        if word in said:
            return words
    return "the request is not HTTP/1.1 the gateway can read"


def quiet(event: str, throttle: Throttle, **fields: str) -> None:
    """An info line about a client, at most a few per window (with how many were not)."""
    held = throttle.allow(event)
    if held is not None:
        log.info(event, **fields, **({"similar_left_out": str(held)} if held else {}))


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
