"""Python reverse proxies, baselines for ``benchmarks.gateway`` beside nginx.

    python benchmarks/python_proxies.py --kind KIND --port P --upstream U [--log-dir D]

``bare``: the gateway's framework alone. The same libraries and settings as the gateway's
data path (uvloop when installed, an ``aiohttp`` server with cancellation and no access
log, one keep-alive ``ClientSession`` to the engine, no decompression), forwarding every
request as it came and passing the answer back (a sized one whole, a stream chunk by
chunk), with no routing, keys, limits, metrics, logs or retries. Its distance from nginx
is what the framework costs; the gateway's distance from it is the gateway's own work.

``raw``: no HTTP framework, the floor for any Python data path. uvloop's streams, each
client connection paired with one kept-alive engine connection, requests passed on as
they came and answers relayed as they come, framed only as far as HTTP/1.1 needs to find
each message's end (``Content-Length`` or chunked). No routing, no header rewriting, no
error handling past closing both sides: what the interpreter and the loop alone cost.

``asgi``: a well-kept server that is not aiohttp's. uvicorn (its httptools parser, uvloop)
serving a minimal ASGI app that forwards each request on a kept-alive engine connection
from a pool (plain HTTP/1.1 on asyncio streams, as ``raw`` speaks it) and hands the answer
back through ASGI (a sized one whole, a stream chunk by chunk). What a gateway on that
server, with no work of its own, would cost.

``h1``: a server of one's own on a well-kept parser. An ``asyncio.Protocol`` feeding
httptools (the llhttp parser uvicorn and aiohttp use), each request taken whole (method,
target, headers, body, keep-alive) and forwarded like ``asgi``'s, the answer's head
parsed, rewritten (hop-by-hop fields out, ``x-reconcile-deployment`` in) and written with
the body (a stream's chunks relayed as they come). What a gateway that owns its
connections, with no work of its own, would cost: parsing and rewriting included, which
``raw`` skips.

``work``: ``h1`` doing the gateway's own work for a request, flat, with the gateway's own
pieces: the path checked, the key looked up, the body's JSON read for its model, the
least loaded instance of its pool chosen and counted, the key headers kept back, the
answer's usage read (``accounting/usage.py``), and after the answer: the in-flight
counts, the metrics (``GatewayMetrics``) and the request log's line (``RequestLog``, its
writer thread). None of the rest (limits, fallbacks, OnDemand, retries, passive health,
tracing): what a gateway built flat would cost at the least, so the distance between it
and the gateway is how the gateway's path is built, not what it does.

``served``: ``work``'s work, the same pieces, in one flat handler on the gateway's own
server and messages (``http/server.py``, ``http/messages.py``: its request and answer
objects) instead of h1's: its distance from ``work`` is what those cost, the gateway's
distance from it is the rest of the gateway's path (surface, forwarder, engine client).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

if TYPE_CHECKING:
    from controller.gateway.accounting.usage import Meter

# -- bare: aiohttp's server and client, nothing else -----------------------------------

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade", "host",
     "content-length"}
)  # fmt: skip


def _headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP)


def bare_app(upstream: str) -> web.Application:
    state: dict[str, aiohttp.ClientSession] = {}

    async def session(_: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        state["s"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def close(_: web.Application) -> None:
        await state["s"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with state["s"].request(
            request.method,
            upstream + request.rel_url.raw_path_qs,
            headers=_headers(request.headers),
            data=body or None,
            allow_redirects=False,
        ) as answer:
            if answer.content_length is not None:
                data = await answer.read()
                return web.Response(
                    status=answer.status, body=data, headers=_headers(answer.headers)
                )
            out = web.StreamResponse(status=answer.status, headers=_headers(answer.headers))
            await out.prepare(request)
            async for chunk in answer.content.iter_any():
                await out.write(chunk)
            await out.write_eof()
            return out

    made = web.Application()
    made.on_startup.append(session)
    made.on_cleanup.append(close)
    made.router.add_route("*", "/{tail:.*}", forward)
    return made


# -- raw: no framework -----------------------------------------------------------------

END = b"\r\n\r\n"
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _length(head: bytes) -> int | None:
    """The message's Content-Length, or None when it is chunked (or has none)."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


async def _relay_answer(up: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
    head = await up.readuntil(END)
    length = _length(head)
    if length is not None:
        out.write(head + await up.readexactly(length))
        return
    out.write(head)
    while True:  # chunked: each chunk as it comes, through the zero-length last one
        size_line = await up.readuntil(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        chunk = await up.readexactly(size + 2)
        out.write(size_line + chunk)
        if size == 0:
            return
        await out.drain()


def raw_handler(upstream: int) -> Handler:
    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        try:
            while True:
                head = await reader.readuntil(END)
                length = _length(head) or 0
                up_writer.write(head + (await reader.readexactly(length) if length else b""))
                await _relay_answer(up_reader, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    return client


# -- asgi: uvicorn's server, a pooled plain client -------------------------------------

ASGI = dict[str, Any]
Receive = Callable[[], Awaitable[ASGI]]
Send = Callable[[ASGI], Awaitable[None]]
HOP_BY_HOP_B = frozenset(name.encode() for name in HOP_BY_HOP)
ANSWER_DROPS = HOP_BY_HOP_B - {b"content-length"}  # a sized answer stays sized


class _Pool:
    """Kept-alive connections to one engine port: one taken per request, given back after."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await asyncio.open_connection("127.0.0.1", self.port)


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def _request_head(
    method: bytes, target: bytes, headers: Iterable[tuple[bytes, bytes]], length: int
) -> bytes:
    """A request's head for the engine: hop-by-hop fields out, the body's length in."""
    lines = [method + b" " + target + b" HTTP/1.1", b"host: engine"]
    lines += [k + b": " + v for k, v in headers if k not in HOP_BY_HOP_B]
    lines.append(b"content-length: %d" % length)
    return b"\r\n".join(lines) + END


async def _unchunked(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """A chunked body's chunks as they come, unframed (through the last one's CRLF)."""
    while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
        yield (await reader.readexactly(size + 2))[:-2]
    await reader.readexactly(2)


def asgi_app(upstream: int) -> Callable[[ASGI, Receive, Send], Awaitable[None]]:
    pool = _Pool(upstream)

    async def app(scope: ASGI, receive: Receive, send: Send) -> None:
        body = await _body(receive)
        reader, writer = await pool.take()
        query = scope["query_string"]
        target = scope["raw_path"] + (b"?" + query if query else b"")
        method = scope["method"].encode()
        writer.write(_request_head(method, target, scope["headers"], len(body)) + body)
        head = await reader.readuntil(END)
        status_line, *lines = head[: -len(END)].split(b"\r\n")
        pairs = [line.split(b":", 1) for line in lines]
        headers = [(k.strip().lower(), v.strip()) for k, v in pairs]
        await send({"type": "http.response.start", "status": int(status_line.split()[1]),
                    "headers": [(k, v) for k, v in headers if k not in ANSWER_DROPS]})  # fmt: skip
        length = _length(head)
        if length is not None:
            data = await reader.readexactly(length)
            await send({"type": "http.response.body", "body": data})
        else:  # chunked: each chunk on as it comes; uvicorn frames them again
            async for chunk in _unchunked(reader):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        pool.idle.append((reader, writer))

    return app


# -- h1: an asyncio.Protocol on httptools, the same pooled client ----------------------


class _H1(asyncio.Protocol):
    """One client connection: requests parsed by httptools, served in order."""

    def __init__(self, pool: _Pool) -> None:
        import httptools  # the bench extra's

        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.parse_error = httptools.HttpParserError
        self.transport: asyncio.Transport | None = None
        self.pending: list[tuple[bytes, bytes, list[tuple[bytes, bytes]], bytes, bool]] = []
        self.serving: asyncio.Task[None] | None = None  # held: a task no one holds is collected
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except self.parse_error:
            self._close()

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [], []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        keep = self.parser.should_keep_alive()
        self.pending.append((method, self.url, self.headers, b"".join(self.body), keep))
        if self.serving is None:
            self.serving = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        try:
            while self.pending:
                if not await self._one(*self.pending.pop(0)):
                    return self._close()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            self._close()
        finally:
            self.serving = None

    async def _one(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        keep: bool,
    ) -> bool:  # fmt: skip
        reader, writer = await self.pool.take()
        writer.write(_request_head(method, url, headers, len(body)) + body)
        await self._relay(reader, keep)
        self.pool.idle.append((reader, writer))
        return keep

    async def _relay(self, reader: asyncio.StreamReader, keep: bool) -> bytes:
        """The engine's answer to the client; a sized one's body is returned."""
        head = await reader.readuntil(END)
        status_line, *fields = head[: -len(END)].split(b"\r\n")
        out = [status_line, b"x-reconcile-deployment: hot"]
        for field in fields:
            name = field.split(b":", 1)[0].strip().lower()
            if name not in ANSWER_DROPS or name == b"transfer-encoding":
                out.append(field)
        if not keep:
            out.append(b"connection: close")
        length = _length(head)
        assert self.transport is not None
        if length is not None:
            data = await reader.readexactly(length)
            self.transport.write(b"\r\n".join(out) + END + data)
            return data
        self.transport.write(b"\r\n".join(out) + END)
        while True:  # chunked: relayed as it comes, framing and all
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            self.transport.write(size_line + await reader.readexactly(size + 2))
            if size == 0:
                return b""

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()


# -- work: h1 doing the gateway's own work for a request, flat ---------------------------

KEY_HEADERS = frozenset({b"authorization", b"x-api-key"})


class _Work(_H1):
    """``h1`` with the gateway's work for each request (the module's docstring)."""

    def __init__(self, pool: _Pool, pools: dict[str, list[int]], books: _Books) -> None:
        super().__init__(pool)
        self.pools = pools  # model -> its instances' engine ports
        self.books = books

    async def _one(
        self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]], body: bytes,
        keep: bool,
    ) -> bool:  # fmt: skip
        path = url.split(b"?", 1)[0].decode("latin-1")
        auth = next((v for k, v in headers if k == b"authorization"), b"")
        meter, key, model, port = self.books.begin(path, auth, body, self.pools, self.pool.port)
        sent = [(k, v) for k, v in headers if k not in KEY_HEADERS]
        reader, writer = await self.pool.take()
        writer.write(_request_head(method, url, sent, len(body)) + body)
        try:
            data = await self._relay(reader, keep)
        finally:
            self.books.inflight[port] -= 1
        self.pool.idle.append((reader, writer))
        meter.answered()
        self.books.done(key, model, meter, data)
        return keep


class _Books:
    """The counts, metrics and request log of ``work``, the gateway's own pieces."""

    def __init__(self, log_dir: Path, kind: str = "work") -> None:
        # Imported here: the other kinds run without the gateway's modules.
        from controller.gateway.accounting import requestlog, usage
        from controller.gateway.accounting.metrics import GatewayMetrics

        self.meter = usage.Meter
        self._usage = usage.from_json
        self._line = requestlog.line
        self.keys: dict[bytes | str, str] = {}
        self.inflight: dict[int, int] = {}
        self.metrics = GatewayMetrics()
        self.log = requestlog.RequestLog(log_dir / f"{kind}-requests.jsonl")
        self.log.start()

    def begin(
        self, path: str, auth: bytes | str, body: bytes, pools: dict[str, list[int]], port: int
    ) -> tuple[Meter, str, str, int]:
        """A request's work before its engine call: its meter, its key, its model (the
        body's JSON read), and the least loaded instance of its pool (``port`` when it has
        none), counted in flight."""
        meter = self.meter()
        key = self.keys.get(auth, "-")
        model = "-"
        if path.startswith("/v1/") and body:
            found = json.loads(body)
            model = found.get("model", "-") if isinstance(found, dict) else "-"
        pool = pools.get(model) or [port]
        chosen = min(pool, key=lambda p: self.inflight.get(p, 0))
        self.inflight[chosen] = self.inflight.get(chosen, 0) + 1
        meter.model = model
        return meter, key, model, chosen

    def done(self, key: str, model: str, meter: Meter, answer: bytes) -> None:
        """A request answered: its usage, its log line, its metrics."""
        self._usage(answer, meter)
        self.log.append(self._line(key, model, 200, meter))
        self.metrics.ended(model, key, 200, meter)


async def _serve_h1(port: int, upstream: int, log_dir: Path | None = None) -> None:
    """``h1``; ``work`` when given where its request log goes."""
    pool = _Pool(upstream)
    loop = asyncio.get_running_loop()
    books = _Books(log_dir) if log_dir is not None else None
    pools = {"hot": [upstream]}

    def protocol() -> _H1:
        return _Work(pool, pools, books) if books is not None else _H1(pool)

    server = await loop.create_server(protocol, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


# -- served: the work floor's work on the gateway's own server -------------------------


async def _serve_ours(port: int, upstream: int, log_dir: Path) -> None:
    """``served``: the work floor's work for each request in one flat handler on the
    gateway's own server and messages (``http/server.py``, ``http/messages.py``): the
    distance from ``work`` is what those cost; the gateway's from it, its surface's."""
    from controller.gateway.http.messages import Passed, Request, StreamResponse
    from controller.gateway.http.server import Connections, Server, connection_cap

    pool = _Pool(upstream)
    books = _Books(log_dir, "served")
    pools = {"hot": [upstream]}
    kept = KEY_HEADERS | HOP_BY_HOP_B

    async def handle(request: Request) -> StreamResponse:
        # As the gateway reads it: at once when it came whole (bodies.read, Body.received).
        body = request.content.received() if request.content.is_eof() else await request.read()
        path = request.raw_path.partition("?")[0]
        auth = request.headers.get("Authorization", "")
        meter, key, model, chosen = books.begin(path, auth, body, pools, upstream)
        fields = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in request.fields]
        sent = [(k, v) for k, v in fields if k.lower() not in kept]
        target = request.raw_path.encode("latin-1")
        reader, writer = await pool.take()
        writer.write(_request_head(request.method.encode(), target, sent, len(body)) + body)
        try:
            answer, data = await _answered(request, reader)
        finally:
            books.inflight[chosen] -= 1
        pool.idle.append((reader, writer))
        meter.answered()
        books.done(key, model, meter, data)
        return answer

    async def _answered(
        request: Request, reader: asyncio.StreamReader
    ) -> tuple[StreamResponse, bytes]:
        head = await reader.readuntil(END)
        status_line, *lines = head[: -len(END)].decode("latin-1").split("\r\n")
        parts = (line.partition(":") for line in lines)
        # Framing out (Passed writes a sized answer's length, StreamResponse chunks a stream).
        fields = [(k, v.strip()) for k, _, v in parts if k.lower().encode() not in HOP_BY_HOP_B]
        fields.append(("x-reconcile-deployment", "hot"))
        status = int(status_line.split()[1])
        length = _length(head)
        if length is not None:  # sent at once, as the gateway sends a sized answer
            body = await reader.readexactly(length)
            named = CIMultiDictProxy(CIMultiDict(fields))
            whole = Passed(status=status, reason=None, fields=fields, named=named, body=body)
            await whole.prepare(request)
            return whole, whole.body
        streamed = StreamResponse(status=status, headers=fields)
        await streamed.prepare(request)
        async for chunk in _unchunked(reader):
            await streamed.write(chunk)
        await streamed.write_eof()
        return streamed, b""

    server = Server(handle, Connections(connection_cap()), 1 << 20)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server.protocol, "127.0.0.1", port, backlog=1024)
    async with listener:
        await listener.serve_forever()


async def _serve_raw(port: int, upstream: int) -> None:
    server = await asyncio.start_server(raw_handler(upstream), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    kinds = ("bare", "raw", "asgi", "h1", "work", "served")
    parser.add_argument("--kind", choices=kinds, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    parser.add_argument("--log-dir", type=Path, help="work, served: their request log's folder")
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.kind == "raw":
        asyncio.run(_serve_raw(args.port, args.upstream))
        return
    log_dir = args.log_dir or Path(tempfile.gettempdir())
    if args.kind == "served":
        asyncio.run(_serve_ours(args.port, args.upstream, log_dir))
        return
    if args.kind in ("h1", "work"):
        asyncio.run(_serve_h1(args.port, args.upstream, log_dir if args.kind == "work" else None))
        return
    if args.kind == "asgi":
        import uvicorn  # the bench extra's

        uvicorn.run(
            asgi_app(args.upstream),
            host="127.0.0.1",
            port=args.port,
            loop="uvloop",
            http="httptools",
            lifespan="off",
            access_log=False,
            log_level="warning",
        )
        return
    web.run_app(
        bare_app(f"http://127.0.0.1:{args.upstream}"),
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        handler_cancellation=True,
        print=None,
    )


if __name__ == "__main__":
    main()
