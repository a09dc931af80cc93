"""A stand-in inference engine for demos and tests: /health, /v1/models and the OpenAI
``/v1/completions`` and ``/v1/chat/completions`` (``"stream": true`` too).

    python -m controller.demo.engine --port 8000 [--host 127.0.0.1] [--load-seconds 1]
        [--chunks 3] [--chunk-delay 0.05]

It "loads" for ``--load-seconds`` (``/health`` answers 503 meanwhile, like
llama.cpp), then serves. A streamed answer sends ``--chunks`` server-sent events
``--chunk-delay`` seconds apart. Every answer says which engine process made it
(``system_fingerprint``: its pid) so tests can tell instances apart. SIGTERM ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--model", default="demo")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--chunks", type=int, default=3)
    parser.add_argument("--chunk-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    ready_at = time.monotonic() + args.load_seconds
    me = f"pid-{os.getpid()}"

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: the gateway reuses connections
        # Headers and body go out as two writes: without TCP_NODELAY the second waits for
        # the client's delayed ACK (~40 ms a request), which no real engine server pays.
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            if time.monotonic() < ready_at:
                self._send(503, {"status": "loading model"})
            elif self.path == "/health":
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": args.model}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            try:
                request = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                request = {}
            request = request if isinstance(request, dict) else {}
            chat = self.path.startswith("/v1/chat/completions")
            if request.get("stream"):
                self._stream(chat)
                return
            text = f"hello from {args.model}"
            choice: dict[str, Any] = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            choice["finish_reason"] = "stop"
            self._send(200, self._answer(chat, [choice]))

        def _answer(self, chat: bool, choices: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "id": f"cmpl-{me}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": args.model,
                "system_fingerprint": me,
                "choices": choices,
            }

        def _stream(self, chat: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            for i in range(args.chunks):
                piece = f"chunk {i} "
                delta = {"delta": {"content": piece}} if chat else {"text": piece}
                body = self._answer(chat, [{"index": 0, **delta, "finish_reason": None}])
                body["object"] = "chat.completion.chunk" if chat else "text_completion"
                self.wfile.write(f"data: {json.dumps(body)}\n\n".encode())
                self.wfile.flush()
                if args.chunk_delay:
                    time.sleep(args.chunk_delay)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _send(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *fmt_args: object) -> None:
            sys.stdout.write(f"{self.address_string()} {format % fmt_args}\n")
            sys.stdout.flush()

    ThreadingHTTPServer.daemon_threads = True
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"demo engine {args.model} on {args.host}:{args.port} (pid {os.getpid()})", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
