"""A single-threaded engine: it answers nothing else, not even ``GET /health``, while it
computes a request (a ``command`` engine on Python's ``http.server`` without threads).

    python serial_engine.py --port N --name NAME

``POST`` reads a JSON body, computes for its ``seconds`` (default 0), and answers JSON
naming the engine (``engine``) and how many POSTs it has received (``posts``, this one
included). ``GET /health`` answers 200; ``GET /posts`` says how many POSTs it received.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


class Serial(HTTPServer):
    name = ""
    posts = 0

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that left before its answer (a look that timed out): nothing to say."""


class Handler(BaseHTTPRequestHandler):
    server: Serial

    def do_GET(self) -> None:
        if self.path == "/posts":
            self._send({"posts": self.server.posts})
        else:
            self._send({"status": "ok"})

    def do_POST(self) -> None:
        self.server.posts += 1
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = {}
        seconds = body.get("seconds", 0) if isinstance(body, dict) else 0
        time.sleep(float(seconds))  # the computation: this server does nothing else meanwhile
        self._send({"engine": self.server.name, "posts": self.server.posts})

    def _send(self, said: dict[str, Any]) -> None:
        data = json.dumps(said).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    args = parser.parse_args()
    server = Serial(("127.0.0.1", args.port), Handler)
    server.name = args.name
    server.serve_forever()


if __name__ == "__main__":
    main()
