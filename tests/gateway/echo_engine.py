"""An engine that says what reached it (for the gateway's path and token tests).

    python echo_engine.py --port N --model NAME [--hold-while FILE] [--head-while FILE]
                          [--cut-on-term]

``GET /health`` answers 200. Any other request is read as a stream (never whole: a
50 MB upload costs this process little too) and answered with JSON naming the engine
(``engine``), the method, path and query, a few headers, the body's size and SHA-256,
and the body itself when it is small JSON. The OpenAI shapes a client library parses
are added where their paths ask: ``data`` for embeddings, ``text`` for transcriptions,
``choices`` and ``usage`` for completions (``"stream": true``: server-sent events, the
usage chunk last when ``stream_options.include_usage`` asks for it). While
``--hold-while FILE`` exists, a stream holds its end (its first chunks sent): a request
in flight for as long as a test wants: the drain tests release it (the file removed)
once their check is made, and last as long as their events, not a stream's margin.
While ``--head-while FILE`` exists, a request gets nothing at all, not even its answer's
head (a long prefill), while ``/health`` still answers; ``GET /looks`` says how many
``/health`` it answered. A SIGTERM lets the requests in flight end (aiohttp's run_app's
grace); with ``--cut-on-term`` it ends the process at once and cuts them, as the demo
engine does: a stream that ends whole proves its engine was not signalled before its end.
Each chunk names the process (``system_fingerprint``: ``pid-N``, as the demo engine's do).

On the demo engine's small HTTP/1.1 server (controller/demo/httpserver.py), one thread a
connection: on aiohttp each start cost ~0.3 s of CPU (its imports), this one ~0.07 s, and
the gateway tests start it ~30 times a run.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, cast
from urllib.parse import unquote

from controller.demo.httpserver import MAX_LINE, Handler, Server

SHOWN = (
    *("content-type", "content-length", "anthropic-version", "x-api-key", "authorization"),
    "traceparent",  # tests/gateway/test_traces.py: the trace reached the engine
)
PROMPT_TOKENS = 7  # what every answer's usage says (a test compares the gateway's counts)
COMPLETION_TOKENS = 5
CHUNKS = 3
SMALL = 65536  # a body up to this size is kept (and echoed when it is JSON)
POLL = 0.05  # how often a held request looks at its file
GRACE = 60.0  # seconds a SIGTERM waits for the requests in flight (aiohttp's run_app's)


def usage() -> dict[str, int]:
    total = PROMPT_TOKENS + COMPLETION_TOKENS
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": COMPLETION_TOKENS,
        "total_tokens": total,
    }


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


def wait_while(path: Path | None) -> None:
    while path is not None and path.exists():
        time.sleep(POLL)


class Echo(Handler):
    model = ""
    hold: Path | None = None
    head: Path | None = None
    looks: ClassVar[list[int]] = [0]  # one count for the process: every connection adds
    counting: ClassVar[threading.Lock] = threading.Lock()
    # as the demo engine's: an answer's head and body leave as one write (wfile buffered,
    # flushed after each request and each event); no Nagle wait for the small events
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def handle_one_request(self) -> None:
        # a keep-alive connection's wait for its next request is not a request in flight
        if not cast(io.BufferedReader, self.rfile).peek(1):
            self.close_connection = True  # the client closed it
            return
        with INFLIGHT:  # from its first byte to its answer's end: a SIGTERM lets it finish
            INFLIGHT.requests += 1
        try:
            super().handle_one_request()
        finally:
            with INFLIGHT:
                INFLIGHT.requests -= 1
                INFLIGHT.notify_all()

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        if path in ("/health", "/looks"):
            for _ in self.chunks():  # a body sent with it (tests' _chat sends one) is read,
                pass  # not left to be taken for the connection's next request
        if path == "/health":
            with self.counting:
                self.looks[0] += 1
            self.answer({"status": "ok"})
        elif path == "/looks":
            self.answer({"looks": self.looks[0]})
        else:
            self.echo()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("do_"):  # any other method: echoed too (aiohttp's "*" route)
            return self.echo
        raise AttributeError(name)

    def chunks(self) -> Iterator[bytes]:
        """The request's body as it arrives: Content-Length's bytes, or chunked's."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            yield from self.chunked()
            return
        left = int(self.headers.get("content-length") or 0)
        while left > 0:
            data = self.rfile.read1(min(left, SMALL))
            if not data:
                raise ConnectionResetError("the body ended early")
            left -= len(data)
            yield data

    def chunked(self) -> Iterator[bytes]:
        while size := int(self.rfile.readline(MAX_LINE).split(b";")[0].strip() or b"0", 16):
            left = size
            while left > 0:
                data = self.rfile.read1(min(left, SMALL))
                if not data:
                    raise ConnectionResetError("the body ended early")
                left -= len(data)
                yield data
            self.rfile.readline(MAX_LINE)  # the CRLF after a chunk
        while self.rfile.readline(MAX_LINE) not in (b"\r\n", b"\n", b""):
            pass  # trailers: read, not kept

    def echo(self) -> None:
        digest, size, small = hashlib.sha256(), 0, bytearray()
        try:
            for chunk in self.chunks():
                digest.update(chunk)
                size += len(chunk)
                small += chunk[: SMALL - len(small)]
        except ValueError:  # a chunk size that is not hex: the gateway's bug, said so
            self._refuse(400, "bad chunked body")
            return
        path, _, query = self.path.partition("?")
        said: dict[str, Any] = {
            "engine": self.model,
            "method": self.command,
            "path": unquote(path),
            "query": query,
            "headers": {k: self.headers[k] for k in SHOWN if k in self.headers},
            "bytes": size,
            "sha256": digest.hexdigest(),
            "body": _json(small) if size <= SMALL else None,
        }
        wait_while(self.head)  # a long prefill: not a byte, not a header
        if isinstance(said["body"], dict) and said["body"].get("stream"):
            self.stream(said, said["body"])
        else:
            self.answer({**said, **shape(said["path"], self.model)})

    def answer(self, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def stream(self, said: dict[str, Any], body: dict[str, Any]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        base = {"id": "cmpl-echo", "object": "chat.completion.chunk", "created": 0}
        base.update(model=self.model, system_fingerprint=f"pid-{os.getpid()}")
        for i in range(CHUNKS):
            delta = {"index": 0, "delta": {"content": f"c{i}"}, "finish_reason": None}
            chunk = {**base, "choices": [delta], **({"echo": said} if i == 0 else {})}
            self.event(json.dumps(chunk))
        wait_while(self.hold)
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            self.event(json.dumps({**base, "choices": [], "usage": usage()}))
        self.event("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def event(self, data: str) -> None:
        """One server-sent event, as one HTTP chunk."""
        line = f"data: {data}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        self.wfile.flush()

    def log_message(self, format: str, *args: object) -> None:
        pass  # no line per request (aiohttp's access_log=None)


def _json(small: bytearray) -> Any:
    try:
        return json.loads(small) if small else None
    except ValueError:
        return None


class Inflight(threading.Condition):
    """How many requests are being read or answered."""

    requests = 0


INFLIGHT = Inflight()


def drain() -> None:
    """As aiohttp's run_app on SIGTERM: no new connection, and the requests in flight
    answered (up to ``GRACE``); connections idle between requests close with the exit."""
    deadline = time.monotonic() + GRACE
    with INFLIGHT:
        while INFLIGHT.requests and time.monotonic() < deadline:
            INFLIGHT.wait(POLL)


class EchoServer(Server):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client (the gateway cutting a stream) that hung up mid-answer: not a traceback
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--hold-while", type=Path)
    parser.add_argument("--head-while", type=Path)
    parser.add_argument("--cut-on-term", action="store_true")
    args = parser.parse_args(argv)
    bound = {"model": args.model, "hold": args.hold_while, "head": args.head_while}
    server = EchoServer(("127.0.0.1", args.port), type("Bound", (Echo,), bound))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as aiohttp's run_app: exit 0
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        if not args.cut_on_term:
            drain()


if __name__ == "__main__":
    main()
