"""An engine that misbehaves one way at a time (for the gateway's chaos tests).

    python chaos_engine.py --port N --mode MODE [--metrics MODE] [--sick INSTANCE]

``GET /health`` answers 200. With ``--sick INSTANCE``, only the replica whose
``RECONCILE_INSTANCE`` names that instance misbehaves; the others answer every POST
with a whole JSON body naming their instance (``ok``). A POST's misbehaviour
(``--mode``): ``bigchunk`` sends a head, then one chunk whose size line says a
terabyte, and its bytes for ever; ``interim`` interim answers (``100 Continue``) for
ever; ``trailers`` a body, then trailer fields for ever; ``crlf`` a stream of events
that end CRLF CRLF (waiting for ``--go FILE`` midway); ``bighead`` a head of 100 KB;
``garbage`` bytes that are not HTTP, then closes.
``GET /metrics`` (``--metrics``): ``huge`` sends a page with no end (chunked), ``vast``
one whose Content-Length says a terabyte; else a page of vLLM's queue. Each request is one stdout
line (``POST /v1/x``), and each endless answer's end (``closed after N bytes``): a test
counts what reached it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path

MODES = ("ok", "bigchunk", "bighead", "garbage", "interim", "crlf", "trailers")
METRICS = ("ok", "huge", "vast")
BLOB = b"x" * 65536
PAGE = b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--metrics", choices=METRICS, default="ok")
    parser.add_argument("--sick", help="the one instance that misbehaves (default: every one)")
    parser.add_argument("--go", type=Path, help="crlf: the file whose creation ends the stream")
    args = parser.parse_args()
    instance = os.environ.get("RECONCILE_INSTANCE", "//").split("/")[1]
    sick = args.sick is None or args.sick == instance
    mode = args.mode if sick else "ok"
    metrics = args.metrics if sick else "ok"
    asyncio.run(serve(args.port, mode, metrics, instance, args.go))


async def serve(port: int, mode: str, metrics: str, instance: str, go: Path | None) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await read_request(reader):
                print(line, flush=True)
                if not await answer(writer, line, mode, metrics, instance, go):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


async def read_request(reader: asyncio.StreamReader) -> str | None:
    """A whole request (head and sized body) read; its request line, None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for field in head.split(b"\r\n")[1:]:
        name, _, value = field.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    await reader.readexactly(length)
    method, path = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")[:2]
    return f"{method} {path}"


async def answer(
    writer: asyncio.StreamWriter,
    line: str,
    mode: str,
    metrics: str,
    instance: str,
    go: Path | None = None,
) -> bool:
    """Answer one request; False: the connection ends."""
    if line.startswith("GET /health"):
        writer.write(whole(b'{"status": "ok"}'))
    elif line.startswith("GET /metrics"):
        await metrics_page(writer, metrics)
    elif mode == "bigchunk":
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffff\r\n")
        await endless(writer, b"")
    elif mode == "bighead":
        writer.write(b"HTTP/1.1 200 OK\r\nX-Big: " + b"y" * 100_000 + b"\r\n" + whole(b"{}")[17:])
    elif mode == "interim":
        while True:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" * 64)
            await writer.drain()
    elif mode == "trailers":
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n")
        while True:
            writer.write(b"X-Trailer: y\r\n" * 4096)
            await writer.drain()
    elif mode == "crlf":
        await crlf_stream(writer, go)
    elif mode == "garbage":
        writer.write(b"\x00\x01 this is no HTTP at all \xff\r\n\r\n")
        await writer.drain()
        return False
    else:
        body = json.dumps({"object": "ok", "system_fingerprint": instance}).encode()
        writer.write(whole(body))
    await writer.drain()
    return True


async def crlf_stream(writer: asyncio.StreamWriter, go: Path | None) -> None:
    """A chat stream whose events end CRLF CRLF (sse-starlette's way): one, then, once
    ``go`` exists, another, the usage chunk and ``[DONE]``."""
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    event(writer, {"choices": [{"index": 0, "delta": {"content": "one"}}]})
    await writer.drain()
    while go is not None and not go.exists():
        await asyncio.sleep(0.05)
    event(writer, {"choices": [{"index": 0, "delta": {"content": "two"}}]})
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    event(writer, {"choices": [], "usage": usage})
    data = b"data: [DONE]\r\n\r\n"
    writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data))


def event(writer: asyncio.StreamWriter, chunk: dict[str, object]) -> None:
    fields = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "c"}
    data = b"data: %s\r\n\r\n" % json.dumps({**fields, **chunk}).encode()
    writer.write(b"%x\r\n%s\r\n" % (len(data), data))


async def metrics_page(writer: asyncio.StreamWriter, metrics: str) -> None:
    if metrics == "huge":
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        await endless(writer, b"%x\r\n" % len(BLOB), b"\r\n")
    elif metrics == "vast":
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1099511627776\r\n\r\n")
        await endless(writer, b"")
    else:
        writer.write(whole(PAGE, b"text/plain"))


async def endless(writer: asyncio.StreamWriter, before: bytes, after: bytes = b"") -> None:
    """The same bytes for ever, as fast as the reader takes them: its close ends it, and
    a line says so (``closed after N bytes``)."""
    sent = 0
    try:
        while True:
            writer.write(before + BLOB + after)
            await writer.drain()
            sent += len(BLOB)
    except ConnectionError:
        print(f"closed after {sent} bytes", flush=True)
        raise


def whole(body: bytes, kind: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        kind,
        len(body),
        body,
    )


if __name__ == "__main__":
    main()
