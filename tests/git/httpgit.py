"""Smart HTTP for the tests: ``git http-backend`` behind a small threaded server on
loopback, with Basic auth, so a wrong token and a server that goes away are real."""

from __future__ import annotations

import base64
import os
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class GitHTTP:
    def __init__(self, root: Path, user: str, token: str) -> None:
        self.root, self.expected = root, base64.b64encode(f"{user}:{token}".encode()).decode()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, repo: str, user: str = "", token: str = "") -> str:
        auth = f"{user}:{token}@" if user else ""
        return f"http://{auth}127.0.0.1:{self.port}/{repo}"

    def on_request(self) -> None:
        """Called as an authorised request comes, its git still waiting for the answer."""

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                self._cgi()

            def do_POST(self) -> None:
                self._cgi()

            def _cgi(self) -> None:
                if self.headers.get("Authorization") != f"Basic {outer.expected}":
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                outer.on_request()
                path, _, query = self.path.partition("?")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {
                    **os.environ,
                    "GIT_PROJECT_ROOT": str(outer.root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                    "REMOTE_USER": "tess",
                    "REMOTE_ADDR": "127.0.0.1",
                }
                out = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60
                ).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode().split("\r\n"):
                    key, _, value = line.partition(": ")
                    if key.lower() == "status":
                        status = int(value.split()[0])
                    elif key:
                        headers.append((key, value))
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        return Handler
