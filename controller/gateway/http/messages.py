"""A request as the gateway's server hands it to a handler, and the answers a handler
gives back (server.py reads the one and writes the others).

The shapes are the few the gateway uses of what aiohttp's ``web`` module offered (its
server was the gateway's until issue 41: ``status``, ``headers``, ``prepare``, ``write``,
``write_eof``, ``force_close``), so a handler reads as it did. A ``Response`` is written
whole, head and body in one send, once its handler returns; a ``StreamResponse`` is
begun by ``prepare`` and written as the handler goes (chunked unless it has a length).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qsl

from multidict import CIMultiDict, CIMultiDictProxy, MultiDict, MultiDictProxy

BODY_HIGH = 256 * 1024  # bytes of a body buffered before the connection stops reading
BODY_LOW = 64 * 1024  # ... and read down to this before it reads again
# Every status's standard reason phrase (a 302 said `Unknown`, a 409 too), RFC 9110's
# where Python's older name differs; an engine's own phrase is passed on as it sent it.
REASONS = {status.value: status.phrase for status in HTTPStatus} | {
    413: "Content Too Large",
    422: "Unprocessable Content",
}
BODILESS_STATUS = frozenset({204, 304})
Fields = Mapping[str, str] | Sequence[tuple[str, str]]  # an answer's headers, by name or in order


class BodyTooLarge(Exception):
    """A body read whole went past the limit it was read with."""


class Connection(Protocol):
    """What a request and its answer need of their connection (server.Protocol)."""

    def send(self, data: bytes) -> None: ...
    def must_drain(self) -> bool: ...
    async def drain(self) -> None: ...
    def reading(self, on: bool) -> None: ...
    def force_close(self) -> None: ...
    def continue_once(self) -> None: ...
    def keeps_alive(self, request: Request) -> bool: ...
    @property
    def cut(self) -> str | None: ...  # why the gateway cut the request (its drain ran out)


class Body:
    """A request's body as it arrives: the connection feeds it, the handler reads it.
    Past ``BODY_HIGH`` bytes unread the connection stops reading (a large upload is
    passed on at the engine's pace, never held whole)."""

    def __init__(self, connection: Connection, *, eof: bool = False) -> None:
        self._connection = connection
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = eof
        self._failed: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    # -- the connection's side
    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > BODY_HIGH and not self._paused:
            self._paused = True
            self._connection.reading(False)
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def fail(self, exc: BaseException) -> None:
        """The connection ended before the body did: a reader gets ``exc``."""
        if not self._eof:
            self._failed = exc
            self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- the handler's side
    def is_eof(self) -> bool:
        """Received whole: what is left of it is buffered here."""
        return self._eof

    async def readany(self) -> bytes:
        """The next bytes that came (b"" at the body's end)."""
        while not self._chunks:
            if self._eof:
                return b""
            if self._failed is not None:
                raise self._failed
            self._connection.continue_once()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = self._chunks.popleft()
        self._size -= len(data)
        if self._paused and self._size < BODY_LOW:
            self._paused = False
            self._connection.reading(True)
        return data

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self.readany():
            yield chunk

    def received(self, limit: int | None = None) -> bytes:
        """The rest of a body received whole (``is_eof``), at once; past ``limit`` bytes:
        BodyTooLarge. No coroutine: most bodies are here with their heads."""
        data = (
            b"".join(self._chunks)
            if len(self._chunks) > 1
            else (self._chunks[0] if self._chunks else b"")
        )
        self._chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            self._connection.reading(True)
        if limit is not None and len(data) > limit:
            raise BodyTooLarge(f"the body is larger than {limit} bytes")
        return data

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body, whole; past ``limit`` bytes: BodyTooLarge."""
        if self._eof:
            return self.received(limit)
        parts: list[bytes] = []
        size = 0
        while chunk := await self.readany():
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge(f"the body is larger than {limit} bytes")
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)


class Request:
    """One request: its head as parsed, its body as it comes (``content``)."""

    __slots__ = (
        "_query",
        "content",
        "content_length",
        "fields",
        "headers",
        "keep_alive",
        "match_info",
        "max_body",
        "method",
        "protocol",
        "raw_path",
        "remote",
        "version",
    )  # fmt: skip

    def __init__(
        self,
        method: str,
        raw_path: str,
        fields: list[tuple[str, str]],
        version: tuple[int, int],
        remote: str | None,
        content: Body,
        protocol: Connection,
        keep_alive: bool,
        max_body: int | None = None,
    ) -> None:
        self.method = method
        self.raw_path = raw_path  # the target as sent: the gateway normalises it itself
        self.fields = fields  # the headers as sent, in order (what is forwarded)
        self.headers = CIMultiDictProxy(CIMultiDict(fields))  # ... looked up by name
        length = self.headers.get("Content-Length")
        self.content_length = int(length) if length is not None and length.isdigit() else None
        self.version = version
        self.remote = remote
        self.content = content
        self.protocol = protocol
        self.keep_alive = keep_alive  # the client's own wish (its version, `Connection`)
        self.match_info: dict[str, str] = {}  # a route's named parts (router.py)
        self.max_body = max_body  # read() refuses past it (the gateway's --max-body)
        self._query: MultiDictProxy[str] | None = None

    @property
    def host(self) -> str:
        return self.headers.get("Host", "")

    @property
    def body_exists(self) -> bool:
        return bool(self.content_length) or "Transfer-Encoding" in self.headers

    @property
    def content_type(self) -> str:
        """The media type alone, lower case (``application/json``), "" if none."""
        return self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()

    @property
    def query(self) -> MultiDictProxy[str]:
        if self._query is None:
            _, _, query = self.raw_path.partition("?")
            self._query = MultiDictProxy(MultiDict(parse_qsl(query.partition("#")[0])))
        return self._query

    async def read(self) -> bytes:
        """The whole body (BodyTooLarge past ``max_body``)."""
        return await self.content.read(self.max_body)


class StreamResponse:
    """An answer written as it goes: ``prepare`` sends its head, ``write`` its body."""

    # Fields known only once the body is written (RFC 9110 §6.5), sent after a chunked
    # body's last chunk (a stream begun before who would serve it was known: waiting.py);
    # a class default, so the answers that have none pay no init for it.
    trailers: tuple[tuple[str, str], ...] = ()

    def __init__(
        self,
        *,
        status: int = 200,
        reason: str | None = None,
        headers: Fields | None = None,
    ) -> None:
        self.status = status
        self.reason = reason
        self.headers: CIMultiDict[str] = CIMultiDict(headers or {})
        self.content_length: int | None = None
        self.keep_alive = True  # False: the connection ends with this answer
        self._connection: Connection | None = None
        self._chunked = False
        self._head_only = False
        self._ended = False

    @property
    def prepared(self) -> bool:
        return self._connection is not None

    @property
    def ended(self) -> bool:
        """Written whole (``write_eof``, or a ``Response`` sent)."""
        return self._ended

    def force_close(self) -> None:
        self.keep_alive = False

    async def prepare(self, request: Request) -> None:
        """Send the head; the body follows with ``write``."""
        if self._connection is not None:
            return
        self._begin(request)
        if self.content_length is None and not self._head_only:
            self._chunked = request.version >= (1, 1)
            if not self._chunked:
                self.keep_alive = False  # HTTP/1.0: the body ends with the connection
        self._send(self.head(request))
        if request.protocol.must_drain():
            await request.protocol.drain()

    def _begin(self, request: Request) -> None:
        self._connection = request.protocol
        self._head_only = request.method == "HEAD" or self.status in BODILESS_STATUS

    def head(self, request: Request) -> bytes:
        """The status line and headers, as sent."""
        headers = self.headers
        if self.content_length is not None:
            headers["Content-Length"] = str(self.content_length)
        elif self._chunked:
            headers["Transfer-Encoding"] = "chunked"
        if self.keep_alive and not request.protocol.keeps_alive(request):
            self.keep_alive = False  # the client's wish, or a draining gateway's
        if not self.keep_alive:
            headers["Connection"] = "close"
        return _head(self.status, self.reason, headers.items(), "Date" in headers)

    async def write(self, data: bytes) -> None:
        if self._connection is None:
            raise RuntimeError("write before prepare")
        if not data or self._head_only:
            return
        self._send(b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data)
        if self._connection.must_drain():
            await self._connection.drain()

    async def write_eof(self, data: bytes = b"") -> None:
        if self._ended:
            return
        if data:
            await self.write(data)
        self._ended = True
        if self._chunked and not self._head_only:
            self._send(_last_chunk(self.trailers) if self.trailers else b"0\r\n\r\n")
            assert self._connection is not None
            if self._connection.must_drain():
                await self._connection.drain()

    def _send(self, data: bytes) -> None:
        assert self._connection is not None
        self._connection.send(data)


class Response(StreamResponse):
    """An answer whose body is known whole: written head and body in one send."""

    def __init__(
        self,
        *,
        status: int = 200,
        reason: str | None = None,
        body: bytes | None = None,
        text: str | None = None,
        headers: Fields | None = None,
        content_type: str | None = None,
    ) -> None:
        super().__init__(status=status, reason=reason, headers=headers)
        if text is not None:
            body = text.encode()
            content_type = content_type or "text/plain"
            content_type += "; charset=utf-8"
        self.body = body if body is not None else b""
        if content_type is not None:
            self.headers["Content-Type"] = content_type

    async def prepare(self, request: Request) -> None:
        """Head and body in one send: the answer is complete once its handler returns."""
        if self.prepared:
            return
        if self.status not in BODILESS_STATUS:
            self.content_length = len(self.body)
        self._begin(request)
        head = self.head(request)
        self._send(head if self._head_only else head + self.body)
        self._ended = True
        if request.protocol.must_drain():
            await request.protocol.drain()

    def head(self, request: Request) -> bytes:
        if self.body and "Content-Type" not in self.headers:
            # Only now: a handler may add its headers after the Response is made.
            self.headers["Content-Type"] = "application/octet-stream"
        return super().head(request)


class Passed(Response):
    """An answer passed on whole as it came (an engine's sized answer): its status,
    reason, fields in order (hop-by-hop ones already out: ``fields``) and body, head and
    body written in one send, as a ``Response`` writes them, the same fields in the same
    order. Its fields are not put in a header map (``headers`` stays empty; ``named`` is
    the engine's own, for the two lookups a head needs): a ``Response`` made of them,
    its map and its head cost four times this on every proxied answer (issue 41)."""

    def __init__(
        self,
        *,
        status: int,
        reason: str | None,
        fields: list[tuple[str, str]],
        named: Mapping[str, str],
        body: bytes,
    ) -> None:
        StreamResponse.__init__(self, status=status, reason=reason)
        self.fields = fields
        self.named = named
        self.body = body

    def head(self, request: Request) -> bytes:
        """The head ``Response.head`` writes for these fields: the engine's, then a type
        when it gave none, the length, and ``Connection: close`` when the connection ends."""
        fields = self.fields.copy()
        if self.body and "Content-Type" not in self.named:
            fields.append(("Content-Type", "application/octet-stream"))
        if self.content_length is not None:
            fields.append(("Content-Length", str(self.content_length)))
        if self.keep_alive and not request.protocol.keeps_alive(request):
            self.keep_alive = False
        if not self.keep_alive:
            fields.append(("Connection", "close"))
        return _head(self.status, self.reason, fields, "Date" in self.named)


def _head(status: int, reason: str | None, fields: Iterable[tuple[str, str]], dated: bool) -> bytes:
    """An answer's status line and header fields, as sent: a ``Date`` of the gateway's
    unless the fields have one (a singleton: an engine's, passed on, is the answer's)."""
    date = "" if dated else f"Date: {_date()}\r\n"
    lines = "".join([f"{name}: {value}\r\n" for name, value in fields])
    text = f"HTTP/1.1 {status} {reason or REASONS.get(status, 'Unknown')}\r\n{date}{lines}\r\n"
    return text.encode("latin-1", "replace")


def _last_chunk(trailers: Iterable[tuple[str, str]]) -> bytes:
    """A chunked body's last chunk with its trailer fields."""
    lines = "".join([f"{name}: {value}\r\n" for name, value in trailers])
    return f"0\r\n{lines}\r\n".encode("latin-1", "replace")


def json_response(
    data: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        status=status,
        body=json.dumps(data).encode(),
        headers=headers,
        content_type="application/json; charset=utf-8",
    )


_date_cache: tuple[int, str] = (0, "")


def _date() -> str:
    """The Date header's value, formatted once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]
