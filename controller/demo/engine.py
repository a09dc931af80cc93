"""A stand-in inference engine for demos and tests: /health, /v1/models, /v1/completions.

    python -m controller.demo.engine --port 8000 [--host 127.0.0.1] [--load-seconds 1]

It "loads" for ``--load-seconds`` (``/health`` answers 503 meanwhile, like
llama.cpp), then serves. SIGTERM ends it cleanly.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--model", default="demo")
    parser.add_argument("--load-seconds", type=float, default=0.0)
    args = parser.parse_args(argv)
    ready_at = time.monotonic() + args.load_seconds

    class Handler(BaseHTTPRequestHandler):
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
            self.rfile.read(length)
            self._send(200, {"choices": [{"text": f"hello from {args.model}"}]})

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
