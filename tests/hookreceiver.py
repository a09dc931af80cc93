"""A local notification hook for the tests: a real HTTP server on a port of the test's."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """A local hook: answers 500 to the first ``fail_first`` POSTs, then 200."""

    def __init__(self, port: int, fail_first: int = 0) -> None:
        self.port = port
        self.fail_first = fail_first
        self.tries: list[dict[str, Any]] = []  # every POST, failed or not
        self.accepted: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.lock = threading.Lock()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.tries.append(body)
                    outer.auth.append(self.headers.get("Authorization"))
                    ok = len(outer.tries) > outer.fail_first
                    if ok:
                        outer.accepted.append(body)
                self.send_response(200 if ok else 500)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
