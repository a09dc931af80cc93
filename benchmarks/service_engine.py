"""A stand-in engine with a fixed service time: at most ``--concurrency`` requests are
served at once, each takes ``--service-ms``; the rest wait in its queue (as a batching
engine's scheduler would hold them).

    python benchmarks/service_engine.py --port 8000 --service-ms 20 --concurrency 4
    python benchmarks/service_engine.py --port 8000 --service-ms 0 --openai

``--openai``: every POST answers as an OpenAI chat completion does (id, choices, usage;
``"stream": true`` as server-sent events, chunked, three chunks then the usage and
``[DONE]``), still with keep-alive and no per-request thread: the lean stand-in engine
``benchmarks.gateway`` measures proxies against (the demo engine's thread per
connection and its GIL made the engine the bottleneck at 32 clients, not the proxy).

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
    """One request's head and body; None when the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip() or 0)
    return head + (await reader.readexactly(length) if length else b"")


CHAT = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "hot",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "a short answer from the stand-in"},
            "finish_reason": "stop",
        }
    ],
    "usage": {"prompt_tokens": 8, "completion_tokens": 6, "total_tokens": 14},
}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _openai_answers() -> tuple[bytes, bytes]:
    """(a chat completion, its streamed form): fixed bytes, made once."""
    body = json.dumps(CHAT).encode()
    whole = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    events = []
    for word in ("a ", "short ", "answer"):
        delta = {"choices": [{"index": 0, "delta": {"content": word}}], "object": "chunk"}
        events.append(b"data: " + json.dumps(delta).encode() + b"\n\n")
    events.append(
        b"data: " + json.dumps({"choices": [], "usage": CHAT["usage"]}).encode() + b"\n\n"
    )
    events.append(b"data: [DONE]\n\n")
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    stream = head + b"".join(_chunk(e) for e in events) + b"0\r\n\r\n"
    return whole, stream


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


def _serve_openai() -> Handler:
    whole, stream = _openai_answers()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _request(reader)) is not None:
                if request.startswith(b"GET /health"):
                    writer.write(HEALTH)
                else:
                    streamed = b'"stream": true' in request or b'"stream":true' in request
                    writer.write(stream if streamed else whole)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    return connection


async def main(port: int, service: float, concurrency: int, openai: bool = False) -> None:
    if openai:
        handler = _serve_openai()
    else:
        handler = _serve(service, asyncio.Semaphore(concurrency), _answer())
    server = await asyncio.start_server(handler, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--openai", action="store_true", help="answer as an OpenAI engine")
    args = parser.parse_args()
    asyncio.run(main(args.port, args.service_ms / 1000, args.concurrency, args.openai))
