"""The gateway's client to its engines: kept-alive HTTP/1.1 connections, nothing more.

Why not aiohttp's client: measured on this project's 2-core box (``benchmarks.gateway``),
an aiohttp server forwarding through aiohttp's client reached about half of nginx's
requests/s at 32 clients, and the same server forwarding through a plain pooled HTTP/1.1
client reached the engine's own rate; the client's per-request machinery (its request
and response objects, cookie jar, tracing hooks, timers) was most of the gateway's cost.
(The engines' /metrics are read with it too, ``get_text``: aiohttp's import alone was a
quarter of a gateway process's start.) An engine speaks plain HTTP/1.1 on a port the
gateway chose, so this client needs only:

- a pool of connections per engine address, at most ``limit`` open in all (idle ones
  are closed to make room), an idle one dropped once the engine has closed it or after
  ``IDLE_TIMEOUT`` (looked at when the oldest is due: nothing pooled, no timer), and
  never pooled again after a ``Connection: close`` answer;
- a connect timeout and the engine sockets of ``enginesock`` (a lost host is noticed);
- the request written as given (a sized body whole, an upload chunked unless sized);
- the answer's head parsed, then its body read whole, in part, or as it comes, framed by
  ``Content-Length``, chunked encoding, or the connection's end.

Its failures are the proxy's three kinds (``proxy.py``): ``Unreached`` (nothing was sent:
another instance may take the request), ``Dropped`` (the connection ended before any byte
of the answer: the request may be sent again) and ``Malformed`` (the engine did answer,
wrongly). A failure mid-body is ``Dropped`` too; the proxy knows by then that the answer
has begun.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

HEAD_MAX = 64 * 1024  # bytes of an answer's status line and headers
IDLE_TIMEOUT = 15.0  # seconds an unused connection stays pooled (aiohttp's default)
# A timer may end a little early (uvloop rounds its delay to a millisecond of a cached
# clock): a connection this close to its end goes with the look, not on a second wake.
DUE_SLACK = 0.05  # seconds
# bytes of a body read but not yet taken past which reading pauses (asyncio's streams paused
# at twice their 64 KiB limit): a client that reads slowly holds its engine back, not memory
PAUSE_AT = 128 * 1024
NO_BODY = frozenset({204, 304})
INTERIM_MAX = 5  # interim (1xx) answers skipped before the answer's own head
# bytes of a page ``get_text`` reads (an engine's /metrics: vLLM's is ~100 KB)
TEXT_MAX = 4 * 1024 * 1024

SocketFactory = Callable[[tuple[Any, ...]], socket.socket]


class Unreached(Exception):
    """The engine was not reached (refused, unreachable, or the connect timed out)."""


class Dropped(Exception):
    """The engine's connection ended or failed (before its answer, or in its body)."""


class Malformed(Exception):
    """The engine's answer is not HTTP/1.x the client can read."""


_NO_FIELDS: CIMultiDict[str] = CIMultiDict()  # an answer's, until its head came


class _Connection(asyncio.Protocol):
    """One engine connection: the answers' bytes read by httptools (llhttp) as they come,
    for one request at a time. An ``asyncio.Protocol`` of its own, not asyncio's streams
    (a reader's buffer searched for the head's end, a future per read, a writer's layer
    over the transport): 1-2% fewer instructions a proxied request (benchmarks/RESULTS.md),
    and bytes an engine sends past its answer are seen as such, never read as the next
    request's answer."""

    def __init__(self, key: tuple[str, int]) -> None:
        self.key = key
        self.idle_since = 0.0
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._busy = False  # a request is in progress on it (between ``begin`` and release)
        self._method = ""
        self._closed = False  # the engine's side ended (EOF, reset) or it was closed
        self._failure: Dropped | Malformed | None = None  # why no more of it can be read
        self._waiter: asyncio.Future[None] | None = None  # the reader waits for more
        self._writable: asyncio.Future[None] | None = None  # set while writes are paused
        self._paused = False  # reading paused: the reader holds ``PAUSE_AT`` bytes unread
        self._pieces: deque[bytes] = deque()  # body bytes come, not yet read
        self._reset()

    def _reset(self) -> None:
        """The state of one answer, before any of it came."""
        self._start = b""  # the answer's first bytes, quoted when it is no HTTP
        self._head_bytes = 0  # bytes of its header fields (at most HEAD_MAX)
        self._head_read = 0  # bytes read while its head was still coming (at most HEAD_MAX)
        self._interim = 0  # interim (1xx) answers skipped
        self._reason = b""
        self.fields: list[tuple[str, str]] = []
        self.named: CIMultiDict[str] = _NO_FIELDS
        self.headed = False  # its head came: ``status`` to ``framing`` are set
        self.status = 0
        self.reason = ""
        self.version = ""
        self.framing = _UNREAD
        self.keep = False
        self.complete = False  # its body came whole
        self._pieces.clear()  # none left: an answer not read whole closes its connection
        self._buffered = 0  # ... their length
        self._received = 0  # body bytes come in all
        self._held = 0  # bytes read since the parser last handed any over (-1: in this read)
        self._trailers = 0  # bytes of trailer fields

    def usable(self) -> bool:
        """Still open at both ends, nothing unread: an engine that closed it while idle
        left an EOF, one that sent bytes unasked spoiled it."""
        return not self._closed and self._failure is None and self.transport is not None

    def begin(self, method: str) -> None:
        self._reset()
        self._busy = True
        self._method = method

    def close(self) -> None:
        self._busy = False
        if self.transport is not None:
            self.transport.close()

    # -- asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def connection_lost(self, exc: BaseException | None) -> None:
        self._closed = True
        if exc is not None and self._failure is None:
            self._failure = _lost(exc, self.headed)
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError("the engine closed the connection"))
            self._writable.exception()  # retrieved here: no one may be waiting on it
        self._ended()

    def eof_received(self) -> bool:
        """The engine sent its FIN: an answer framed by the connection's end is complete.
        True: the write side stays open (a body still being sent fails on its own)."""
        self._closed = True
        self._ended()
        return True

    def _ended(self) -> None:
        if self.headed and not self.complete and self._failure is None:
            if self.framing.length is None and not self.framing.chunked:
                self.complete = True  # framed by the connection's end: this is it
            else:
                self._failure = _mid_answer(self.framing, self._received)
        elif not self.headed and self._failure is None:
            self._failure = Dropped(
                "the engine's connection ended inside its answer's head"
                if self._start
                else "the engine closed the connection before its answer"
            )
        self._wake()

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        if not self._busy or self.complete or self._failure is not None:
            # Bytes no request asked for (or past a failure): the connection is spoiled.
            self._fail(Malformed("the engine sent bytes past its answer"))
            return
        if not self._start:
            self._start = data[:80]
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            self._fail(cause if isinstance(cause, Malformed) else self._unreadable(exc))
            return
        except httptools.HttpParserUpgrade as exc:
            self._fail(Malformed(f"an upgrade the gateway did not ask for ({_said(exc)})"))
            return
        except httptools.HttpParserError as exc:
            self._fail(self._unreadable(exc))
            return
        if not self.headed:
            # A head still coming (httptools holds a header's bytes until its line ends)
            self._head_read += len(data)
            if self._head_read > HEAD_MAX:
                self._fail(Malformed(f"an answer head over {HEAD_MAX} bytes"))
                return
        elif not self.complete:
            # Bounded as the head is: a chunk's size line, or a trailer, with no end.
            self._held = 0 if self._held < 0 else self._held + len(data)
            if self._held > HEAD_MAX:
                self._fail(Malformed(f"a malformed chunk (a line over {HEAD_MAX} bytes)"))
                return
            if self._buffered > PAUSE_AT and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
        self._wake()

    def _unreadable(self, exc: Exception) -> Malformed:
        if self.headed:
            return Malformed(f"a malformed chunk ({_said(exc)})")
        if not self._reason and not self.fields and self._parser.get_status_code() == 0:
            line = self._start.partition(b"\r\n")[0].decode("latin-1")
            return Malformed(f"not an HTTP/1.x status line: {line[:80]!r}")
        return Malformed(f"a malformed answer head ({_said(exc)})")

    def _fail(self, failure: Dropped | Malformed) -> None:
        if self._failure is None:
            self._failure = failure
        if self.transport is not None:
            self.transport.close()
        self._wake()

    # -- httptools' callbacks
    def on_message_begin(self) -> None:
        if self.headed:
            # Another answer after this one, unasked: never read as the next request's
            # (it would be another client's answer); the connection is not reused.
            raise Malformed("the engine sent bytes past its answer")

    def on_status(self, reason: bytes) -> None:
        self._reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        self._held = -1
        if self.headed:
            # A trailer: none of the gateway's business, but bounded as a head is: an
            # engine that sent them for ever held its client for good, and a core.
            self._trailers += len(name) + len(value)
            if self._trailers > HEAD_MAX:
                raise Malformed(f"trailers over {HEAD_MAX} bytes")
            return
        # Counted here too: a head that came whole in one read is parsed whole at once.
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > HEAD_MAX:
            raise Malformed(f"an answer head over {HEAD_MAX} bytes")
        # llhttp leaves out the whitespace before a value, not after it
        self.fields.append((name.decode("latin-1"), value.decode("latin-1").rstrip(" \t")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:
            # An interim answer, skipped: a few (Go's client takes 5), since an engine that
            # sent them for ever held its client for good, and the gateway's CPU with it.
            self._interim += 1
            if self._interim > INTERIM_MAX:
                raise Malformed(f"more than {INTERIM_MAX} interim (1xx) answers")
            self._reason = b""
            self.fields = []
            return
        self.status = status
        self.reason = self._reason.decode("latin-1")
        self.version = f"HTTP/{self._parser.get_http_version()}"
        self.named = CIMultiDict(self.fields)
        self.framing, self.keep = _framing(self._method, status, self.version, self.named)
        self.headed = True
        self._held = -1
        if self._method == "HEAD":
            # No body, whatever its head says; llhttp cannot be told so, and would read the
            # next answer as this one's: never reused (engines are rarely asked a HEAD).
            self.complete = True
            self.keep = False

    def on_body(self, body: bytes) -> None:
        self._held = -1
        self._pieces.append(body)
        self._buffered += len(body)
        self._received += len(body)

    def on_message_complete(self) -> None:
        if self.headed:
            self.complete = True

    # -- what the client's side asks of it
    def write(self, data: bytes) -> None:
        if self.transport is None or self.transport.is_closing():
            raise _while_sending(ConnectionResetError("the engine closed the connection"))
        try:
            self.transport.write(data)
        except OSError as exc:  # _unanswered says why not ConnectionError alone
            raise _while_sending(exc) from exc

    async def drain(self) -> None:
        if self._writable is not None and not self._writable.done():
            try:
                await self._writable
            except OSError as exc:
                raise _while_sending(exc) from exc

    async def head(self) -> None:
        """Until the answer's head came; its failure raised, if it failed first."""
        while not self.headed:
            if self._failure is not None:
                raise self._failure
            await self._wait()

    def take(self) -> bytes | None:
        """The body's next bytes come, if any (reading resumes once they are taken)."""
        if not self._pieces:
            return None
        piece = self._pieces.popleft()
        self._buffered -= len(piece)
        if self._paused and self._buffered <= PAUSE_AT and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return piece

    async def more(self) -> bool:
        """Wait for more of the body; False once it came whole (its failure raised)."""
        if self.complete:
            return False
        if self._failure is not None:
            raise self._failure
        await self._wait()
        return True

    async def _wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Upstream:
    """Kept-alive connections to the engines, at most ``limit`` open at once."""

    def __init__(
        self, *, limit: int, connect_timeout: float, socket_factory: SocketFactory
    ) -> None:
        self._limit = limit
        self._open = 0
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        # Requests waiting for room (the cap reached), woken one at a time as a connection
        # is given back, closed, or never made.
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._connect_timeout = connect_timeout
        self._socket_factory = socket_factory
        self._sweep: asyncio.TimerHandle | None = None  # armed while a connection is pooled
        self._closed = False

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        target: str,
        headers: list[tuple[str, str]],
        body: bytes | AsyncIterator[bytes] | None,
        *,
        length: int | None = None,
        fresh: bool = False,
    ) -> Answer:
        """Send the request on a pooled connection (or a new one; always a new one when
        ``fresh``) and read the answer's head. ``target``: the path and query as they go
        on the request line; ``headers``: the fields sent, but ``Host`` and the body's
        framing, which are the client's own; ``length``: a streamed body's, when known
        (else it goes chunked)."""
        key = (host, port)
        # A kept-alive connection (most requests) without the wait for room's coroutine.
        conn = None if fresh else self._pooled(key)
        if conn is None:
            conn = await self._acquire(key, pooled=not fresh)
        conn.begin(method)
        try:
            head = _head(method, _host_header(host, port), target, headers, body, length)
            if isinstance(body, bytes) or body is None:
                conn.write(head + (body or b""))  # whole: one write, no coroutine
            else:
                await _send_streamed(conn, head, length is not None, body)
            await conn.head()  # interim 1xx answers skipped (_Connection.on_headers_complete)
        except BaseException:
            self._forget(conn)
            raise
        return Answer(conn, self)

    async def reachable(self, host: str, port: int) -> bool:
        """Whether the engine at ``host:port`` takes a connection now (made, within the
        cap, and closed at once). A SIGKILLed engine's connections end with a reset while
        its process dies (a retry's fresh one too, taken into its backlog), then its port
        refuses: only that says the instance itself is gone."""
        try:
            conn = await self._acquire((host, port), pooled=False)
        except Unreached:
            return False
        self._forget(conn)
        return True

    async def close(self) -> None:
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
        for pool in self._idle.values():
            for conn in pool:
                conn.close()
        self._idle.clear()

    # -- the pool --------------------------------------------------------------------

    async def _acquire(self, key: tuple[str, int], *, pooled: bool) -> _Connection:
        """A kept-alive connection to ``key`` (unless a new one is asked for), else a new
        one once there is room: under the cap, or by closing the oldest idle connection
        (to any engine); else wait until a connection is given back or closed."""
        while True:
            conn = self._pooled(key) if pooled else None
            if conn is not None:
                return conn
            if self._open < self._limit or self._close_oldest_idle():
                break
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # woken and cancelled at once: the wake goes on
                raise
        self._open += 1
        try:
            return await self._connect(key)
        except BaseException:
            self._open -= 1
            self._wake()
            raise

    def _pooled(self, key: tuple[str, int]) -> _Connection | None:
        pool = self._idle.get(key)
        while pool:
            conn = pool.pop()  # the most recent: the likeliest to be alive
            if conn.usable():
                return conn
            self._forget(conn)
        return None

    def _wake(self) -> None:
        """The first request still waiting for room looks again."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def _connect(self, key: tuple[str, int]) -> _Connection:
        host, port = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                infos = await _addresses(loop, host, port)
                family, type_, proto, _, address = infos[0]
                sock = self._socket_factory((family, type_, proto))
                try:
                    sock.setblocking(False)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    await loop.sock_connect(sock, address)
                except BaseException:
                    sock.close()
                    raise
        except TimeoutError as exc:
            raise Unreached(f"connect to {host}:{port} timed out") from exc
        except OSError as exc:
            raise Unreached(f"cannot connect to {host}:{port}: {exc.strerror or exc}") from exc
        _, conn = await loop.create_connection(lambda: _Connection(key), sock=sock)
        return conn

    def _give_back(self, conn: _Connection) -> None:
        """A connection whose answer was read to its end, kept alive for the next."""
        if self._closed or not conn.usable():
            self._forget(conn)
            return
        conn.idle_since = time.monotonic()
        pool = self._idle.get(conn.key)
        if pool is None:
            pool = self._idle[conn.key] = deque()
        pool.append(conn)
        self._arm_sweep()
        self._wake()  # a request waiting for room may take it, or close it for its own

    def _forget(self, conn: _Connection) -> None:
        conn.close()
        self._open -= 1
        self._wake()

    def _close_oldest_idle(self) -> bool:
        oldest: _Connection | None = None
        for pool in self._idle.values():
            if pool and (oldest is None or pool[0].idle_since < oldest.idle_since):
                oldest = pool[0]
        if oldest is None:
            return False
        self._idle[oldest.key].popleft()
        oldest.close()
        self._open -= 1
        return True

    def _arm_sweep(self) -> None:
        """A look at the pool when its oldest idle connection is due. It once looked every
        5 s from the first request on, for good: a gateway that had proxied one request
        woke every 5 s with nothing pooled (tests/gateway/test_upstream_client.py)."""
        if self._sweep is not None or self._closed:
            return
        oldest = min((pool[0].idle_since for pool in self._idle.values() if pool), default=None)
        if oldest is not None:
            due = oldest + IDLE_TIMEOUT - time.monotonic()
            self._sweep = asyncio.get_running_loop().call_later(max(due, 0.0), self._swept)

    def _swept(self) -> None:
        """Idle connections past ``IDLE_TIMEOUT`` or closed by their engine are closed;
        armed again for the next one due, if any is left."""
        self._sweep = None
        until = time.monotonic() - IDLE_TIMEOUT + DUE_SLACK  # idle since before: due
        for key, pool in list(self._idle.items()):
            kept = deque(c for c in pool if c.usable() and c.idle_since > until)
            for conn in pool:
                if conn not in kept:
                    self._forget(conn)
            if kept:
                self._idle[key] = kept
            else:
                del self._idle[key]
        self._arm_sweep()


class Answer:
    """An engine's answer: its head now, its body as the caller reads it. ``async with``
    gives the connection back once the body was read to its end, else closes it (a
    client gone mid-answer closes the engine's connection: the engine stops)."""

    def __init__(self, conn: _Connection, upstream: Upstream) -> None:
        self._conn = conn
        self._upstream = upstream
        self.status = conn.status
        self.reason = conn.reason
        self.fields = conn.fields  # the headers as the engine sent them, in order
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(conn.named)  # ... by name
        self._framing = conn.framing
        self._keep = conn.keep
        self._done = False

    @property
    def content_length(self) -> int | None:
        return self._framing.length

    async def read(self) -> bytes:
        """The whole body (most answers come whole with their head: no wait, no
        generator)."""
        conn = self._conn
        parts = []
        while True:
            while (piece := conn.take()) is not None:
                parts.append(piece)
            if not await conn.more():
                break
        self._done = True
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read_some(self, most: int) -> bytes:
        """Up to ``most`` bytes of the body from its beginning (the rest left unread)."""
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
            if len(out) >= most:
                break
        return bytes(out[:most])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes (a chunked one's chunks each on its own, a chunk past a
        read in pieces, never held whole: a size line that said a terabyte once held the
        gateway's memory until it ran out, 4 GB in 20 s)."""
        conn = self._conn
        while True:
            piece = conn.take()
            if piece is not None:
                yield piece
            elif not await conn.more():
                break
        self._done = True

    async def __aenter__(self) -> Answer:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if self._done and self._keep:
            self._upstream._give_back(conn)
        else:
            self._upstream._forget(conn)


async def get_text(upstream: Upstream, host: str, port: int, path: str) -> tuple[int, str] | None:
    """``GET path`` of an engine, off the requests' path (its ``/metrics``): the answer's
    status and, of a 200, its body as text (in the charset its ``Content-Type`` names,
    else UTF-8); None when no whole answer came, it is longer than ``TEXT_MAX``, or its
    text is not in that charset. No ``Accept-Encoding`` is sent, so the body comes as it
    is (aiohttp's client asked for gzip and, told not to decompress, read compressed
    bytes as text)."""
    try:
        async with await upstream.request("GET", host, port, path, [], None) as answer:
            if answer.status != 200:
                return answer.status, ""
            # Read whole, an endless page held what its 2 s timeout let in (500 MB on
            # loopback, every 5 s); past the bound the rest is left and the connection
            # closed.
            if (answer.content_length or 0) > TEXT_MAX:
                return None
            body = await answer.read_some(TEXT_MAX + 1)
            if len(body) > TEXT_MAX:
                return None
            charset = _charset(answer.headers.get("Content-Type", ""))
    except (Unreached, Dropped, Malformed, OSError):
        return None
    try:
        return 200, body.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return None


def _charset(content_type: str) -> str:
    for param in content_type.split(";")[1:]:
        key, _, value = param.partition("=")
        if key.strip().lower() == "charset" and value.strip(' "'):
            return value.strip(' "')
    return "utf-8"


class _Framing:
    """Where a body ends: its length, chunked encoding, or the connection's end."""

    def __init__(self, length: int | None, chunked: bool) -> None:
        self.length = length
        self.chunked = chunked


_UNREAD = _Framing(None, False)  # an answer's, until its head came


def _head(
    method: str,
    host: str,
    target: str,
    headers: list[tuple[str, str]],
    body: bytes | AsyncIterator[bytes] | None,
    length: int | None,
) -> bytes:
    if isinstance(body, bytes):
        framing = f"\r\nContent-Length: {len(body)}"
    elif body is None:
        framing = ""
    elif length is not None:
        framing = f"\r\nContent-Length: {length}"
    else:
        framing = "\r\nTransfer-Encoding: chunked"
    fields = "".join([f"\r\n{k}: {v}" for k, v in headers])
    return f"{method} {target} HTTP/1.1\r\nHost: {host}{fields}{framing}\r\n\r\n".encode("latin-1")


async def _send_streamed(
    conn: _Connection, head: bytes, sized: bool, body: AsyncIterator[bytes]
) -> None:
    """A body that comes as it is read (an upload): its chunks as they come, with its
    length when the client gave one (``sized``), else chunked."""
    conn.write(head)
    async for chunk in body:
        if chunk:
            conn.write(chunk if sized else b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await conn.drain()
    if not sized:
        conn.write(b"0\r\n\r\n")


def _lost(exc: BaseException, headed: bool) -> Dropped:
    """What a connection's failure (a reset, a timeout) means for its request. Not
    ConnectionError alone: a kept-alive connection to a host cut off ends with ETIMEDOUT
    (the keepalive probes of enginesock), a TimeoutError, which is no ConnectionError; it
    was a 500 until the partition test caught it."""
    if headed:
        return Dropped(f"the engine's connection ended mid-answer ({_said(exc)})")
    return Dropped(f"the engine's connection failed ({_said(exc)})")


def _framing(
    method: str, status: int, version: str, headers: CIMultiDict[str]
) -> tuple[_Framing, bool]:
    """How the body ends, and whether the connection may serve another request."""
    named = headers.get("Connection")  # most answers have none: no set to build
    tokens = {t.strip().lower() for t in named.split(",")} if named else set()
    keep = "keep-alive" in tokens if version == "HTTP/1.0" else "close" not in tokens
    if method == "HEAD" or status in NO_BODY:
        return _Framing(0, False), keep
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        return _Framing(None, True), keep
    length = headers.get("Content-Length")
    if length is not None:
        if not length.strip().isdigit():
            raise Malformed(f"a Content-Length that is no number: {length[:40]!r}")
        return _Framing(int(length), False), keep
    return _Framing(None, False), False  # to the connection's end: never reused


async def _addresses(
    loop: asyncio.AbstractEventLoop, host: str, port: int
) -> list[tuple[Any, ...]]:
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not found:
            raise OSError(f"{host} has no address") from None
        return list(found)
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]


def _host_header(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _mid_answer(framing: _Framing, received: int) -> Dropped:
    """The engine closed the connection inside a sized or chunked body."""
    short = "" if framing.length is None else f" ({framing.length - received}+ bytes short)"
    return Dropped(f"the engine closed the connection before its answer's end{short}")


def _while_sending(exc: BaseException) -> Dropped:
    return Dropped(f"the engine's connection ended while sending ({_said(exc)})")


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
