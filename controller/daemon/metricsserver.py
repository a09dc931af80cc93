"""``/metrics`` over HTTP: imported only with ``--metrics-port``.

Its own module because ``http.server`` brings ``http.client``, ``ssl`` and ``email``
(~6 MB resident), which a daemon without ``--metrics-port`` should not carry.
"""

from __future__ import annotations

import errno
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from controller.daemon.metrics import CONTENT_TYPE, current
from controller.errors import ConfigError
from controller.logsetup import get_logger

log = get_logger("reconcile")


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:  # load balancers and `curl -I` check with HEAD
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, "text/plain; charset=utf-8", b"see /metrics\n", body)
            return
        self._send(200, CONTENT_TYPE, current().encode(), body)

    def _send(self, code: int, kind: str, data: bytes, body: bool) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # scrapes every 15 s would drown the reconciler's own log


def _bind_error(host: str, port: int, exc: OSError) -> str:
    where = f"--metrics-port {host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"{where}: the address is already in use by another process "
            f"(see `ss -ltnp 'sport = :{port}'`): pick another port or stop that process"
        )
    if exc.errno == errno.EACCES:
        return f"{where}: permission denied (ports below 1024 need root): pick a port above 1024"
    return f"{where}: cannot listen there: {exc.strerror or exc}"


def serve(host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` from a daemon thread; the caller may ``shutdown()`` it."""
    try:
        server = ThreadingHTTPServer((host, port), _Handler)
    except OSError as exc:  # not the disk: say which address, and what to do
        raise ConfigError(_bind_error(host, port, exc)) from exc
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    log.info("serving metrics", address=f"http://{host}:{port}/metrics")
    return server
