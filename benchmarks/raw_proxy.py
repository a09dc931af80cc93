"""A Python reverse proxy with no HTTP framework: the floor for any Python data path.

    python benchmarks/raw_proxy.py --port P --upstream U

A baseline for ``benchmarks.gateway``, next to ``bare_proxy.py`` (aiohttp): uvloop's
streams, each client connection paired with one kept-alive engine connection, requests
passed on as they came and answers relayed as they come, framed only as far as HTTP/1.1
needs to find each message's end (``Content-Length`` or chunked). No routing, no header
rewriting, no error handling past closing both sides: what the interpreter and the loop
alone cost per request. A gateway written this way would still have all of its own work
to add on top.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable

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


def serve(upstream: int) -> Handler:
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


async def main(port: int, upstream: int) -> None:
    server = await asyncio.start_server(serve(upstream), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", type=int, required=True)
    args = parser.parse_args()
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(main(args.port, args.upstream))
