"""A stand-in engine with a fixed service time: at most ``--concurrency`` requests are
served at once, each takes ``--service-ms``; the rest wait in its queue (as a batching
engine's scheduler would hold them).

    python benchmarks/service_engine.py --port 8000 --service-ms 20 --concurrency 4

Raw asyncio HTTP/1.1 with keep-alive, so the engine itself costs little CPU next to the
gateway it is measured through. ``GET /health`` is 200; any other request answers
``{"engine": "<pid>"}`` once served (the benchmark counts who served what).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from collections.abc import Awaitable, Callable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]

HEALTH = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"


def _answer() -> bytes:
    body = json.dumps({"engine": str(os.getpid())}).encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode() + b"\r\n" + body


async def _request(reader: asyncio.StreamReader) -> bytes | None:
    """One request's head (its body read and dropped); None when the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    if length:
        await reader.readexactly(length)
    return head


def _serve(service: float, slots: asyncio.Semaphore, answer: bytes) -> Handler:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (head := await _request(reader)) is not None:
                if head.startswith(b"GET /health"):
                    writer.write(HEALTH)
                else:
                    async with slots:
                        await asyncio.sleep(service)
                    writer.write(answer)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return connection


async def main(port: int, service: float, concurrency: int) -> None:
    handler = _serve(service, asyncio.Semaphore(concurrency), _answer())
    server = await asyncio.start_server(handler, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.port, args.service_ms / 1000, args.concurrency))
