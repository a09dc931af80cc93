"""An engine that says what reached it (for the gateway's path and token tests).

    python echo_engine.py --port N --model NAME [--hold-while FILE] [--head-while FILE]

``GET /health`` answers 200. Any other request is read as a stream (never whole: a
50 MB upload costs this process little too) and answered with JSON naming the engine
(``engine``), the method, path and query, a few headers, the body's size and SHA-256,
and the body itself when it is small JSON. The OpenAI shapes a client library parses
are added where their paths ask: ``data`` for embeddings, ``text`` for transcriptions,
``choices`` and ``usage`` for completions (``"stream": true``: server-sent events, the
usage chunk last when ``stream_options.include_usage`` asks for it). While
``--hold-while FILE`` exists, a stream holds its end (its first chunks sent): a request
in flight for as long as a test wants. While ``--head-while FILE`` exists, a request
gets nothing at all, not even its answer's head (a long prefill), while ``/health`` still
answers; ``GET /looks`` says how many ``/health`` it answered.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

from aiohttp import web

SHOWN = ("content-type", "content-length", "anthropic-version", "x-api-key", "authorization")
SHOWN += ("traceparent",)  # test_traces.py: the trace context reached the engine
SHOWN += ("traceparent",)  # tests/gateway/test_traces.py: the trace reached the engine
PROMPT_TOKENS = 7  # what every answer's usage says (a test compares the gateway's counts)
COMPLETION_TOKENS = 5
CHUNKS = 3


def usage() -> dict[str, int]:
    total = PROMPT_TOKENS + COMPLETION_TOKENS
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": total,
    }


async def echo(request: web.Request) -> web.StreamResponse:
    model: str = request.app["model"]
    digest = hashlib.sha256()
    size = 0
    small = bytearray()
    async for chunk in request.content.iter_any():
        digest.update(chunk)
        size += len(chunk)
        if len(small) < 65536:
            small += chunk[: 65536 - len(small)]
    body: Any = None
    try:
        body = json.loads(small) if size <= 65536 and small else None
    except ValueError:
        body = None
    said: dict[str, Any] = {
        "engine": model,
        "method": request.method,
        "path": request.path,
        "query": request.query_string,
        "headers": {k: request.headers[k] for k in SHOWN if k in request.headers},
        "bytes": size,
        "sha256": digest.hexdigest(),
        "body": body,
    }
    head: Path | None = request.app["head"]
    while head is not None and head.exists():  # a long prefill: not a byte, not a header
        await asyncio.sleep(0.05)
    if isinstance(body, dict) and body.get("stream"):
        return await stream(request, said, body)
    return web.json_response({**said, **shape(request.path, model)})


def shape(path: str, model: str) -> dict[str, Any]:
    if path.endswith("/embeddings"):
        item = {"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}
        return {"object": "list", "data": [item], "model": model, "usage": usage()}
    if "/audio/" in path and not path.endswith("/speech"):
        return {"text": f"heard by {model}"}
    if path.endswith("/completions"):
        choice = {"index": 0, "message": {"role": "assistant", "content": "hi"}}
        return {
            "id": "cmpl-echo",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{**choice, "finish_reason": "stop"}],
            "usage": usage(),
        }
    return {}


async def stream(
    request: web.Request, said: dict[str, Any], body: dict[str, Any]
) -> web.StreamResponse:
    answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await answer.prepare(request)
    base = {
        "id": "cmpl-echo",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": said["engine"],
    }
    for i in range(CHUNKS):
        delta = {"index": 0, "delta": {"content": f"c{i}"}, "finish_reason": None}
        chunk = {**base, "choices": [delta], **({"echo": said} if i == 0 else {})}
        await answer.write(f"data: {json.dumps(chunk)}\n\n".encode())
    hold: Path | None = request.app["hold"]
    while hold is not None and hold.exists():
        await asyncio.sleep(0.05)
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        last = {**base, "choices": [], "usage": usage()}
        await answer.write(f"data: {json.dumps(last)}\n\n".encode())
    await answer.write(b"data: [DONE]\n\n")
    await answer.write_eof()
    return answer


async def health(request: web.Request) -> web.Response:
    request.app["looks"] += 1
    return web.json_response({"status": "ok"})


async def looks(request: web.Request) -> web.Response:
    """How many GET /health it answered (the gateway's looks at it included)."""
    return web.json_response({"looks": request.app["looks"]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hold-while", type=Path)
    parser.add_argument("--head-while", type=Path)
    args = parser.parse_args()
    app = web.Application(client_max_size=1 << 30)
    app["model"] = args.model
    app["hold"] = args.hold_while
    app["head"] = args.head_while
    app["looks"] = 0
    app.router.add_get("/health", health)
    app.router.add_get("/looks", looks)
    app.router.add_route("*", "/{tail:.*}", echo)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    asyncio.set_event_loop(asyncio.new_event_loop())
    main()
