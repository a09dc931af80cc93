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
import contextlib
import ipaddress
import re
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

HEAD_MAX = 64 * 1024  # bytes of an answer's status line and headers
IDLE_TIMEOUT = 15.0  # seconds an unused connection stays pooled (aiohttp's default)
# A timer may end a little early (uvloop rounds its delay to a millisecond of a cached
# clock): a connection this close to its end goes with the look, not on a second wake.
DUE_SLACK = 0.05  # seconds
READ_SIZE = 64 * 1024  # bytes asked of the socket at once for a body of unknown end
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


class _Connection:
    __slots__ = ("idle_since", "key", "reader", "writer")

    def __init__(
        self, key: tuple[str, int], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.key = key
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        """Still open at both ends: an engine that closed it while idle left an EOF."""
        return not self.reader.at_eof() and not self.writer.is_closing()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
            # asyncio keeps how the connection ended in a future of its own; one that
            # holds an error (a reset) and is collected in a cycle before its protocol is
            # logged "Future exception was never retrieved". Waiting for the close reads it.
            asyncio.ensure_future(self.writer.wait_closed()).add_done_callback(_read_out)


def _read_out(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()


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
        try:
            head = _head(method, _host_header(host, port), target, headers, body, length)
            if isinstance(body, bytes) or body is None:
                _write(conn, head + (body or b""))  # whole: one write, no coroutine
            else:
                await _send_streamed(conn, head, length is not None, body)
            # The answer's head, interim 1xx answers skipped: a few (Go's client takes 5),
            # since an engine that sent them for ever held its client for good, and the
            # gateway's CPU with it.
            for _ in range(INTERIM_MAX + 1):
                try:
                    status, reason, version, fields = _parse_head(
                        await conn.reader.readuntil(b"\r\n\r\n")
                    )
                except (asyncio.IncompleteReadError, OSError, asyncio.LimitOverrunError) as exc:
                    raise _unanswered(exc) from exc
                if not 100 <= status < 200:
                    break
            else:
                raise Malformed(f"more than {INTERIM_MAX} interim (1xx) answers")
            named = CIMultiDict(fields)
            framing, keep = _framing(method, status, version, named)
        except BaseException:
            self._forget(conn)
            raise
        return Answer(conn, self, status, reason, fields, named, framing, keep)

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
        reader, writer = await asyncio.open_connection(sock=sock, limit=HEAD_MAX)
        return _Connection(key, reader, writer)

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

    def __init__(
        self,
        conn: _Connection,
        upstream: Upstream,
        status: int,
        reason: str,
        fields: list[tuple[str, str]],
        headers: CIMultiDict[str],
        framing: _Framing,
        keep: bool,
    ) -> None:
        self._conn = conn
        self._upstream = upstream
        self.status = status
        self.reason = reason
        self.fields = fields  # the headers as the engine sent them, in order
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(headers)  # ... by name
        self._framing = framing
        self._keep = keep
        self._done = False

    @property
    def content_length(self) -> int | None:
        return self._framing.length

    async def read(self) -> bytes:
        """The whole body."""
        length = self._framing.length
        if length is None or self._framing.chunked:
            return b"".join([chunk async for chunk in self.chunks()])
        # A sized body in one read: no generator per chunk (most answers are this).
        try:
            data = await self._conn.reader.readexactly(length)
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise _mid_answer(exc) from exc
        self._done = True
        return data

    async def read_some(self, most: int) -> bytes:
        """Up to ``most`` bytes of the body from its beginning (the rest left unread)."""
        out = bytearray()
        async for chunk in self.chunks():
            out += chunk
            if len(out) >= most:
                break
        return bytes(out[:most])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it comes, framed by its chunks, its length or the connection's end:
        read here, one generator (a generator per framing under it cost each chunk of a
        stream a level of its own)."""
        reader = self._conn.reader
        length = self._framing.length
        try:
            if self._framing.chunked:
                while size := int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16):
                    # A chunk is passed on in pieces: read whole, one whose size line said
                    # a terabyte held the gateway's memory until it ran out (4 GB in 20 s)
                    while size > READ_SIZE:
                        yield await reader.readexactly(READ_SIZE)
                        size -= READ_SIZE
                    data = await reader.readexactly(size + 2)
                    if data[-2:] != b"\r\n":
                        raise ValueError("a chunk does not end where its size says")
                    yield data[:-2]
                # Trailers: none of the gateway's business, but bounded as a head is: an
                # engine that sent them for ever held its client for good, and a core.
                trailers = 0
                while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                    trailers += len(line)
                    if trailers > HEAD_MAX:
                        raise ValueError(f"trailers over {HEAD_MAX} bytes")
            elif length is not None:
                while length:
                    chunk = await reader.read(min(length, READ_SIZE))
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"", length)
                    length -= len(chunk)
                    yield chunk
            else:
                while chunk := await reader.read(READ_SIZE):
                    yield chunk
        except (OSError, asyncio.IncompleteReadError) as exc:  # OSError: _unanswered says why
            raise _mid_answer(exc) from exc
        except (ValueError, asyncio.LimitOverrunError) as exc:
            raise Malformed(f"a malformed chunk ({_said(exc)})") from exc
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


def _write(conn: _Connection, data: bytes) -> None:
    try:
        conn.writer.write(data)
    except OSError as exc:  # _unanswered says why not ConnectionError alone
        raise _while_sending(exc) from exc


async def _send_streamed(
    conn: _Connection, head: bytes, sized: bool, body: AsyncIterator[bytes]
) -> None:
    """A body that comes as it is read (an upload): its chunks as they come, with its
    length when the client gave one (``sized``), else chunked."""
    writer = conn.writer
    try:
        writer.write(head)
        async for chunk in body:
            if chunk:
                writer.write(chunk if sized else b"%x\r\n%b\r\n" % (len(chunk), chunk))
                await writer.drain()
        if not sized:
            writer.write(b"0\r\n\r\n")
    except OSError as exc:  # _unanswered says why not ConnectionError alone
        raise _while_sending(exc) from exc


def _unanswered(exc: BaseException) -> Dropped | Malformed:
    """What a failed read of an answer's head means for the request."""
    if isinstance(exc, asyncio.IncompleteReadError):
        return Dropped(
            "the engine closed the connection before its answer"
            if not exc.partial
            else "the engine's connection ended inside its answer's head"
        )
    if isinstance(exc, asyncio.LimitOverrunError):
        return Malformed(f"an answer head over {HEAD_MAX} bytes")
    # Not ConnectionError alone: a kept-alive connection to a host cut off ends with
    # ETIMEDOUT (the keepalive probes of enginesock), a TimeoutError, which is no
    # ConnectionError; it was a 500 until the partition test caught it.
    return Dropped(f"the engine's connection failed ({_said(exc)})")


# A status line, then header lines (a name without spaces, a colon, the value with the
# whitespace around it left out): each line whole, from one CRLF to the next.
_STATUS = re.compile(r"(HTTP/1\.[0-9]) ([0-9]{3})(?: ([^\r\n]*))?\r\n")
_FIELD = re.compile(r"([^\s:]+):[ \t]*([^\r\n]*?)[ \t]*\r\n")


def _parse_head(head: bytes) -> tuple[int, str, str, list[tuple[str, str]]]:
    """The status, reason, version and header fields of an answer's head (which ends
    with its blank line), each field as ``_FIELD`` reads one. Split and partitioned,
    not matched line by line (or all at once: a third of the CPU), with the same
    checks: every line ends CRLF, every name is there and holds no space."""
    text = head.decode("latin-1")
    status = _STATUS.match(text)
    if status is None:
        line = text.partition("\r\n")[0]
        raise Malformed(f"not an HTTP/1.x status line: {line[:80]!r}")
    version, code, reason = status.groups("")
    lines = text[status.end() : -4].split("\r\n") if len(text) > status.end() + 2 else []
    fields = []
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or name.split() != [name]:  # none, or a space in it (or around)
            break
        fields.append((name, value.strip(" \t")))
    # A lone CR or LF (inside a line, as no split finds it) is as malformed.
    bare = text.count("\r") + text.count("\n") != 2 * text.count("\r\n")
    if len(fields) != len(lines) or bare:
        bad = next((line for line in lines if not _FIELD.fullmatch(line + "\r\n")), "")
        raise Malformed(f"a malformed header line: {bad[:80]!r}")
    return int(code), reason, version, fields


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


def _mid_answer(exc: BaseException) -> Dropped:
    if isinstance(exc, asyncio.IncompleteReadError):  # its own words: "... undefined ..."
        short = "" if exc.expected is None else f" ({exc.expected - len(exc.partial)}+ bytes short)"
        return Dropped(f"the engine closed the connection before its answer's end{short}")
    return Dropped(f"the engine's connection ended mid-answer ({_said(exc)})")


def _while_sending(exc: BaseException) -> Dropped:
    return Dropped(f"the engine's connection ended while sending ({_said(exc)})")


def _said(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
