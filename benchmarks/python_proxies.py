"""Two Python reverse proxies, baselines for ``benchmarks.gateway`` beside nginx.

    python benchmarks/python_proxies.py --kind bare|raw --port P --upstream U

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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

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


async def _serve_raw(port: int, upstream: int) -> None:
    server = await asyncio.start_server(raw_handler(upstream), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kind", choices=("bare", "raw"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    if args.kind == "raw":
        asyncio.run(_serve_raw(args.port, args.upstream))
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
